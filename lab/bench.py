"""``admission bench``: do the policies pay off on a real database?

The closed TPC-H workload (N clients, think time, a mix) runs through the proxy on a real
backend once per policy and repetition, plus **none** (no admission control: every statement
runs at once) and **fcfs** with the same MPL (what a PgBouncer pool gives). Policies are
interleaved within each repetition so that drift on a shared machine spreads over all of them.

Per run, over the measurement window (after the warm-up): throughput from the statements that
complete inside it, response times from those that start inside it (the run drains, so even a
statement a policy starves is counted in full); mean / p95 / p99 response time, the weighted
slowdown Σ_r X_r/X · R_r/D_r (D_r from the model's isolation runs), and per class; over
repetitions, means with 95% confidence intervals. Aging and queue timeouts are counted from the
scheduler.

The bench sits in the lab, above training: the target it runs on is ``lab.target``'s, and
without a model it trains a quick one first (``quick_model``).
"""

from __future__ import annotations

import functools
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from admission.classify import classify_sql
from admission.model import EtaModel
from admission.scheduler import Limits
from admission.sim.study import Estimate, PolicySummary, ccdf
from lab.target import open_target
from lab.train import train
from training.train import TrainConfig
from workloads.tpch.load import LoadResult, run_closed
from workloads.tpch.mixes import Mix
from workloads.tpch.queries import Dialect, draw_parameters, render_query

__all__ = ["ALL_POLICIES", "BenchConfig", "BenchResult", "run_bench"]

ALL_POLICIES = ("none", "fcfs", "sept", "min-q", "min-a", "max-u", "max-p")
Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class BenchConfig:
    mix: Mix
    backend: str = "duckdb"
    tpch: float = 0.1
    clients: int = 16
    think: float = 0.0
    duration: float = 30.0
    warmup: float | None = None  # default: 10 % of the duration
    limits: Limits = field(default_factory=lambda: Limits(mpl=4))  # every policy but "none"
    policies: tuple[str, ...] = ALL_POLICIES
    repetitions: int = 3
    seed: int = 0

    @property
    def warmup_seconds(self) -> float:
        return self.duration * 0.1 if self.warmup is None else self.warmup


@dataclass
class Run:
    policy: str
    repetition: int
    load: LoadResult
    aged: int
    timed_out: int


@dataclass
class BenchResult:
    config: BenchConfig
    model: EtaModel
    summaries: dict[str, PolicySummary] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        c = self.config
        policies = {}
        for name, summary in self.summaries.items():
            entry = summary.json()
            entry["errors"] = self.errors.get(name, 0)
            policies[name] = entry
        out: dict[str, Any] = _finite(
            {
                "backend": c.backend,
                "tpch": c.tpch,
                "mix": c.mix.name,
                "clients": c.clients,
                "think": c.think,
                "duration": c.duration,
                "warmup": c.warmup_seconds,
                "mpl": c.limits.mpl,
                "threads": c.limits.threads,
                "repetitions": c.repetitions,
                "model": {"backend": self.model.backend, "dataset": self.model.dataset},
                "policies": policies,
            }
        )
        return out


def _finite(value: Any) -> Any:
    """JSON has no NaN: a metric with no samples (a class that never completed) is null."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _limits(config: BenchConfig, policy: str) -> Limits:
    return Limits() if policy == "none" else config.limits


def run_bench(
    config: BenchConfig,
    model: EtaModel,
    progress: Progress = _quiet,
    tick: Callable[[int], None] | None = None,
) -> BenchResult:
    """Every policy × repetition through one proxy, switching policy and limits between runs."""
    for policy in config.policies:
        if policy not in ALL_POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(ALL_POLICIES)}")
    dialect: Dialect = "duckdb" if config.backend == "duckdb" else "postgres"
    target = open_target(config.backend, config.tpch, model=model, progress=progress)
    proxy, conninfo = target.proxy, target.conninfo
    result = BenchResult(config, model)
    try:
        gate = proxy.gate
        done = 0
        for rep in range(config.repetitions):
            order = list(config.policies)
            random.Random(config.seed * 7919 + rep).shuffle(order)
            for policy in order:
                proxy.call(functools.partial(_switch, gate, policy, _limits(config, policy)))
                before = (gate.scheduler.stats.aged, gate.stats.timed_out)
                progress(f"repetition {rep + 1}/{config.repetitions}: {policy}")
                load = run_closed(
                    conninfo,
                    config.mix,
                    clients=config.clients,
                    duration=config.duration,
                    think=config.think,
                    scale_factor=config.tpch,
                    dialect=dialect,
                    seed=config.seed * 1000 + rep,
                )
                after = (gate.scheduler.stats.aged, gate.stats.timed_out)
                result.runs.append(
                    Run(policy, rep, load, after[0] - before[0], after[1] - before[1])
                )
                done += 1
                if tick:
                    tick(done)
    finally:
        target.close()
    demands = _demands(model, config.mix, dialect, config.tpch)
    for policy in config.policies:
        runs = [r for r in result.runs if r.policy == policy]
        result.summaries[policy] = _summary(policy, runs, demands, config)
        result.errors[policy] = sum(len(r.load.failed) for r in runs)
    return result


def _switch(gate: Any, policy: str, limits: Limits) -> None:
    """The gate's settings for one run: "none" is FCFS without limits."""
    gate.set_policy("fcfs" if policy == "none" else policy)
    gate.set_limits(limits)


def _demands(model: EtaModel, mix: Mix, dialect: Dialect, sf: float) -> dict[int, float]:
    """D_r of each query of the mix, from the model (its default profile if untrained)."""
    index = model.index()
    out = {}
    for q in mix.queries:
        fingerprint = classify_sql(
            render_query(q, draw_parameters(q, random.Random(q), sf), dialect)
        ).fingerprint
        i = index.get(fingerprint)
        out[q] = model.classes[i].D if i is not None else model.default_profile().D
    return out


@dataclass(frozen=True)
class _Window:
    """One run's measurement window, from the end of the warm-up to the nominal end."""

    responses: list[tuple[int, float]]  # (query, response) of statements started inside
    completions: dict[int, int]  # statements of each query that completed inside
    length: float


def _window(run: Run, config: BenchConfig) -> _Window:
    """Throughput counts completions inside the window; response times come from the
    statements that *started* inside it. The run drains (every statement started finishes),
    so a statement a policy keeps waiting past the window's end still counts with its full
    response time — counting completions only would leave out exactly the starved ones."""
    start = run.load.started + config.warmup_seconds
    end = run.load.started + config.duration
    responses = [(s.query, s.response) for s in run.load.ok if start <= s.start <= end]
    completions: dict[int, int] = {}
    for s in run.load.ok:
        if start <= s.end <= end:
            completions[s.query] = completions.get(s.query, 0) + 1
    return _Window(responses, completions, max(end - start, 1e-9))


def _summary(
    policy: str, runs: list[Run], demands: dict[int, float], config: BenchConfig
) -> PolicySummary:
    throughput, mean, p50, p95, p99, slowdown = [], [], [], [], [], []
    per_class: dict[int, dict[str, list[float]]] = {}
    everything: list[float] = []
    gaps = []
    for run in runs:
        w = _window(run, config)
        times = np.array([r for _, r in w.responses]) if w.responses else np.array([np.nan])
        everything.extend(r for _, r in w.responses)
        x = sum(w.completions.values()) / w.length
        throughput.append(x)
        mean.append(float(np.mean(times)))
        p50.append(float(np.percentile(times, 50)))
        p95.append(float(np.percentile(times, 95)))
        p99.append(float(np.percentile(times, 99)))
        by_q: dict[int, list[float]] = {}
        for q, r in w.responses:
            by_q.setdefault(q, []).append(r)
        slowdown.append(
            sum(
                len(rs) / len(w.responses) * statistics.fmean(rs) / demands[q]
                for q, rs in by_q.items()
            )
        )
        for q in config.mix.queries:
            rs = by_q.get(q, [])
            c = per_class.setdefault(q, {"throughput": [], "mean_response": [], "slowdown": []})
            c["throughput"].append(w.completions.get(q, 0) / w.length)
            c["mean_response"].append(statistics.fmean(rs) if rs else float("nan"))
            c["slowdown"].append(statistics.fmean(rs) / demands[q] if rs else float("nan"))
        if config.think == 0 and w.responses:  # closed, no think time: N = X · R
            gaps.append(abs(config.clients - x * float(np.mean(times))) / config.clients)
    return PolicySummary(
        policy=policy,
        throughput=Estimate.of(throughput),
        mean_response=Estimate.of(mean),
        p50_response=Estimate.of(p50),
        p95_response=Estimate.of(p95),
        p99_response=Estimate.of(p99),
        weighted_slowdown=Estimate.of(slowdown),
        per_class={
            f"Q{q}": {k: Estimate.of(v) for k, v in m.items()} for q, m in per_class.items()
        },
        littles_law_gap=max(gaps) if gaps else float("nan"),
        aged=sum(r.aged for r in runs),
        timed_out=sum(r.timed_out for r in runs),
        task_completions=sum(len(_window(r, config).responses) for r in runs),
        ccdf=ccdf(np.array(everything)) if everything else [],
    )


def quick_model(
    config: BenchConfig, progress: Progress = _quiet, path: Path | None = None
) -> EtaModel:
    """Train a short model over the mix's classes (when ``admission bench`` got no --model)."""
    progress("no --model: training a quick one over the mix's classes")
    trained = train(
        TrainConfig(
            backend=config.backend,
            tpch=config.tpch,
            classes=config.mix.queries,
            isolation_reps=3,
            concurrency=max(2, min(config.clients, 8)),
            duration=max(5.0, min(config.duration, 20.0)),
            seed=config.seed,
        ),
        progress,
    ).model
    if path is not None:
        trained.save(path)
    return trained
