"""``admission bench``: do the policies pay off on a real database?

A TPC-H workload runs through the proxy on a real backend once per policy and repetition, plus
**none** (no admission control: every statement runs at once) and **fcfs** with the same MPL
(what a PgBouncer pool gives); ``POLICY@N`` runs a policy at MPL N instead (``fcfs@1,fcfs@2``:
a pool of each size). Policies are interleaved within each repetition in a balanced order
(``run_order``, a Williams design): each policy runs equally often in each position and right
after each other policy, so that drift on a shared machine — and whatever one run leaves
behind for the next — spreads evenly over all of them instead of by the luck of a shuffle (with
two settings, a shuffle put the same one first in 9 of 13 repetitions).

The load is closed (N clients, think time: the load adapts to the server and, with no think time,
no policy can move the mean response time, N = X·R) or open: statements arrive on a Poisson,
bursty or traced schedule whether or not earlier ones have finished, at ``rate`` per second or at
the offered load ρ = λ · Σ_r p_r D_r (D_r from the model). Within a repetition every policy gets
the same arrivals (the same statements at the same offsets), so policies are compared on equal
terms; repetitions draw new ones.

Per run, over the measurement window (after the warm-up): throughput from the statements that
complete inside it, response times from those that start (closed) or arrive (open) inside it
(the run drains, so even a statement a policy starves is counted in full); mean / p95 / p99
response time, the weighted slowdown Σ_r X_r/X · R_r/D_r (D_r from the model's isolation runs),
and per class; with SLOs (per class, or k·D_r) the share of statements within their SLO and the
goodput (statements within SLO completed per second); errors by SQLSTATE; over repetitions,
means with 95% confidence intervals. Aging and queue timeouts are counted from the scheduler,
and the scheduler's queue is sampled over time (for the figures and, with bursts, the time the
queue takes to come back to its level before the first burst).

The bench sits in the lab, above training: the target it runs on is ``lab.target``'s, and
without a model it trains a quick one first (``quick_model``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import re
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psycopg

from admission.classify import classify_sql
from admission.model import EtaModel
from admission.policies import POLICIES
from admission.scheduler import SHORT_LANE, Limits
from admission.sim.study import Estimate, PolicySummary, ccdf
from lab.target import open_target
from lab.train import train
from training.train import TrainConfig
from workloads.arrivals import Bursts, bursty, poisson, read_trace
from workloads.tpch.load import Arrival, LoadResult, run_closed, run_open, tpch_arrivals
from workloads.tpch.mixes import Mix
from workloads.tpch.queries import Dialect, draw_parameters, render_query

__all__ = [
    "ALL_POLICIES",
    "ARRIVALS",
    "BASELINES",
    "POOL_COUNTERS",
    "RECOMMENDED",
    "BenchConfig",
    "BenchResult",
    "apply_setting",
    "baseline",
    "learns",
    "mean_mpl",
    "open_arrivals",
    "paired_change",
    "paired_changes",
    "parse_policy",
    "pool_counts_since",
    "releases",
    "repetition_means",
    "run_bench",
    "tunes_mpl",
    "verdict",
]

ALL_POLICIES = ("none", "fcfs", "sept", "min-q", "min-a", "max-u", "max-p", "latency")
ARRIVALS = ("closed", "poisson", "bursty", "trace")
LOAD_BASES = ("model", "measured")  # what --load is a share of (see BenchConfig.load_basis)
BASELINES = ("none", "fcfs")  # what a user has without admission control: nothing, or a pool
RECOMMENDED = "latency"  # the policy the verdict speaks for (``admission serve``'s default)
THESIS = ("sept", "min-q", "min-a", "max-u", "max-p")
SAMPLE_EVERY = 0.2  # seconds between samples of the scheduler's queue
# connections an open run opens before its clock starts (more when all are busy): opening one
# through the proxy takes milliseconds a statement would otherwise wait for
OPEN_CONNECTIONS = 64
Progress = Callable[[str], None]


LEARN = "+learn"  # a policy spec's suffix: start from no model and learn D_r while it runs
MEMORY = "+mem"  # a policy spec's suffix: admit under the memory budget (--memory)
GRANT = "+grant"  # … give each admitted statement its work_mem share (--grant-work-mem)
# … the same setting once more under its own name: an A/A control, how far two runs of one
# setting differ within this run (on a shared machine, at times by more than any policy)
AGAIN = "+again"
# … give the MPL slot of a statement in service BenchConfig.release_after to the queue
RELEASE = "+release"
RELEASE_AFTER = 1.0  # seconds, for POLICY+release when --release-after is not given
AUTO = "auto"  # POLICY@auto: the MPL tuned while it runs
# … the latency policy's due factor for this run (``latency@2+due=10``; 0: no aging), so that
# two due factors are compared side by side in one interleaved bench
DUE = "+due="
_DUE_SUFFIX = re.compile(r"\+due=([0-9]+(?:\.[0-9]*)?)$")
# … admit statements far shorter than those in service beside a full MPL (``+lane``: by
# SHORT_LANE; ``+lane=8``: 8 times shorter than the least expected remaining time in service;
# ``+lane=0``: no lane, also for the latency policy, whose own it is)
LANE = "+lane"
_LANE_SUFFIX = re.compile(r"\+lane(?:=([0-9]+(?:\.[0-9]*)?))?$")


def _suffixes(spec: str) -> tuple[str, set[str]]:
    """``latency@2+mem+learn`` → ("latency@2", {"+mem", "+learn"}); a due factor is kept
    with its value (``+due=10``)."""
    spec = spec.strip()
    found: set[str] = set()
    while True:
        due = _DUE_SUFFIX.search(spec)
        if due is not None and not any(f.startswith(DUE) for f in found):
            found.add(due.group(0))
            spec = spec[: due.start()].rstrip()
            continue
        lane = _LANE_SUFFIX.search(spec)
        if lane is not None and not any(f.startswith(LANE) for f in found):
            found.add(lane.group(0))
            spec = spec[: lane.start()].rstrip()
            continue
        for suffix in (LEARN, MEMORY, GRANT, RELEASE, AGAIN):
            if spec.endswith(suffix) and suffix not in found:
                found.add(suffix)
                spec = spec[: -len(suffix)].rstrip()
                break
        else:
            if DUE in spec:
                raise ValueError(f"{spec!r}: +due= takes a number of D_r (+due=10; 0: no aging)")
            return spec, found


def due_factor(spec: str) -> float | None:
    """The due factor ``spec`` sets (``latency@2+due=10`` → 10.0; ``+due=0`` → 0.0, aging off),
    or None when it sets none (the bench's --due-factor applies)."""
    for suffix in _suffixes(spec)[1]:
        if suffix.startswith(DUE):
            return float(suffix[len(DUE) :])
    return None


def short_lane(spec: str) -> float | None:
    """The short lane ``spec`` sets (``latency@2+lane`` → SHORT_LANE; ``+lane=8`` → 8.0;
    ``+lane=0`` → 0.0, none), or None when it sets none (the policy's own applies)."""
    for suffix in _suffixes(spec)[1]:
        if suffix.startswith(LANE):
            value = suffix[len(LANE) + 1 :]
            return float(value) if value else SHORT_LANE
    return None


def learns(spec: str) -> bool:
    """Whether a run of ``spec`` (``latency@2+learn``) starts from no model and learns."""
    return LEARN in _suffixes(spec)[1]


def memory_aware(spec: str) -> bool:
    """Whether a run of ``spec`` (``fcfs@4+mem``) admits under the memory budget: each
    statement's class M_r reserved, as ``serve --memory`` does."""
    return MEMORY in _suffixes(spec)[1]


def grants(spec: str) -> bool:
    """Whether a run of ``spec`` (``fcfs@2+grant``) gives each admitted statement its share of
    the work memory (--grant-work-mem) as its work_mem, as ``serve --grant-work-mem`` does."""
    return GRANT in _suffixes(spec)[1]


def control(spec: str) -> bool:
    """Whether ``spec`` (``fcfs@2+again``) is a second run of a setting also in the bench
    under its plain name: it runs exactly as that one does, and is neither a baseline nor a
    candidate — the verdict reports how far it differs from the original."""
    return AGAIN in _suffixes(spec)[1]


def original(spec: str) -> str:
    """The setting a control (``fcfs@2+mem+again``) repeats (``fcfs@2+mem``)."""
    return spec.strip().replace(AGAIN, "", 1).strip() if control(spec) else spec


def releases(spec: str) -> bool:
    """Whether a run of ``spec`` (``latency@2+release``) gives the MPL slot of a statement in
    service ``release_after`` seconds to the queue, as ``serve --release-after`` does."""
    return RELEASE in _suffixes(spec)[1]


def baseline(spec: str) -> bool:
    """Whether ``spec`` is what a user has without this product: no admission control, or a
    plain FCFS pool — not one managing memory, releasing slots, or repeating another run."""
    return (
        parse_policy(spec)[0] in BASELINES
        and not budgeted(spec)
        and not releases(spec)
        and short_lane(spec) is None
        and not control(spec)
    )


def budgeted(spec: str) -> bool:
    """Whether a run of ``spec`` manages memory (``+mem`` or ``+grant``): not a baseline."""
    return memory_aware(spec) or grants(spec)


def tunes_mpl(spec: str) -> bool:
    """Whether a run of ``spec`` (``latency@auto``) tunes its MPL while it runs (``--mpl
    auto``), starting from the configured MPL (or this machine's cores)."""
    return _suffixes(spec)[0].partition("@")[2].strip().lower() == AUTO


def parse_policy(spec: str) -> tuple[str, int | None]:
    """``POLICY`` or ``POLICY@MPL`` (``fcfs@2``: FCFS at MPL 2; ``fcfs@auto``: tuned, see
    ``tunes_mpl``, the MPL returned is None); "none" takes no MPL. The suffixes ``+learn``
    (see ``learns``), ``+mem`` (``memory_aware``), ``+grant`` (``grants``), ``+release``
    (``releases``) and ``+lane`` (``short_lane``) are allowed on any but none; ``+again``
    (``control``) on any;
    ``+due=X`` (``due_factor``) on latency."""
    spec, suffixes = _suffixes(spec)
    if suffixes - {AGAIN} and spec.partition("@")[0] == "none":
        raise ValueError("none is no admission control: it has no model to learn or budget")
    if any(s.startswith(DUE) for s in suffixes) and spec.partition("@")[0] != "latency":
        raise ValueError(f"{spec!r}: +due= sets the latency policy's aging; no other policy has it")
    for s in suffixes:
        if s.startswith(LANE + "=") and 0 < float(s[len(LANE) + 1 :]) < 1:
            raise ValueError(f"{spec!r}: +lane=X takes a factor of at least 1 (+lane=4; 0: none)")
    name, at, mpl = spec.partition("@")
    if name != "none" and name not in POLICIES:
        choices = ", ".join(("none", *POLICIES))
        raise ValueError(f"unknown policy {name!r}; choose from {choices} (POLICY@MPL sets MPL)")
    if not at:
        return name, None
    if name == "none":
        raise ValueError("none is no admission control: it takes no MPL")
    if mpl.strip().lower() == AUTO:
        return name, None
    try:
        value = int(mpl)
    except ValueError:
        raise ValueError(f"{spec!r}: the MPL after @ must be a whole number") from None
    if value < 1:
        raise ValueError(f"{spec!r}: the MPL must be at least 1")
    return name, value


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class BenchConfig:
    mix: Mix
    backend: str = "duckdb"
    tpch: float = 0.1
    clients: int = 16  # closed: clients; open: connections opened before the run
    think: float = 0.0
    duration: float = 30.0
    warmup: float | None = None  # default: 10 % of the duration
    limits: Limits = field(default_factory=lambda: Limits(mpl=4))  # every policy but "none"
    policies: tuple[str, ...] = ALL_POLICIES  # names, or NAME@MPL
    repetitions: int = 3
    seed: int = 0
    arrivals: str = "closed"
    rate: float | None = None  # open: statements per second …
    load: float | None = None  # … or the offered load ρ
    # what ρ is a share of: "model", λ·Σ p_r D_r with the model's D_r (a statement alone);
    # "measured", the statements/s this server completed in a closed loop with no admission
    # control just before the runs (``measure_capacity``): the machine as it is now, the
    # parallelism between statements included, whatever the training run measured
    load_basis: str = "model"
    capacity_seconds: float = 10.0  # the length of that closed loop
    bursts: Bursts | None = None  # bursty
    trace: Path | None = None  # trace
    slo: dict[str, float] = field(default_factory=dict)  # class name → seconds
    slo_factor: float | None = None  # otherwise SLO = k · D_r
    max_connections: int = 256
    memory: int | None = None  # POLICY+mem's budget, bytes (None: the embedded server's auto)
    memory_limit: int | None = None  # the embedded DuckDB's memory_limit, bytes
    max_temp_size: int | None = None  # … and its max_temp_directory_size (0: no spilling)
    grant_work_mem: int | None = None  # POLICY+grant's work memory in total, bytes (PostgreSQL)
    # PostgreSQL: transaction pooling with this many server connections (the MPL is at most
    # this; FCFS is a PgBouncer pool); None: a server connection per client
    pool_size: int | None = None
    release_after: float | None = None  # POLICY+release's, seconds (None: RELEASE_AFTER)

    def __post_init__(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise ValueError(
                f"--arrivals must be one of {', '.join(ARRIVALS)}, not {self.arrivals!r}"
            )
        for spec in self.policies:
            parse_policy(spec)
            if grants(spec) and self.backend == "duckdb":
                raise ValueError(f"{spec}: +grant sets PostgreSQL's work_mem (a --backend)")
            if grants(spec) and self.grant_work_mem is None:
                raise ValueError(f"{spec}: +grant needs --grant-work-mem SIZE")
            if releases(spec) and (self.pool_size is not None or grants(spec)):
                raise ValueError(f"{spec}: +release is not supported with --pool-size or +grant")
            if short_lane(spec) and (self.pool_size is not None or grants(spec)):
                raise ValueError(f"{spec}: +lane is not supported with --pool-size or +grant")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("a policy is listed twice (SETTING+again runs one a second time)")
        for spec in self.policies:
            if control(spec) and original(spec) not in self.policies:
                raise ValueError(
                    f"{spec} repeats {original(spec)}, which is not among the policies"
                )
        if self.pool_size is not None:
            if self.backend == "duckdb":
                raise ValueError(
                    "--pool-size pools PostgreSQL's connections (--backend); the embedded "
                    "DuckDB has none to pool"
                )
            if self.pool_size < 1:
                raise ValueError(f"--pool-size must be at least 1, not {self.pool_size}")
            if any(parse_policy(p)[0] == "none" for p in self.policies):
                raise ValueError(
                    "none is not a setting with --pool-size: every statement waits for one of "
                    "the pool's server connections, in the admission queue (fcfs is a "
                    "PgBouncer pool)"
                )
            mpls = [parse_policy(p)[1] for p in self.policies]
            if not self.limits.mpl or any(
                m is not None and m > self.pool_size for m in [self.limits.mpl, *mpls]
            ):
                raise ValueError(
                    f"an MPL above --pool-size {self.pool_size} (or unlimited) is not a setting: "
                    "a statement admitted must find a server connection"
                )
        if self.open:
            if self.arrivals == "trace":
                if self.trace is None:
                    raise ValueError("--arrivals trace needs --trace FILE")
                if self.rate is not None or self.load is not None:
                    raise ValueError("a trace sets its own arrival times: no --rate or --load")
            elif (self.rate is None) == (self.load is None):
                raise ValueError(f"--arrivals {self.arrivals} needs --rate or --load (one of them)")
            if self.arrivals == "bursty" and self.bursts is None:
                raise ValueError("--arrivals bursty needs bursts")
        elif self.rate is not None or self.load is not None or self.trace is not None:
            raise ValueError(
                "--rate, --load and --trace need open arrivals "
                "(--arrivals poisson, bursty or trace)"
            )
        if self.load_basis not in LOAD_BASES:
            raise ValueError(
                f"--load-basis must be one of {', '.join(LOAD_BASES)}, not {self.load_basis!r}"
            )
        if self.load_basis == "measured":
            if self.arrivals not in ("poisson", "bursty"):
                raise ValueError(
                    "--load-basis measured sets the rate of poisson or bursty arrivals from "
                    "--load (a closed loop or a trace has its own)"
                )
            if self.load is None:
                raise ValueError("--load-basis measured sets the rate from --load: give --load")
            if not self.capacity_seconds >= 1:
                raise ValueError(
                    f"--capacity-seconds must be at least 1, not {self.capacity_seconds}"
                )
        for name, value in (
            ("rate", self.rate),
            ("load", self.load),
            ("slo-factor", self.slo_factor),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"--{name} must be positive, not {value}")
        for name, value in self.slo.items():
            if not value > 0:
                raise ValueError(f"the SLO of {name} must be positive, not {value}")

    @property
    def open(self) -> bool:
        return self.arrivals != "closed"

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
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, queued, running)
    mpls: list[tuple[float, int]] = field(default_factory=list)  # (t, MPL) of a tuned run
    # bytes spilled to disk: the embedded DuckDB's temporary files at their largest, or the
    # temporary bytes PostgreSQL wrote during the run (pg_stat_database.temp_bytes)
    spill: int = 0
    released: int = 0  # statements that gave their MPL slot back (POLICY+release)


@dataclass
class OpenSummary:
    """What an open run adds to a policy's summary: SLOs, errors by kind, the generator's
    health and, with bursts, the queue's recovery."""

    slo_attainment: Estimate  # share of statements (arrived in the window) within their SLO
    goodput: Estimate  # statements within SLO completed per second
    per_class_attainment: dict[str, Estimate]
    errors_by_sqlstate: dict[str, int]
    late: int  # sent more than 10 ms after arriving (no free connection)
    unsent: int
    connections: int  # the most connections open at once
    recovery: list[float | None]  # seconds from each burst's end to the pre-burst queue level

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out.update(self.slo_attainment.json("slo_attainment"))
        out.update(self.goodput.json("goodput"))
        out["per_class_slo_attainment"] = {
            k: v.json("mean") for k, v in self.per_class_attainment.items()
        }
        out.update(
            errors_by_sqlstate=self.errors_by_sqlstate,
            late=self.late,
            unsent=self.unsent,
            connections=self.connections,
            burst_recovery=self.recovery,
        )
        return out


@dataclass
class BenchResult:
    config: BenchConfig
    model: EtaModel
    summaries: dict[str, PolicySummary] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    rate: float | None = None  # open: the arrival rate used (statements/s)
    offered_load: float | None = None  # open: ρ = λ · Σ p_r D_r
    # open, --load-basis measured: the statements/s measured before the runs; ρ is then
    # λ / capacity, and ``offered_load`` stays the model's ρ of the same λ
    capacity: float | None = None
    slo: dict[str, float] = field(default_factory=dict)  # the SLO of each class
    open: dict[str, OpenSummary] = field(default_factory=dict)
    # --pool-size: the pools' counts over the runs (server connections opened, handovers …;
    # a capacity run's before them not included) and their state at the end
    pools: list[dict[str, Any]] | None = None

    def json(self) -> dict[str, Any]:
        c = self.config
        policies = {}
        for name, summary in self.summaries.items():
            entry = summary.json()
            entry["errors"] = self.errors.get(name, 0)
            if name in self.open:
                entry.update(self.open[name].json())
            entry["repetitions"] = [_repetition(r, c) for r in self.runs if r.policy == name]
            policies[name] = entry
        out: dict[str, Any] = _finite(
            {
                "backend": c.backend,
                "pool_size": c.pool_size,
                "pools": self.pools,
                "tpch": c.tpch,
                "mix": c.mix.name,
                "arrivals": c.arrivals,
                "rate": self.rate,
                "offered_load": self.offered_load,
                "load_basis": c.load_basis if c.load is not None else None,
                "capacity": self.capacity,
                "load": c.load,
                "bursts": dataclasses.asdict(c.bursts)
                if c.bursts and c.arrivals == "bursty"
                else None,
                "slo": self.slo,
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


def _limits(config: BenchConfig, policy: str, memory: int | None = None) -> Limits:
    """A run's limits: none has none; POLICY@N runs at MPL N; POLICY@auto starts from the
    configured MPL, or this machine's cores; others run at the configured ones; POLICY+mem
    under the memory budget ``memory``, the others without one."""
    name, mpl = parse_policy(policy)
    if name == "none":
        return Limits()
    if tunes_mpl(policy):
        mpl = config.limits.mpl or os.cpu_count() or 1
    limits = config.limits if mpl is None else dataclasses.replace(config.limits, mpl=mpl)
    limits = dataclasses.replace(limits, memory=memory if memory_aware(policy) else None)
    if releases(policy):
        after = config.release_after if config.release_after is not None else RELEASE_AFTER
        limits = dataclasses.replace(limits, release_after=after)
    due = due_factor(policy)
    if due is not None:
        limits = dataclasses.replace(limits, due_factor=due or None)
    lane = short_lane(policy)
    if lane is None and (config.pool_size is not None or grants(policy)):
        lane = 0.0  # (beside the MPL there is no server connection of the pool, no grant)
    if lane is not None:
        limits = dataclasses.replace(limits, short_lane=lane)
    return limits


def run_bench(
    config: BenchConfig,
    model: EtaModel,
    progress: Progress = _quiet,
    tick: Callable[[int], None] | None = None,
    learned: list[EtaModel] | None = None,
) -> BenchResult:
    """Every policy × repetition through one proxy, switching policy and limits between runs.
    ``learned`` gets the model each learning run (``POLICY+learn``) ended with."""
    dialect: Dialect = "duckdb" if config.backend == "duckdb" else "postgres"
    demands = _demands(model, config.mix, dialect, config.tpch)
    trace = read_trace(config.trace) if config.arrivals == "trace" and config.trace else None
    result = BenchResult(config, model)
    measured = config.load_basis == "measured"  # (only poisson or bursty: BenchConfig)
    if config.open and trace is None and not measured:
        result.rate, result.offered_load = _rate(config, demands)
        _say_rate(config, result, progress)
    traced, traced_demands = _traced(trace, model) if trace is not None else (None, {})
    _slos(config, traced_demands if traced is not None else demands)  # refused before any run
    target = open_target(
        config.backend,
        config.tpch,
        model=model,
        progress=progress,
        learn=any(learns(p) for p in config.policies),
        auto_mpl=any(tunes_mpl(p) for p in config.policies),
        memory_limit=config.memory_limit,
        max_temp_size=config.max_temp_size,
        memory_auto=config.memory is None and any(memory_aware(p) for p in config.policies),
        pool_size=config.pool_size,
    )
    proxy, conninfo = target.proxy, target.conninfo
    learning, auto_mpl = proxy.server.learning, proxy.server.auto_mpl
    budget = config.memory
    if budget is None and any(memory_aware(p) for p in config.policies):
        budget = proxy.server.gate.scheduler.limits.memory  # the server's auto
        if budget is None:
            target.close()
            raise ValueError("POLICY+mem needs --memory SIZE (in front of PostgreSQL: no auto)")
        progress(f"memory budget of the +mem runs: {budget / 2**20:.0f} MiB")
    pools_before: list[dict[str, Any]] = []
    try:
        gate = proxy.gate
        if measured:
            assert config.load is not None
            if learning is not None:
                proxy.call(functools.partial(learning.keep, model))
            if auto_mpl is not None:
                proxy.call(auto_mpl.pause)
            result.capacity = measure_capacity(proxy, conninfo, config, dialect, progress)
            if gate.pools is not None:  # the runs' counts will not include the capacity run's
                pools_before = proxy.call(gate.pools.status)
            if _pg_temp_bytes(config.backend) is not None:  # its statistics, before the runs'
                time.sleep(PG_STATS_DELAY)
            result.rate = config.load * result.capacity
            result.offered_load = result.rate * _work(config, demands)
            _say_rate(config, result, progress)
        done = 0
        for rep in range(config.repetitions):
            order = run_order(config.policies, config.seed, rep)
            arrivals = (
                traced if traced is not None else _arrivals(config, result.rate, dialect, rep)
            )
            for policy in order:
                proxy.call(
                    functools.partial(_switch, gate, policy, _limits(config, policy, budget))
                )
                if grants(policy) or config.grant_work_mem is not None:
                    grant = config.grant_work_mem if grants(policy) else None
                    proxy.call(functools.partial(setattr, proxy.server, "work_mem_grant", grant))
                if learning is not None:  # learning runs start from nothing; others keep
                    if learns(policy):  # the model as given
                        proxy.call(learning.reset)
                    else:
                        proxy.call(functools.partial(learning.keep, model))
                if auto_mpl is not None:  # tuned runs start afresh; others keep their MPL
                    if tunes_mpl(policy):
                        proxy.call(auto_mpl.resume)
                    else:
                        proxy.call(auto_mpl.pause)
                before = (
                    gate.scheduler.stats.aged,
                    gate.stats.timed_out,
                    gate.scheduler.stats.released,
                )
                written = _pg_temp_bytes(config.backend)
                progress(f"repetition {rep + 1}/{config.repetitions}: {policy}")
                sampler = _QueueSampler(proxy, gate)
                try:
                    if arrivals is not None:
                        load = run_open(
                            conninfo,
                            arrivals,
                            duration=config.duration,
                            connections=min(
                                max(config.clients, OPEN_CONNECTIONS), config.max_connections
                            ),
                            max_connections=config.max_connections,
                        )
                    else:
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
                finally:
                    timeline = sampler.stop()
                after = (
                    gate.scheduler.stats.aged,
                    gate.stats.timed_out,
                    gate.scheduler.stats.released,
                )
                if written is not None:  # (PostgreSQL counts a statement's at its end, and
                    time.sleep(PG_STATS_DELAY)  # backends report at most once a second)
                    sampler.spill = max(0, (_pg_temp_bytes(config.backend) or 0) - written)
                origin = load.started
                result.runs.append(
                    Run(
                        policy,
                        rep,
                        load,
                        after[0] - before[0],
                        after[1] - before[1],
                        [(t - origin, q, n) for t, q, n in timeline],
                        [(t - origin, m) for t, m in sampler.mpls] if tunes_mpl(policy) else [],
                        sampler.spill,
                        after[2] - before[2],
                    )
                )
                if learned is not None and learns(policy):
                    learned.append(proxy.call(lambda: gate.scheduler.model))
                done += 1
                if tick:
                    tick(done)
        if gate.pools is not None:
            result.pools = pool_counts_since(proxy.call(gate.pools.status), pools_before)
    finally:
        target.close()
    if traced is not None:  # the trace's classes, not the mix's
        demands = traced_demands
    if config.open:
        result.slo = _slos(config, demands)
    for policy in config.policies:
        runs = [r for r in result.runs if r.policy == policy]
        result.summaries[policy] = _summary(policy, runs, demands, config)
        result.errors[policy] = sum(len(r.load.failed) for r in runs)
        if config.open:
            result.open[policy] = _open_summary(runs, result.slo, config)
    return result


def _say_rate(config: BenchConfig, result: BenchResult, progress: Progress) -> None:
    assert result.rate is not None and result.offered_load is not None
    burst = (
        f", ×{config.bursts.factor:g} for {config.bursts.length:g} s every "
        f"{config.bursts.every:g} s"
        if config.arrivals == "bursty" and config.bursts
        else ""
    )
    if result.capacity is not None:
        progress(
            f"{config.arrivals} arrivals at {result.rate:.3g} statements/s: offered load "
            f"ρ = {config.load:g} of the measured {result.capacity:.3g}/s (by the model's D_r, "
            f"λ·Σ p_r D_r = {result.offered_load:.3g}){burst}"
        )
    else:
        progress(
            f"{config.arrivals} arrivals at {result.rate:.3g} statements/s: offered load "
            f"ρ = λ·Σ p_r D_r = {result.offered_load:.3g} (D_r from the model){burst}"
        )


# a pool's counts that only grow (proxy.pool.Pool.status); the others are of the moment
POOL_COUNTERS = (
    "opened",
    "closed",
    "failed",
    "waited",
    "wait_seconds",
    "handovers",
    "settings_replayed",
    "reprepared",
    "evicted",
    "parked",
)


def pool_counts_since(
    now: Sequence[dict[str, Any]], before: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each pool's status ``now``, its counts less what they were at ``before`` (a pool that
    did not exist then keeps its own): what the runs did, without the capacity run's."""
    base = {(p["database"], p["user"]): p for p in before}
    out = []
    for pool in now:
        then = base.get((pool["database"], pool["user"]))
        if then is not None:
            pool = {**pool, **{k: round(pool[k] - then[k], 6) for k in POOL_COUNTERS}}
        out.append(pool)
    return out


_T = TypeVar("_T")


def run_order(policies: Sequence[_T], seed: int, rep: int) -> list[_T]:
    """The order of the runs in repetition ``rep``: a row of a Williams design (a Latin square
    balanced for the run before), over the policies in an order drawn once from ``seed``.
    Over a whole design — k repetitions of k policies for an even k, 2k for an odd k — each
    policy runs equally often in each position and right after each other policy equally
    often; and over the first k − 1 repetitions no policy runs after the same one twice, so
    that what one run leaves behind for the next (a heavy run's memory, a backlog's heat) does
    not fall on the same policy in every repetition of a short run. (A rotation of one order
    balanced the positions but kept each policy's predecessor for k repetitions: with five
    settings and three repetitions one policy ran right after no admission control in all
    three.)"""
    base = list(policies)
    random.Random(seed * 7919).shuffle(base)
    k = len(base)
    if k < 2:
        return base
    # the first row: 0, 1, k−1, 2, k−2, …; row i adds i to every label (mod k)
    first = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    if k % 2 == 0:
        shift, backwards = rep % k, False
    else:  # an odd k needs the mirror rows too; alternating keeps early predecessors distinct
        shift, backwards = (rep % (2 * k)) // 2, rep % 2 == 1
    row = [base[(label + shift) % k] for label in first]
    return row[::-1] if backwards else row


def measure_capacity(
    proxy: Any, conninfo: str, config: BenchConfig, dialect: Dialect, progress: Progress
) -> float:
    """Statements per second this server completes of the mix, now: a closed loop of
    min(32, max(8, 2 × the cores this process may run on)) clients, no think time, for
    ``capacity_seconds``, with no admission control (with ``pool_size``, FCFS over the pool),
    counted over its last 80 %. A closed loop keeps the server saturated, so its throughput is
    the rate an open load cannot exceed for long; each client draws from the mix, so
    completions follow the mix's shares."""
    # (at most 32: a CPU quota is not seen in the affinity, and more add nothing but memory)
    clients = min(32, max(8, 2 * len(os.sched_getaffinity(0))))
    policy = "none" if config.pool_size is None else f"fcfs@{config.pool_size}"
    proxy.call(functools.partial(_switch, proxy.gate, policy, _limits(config, policy)))
    seconds = config.capacity_seconds
    progress(
        f"measuring capacity: {clients} closed-loop clients, {policy}, {seconds:g} s "
        "(--load-basis measured)"
    )
    load = run_closed(
        conninfo,
        config.mix,
        clients=clients,
        duration=seconds,
        scale_factor=config.tpch,
        dialect=dialect,
        seed=config.seed * 1000 + 999,
    )
    start, end = load.started + 0.2 * seconds, load.started + seconds
    done = sum(1 for s in load.ok if start <= s.end <= end)
    connected = len({s.client for s in load.statements})
    if connected < clients:  # the others could not connect (max_connections, …)
        progress(f"capacity run: only {connected} of {clients} clients connected")
    if load.failed:
        states = ", ".join(sorted({s.sqlstate or "" for s in load.failed}))
        if len(load.failed) > 0.05 * len(load.statements):
            raise ValueError(
                f"the capacity run: {len(load.failed)} of {len(load.statements)} statements "
                f"failed ({states}); a rate measured on the rest would not be the mix's"
            )
        progress(f"capacity run: {len(load.failed)} statements failed ({states})")
    least = max(20, connected)  # at least one per client and 20 in all
    if done < least:
        raise ValueError(
            f"the capacity run completed {done} statements in its last {end - start:.3g} s "
            f"(at least {least} needed to measure a rate): give a longer --capacity-seconds, "
            "or --rate"
        )
    return done / (end - start)


def _work(config: BenchConfig, demands: dict[str, float]) -> float:
    """Σ_r p_r D_r: seconds of work per statement of the mix, by the model."""
    return sum(config.mix.weights[q] * demands[f"Q{q}"] for q in config.mix.queries)


def _rate(config: BenchConfig, demands: dict[str, float]) -> tuple[float, float]:
    """(λ, ρ): the one given, the other from ρ = λ · Σ_r p_r D_r."""
    work = _work(config, demands)
    if config.rate is not None:
        return config.rate, config.rate * work
    assert config.load is not None
    if not work > 0:
        raise ValueError(
            "the model gives the mix no demand (D_r = 0): give --rate instead of --load"
        )
    return config.load / work, config.load


def _arrivals(
    config: BenchConfig, rate: float | None, dialect: Dialect, rep: int
) -> list[Arrival] | None:
    """The repetition's arrivals (the same for every policy), or None for a closed run."""
    if not config.open:
        return None
    assert rate is not None
    rng = random.Random(config.seed * 1_000_033 + rep)
    if config.arrivals == "bursty":
        assert config.bursts is not None
        offsets = bursty(rate, config.duration, config.bursts, rng)
    else:
        offsets = poisson(rate, config.duration, rng)
    return tpch_arrivals(
        offsets,
        config.mix,
        scale_factor=config.tpch,
        dialect=dialect,
        seed=config.seed * 1000 + rep,
    )


def _traced(rows: Sequence[Any], model: EtaModel) -> tuple[list[Arrival], dict[str, float]]:
    """A trace's statements, each named by its class in the model (its fingerprint's start
    when the model does not know it), and each class's D_r; each SQL is classified once."""
    index = model.index()
    out, demands = [], {}
    for row in rows:
        fingerprint = classify_sql(row.sql).fingerprint
        i = index.get(fingerprint)
        name = model.classes[i].name if i is not None else f"class {fingerprint[:8]}"
        demands[name] = model.classes[i].D if i is not None else model.default_profile().D
        out.append(Arrival(row.offset, 0, name, row.sql))
    return out, demands


def _class_demand(model: EtaModel, sql: str) -> float:
    i = model.index().get(classify_sql(sql).fingerprint)
    return model.classes[i].D if i is not None else model.default_profile().D


PG_STATS_DELAY = 1.5  # s: PostgreSQL's backends report their statistics at most once a second


def _pg_temp_bytes(backend: str) -> int | None:
    """PostgreSQL: the temporary bytes its statements have written in the bench's database so
    far (None on the embedded DuckDB, or when the server does not say)."""
    if backend == "duckdb":
        return None
    try:
        with psycopg.connect(backend, autocommit=True) as conn:
            row = conn.execute(
                "select temp_bytes from pg_stat_database where datname = current_database()"
            ).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row and row[0] is not None else None


class _QueueSampler:
    """Samples the scheduler's queued and running statements every SAMPLE_EVERY seconds on
    the proxy's loop, from a thread of its own."""

    def __init__(self, proxy: Any, gate: Any) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self.mpls: list[tuple[float, int]] = []  # (t, MPL in force), 0 for none
        self.spill = 0  # the embedded DuckDB's temporary files at their largest (bytes)
        self._done = threading.Event()
        self._proxy, self._gate = proxy, gate
        # read on this thread, off the proxy's loop (a query of DuckDB's own)
        self._temp_bytes = getattr(getattr(proxy.server, "backend", None), "temp_bytes", None)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> tuple[int, int, int]:
        scheduler = self._gate.scheduler
        return scheduler.queued, scheduler.running, scheduler.limits.mpl or 0

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_EVERY):
            try:
                queued, running, mpl = self._proxy.call(self._read)
            except Exception:  # the proxy is closing
                return
            now = time.monotonic()
            self.samples.append((now, queued, running))
            self.mpls.append((now, mpl))
            if self._temp_bytes is not None:
                try:
                    self.spill = max(self.spill, self._temp_bytes())
                except Exception:  # the backend is closing
                    return

    def stop(self) -> list[tuple[float, int, int]]:
        self._done.set()
        self._thread.join()
        return self.samples


def apply_setting(gate: Any, config: BenchConfig, policy: str) -> None:
    """Put a running gate (on its event loop) on ``policy``'s policy and limits, as a run of
    ``run_bench`` starts (the memory budget of +mem not included)."""
    _switch(gate, policy, _limits(config, policy))


def open_arrivals(
    config: BenchConfig, model: EtaModel, rep: int = 0
) -> tuple[float, float, list[Arrival]]:
    """(λ, ρ, the arrivals) of an open ``config`` (poisson or bursty) as ``run_bench``'s
    repetition ``rep`` has them, ρ and λ by the model's D_r."""
    dialect: Dialect = "duckdb" if config.backend == "duckdb" else "postgres"
    rate, rho = _rate(config, _demands(model, config.mix, dialect, config.tpch))
    arrivals = _arrivals(config, rate, dialect, rep)
    if arrivals is None:
        raise ValueError("open arrivals need --arrivals poisson or bursty")
    return rate, rho, arrivals


def _switch(gate: Any, policy: str, limits: Limits) -> None:
    """The gate's settings for one run: "none" is FCFS without limits."""
    name, _ = parse_policy(policy)
    gate.set_policy("fcfs" if name == "none" else name)
    gate.set_limits(limits)


def _demands(model: EtaModel, mix: Mix, dialect: Dialect, sf: float) -> dict[str, float]:
    """D_r of each query of the mix ("Q6" → seconds), from the model (its default profile if
    untrained)."""
    out = {}
    for q in mix.queries:
        out[f"Q{q}"] = _class_demand(
            model, render_query(q, draw_parameters(q, random.Random(q), sf), dialect)
        )
    return out


def _slos(config: BenchConfig, demands: dict[str, float]) -> dict[str, float]:
    """Each class's SLO: given by name, else k·D_r (default k = 10)."""
    unknown = sorted(set(config.slo) - set(demands))
    if unknown:
        raise ValueError(f"--slo names classes not in the workload: {', '.join(unknown)}")
    k = config.slo_factor if config.slo_factor is not None else 10.0
    return {name: config.slo.get(name, k * d) for name, d in demands.items()}


def _open_summary(runs: list[Run], slo: dict[str, float], config: BenchConfig) -> OpenSummary:
    attainment, goodput = [], []
    per_class: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    recovery: list[float | None] = []
    for run in runs:
        start = run.load.started + config.warmup_seconds
        end = run.load.started + config.duration
        arrived = [s for s in run.load.statements if start <= s.start <= end]
        met = [
            s
            for s in arrived
            if s.sqlstate is None and s.response <= slo.get(s.label, float("inf"))
        ]
        attainment.append(len(met) / len(arrived) if arrived else float("nan"))
        goodput.append(sum(1 for s in met if s.end <= end) / max(end - start, 1e-9))
        for name in slo:
            mine = [s for s in arrived if s.label == name]
            if mine:
                ok = sum(1 for s in mine if s.sqlstate is None and s.response <= slo[name])
                per_class.setdefault(name, []).append(ok / len(mine))
        for s in run.load.failed:
            errors[s.sqlstate or "?"] = errors.get(s.sqlstate or "?", 0) + 1
        if config.arrivals == "bursty" and config.bursts is not None:
            recovery.extend(
                burst_recovery(run.timeline, config.bursts, config.duration, config.warmup_seconds)
            )
    return OpenSummary(
        slo_attainment=Estimate.of(attainment),
        goodput=Estimate.of(goodput),
        per_class_attainment={k: Estimate.of(v) for k, v in per_class.items()},
        errors_by_sqlstate=errors,
        late=sum(r.load.late for r in runs),
        unsent=sum(r.load.unsent for r in runs),
        connections=max((r.load.connections for r in runs), default=0),
        recovery=recovery,
    )


def burst_recovery(
    timeline: Sequence[tuple[float, int, int]], bursts: Bursts, duration: float, warmup: float
) -> list[float | None]:
    """For each burst that ends inside the run, the seconds from its end until the queue is
    back to its steady level — the 95th percentile of the queue between the warm-up and the
    first burst — or None when it is not back before the next burst or the end of the run."""
    windows = bursts.windows(duration)
    if not windows:
        return []
    before = [q for t, q, _ in timeline if warmup <= t < windows[0][0]]
    if not before:
        return [None for _ in windows]
    level = float(np.percentile(before, 95))
    out: list[float | None] = []
    for i, (_, stop) in enumerate(windows):
        limit = windows[i + 1][0] if i + 1 < len(windows) else duration
        back = next((t - stop for t, q, _ in timeline if stop <= t < limit and q <= level), None)
        out.append(back)
    return out


@dataclass(frozen=True)
class _Window:
    """One run's measurement window, from the end of the warm-up to the nominal end."""

    responses: list[tuple[str, float]]  # (class, response) of statements started inside
    completions: dict[str, int]  # statements of each class that completed inside
    length: float


def _window(run: Run, config: BenchConfig) -> _Window:
    """Throughput counts completions inside the window; response times come from the
    statements that *started* inside it. The run drains (every statement started finishes),
    so a statement a policy keeps waiting past the window's end still counts with its full
    response time — counting completions only would leave out exactly the starved ones."""
    start = run.load.started + config.warmup_seconds
    end = run.load.started + config.duration
    responses = [(s.label, s.response) for s in run.load.ok if start <= s.start <= end]
    completions: dict[str, int] = {}
    for s in run.load.ok:
        if start <= s.end <= end:
            completions[s.label] = completions.get(s.label, 0) + 1
    return _Window(responses, completions, max(end - start, 1e-9))


def _summary(
    policy: str, runs: list[Run], demands: dict[str, float], config: BenchConfig
) -> PolicySummary:
    throughput, mean, p50, p95, p99, slowdown = [], [], [], [], [], []
    per_class: dict[str, dict[str, list[float]]] = {}
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
        by_q: dict[str, list[float]] = {}
        for q, r in w.responses:
            by_q.setdefault(q, []).append(r)
        slowdown.append(
            sum(
                len(rs) / len(w.responses) * statistics.fmean(rs) / demands[q]
                for q, rs in by_q.items()
            )
        )
        for q in demands:
            rs = by_q.get(q, [])
            c = per_class.setdefault(q, {"throughput": [], "mean_response": [], "slowdown": []})
            c["throughput"].append(w.completions.get(q, 0) / w.length)
            c["mean_response"].append(statistics.fmean(rs) if rs else float("nan"))
            c["slowdown"].append(statistics.fmean(rs) / demands[q] if rs else float("nan"))
        if not config.open and config.think == 0 and w.responses:  # closed, no think: N = X·R
            gaps.append(abs(config.clients - x * float(np.mean(times))) / config.clients)
    return PolicySummary(
        policy=policy,
        throughput=Estimate.of(throughput),
        mean_response=Estimate.of(mean),
        p50_response=Estimate.of(p50),
        p95_response=Estimate.of(p95),
        p99_response=Estimate.of(p99),
        weighted_slowdown=Estimate.of(slowdown),
        per_class={q: {k: Estimate.of(v) for k, v in m.items()} for q, m in per_class.items()},
        littles_law_gap=max(gaps) if gaps else float("nan"),
        aged=sum(r.aged for r in runs),
        timed_out=sum(r.timed_out for r in runs),
        released=sum(r.released for r in runs),
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


def _repetition(run: Run, config: BenchConfig) -> dict[str, Any]:
    """One run's own numbers, for the JSON (paired comparisons, drift between repetitions)."""
    w = _window(run, config)
    times = [r for _, r in w.responses]
    out: dict[str, Any] = {
        "repetition": run.repetition,
        "throughput": sum(w.completions.values()) / w.length,
        "mean_response": statistics.fmean(times) if times else float("nan"),
        "p99_response": float(np.percentile(times, 99)) if times else float("nan"),
        "errors": len(run.load.failed),
        "spill_bytes": run.spill,
    }
    if run.mpls:  # a tuned run: where its MPL went
        out["mpl_path"] = _mpl_path(run.mpls)
        out["mpl_mean"] = mean_mpl(run.mpls, config.warmup_seconds)
    return out


def _mpl_path(mpls: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """(seconds into the run, MPL) at the start and at every change."""
    path: list[tuple[float, int]] = []
    for t, m in mpls:
        if not path or path[-1][1] != m:
            path.append((round(t, 1), m))
    return path


def mean_mpl(mpls: Sequence[tuple[float, int]], since: float = 0.0) -> float:
    """The MPL a tuned run held on average (over equally spaced samples) after ``since``."""
    held = [m for t, m in mpls if t >= since]
    return statistics.fmean(held) if held else float("nan")


def repetition_means(result: BenchResult, policy: str) -> list[float]:
    """``policy``'s own mean response time in each repetition (what ``paired_changes``
    compares): a change carried by one repetition shows which side moved."""
    return [_repetition_mean(result, policy, rep) for rep in range(result.config.repetitions)]


def _repetition_mean(result: BenchResult, policy: str, rep: int) -> float:
    """Mean response time of one run, over its window (as ``_summary`` counts it)."""
    (run,) = [r for r in result.runs if r.policy == policy and r.repetition == rep]
    w = _window(run, result.config)
    return statistics.fmean(r for _, r in w.responses) if w.responses else float("nan")


def paired_changes(result: BenchResult, policy: str, baseline: str) -> list[float]:
    """Per repetition, how much lower ``policy``'s mean response time is than ``baseline``'s
    (1 − R/R_base): the two ran on the same arrivals, interleaved."""
    return [
        1 - _repetition_mean(result, policy, rep) / _repetition_mean(result, baseline, rep)
        for rep in range(result.config.repetitions)
    ]


def paired_change(result: BenchResult, policy: str, baseline: str) -> Estimate:
    """``paired_changes`` as one change with its 95 % interval — far tighter than comparing
    the two policies' own intervals: 1 − the geometric mean of the repetitions' ratios
    R/R_base, the interval of the mean log ratio carried over (its wider side, so the ± never
    claims more than the log interval does). Not the plain mean of 1 − R/R_base: where
    repetitions of one setting differ 2×, that mean is biased against whichever policy is on
    top of the ratio (two identical settings at ×2 and ×½ would read 25 % worse, both ways
    round); the log ratio is symmetric, and its mean is 0 for two runs of one setting."""
    changes = paired_changes(result, policy, baseline)
    ratios = [1.0 - c for c in changes]
    if not ratios or not all(r > 0 and math.isfinite(r) for r in ratios):
        return Estimate.of(changes) if changes else Estimate(math.nan, None)
    logs = Estimate.of([math.log(r) for r in ratios])
    center = math.exp(logs.mean)
    if logs.ci is None:
        return Estimate(1.0 - center, None)
    return Estimate(1.0 - center, center * math.expm1(logs.ci))


def aa_line(result: BenchResult, again: str) -> str:
    """How far a control run differs from the run of the same setting (``+again``)."""
    first = original(again)
    d = paired_change(result, again, first)  # 1 − R_again/R_first, per repetition
    size = f"{-d.mean:+.1%}" + (f" ± {d.ci:.1%}" if d.ci is not None else "")
    per = ", ".join(f"{-x:+.1%}" for x in paired_changes(result, again, first))
    return (
        f"A/A control: {first} run twice differed by {size} in mean R (the second against "
        f"the first, paired; per repetition {per}) — differences between settings of this "
        "size are the machine's, not the settings'."
    )


def verdict(result: BenchResult) -> list[str]:
    """What the table shows, in words: the best baseline (no admission control, or an FCFS
    pool at its best size), then how much lower the recommended policy's and the best thesis
    policy's mean response times are than it, paired by repetition with 95 % intervals, with
    their p99 and throughput against it. In a closed loop with no think time the mean cannot
    move (N = X·R), and the verdict says so."""
    s = result.summaries
    baselines = [p for p in s if baseline(p)]
    if not baselines:
        return []
    lines = []
    failing = [p for p in s if result.errors.get(p)]
    if failing:  # a statement that failed has no response time: its policy looks faster
        lines.append(
            "Failed statements (not in R): "
            + ", ".join(f"{p} {result.errors[p]}" for p in failing)
            + "."
        )
        sound = [p for p in baselines if not result.errors.get(p)]
        baselines = sound or baselines
    best = min(baselines, key=lambda p: s[p].mean_response.mean)
    lines.append(
        f"Best baseline: {best} (mean R {s[best].mean_response} s, p99 "
        f"{s[best].p99_response} s, {s[best].throughput}/s"
        + (", the best without failed statements" if failing and best not in failing else "")
        + ")."
    )
    closed_no_think = not result.config.open and result.config.think == 0
    thesis = [p for p in s if parse_policy(p)[0] in THESIS and not control(p)]
    candidates = [p for p in s if parse_policy(p)[0] == RECOMMENDED and not control(p)]
    if thesis:
        candidates.append(min(thesis, key=lambda p: s[p].mean_response.mean))
    candidates += [p for p in s if budgeted(p) and not control(p) and p not in candidates]
    for p in candidates:
        cut = paired_change(result, p, best)
        x = s[p].throughput.mean / s[best].throughput.mean - 1
        tail = s[p].p99_response.mean / s[best].p99_response.mean
        who = (
            "memory grants"
            if grants(p)
            else "memory-aware"
            if memory_aware(p)
            else "recommended"
            if parse_policy(p)[0] == RECOMMENDED
            else "best thesis policy"
        )
        sure = cut.ci is not None and abs(cut.mean) > cut.ci
        size = f"{abs(cut.mean):.0%}" + (f" ± {cut.ci:.0%}" if cut.ci is not None else "")
        lines.append(
            f"{p} ({who}): mean R {size} {'lower' if cut.mean >= 0 else 'higher'} than {best} "
            f"({'significant' if sure else 'not significant'} at 95 %, paired over "
            f"{result.config.repetitions} repetitions of the same arrivals), p99 ×{tail:.2f}, "
            f"throughput {x:+.1%}."
        )
    for p in s:
        if control(p) and original(p) in s:
            lines.append(aa_line(result, p))
    if closed_no_think:
        lines.append(
            "Closed loop without think time: clients wait for each answer, so the load adapts "
            "to the server and no admission policy can lower the mean response time (N = X·R); "
            "only the tail and the share between classes move. Open arrivals show what "
            "admission control is for."
        )
    return lines
