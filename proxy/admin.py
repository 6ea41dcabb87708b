"""The admin API: look at the admission system and steer it while it runs (FastAPI).

- ``GET /status`` — policy, limits, statements in service, capacity in use, the queue by class
- ``GET /classes`` — per class: fingerprint, sample SQL, counts, mean queue wait and response
  time, and the model's profile (D_r with its 95 % interval and isolation runs, f_r with the
  runs per fork size, whether D_r converged)
- ``GET /eta?policy=`` — the η matrix a policy uses now
- ``PUT /policy`` ``{"policy": "sept"}``, ``PUT /limits`` ``{"mpl": 8, …}`` — change at run time
- ``POST /model/reload`` — read the model file again (a broken file leaves the old model)
- ``POST /model/reset[?class=NAME]`` — forget what was learned live, of one class or of all
- ``GET /metrics`` — Prometheus: queue-wait and response-time histograms per class, counters of
  admitted, completed, cancelled and timed-out statements, capacity in use
- ``GET /recent`` — the last 500 completed statements: class, queue wait, response time
- ``GET /dashboard`` — a page of the above: capacity, queue by class, the η heat map and recent
  response times, refreshed every second (with a token: ``/dashboard#token=…``)

The app runs on the proxy's own event loop and every handler is ``async`` (FastAPI would run a
plain function in a worker thread), so handlers touch the scheduler without locks.
It listens on loopback by default; bound to any other address it requires a bearer token.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from pydantic import BaseModel, Field

from admission.model import ClassProfile, EtaModel, ModelError
from admission.online import forget_learned
from admission.policies import POLICIES
from admission.policies.base import priority_orders
from admission.scheduler import Job, JobState, Limits, Scheduler
from admission.workloads import WorkloadConfig, WorkloadError
from proxy.autompl import AutoMpl
from proxy.gate import AdmissionGate
from proxy.learning import LiveModel

__all__ = ["AdminMetrics", "create_app"]

_DASHBOARD = Path(__file__).with_name("static") / "dashboard.html"
# enum member access is a descriptor call
_DONE, _CANCELLED, _SHED = JobState.DONE, JobState.CANCELLED, JobState.SHED
_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FIRST = _BUCKETS[0]


class _Tally:
    """One class's counts and latency histograms as the admin API shows them (built from a
    ``_Counts`` when asked, plus the statements still queued or in service)."""

    __slots__ = (
        "admitted",
        "bypassed",
        "cancelled",
        "completed",
        "response_buckets",
        "response_sum",
        "shed",
        "submitted",
        "timed_out",
        "wait_buckets",
        "wait_sum",
    )

    def __init__(self) -> None:
        self.submitted = self.admitted = self.bypassed = self.completed = 0
        self.cancelled = self.timed_out = self.shed = 0
        self.wait_sum = self.response_sum = 0.0
        self.wait_buckets = [0] * (len(_BUCKETS) + 1)  # the last one is +Inf
        self.response_buckets = [0] * (len(_BUCKETS) + 1)

    def counts(self) -> dict[str, int]:
        return {
            "submitted": self.submitted,
            "admitted": self.admitted + self.bypassed,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "timed_out": self.timed_out,
            "shed": self.shed,
        }


class _Counts:
    """One class's statements that left, as ``on_finish`` counts them: only what cannot be
    derived. Completed = admitted + bypassed (every statement done was one or the other);
    the first bucket of each histogram = completed − the buckets above it (most statements
    fall there, so they cost no increment)."""

    __slots__ = (
        "admitted",
        "bypassed",
        "cancelled",
        "response_over",
        "response_sum",
        "shed",
        "timed_out",
        "wait_over",
        "wait_sum",
    )

    def __init__(self) -> None:
        self.admitted = self.bypassed = self.cancelled = self.timed_out = self.shed = 0
        self.wait_sum = self.response_sum = 0.0
        self.wait_over = [0] * (len(_BUCKETS) + 1)  # [0] unused; the last one is +Inf
        self.response_over = [0] * (len(_BUCKETS) + 1)

    def tally(self) -> _Tally:
        out = _Tally()
        out.admitted, out.bypassed = self.admitted, self.bypassed
        out.cancelled, out.timed_out, out.shed = self.cancelled, self.timed_out, self.shed
        out.completed = completed = self.admitted + self.bypassed
        out.submitted = completed + self.cancelled + self.timed_out + self.shed
        out.wait_sum, out.response_sum = self.wait_sum, self.response_sum
        for over, buckets in (
            (self.wait_over, out.wait_buckets),
            (self.response_over, out.response_buckets),
        ):
            buckets[1:] = over[1:]
            buckets[0] = completed - sum(over[1:])
        return out


class AdminMetrics:
    """Counts and latencies per class, from the scheduler's ``on_finish`` hook: one call per
    statement when it leaves (done, cancelled or timed out), a few additions each. Queue wait
    and response time are observed then; statements queued or in service are counted from the
    scheduler when asked. The Prometheus families are built when ``/metrics`` is scraped."""

    def __init__(self, scheduler: Scheduler | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(self)  # collect() below
        self.scheduler = scheduler
        if scheduler is not None:
            scheduler.observe(finishes=self.on_finish)
        self.per_class: dict[str, _Counts] = {}  # the statements that left, by class name
        # the lease keeper when the MPL is a global budget (proxy.coordinator), set by build
        self.coordinator: Any = None
        # the relay's server connection pools in transaction pool mode (proxy.pool), likewise
        self.pools: Any = None
        # the embedded DuckDB's connections shared by its sessions (its ``Cursors``), likewise
        self.cursors: Any = None
        # the limit on writing transactions (proxy.contention), likewise
        self.contention: Any = None
        self.recent: deque[tuple[float, str, float, float]] = deque(maxlen=500)

    def on_finish(self, job: Job, now: float) -> None:
        name = job.klass.name
        counts = self.per_class.get(name)
        if counts is None:
            counts = self.per_class[name] = _Counts()
        state = job.state
        if state is _DONE:
            arrival = job.arrival
            wait = job.admitted_at - arrival  # type: ignore[operator]  # (done: admitted)
            response = now - arrival
            if job.bypass:
                counts.bypassed += 1
            else:
                counts.admitted += 1
            if wait:  # (0 when admitted on arrival, as most statements of a calm system are)
                counts.wait_sum += wait
                if wait > _FIRST:
                    counts.wait_over[bisect_left(_BUCKETS, wait)] += 1
            counts.response_sum += response
            if response > _FIRST:
                counts.response_over[bisect_left(_BUCKETS, response)] += 1
            self.recent.append((now, name, wait, response))
        elif state is _CANCELLED:
            counts.cancelled += 1
        elif state is _SHED:
            counts.shed += 1
        else:
            counts.timed_out += 1

    def tallies(self) -> dict[str, _Tally]:
        """Per class: the statements that left, plus those still queued or in service."""
        out: dict[str, _Tally] = {}
        for name, done in self.per_class.items():
            out[name] = done.tally()
        live = self.scheduler.live_jobs() if self.scheduler is not None else []
        for job in live:
            tally = out.get(job.klass.name) or out.setdefault(job.klass.name, _Tally())
            tally.submitted += 1
            if job.state is JobState.RUNNING:
                if job.bypass:
                    tally.bypassed += 1
                else:
                    tally.admitted += 1
        return out

    def collect(self) -> Iterator[Metric]:
        """The Prometheus view (prometheus_client calls this on every scrape)."""
        label = ["query_class"]
        tallies = self.tallies()
        histograms = (
            ("admission_queue_wait_seconds", "Time statements waited for admission", "wait"),
            (
                "admission_response_seconds",
                "Time from arrival at the proxy to completion",
                "response",
            ),
        )
        for name, doc, field in histograms:
            family = HistogramMetricFamily(name, doc, labels=label)
            for cls, tally in tallies.items():
                counts = getattr(tally, f"{field}_buckets")
                cumulative = list(accumulate(counts))
                buckets = [
                    (_bound(b), float(n)) for b, n in zip(_BUCKETS, cumulative, strict=False)
                ]
                buckets.append(("+Inf", float(cumulative[-1])))
                family.add_metric([cls], buckets, getattr(tally, f"{field}_sum"))
            yield family
        for kind in ("admitted", "bypassed", "completed", "cancelled", "timed_out", "shed"):
            counter = CounterMetricFamily(f"admission_{kind}", f"Statements {kind}", labels=label)
            for cls, tally in tallies.items():
                counter.add_metric([cls], float(getattr(tally, kind)))
            yield counter
        s = self.scheduler
        gauges = (
            ("admission_in_service", "Statements in service", s.in_service if s else 0),
            ("admission_threads_in_use", "Thread budget in use", s.threads_in_use if s else 0),
            (
                "admission_memory_in_use_bytes",
                "Memory budget in use: the M_r of the statements in service",
                s.memory_in_use if s else 0,
            ),
            (
                "admission_memory_budget_bytes",
                "Memory budget (0: none)",
                (s.limits.memory or 0) if s else 0,
            ),
            ("admission_queued", "Statements waiting", s.queued if s else 0),
            (
                "admission_released_in_service",
                "Statements in service beside the MPL (release_after, short_lane)",
                s.released_in_service if s else 0,
            ),
            (
                "admission_mpl",
                "Multiprogramming limit in force (0: unlimited)",
                (s.limits.mpl or 0) if s else 0,
            ),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=float(value))
        if s is not None and s.workloads is not None:
            yield from _tenant_metrics(s)
        if self.pools is not None:
            yield from _pool_metrics(self.pools)
        if self.cursors is not None:
            yield from _duckdb_connection_metrics(self.cursors.status())
        if self.contention is not None:
            yield from _contention_metrics(self.contention.status())
        c = self.coordinator
        if c is not None:
            shared = (
                ("admission_global_mpl", "The global MPL all proxies share", c.budget),
                ("admission_global_held", "Units of the global MPL this proxy holds", c.held),
                (
                    "admission_global_fair_share",
                    "This proxy's fair share of the global MPL at its last heartbeat",
                    c.target or 0,
                ),
                ("admission_global_proxies", "Proxies sharing the global MPL", c.proxies),
                (
                    "admission_coordinator_up",
                    "1 while the coordinator answers heartbeats, 0 when cut off",
                    1 if c.state == "ok" else 0,
                ),
            )
            for name, doc, value in shared:
                yield GaugeMetricFamily(name, doc, value=float(value))


def _contention_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    """The limit on writing transactions (proxy.contention)."""
    yield GaugeMetricFamily(
        "admission_contention_limit",
        "Writing transactions allowed in progress at once (0: no limit)",
        value=float(status["limit"] or 0),
    )
    yield GaugeMetricFamily(
        "admission_contention_holders",
        "Writing transactions in progress",
        value=float(status["holders"]),
    )
    yield GaugeMetricFamily(
        "admission_contention_waiting",
        "Transactions waiting for a place under the limit",
        value=float(status["waiting"]),
    )
    counters = (
        ("admission_contention_aborts", "Writing transactions ended by a conflict", "aborts"),
        ("admission_contention_commits", "Writing transactions ended otherwise", "commits"),
        ("admission_contention_waited", "Transactions that waited for a place", "waited"),
        (
            "admission_contention_timed_out",
            "Waits for a place refused at the queue timeout",
            "timed_out",
        ),
    )
    for name, doc, key in counters:
        yield CounterMetricFamily(name, doc, value=float(status[key]))


def _pool_metrics(pools: Any) -> Iterator[Metric]:
    """Transaction pooling, per (database, user): named like PgBouncer's SHOW POOLS/STATS."""
    label = ["database", "user"]
    rows = pools.status()
    gauges = (
        ("admission_pool_server_active", "Server connections held by a client", "sv_active"),
        ("admission_pool_server_idle", "Server connections idle in the pool", "sv_idle"),
        ("admission_pool_server_login", "Server connections being opened", "sv_login"),
        (
            "admission_pool_clients_waiting",
            "Clients admitted that wait for a server connection being opened",
            "cl_waiting",
        ),
        ("admission_pool_size", "Server connections per pool, at most", "pool_size"),
    )
    for name, doc, key in gauges:
        family = GaugeMetricFamily(name, doc, labels=label)
        for row in rows:
            family.add_metric([row["database"], row["user"]], float(row[key]))
        yield family
    counters = (
        ("admission_pool_handovers", "Server connections given to a client", "handovers"),
        ("admission_pool_opened", "Server connections opened", "opened"),
        ("admission_pool_closed", "Server connections closed by the pool", "closed"),
        ("admission_pool_failed", "Server connections that could not be opened", "failed"),
        (
            "admission_pool_waited",
            "Clients admitted that found every server connection held",
            "waited",
        ),
        (
            "admission_pool_wait_seconds",
            "Seconds admitted clients waited for a server connection",
            "wait_seconds",
        ),
        (
            "admission_pool_parked",
            "Hand-overs of a server connection held back until a cancel sent for it went through",
            "parked",
        ),
    )
    for name, doc, key in counters:
        cfamily = CounterMetricFamily(name, doc, labels=label)
        for row in rows:
            cfamily.add_metric([row["database"], row["user"]], float(row[key]))
        yield cfamily


def _duckdb_connection_metrics(status: dict[str, int]) -> Iterator[Metric]:
    """The embedded DuckDB's connections, lent to sessions and idle (``Cursors``)."""
    yield GaugeMetricFamily(
        "admission_duckdb_connections_lent", "DuckDB connections lent to sessions", status["lent"]
    )
    yield GaugeMetricFamily(
        "admission_duckdb_connections_idle", "DuckDB connections idle, kept", status["idle"]
    )
    for key, doc in (
        ("opened", "DuckDB connections opened for sessions"),
        ("reused", "Times an idle DuckDB connection was lent again"),
        ("closed", "DuckDB connections closed (beyond those kept idle, or a session's own)"),
    ):
        yield CounterMetricFamily(f"admission_duckdb_connections_{key}", doc, status[key])


def _tenant_metrics(s: Scheduler) -> Iterator[Metric]:
    rows = s.tenant_stats()
    label = ["tenant", "priority"]
    families = (
        (GaugeMetricFamily, "admission_tenant_weight", "A tenant's weight", "weight"),
        (GaugeMetricFamily, "admission_tenant_queued", "A tenant's statements waiting", "queued"),
        (
            GaugeMetricFamily,
            "admission_tenant_in_service",
            "A tenant's statements in service",
            "running",
        ),
        (
            CounterMetricFamily,
            "admission_tenant_service_seconds",
            "Statement-seconds in service of a tenant's completed statements",
            "service_seconds",
        ),
        (
            CounterMetricFamily,
            "admission_tenant_wait_seconds",
            "Seconds a tenant's admitted statements waited, in total",
            "wait_seconds",
        ),
        (
            CounterMetricFamily,
            "admission_tenant_admitted",
            "A tenant's statements admitted",
            "admitted",
        ),
    )
    for kind, name, doc, key in families:
        family = kind(name, doc, labels=label)
        for r in rows:
            family.add_metric([r["tenant"], r["priority"]], float(r[key]))
        yield family


def _bound(bucket: float) -> str:
    return str(float(bucket))


class PolicyChange(BaseModel):
    policy: str


class LimitsChange(BaseModel):
    """Fields left out keep their value; 0 for mpl or threads means unlimited; "auto" for mpl
    tunes it (a proxy started with ``--mpl auto``), a number stops the tuning."""

    mpl: Annotated[int, Field(ge=0)] | Literal["auto"] | None = None
    threads: int | None = Field(default=None, ge=0)
    memory: int | None = Field(default=None, ge=0)  # bytes; 0: no memory budget
    backfill: bool | None = None
    max_wait: float | None = Field(default=None, ge=0)
    queue_timeout: float | None = Field(default=None, ge=0)
    due_factor: float | None = Field(default=None, ge=0)  # 0: the latency policy never ages
    lifo_after: float | None = Field(default=None, ge=0)  # 0 or null: never newest-first
    release_after: float | None = Field(default=None, ge=0)  # 0 or null: slots never given back
    # 0: no short lane; null: the policy's own (the latency policy's); left out: unchanged
    short_lane: float | None = Field(default=None, ge=0)


def create_app(
    gate: AdmissionGate,
    metrics: AdminMetrics,
    *,
    model_path: Path | None = None,
    token: str | None = None,
    learning: LiveModel | None = None,
    auto_mpl: AutoMpl | None = None,
    workloads_path: Path | None = None,
) -> FastAPI:
    app = FastAPI(title="admission", version="1", summary="Admission control for the proxy")
    guard = [Depends(_authorizer(token))]
    tuners = _Tuners(learning, auto_mpl)
    _add_views(app, gate, metrics, guard, tuners)
    _add_controls(app, gate, guard, model_path, tuners)
    _add_workloads(app, gate, guard, workloads_path)

    @app.get("/metrics", dependencies=guard)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _authorizer(token: str | None) -> Callable[[Request], None]:
    """The check every route but the dashboard page depends on: the bearer token, if any."""

    def authorize(request: Request) -> None:
        if token is None:
            return
        supplied = request.headers.get("authorization", "")
        if not secrets.compare_digest(supplied, f"Bearer {token}"):
            raise HTTPException(401, "a bearer token is required", {"WWW-Authenticate": "Bearer"})

    return authorize


def _limits_json(limits: Limits) -> dict[str, Any]:
    return {
        "mpl": limits.mpl,
        "threads": limits.threads,
        "memory": limits.memory,
        "backfill": limits.backfill,
        "max_wait": limits.max_wait,
        "queue_timeout": limits.queue_timeout,
        "due_factor": limits.due_factor,
        "lifo_after": limits.lifo_after,
        "release_after": limits.release_after,
        "short_lane": limits.short_lane,
    }


@dataclass(frozen=True)
class _Tuners:
    """What keeps the running proxy tuned, when it was started so: the live model
    (``proxy.learning``) and the adaptive MPL (``proxy.autompl``)."""

    learning: LiveModel | None = None
    auto_mpl: AutoMpl | None = None


def _auto_mpl_json(auto: AutoMpl | None) -> dict[str, Any] | None:
    if auto is None:
        return None
    controller = auto.controller
    return {
        "enabled": auto.enabled,
        "mpl": controller.mpl,
        "changes": controller.changes,
        "reason": controller.reason,
        "bounds": [controller.low, controller.high],
        "demand_work_per_second": controller.demand,
        # a closed loop's demand is what its MPL completes; an open stream's arrives anyway
        "arrivals": "closed loop" if controller.loop else "open",
        "throughput_by_mpl": [
            {
                "mpl": e.mpl,
                "work_per_second": e.mean,
                "stderr": None if math.isnan(e.stderr) else e.stderr,
                "samples": e.samples,
                "age_seconds": e.age,
                "saturated_share": e.saturated,
                # the database's cores' busy share while saturated there (None: not measured)
                "cpu_busy_share": None if math.isnan(e.cpu) else e.cpu,
            }
            for e in controller.estimates()
        ],
    }


def _status(gate: AdmissionGate, tuners: _Tuners = _Tuners()) -> dict[str, Any]:
    """``GET /status``, also the answer to a change of policy or limits."""
    scheduler = gate.scheduler
    learning = tuners.learning
    return {
        "policy": scheduler.policy.name,
        "limits": _limits_json(scheduler.limits),
        "in_service": scheduler.in_service,
        "threads_in_use": scheduler.threads_in_use,
        "memory_in_use": scheduler.memory_in_use,
        # in front of PostgreSQL: the work memory shared by the statements admitted, each its
        # share as its work_mem (serve --grant-work-mem; None: none)
        "work_mem_grant": gate.work_mem_grant,
        "queued": scheduler.queued,
        "queue_by_class": scheduler.queue_by_class(),
        "classes": len(scheduler.fingerprints),
        "classes_over_cap": scheduler.stats.over_cap,
        "refused_queue_full": gate.stats.queue_full,
        "shed": gate.stats.shed,
        "overloaded": scheduler.overloaded(gate.now),
        "timed_out": gate.stats.timed_out,
        "cancelled": gate.stats.cancelled,
        "aged": scheduler.stats.aged,
        # statements in service beside the MPL (release_after, short_lane) now; and since the
        # start, those that gave their MPL slot to the queue and those the short lane admitted
        "released_in_service": scheduler.released_in_service,
        "released": scheduler.stats.released,
        "short_lane_admitted": scheduler.stats.short,
        # and those beside it as one of their class's rare long runs (past its tail)
        "long_runs_beside": scheduler.stats.long,
        "short_lane_in_force": scheduler.short_lane,  # (the limits', else the policy's; null: none)
        "learning": None
        if learning is None
        else {
            "enabled": learning.enabled,
            "models_swapped_in": learning.updates,
            "classes_learned_live": sum(1 for c in scheduler.model.classes if c.live),
            "classes_profiled_live": sum(1 for c in scheduler.model.classes if c.profiled),
            "profile": learning.profile_status() if learning.profile_status else None,
        },
        "mpl_auto": _auto_mpl_json(tuners.auto_mpl),
        # several proxies, one budget: global MPL, what this proxy holds, the coordinator's
        # state (None: the MPL is this proxy's alone)
        "coordinator": None if gate.coordinator is None else gate.coordinator.status(),
        # transaction pooling: per (database, user) its server connections (None: session
        # mode, each client its own)
        "pools": None if gate.pools is None else gate.pools.status(),
        # the embedded DuckDB: its connections lent to sessions now, idle, opened, reused and
        # closed (None: in front of PostgreSQL)
        "duckdb_connections": None if gate.cursors is None else gate.cursors.status(),
        # writing transactions in progress and their limit, lowered while they abort on one
        # another (serve --contention; None: off)
        "contention": None if gate.contention is None else gate.contention.status(),
        # workload classes: per tenant its weight, share of service, queue and waits (None:
        # the proxy serves one tenant)
        "tenants": _tenants_json(scheduler),
    }


def _tenants_json(scheduler: Scheduler) -> dict[str, Any] | None:
    """Per tenant: weight and its share of the weights of tenants seen, the share of service
    (statement-seconds completed) received, statements queued and in service, mean wait."""
    if scheduler.workloads is None:
        return None
    rows = scheduler.tenant_stats()
    weights = sum(r["weight"] for r in rows) or 1.0
    service = sum(r["service_seconds"] for r in rows) or 1.0
    for r in rows:
        r["weight_share"] = r["weight"] / weights
        r["service_share"] = r["service_seconds"] / service
        r["mean_wait"] = r["wait_seconds"] / r["admitted"] if r["admitted"] else 0.0
    idle = scheduler.idle
    return {
        "tenants": rows,
        "background": None
        if idle is None
        else {
            "pressure": scheduler.pressure,
            "pressure_bound": scheduler.workloads.pressure_bound,
            "conservative": idle.conservative,
            "idle_wait": idle.idle_wait,
            "long_busy_period": idle.threshold,
            "cluster_window": idle.cws,
        },
        "held_for": scheduler.held_for,
    }


def _add_workloads(app: FastAPI, gate: AdmissionGate, guard: list[Any], path: Path | None) -> None:
    """The workload classes: what they are and how each is served; reload from the file."""

    @app.get("/workloads", dependencies=guard)
    async def workloads() -> dict[str, Any]:
        config = gate.scheduler.workloads
        return {
            "file": None if path is None else str(path),
            "workloads": None if config is None else config.describe(),
            "status": _tenants_json(gate.scheduler),
        }

    @app.post("/workloads/reload", dependencies=guard)
    async def reload_workloads() -> dict[str, Any]:
        if path is None:
            raise HTTPException(
                409, "the proxy was started without --workload-classes; nothing to reload"
            )
        try:
            config = WorkloadConfig.load(path)
        except WorkloadError as e:
            raise HTTPException(422, f"the workload classes were not reloaded: {e}") from None
        gate.set_workloads(config)
        return {"reloaded": str(path), "workloads": config.describe()}


def _class_view(
    profile: ClassProfile, tally: _Tally, learned_at: float | None = None
) -> dict[str, Any]:
    """One class in ``GET /classes``: its counts and mean times, and the model's profile."""
    done = tally.completed
    admitted = tally.admitted + tally.bypassed
    return {
        "fingerprint": profile.fingerprint,
        "name": profile.name,
        "sample_sql": profile.sample_sql,
        "counts": tally.counts(),
        "mean_queue_wait": tally.wait_sum / admitted if admitted else None,
        "mean_response": tally.response_sum / done if done else None,
        "profile": {
            "D": profile.D,
            "f": profile.f,
            "U": profile.U,
            "Q": profile.Q,
            "A": profile.A,
            "count": profile.count,
            "D_low": profile.D_low,
            "D_high": profile.D_high,
            "D_runs": profile.D_runs,
            # what 9 in 10 of its statements take (live; the short lane's "past its tail")
            "D_tail": profile.D_tail,
            "Q_low": profile.Q_low,
            "Q_high": profile.Q_high,
            "U_low": profile.U_low,
            "U_high": profile.U_high,
            "f_runs": {str(size): runs for size, runs in profile.f_runs.items()},
            "converged": profile.converged,
            "live": profile.live,
            "D_trained": profile.D_trained,
            "cost": profile.cost,
            "profiled": profile.profiled,
            "M": profile.M,  # bytes a statement takes at its peak (None: not measured)
            "spill": profile.spill,
            # PostgreSQL: how many times over work_mem its plan may take (None: not counted)
            "work_mem_units": profile.work_mem_units,
            # when the live model last moved D_r (ISO 8601, UTC), if it did since the start
            "learned_at": None
            if learned_at is None
            else datetime.fromtimestamp(learned_at, UTC).isoformat(timespec="seconds"),
        },
    }


def _add_views(
    app: FastAPI,
    gate: AdmissionGate,
    metrics: AdminMetrics,
    guard: list[Any],
    tuners: _Tuners,
) -> None:
    """The routes that only read: status, classes, recent statements, the dashboard, η."""
    scheduler = gate.scheduler
    learning = tuners.learning

    @app.get("/status", dependencies=guard)
    async def status() -> dict[str, Any]:
        return _status(gate, tuners)

    @app.get("/classes", dependencies=guard)
    async def classes() -> list[dict[str, Any]]:
        tallies = metrics.tallies()
        return [
            _class_view(
                profile,
                tallies.get(profile.name) or _Tally(),
                learning.changed_at.get(profile.fingerprint) if learning else None,
            )
            for profile in scheduler.model.classes
        ]

    @app.get("/recent", dependencies=guard)
    async def recent() -> list[dict[str, Any]]:
        keys = ("time", "class", "wait", "response")
        return [dict(zip(keys, item, strict=True)) for item in metrics.recent]

    @app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        # the page itself holds no data; its requests carry the token (from #token=…)
        return HTMLResponse(_DASHBOARD.read_text(encoding="utf-8"))

    @app.get("/eta", dependencies=guard)
    async def eta(policy: Annotated[str | None, Query()] = None) -> dict[str, Any]:
        chosen = policy or scheduler.policy.name
        if chosen not in POLICIES:
            raise HTTPException(
                422, f"unknown policy {chosen!r}; choose from {', '.join(POLICIES)}"
            )
        prio = POLICIES[chosen].build(scheduler.model)
        names = [c.name for c in scheduler.model.classes]
        return {
            "policy": chosen,
            "classes": names,
            "eta": [list(row) for row in prio.eta],
            "bias": list(prio.bias),
            # the order it admits in, classes whose intervals overlap tied (per class in
            # service for a mix-dependent policy)
            "order": priority_orders(names, prio),
        }


def _add_controls(
    app: FastAPI,
    gate: AdmissionGate,
    guard: list[Any],
    model_path: Path | None,
    tuners: _Tuners,
) -> None:
    """The routes that steer the running proxy: policy, limits, model reload and reset."""
    learning, auto_mpl = tuners.learning, tuners.auto_mpl

    @app.put("/policy", dependencies=guard)
    async def set_policy(change: PolicyChange) -> dict[str, Any]:
        if change.policy not in POLICIES:
            raise HTTPException(
                422, f"unknown policy {change.policy!r}; choose from {', '.join(POLICIES)}"
            )
        gate.set_policy(change.policy)
        return _status(gate, tuners)

    @app.put("/limits", dependencies=guard)
    async def set_limits(change: LimitsChange) -> dict[str, Any]:
        current = _limits_json(gate.scheduler.limits)
        tune = change.mpl == "auto"
        if gate.coordinator is not None and "mpl" in change.model_fields_set:
            raise HTTPException(
                409,
                "the MPL is a share of the global MPL the coordinator keeps "
                f"({gate.coordinator.budget}); start the proxies with another --mpl to change it",
            )
        if tune and auto_mpl is None:
            raise HTTPException(
                409, 'the proxy was started without --mpl auto; it cannot tune "mpl"'
            )
        for key in change.model_fields_set - ({"mpl"} if tune else set()):
            value = getattr(change, key)
            zero_is_none = key in (
                "mpl",
                "threads",
                "memory",
                "due_factor",
                "lifo_after",
                "release_after",
            )
            current[key] = (value or None) if zero_is_none else value
        try:
            limits = Limits(**current)
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        apart = gate.coordinator is not None or gate.pools is not None or gate.work_mem_grant
        if apart and limits.short_lane is None:  # (no lane of the policy's own there)
            limits = dataclasses.replace(limits, short_lane=0)
        if apart and (limits.release_after is not None or limits.short_lane):
            key = "release_after" if limits.release_after is not None else "short_lane"
            raise HTTPException(
                409,
                f"{key} is not supported with a coordinator, transaction pooling or work_mem "
                "grants: a statement beside the MPL would run outside the global budget, "
                "without a server connection of the pool or without a share of the grant",
            )
        if limits.lifo_after is not None and limits.queue_timeout is None:
            raise HTTPException(
                422,
                "lifo_after needs a queue_timeout: once the newest go first, only the timeout "
                "admits or sheds the oldest, which would otherwise wait for ever",
            )
        gate.set_limits(limits)
        if auto_mpl is not None and tune:
            auto_mpl.resume()
        elif auto_mpl is not None and "mpl" in change.model_fields_set:
            auto_mpl.pause()  # a number set by hand: it stays
        return _status(gate, tuners)

    @app.post("/model/reload", dependencies=guard)
    async def reload_model() -> dict[str, Any]:
        if model_path is None:
            raise HTTPException(409, "the proxy was started without --model; nothing to reload")
        try:
            model = EtaModel.load(model_path)
        except ModelError as e:
            raise HTTPException(422, f"the model was not reloaded: {e}") from None
        gate.set_model(model, base=True)
        return {"reloaded": str(model_path), "classes": len(model.classes)}

    @app.post("/model/reset", dependencies=guard)
    async def reset_model(
        query_class: Annotated[str | None, Query(alias="class")] = None,
    ) -> dict[str, Any]:
        """Forget what was learned live: of one class (by name or fingerprint), which goes
        back to the D_r training measured (or the default profile), or of all — the proxy
        then serves the model file with every learned estimate taken out again, or, without
        one, starts from nothing. What is reset is saved to the file like anything learned."""
        if learning is None:
            raise HTTPException(409, "the proxy is not learning (--no-learn); nothing to reset")
        on_disk: EtaModel | None = None
        if model_path is not None and model_path.exists():
            try:
                on_disk = EtaModel.load(model_path)
            except ModelError as e:
                raise HTTPException(422, f"the model was not reset: {e}") from None
        if query_class is None:
            learning.reset(forget_learned(on_disk) if on_disk is not None else None)
            return _status(gate, tuners)
        current = gate.scheduler.model
        index = next(
            (i for i, c in enumerate(current.classes) if query_class in (c.name, c.fingerprint)),
            None,
        )
        if index is None:
            raise HTTPException(404, f"no class {query_class!r}")
        old = current.classes[index]
        learning.estimator.forget(old.fingerprint)
        learning.changed_at.pop(old.fingerprint, None)
        (back,) = forget_learned(current.model_copy(update={"classes": (old,)})).classes
        if old.live and old.D_trained is None:  # never trained: the default profile of now
            back = back.model_copy(update={"D": current.default_profile().D})
        classes = (*current.classes[:index], back, *current.classes[index + 1 :])
        learning.swap(current.model_copy(update={"classes": classes, "eta": {}}))
        return _status(gate, tuners)
