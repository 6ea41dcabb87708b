"""The thesis' procedure as a study: FCFS builds the η tables, then every policy runs with them.

1. Isolation runs (one job at a time) give each class's service demand D_r.
2. R replications under FCFS measure U_r, Q_r, A^c_r and A_r; their means form the model.
3. R replications of every policy use that model, on the same random streams as FCFS (common
   random numbers sharpen the comparison between policies); each metric is a mean over
   replications with a 95% confidence interval (Student t). Replications are independent
   streams spawned from one seed, so a study is reproducible bit for bit.

``map_fn`` lets a caller run replications in parallel processes; nothing here needs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from admission.model import ClassProfile, EtaModel
from admission.online import TAIL
from admission.policies import POLICIES, policy_by_name
from admission.policies.interference import interference_matrix
from admission.sim.engine import RunResult, SimConfig, simulate
from admission.sim.workload import Workload
from admission.workloads import WorkloadConfig

__all__ = [
    "Estimate",
    "PolicySummary",
    "StudyResult",
    "build_model",
    "ccdf",
    "isolation_demands",
    "rank_classes",
    "replicate",
    "run_study",
    "with_tails",
]

# Two-sided 95% Student t quantiles t_{0.975, df}; beyond 30 the normal 1.96 is close enough.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)

MapFn = Callable[[Callable[[Any], RunResult], Iterable[Any]], Iterable[RunResult]]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean over replications and the half-width of its 95% confidence interval."""

    mean: float
    ci: float | None  # None with a single replication

    @classmethod
    def of(cls, samples: Sequence[float]) -> Estimate:
        xs = [float(x) for x in samples]
        m = sum(xs) / len(xs)
        if len(xs) < 2:
            return cls(m, None)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
        df = len(xs) - 1
        t = _T975[df - 1] if df <= len(_T975) else 1.96
        return cls(m, t * sd / math.sqrt(len(xs)))

    def covers(self, value: float, slack: float = 0.0) -> bool:
        """Whether ``value`` lies within the interval widened by ``slack``."""
        half = (self.ci or 0.0) + slack
        return abs(self.mean - value) <= half

    def json(self, key: str) -> dict[str, float | None]:
        return {key: self.mean, f"{key}_ci": self.ci}

    def __str__(self) -> str:
        return f"{self.mean:.3g}" + (f" ± {self.ci:.2g}" if self.ci is not None else "")


def _run_one(args: tuple[Workload, SimConfig, EtaModel, str, np.random.SeedSequence]) -> RunResult:
    workload, config, model, policy, seed = args
    return simulate(workload, config, model, policy, np.random.default_rng(seed))


def replicate(
    workload: Workload,
    config: SimConfig,
    model: EtaModel,
    policy: str,
    replications: int,
    seed: int,
    map_fn: MapFn = map,
) -> list[RunResult]:
    """``replications`` independent runs (streams spawned from ``seed``)."""
    if replications < 1:
        raise ValueError("at least one replication is needed")
    seeds = np.random.SeedSequence(seed).spawn(replications)
    return list(map_fn(_run_one, [(workload, config, model, policy, s) for s in seeds]))


def isolation_demands(workload: Workload, config: SimConfig, seed: int = 0) -> list[float]:
    """D_r: mean response time of a class-r job alone (the thesis' CON1 runs)."""
    demands = []
    for r in range(len(workload.classes)):
        mix = tuple(1.0 if i == r else 0.0 for i in range(len(workload.classes)))
        alone = replace(
            config,
            jobs=1,
            mix=mix,
            think=0.0,
            fcr=None,
            mpl=None,
            max_wait=None,
            queue_timeout=None,
            arrival_rate=None,
            class_per_cycle=False,
            completions=200,
            warmup=10,
        )
        model = workload.model(config.cores, None)
        run = simulate(workload, alone, model, "fcfs", np.random.default_rng(seed + r))
        demands.append(float(run.response_times[r].mean()))
    return demands


def build_model(
    workload: Workload, config: SimConfig, runs: Sequence[RunResult], demands: Sequence[float]
) -> EtaModel:
    """The η model from (FCFS) runs: means of U_r, Q_r, A_r and A^c_r over replications."""
    k = len(workload.classes)

    def mean(xs: Sequence[float]) -> float:
        return float(np.mean(xs))

    profiles = []
    base = workload.model(config.cores, config.fcr, demands)
    for r, c in enumerate(base.classes):
        profiles.append(
            ClassProfile(
                **{
                    **c.model_dump(),
                    "U": mean([x.U[r] for x in runs]),
                    "Q": mean([x.Q[r] for x in runs]),
                    "A": mean([x.A[r] for x in runs]),
                    "count": int(sum(x.completions[r] for x in runs)),
                }
            )
        )
    a = tuple(tuple(mean([x.A_matrix[r][c] for x in runs]) for c in range(k)) for r in range(k))
    return base.model_copy(
        update={
            "classes": tuple(profiles),
            "A_matrix": a,
            "mpl": config.mpl,
            "notes": "built from FCFS simulation",
        }
    )


def with_tails(model: EtaModel, runs: Sequence[RunResult]) -> EtaModel:
    """``model`` with each class's D_tail as the live learning sets it from what ``runs``
    measured: the 90th percentile of its statements' admission-to-completion times, put in
    the model's units by the median over classes of D_r / the median time (admission.online's
    scale)."""
    times = [
        np.concatenate([r.service_times[i] for r in runs]) for i in range(len(runs[0].classes))
    ]
    scale = float(
        np.median(
            [c.D / float(np.median(t)) for c, t in zip(model.classes, times, strict=True) if len(t)]
        )
    )
    classes = tuple(
        c.model_copy(update={"D_tail": scale * float(np.percentile(t, 100 * TAIL))})
        if len(t)
        else c
        for c, t in zip(model.classes, times, strict=True)
    )
    return model.model_copy(update={"classes": classes})


def rank_classes(policy: str, model: EtaModel) -> list[int] | None:
    """The static priority each policy gives each class (highest = K), None for FCFS.

    The score is taken with one task of every class in service (N = 1), so for P_{r,c} it is
    the row sum Σ_c P_{r,c}, for −A^c_r the row sum of −A, and for −Q_r, U_r, SEPT the order of
    Q_r, U_r, D_r — the quantities of the thesis' Tables 5.3 and 5.7.
    """
    prio = policy_by_name(policy).build(model)
    scores = [b + sum(row) for b, row in zip(prio.bias, prio.eta, strict=True)]
    if len(set(scores)) <= 1:
        return None
    order = sorted(range(len(scores)), key=lambda r: scores[r])
    ranks = [0] * len(scores)
    for rank, r in enumerate(order, start=1):
        ranks[r] = rank
    return ranks


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    throughput: Estimate
    mean_response: Estimate
    p50_response: Estimate
    p95_response: Estimate
    p99_response: Estimate
    weighted_slowdown: Estimate
    per_class: dict[str, dict[str, Estimate]]
    littles_law_gap: float  # max over replications of |L − X·R| / L
    aged: int
    timed_out: int
    task_completions: int
    ccdf: list[tuple[float, float]]
    mpl_mean: Estimate | None = None  # with the adaptive MPL: the MPL it held
    released: int = 0  # statements that gave their MPL slot back (release_after)

    @classmethod
    def of(cls, policy: str, runs: Sequence[RunResult], demands: Sequence[float]) -> PolicySummary:
        names = runs[0].classes
        per_class: dict[str, dict[str, Estimate]] = {}
        wsd = []
        for run in runs:
            x_total = run.throughput
            xs = run.class_throughput()
            wsd.append(
                sum(
                    (float(rt.mean()) / demands[r]) * xs[r] / x_total
                    for r, rt in enumerate(run.response_times)
                    if len(rt)
                )
            )
        for r, name in enumerate(names):
            per_class[name] = {
                "throughput": Estimate.of([x.class_throughput()[r] for x in runs]),
                "mean_response": Estimate.of([_mean(x.response_times[r]) for x in runs]),
                "mean_wait": Estimate.of([x.waits[r] for x in runs]),
                "slowdown": Estimate.of([_mean(x.response_times[r]) / demands[r] for x in runs]),
            }

        def pct(q: float) -> Estimate:
            return Estimate.of([float(np.percentile(_all(x), q)) for x in runs])

        gaps = [
            abs(x.jobs_in_system - x.throughput * x.mean_response()) / x.jobs_in_system
            for x in runs
        ]
        return cls(
            policy=policy,
            throughput=Estimate.of([x.throughput for x in runs]),
            mean_response=Estimate.of([x.mean_response() for x in runs]),
            p50_response=pct(50),
            p95_response=pct(95),
            p99_response=pct(99),
            weighted_slowdown=Estimate.of(wsd),
            per_class=per_class,
            littles_law_gap=max(gaps),
            aged=sum(x.aged for x in runs),
            timed_out=sum(x.timed_out for x in runs),
            released=sum(x.released for x in runs),
            task_completions=sum(x.task_completions for x in runs),
            ccdf=ccdf(np.concatenate([_all(x) for x in runs])),
            mpl_mean=Estimate.of([x.mpl_mean for x in runs if x.mpl_mean is not None])
            if any(x.mpl_mean is not None for x in runs)
            else None,
        )

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in (
            "throughput",
            "mean_response",
            "p50_response",
            "p95_response",
            "p99_response",
            "weighted_slowdown",
        ):
            out.update(getattr(self, key).json(key))
        if self.mpl_mean is not None:
            out.update(self.mpl_mean.json("mpl_mean"))
        out["per_class"] = {
            name: {k: v for key, est in m.items() for k, v in est.json(key).items()}
            for name, m in self.per_class.items()
        }
        out.update(
            littles_law_gap=self.littles_law_gap,
            aged=self.aged,
            timed_out=self.timed_out,
            released=self.released,
            ccdf=self.ccdf,
        )
        return out


def _mean(xs: np.ndarray) -> float:
    return float(xs.mean()) if len(xs) else float("nan")


def _all(run: RunResult) -> np.ndarray:
    return np.concatenate(run.response_times)


def ccdf(samples: np.ndarray, points: int = 40) -> list[tuple[float, float]]:
    """P(R > x) on a log-spaced grid from the smallest to the largest response time."""
    xs = np.sort(samples)
    lo, hi = max(float(xs[0]), 1e-9), float(xs[-1])
    grid = np.geomspace(lo, hi, points) if hi > lo else np.array([lo])
    above = 1.0 - np.searchsorted(xs, grid, side="right") / len(xs)
    return [(float(g), float(p)) for g, p in zip(grid, above, strict=True)]


@dataclass(frozen=True)
class StudyResult:
    workload: str
    mix: str
    config: SimConfig
    replications: int
    model: EtaModel
    demands: list[float]
    fcfs_runs: list[RunResult]
    policies: dict[str, PolicySummary]

    def class_rows(self) -> list[dict[str, Any]]:
        """Per class U_r, Q_r, A_r, Σ_c P_{r,c}, U share (with CIs), and each policy's rank."""
        runs = self.fcfs_runs
        rows = []
        ranks = {p: rank_classes(p, self.model) for p in self.policies}
        p_rows = [p_row_sums(self.model, x) for x in runs]
        for r, c in enumerate(self.model.classes):
            row: dict[str, Any] = {"name": c.name, "D": self.demands[r], "f": c.f}
            row["D_tail"] = c.D_tail  # (with tails: the model's, from the FCFS runs)
            row.update(Estimate.of([x.U[r] for x in runs]).json("U"))
            row.update(Estimate.of([x.U[r] / sum(x.U) for x in runs]).json("U_share"))
            row.update(Estimate.of([x.Q[r] for x in runs]).json("Q"))
            row.update(Estimate.of([x.A[r] for x in runs]).json("A"))
            row.update(Estimate.of([p[r] for p in p_rows]).json("P_row_sum"))
            row["rank"] = {p: (rk[r] if rk else None) for p, rk in ranks.items()}
            rows.append(row)
        return rows

    def json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "mix": self.mix,
            "replications": self.replications,
            "config": {k: _plain(getattr(self.config, k)) for k in self.config.__slots__},
            "classes": self.class_rows(),
            "policies": {name: s.json() for name, s in self.policies.items()},
        }


def _plain(value: Any) -> Any:
    """A config field as JSON holds it (the workload classes: as the admin API shows them)."""
    if isinstance(value, WorkloadConfig):
        return value.describe()
    return value


def model_of_run(base: EtaModel, run: RunResult) -> EtaModel:
    """The model one replication alone would give (its U_r, Q_r, A_r and A^c_r)."""
    profiles = tuple(
        c.model_copy(update={"U": run.U[r], "Q": run.Q[r], "A": run.A[r]})
        for r, c in enumerate(base.classes)
    )
    a = tuple(tuple(row) for row in run.A_matrix)
    return base.model_copy(update={"classes": profiles, "A_matrix": a})


def p_row_sums(base: EtaModel, run: RunResult) -> list[float]:
    """Σ_c P_{r,c} per class, as measured in one replication."""
    return [sum(row) for row in interference_matrix(model_of_run(base, run))]


def run_study(
    workload: Workload,
    config: SimConfig,
    *,
    mix_name: str = "",
    policies: Sequence[str] = tuple(POLICIES),
    replications: int = 5,
    seed: int = 1,
    model: EtaModel | None = None,
    map_fn: MapFn = map,
    progress: Callable[[str], None] | None = None,
) -> StudyResult:
    """FCFS builds the model (unless one is given), then each policy runs with it."""
    for p in policies:
        policy_by_name(p)

    def say(message: str) -> None:
        if progress is not None:
            progress(message)

    say("isolation runs (D_r)")
    demands = isolation_demands(workload, config, seed)
    say(f"FCFS × {replications} to build the η tables")
    base = workload.model(config.cores, config.fcr, demands)
    fcfs_runs = replicate(workload, config, base, "fcfs", replications, seed, map_fn)
    built = model if model is not None else build_model(workload, config, fcfs_runs, demands)
    if config.tails is not None:
        # (classes with a heavy tail: each class's D_tail from the FCFS runs, as the live
        # learning would have it, so that the short lane's long-run rules act on it)
        built = with_tails(built, fcfs_runs)
    summaries: dict[str, PolicySummary] = {}
    for p in policies:
        say(f"{p} × {replications}")
        runs = (
            fcfs_runs
            if p == "fcfs"
            else replicate(workload, config, built, p, replications, seed, map_fn)
        )
        summaries[p] = PolicySummary.of(p, runs, demands)
    return StudyResult(
        workload.name, mix_name, config, replications, built, demands, fcfs_runs, summaries
    )
