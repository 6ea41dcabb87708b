"""``admission train``: learn each TPC-H class's profile and write the η model (SPEC §3, §5).

1. **Isolation** — one statement at a time through the proxy (MPL 1), sampled every Δ/5 (at
   most 5 ms). Each class runs once unrecorded (warm-up), then the classes run round-robin, one
   run of each per round so that a drift of the machine hits every class alike, until the 95 %
   interval of every class's D_r is within ±5 % of it (after ``isolation_reps`` rounds at
   least) or ``isolation_seconds`` have passed; the classes that did not converge are named in
   the progress output and the model's notes. D_r is the median run (admission to completion;
   robust to a stray slow run on a shared machine) with a distribution-free 95 % interval
   (``estimate.median_interval``). Each run's nominal fork size is the median thread count
   over its first tenth; f_r is the 90th percentile of those (``estimate.fork_quantile``: what
   nearly every run takes, not a coin flip between trainings), the runs per size are kept, and the
   fork profile (phases) is pooled over the runs with that fork size and lasts D_r. The class's
   mean parallelism (thread-seconds per second) is what the DuckDB probe uses to share its
   threads out. Memory M_r and spill: on DuckDB its profiler's bytes allocated per run (the
   90th percentile of the runs'); on PostgreSQL what EXPLAIN (ANALYZE, BUFFERS) reports of
   the class's operators over MEMORY_RUNS statements run straight on the server afterwards
   (``training.pgmemory``).
2. **Concurrent** — ``concurrency`` closed-loop clients with no think time, FCFS through the proxy,
   for ``duration`` seconds, sampled every Δ: U_r, Q_r, A^c_r and A_r. The run drains (every
   statement started finishes), so nothing straddles the window's ends. Q_r, U_r and every
   A^c_r get a 95 % interval by batch means (the window cut into up to 10 equal batches; the
   samples are autocorrelated, the batch means nearly not), none when the run is too short
   for 4 batches; the policies tie classes whose intervals overlap.
3. A fixed CPU probe (``training.speed``) before and after: the machine's speed, stored in
   the model, with a warning when it changed by more than 10 %.
4. The model file is written atomically, with a per-class table and an η heat map.

Both phases run through a proxy in this process in front of a database with TPC-H loaded, which
the caller provides (``lab.train`` builds it); this module measures, it does not load data.

Ctrl-C during the concurrent run stops the load and writes a model from what was measured if
every class completed at least once (the notes say so); otherwise nothing is written. A model
file is never left half-written.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from admission.classify import classify_sql
from admission.model import ClassProfile, EtaModel, Phase, Speed
from admission.scheduler import Limits
from proxy.app import BackgroundProxy
from training import speed
from training.estimate import (
    Completed,
    Estimator,
    engine_fork,
    fork_quantile,
    fork_runs_text,
    interquartile_range,
    median_interval,
    pooled_phases,
)
from training.pgmemory import explain_memory
from training.proc import ThreadProbe, process_tree_cpu, read_task
from training.sampler import DuckDBJobs, Jobs, PostgresJobs, Recorder, RemotePostgresJobs
from workloads.tpch.load import LoadResult, run_closed
from workloads.tpch.mixes import Mix
from workloads.tpch.queries import Dialect, draw_parameters, render_query

__all__ = ["Checks", "TrainConfig", "TrainResult", "train"]

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class TrainConfig:
    backend: str = "duckdb"  # or postgresql://host:port/db?user=…
    tpch: float = 0.1
    classes: tuple[int, ...] = tuple(range(1, 23))
    isolation_reps: int = 3  # the least runs of each class alone
    isolation_seconds: float = 40.0  # the isolation runs' time cap, all classes together
    concurrency: int = 8
    duration: float = 60.0
    interval: float = 0.05
    mpl: int | None = None  # of the concurrent run; None: every statement is admitted at once
    seed: int = 0
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    @property
    def is_duckdb(self) -> bool:
        return self.backend == "duckdb"


@dataclass
class Checks:
    """How far the estimates are from what they must agree with (SPEC §3)."""

    window: float  # seconds of the concurrent run
    u_sum: float  # Σ_r U_r
    os_cpu: float | None  # CPU seconds the OS reports for the database (None: not visible)
    model_cpu: float  # Σ_r U_r · window · M
    little: dict[str, tuple[float, float]]  # class → (Q_r, X_r · E[thread-seconds])
    sampler_cpu: float  # the sampler's own CPU share of one core during the run
    samples: int

    @property
    def cpu_error(self) -> float:
        if not self.os_cpu:
            return float("nan")  # a remote server: nothing to compare with
        return abs(self.model_cpu - self.os_cpu) / self.os_cpu


@dataclass
class TrainResult:
    model: EtaModel
    checks: Checks
    load: LoadResult
    interrupted: bool = False


class _Probes:
    """How to sample the database behind the proxy: its threads and CPU, and which statement
    each admitted job is. Registers on the proxy's scheduler to hear admissions."""

    def __init__(self, config: TrainConfig, proxy: BackgroundProxy) -> None:
        self.config = config
        self.proxy = proxy
        self.recorder: Recorder | None = None
        self._stop_profiling: Callable[[], None] = lambda: None
        scheduler = proxy.gate.scheduler
        proxy.call(lambda: scheduler.observe(events=self._on_event))
        if config.is_duckdb:
            self.thread_probe = ThreadProbe()
            self.embedded: Any = proxy.server
        else:
            self.direct = config.backend
            self.postmaster = self._local_postmaster()

    def _on_event(self, event: Any) -> None:
        if self.recorder is not None:
            self.recorder.on_event(event)

    def describe(self, job: Hashable) -> tuple[str, int | None]:
        record = self.proxy.gate.scheduler.job(job)
        client = self.proxy.gate.client(job)  # type: ignore[arg-type]
        pid = client.backend_pid if client is not None else None
        return (record.fingerprint if record is not None else "?"), pid

    def jobs(self, weights: dict[str, float], profile: bool = False) -> Jobs:
        """The probe for this backend; ``profile``: also collect DuckDB's profiler CPU."""
        if self.config.is_duckdb:
            jobs = DuckDBJobs(self.thread_probe, weights)
            self._stop_profiling()
            if profile:
                self._stop_profiling = self.embedded.observe(
                    lambda m: jobs.measured(m.job, m.cpu_time, m.memory, m.spilled, m.latency)
                )
            return jobs
        if self.postmaster is not None:
            return PostgresJobs()
        return RemotePostgresJobs(self.direct, self.config.cores)

    def record(self, estimator: Estimator, jobs: Jobs, interval: float) -> Recorder:
        """A recorder of ``jobs`` into ``estimator`` that hears this proxy's admissions."""
        self.recorder = Recorder(estimator, jobs, self.describe, interval)
        return self.recorder

    def _local_postmaster(self) -> int | None:
        """The server's postmaster pid if it runs on this machine (its backend is visible in
        /proc as a postgres process), else None."""
        with psycopg.connect(self.direct) as conn:  # read while the backend is alive
            pid = conn.info.backend_pid
            reading = read_task(f"/proc/{pid}")
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    is_postgres = b"postgres" in f.read()
            except OSError:
                return None
        return reading.ppid if reading is not None and is_postgres else None

    def os_cpu(self) -> float | None:
        """CPU seconds the database has used so far, as the OS counts them (None: remote)."""
        if self.config.is_duckdb:
            return self.thread_probe.read()[1]
        return process_tree_cpu(self.postmaster) if self.postmaster is not None else None

    def set_mpl(self, mpl: int | None) -> None:
        gate = self.proxy.gate
        limits = Limits(mpl=mpl)
        self.proxy.call(lambda: gate.set_limits(limits))


def _fingerprints(classes: tuple[int, ...], dialect: Dialect, sf: float) -> dict[str, int]:
    rng = random.Random(0)
    return {
        classify_sql(render_query(q, draw_parameters(q, rng, sf), dialect)).fingerprint: q
        for q in classes
    }


Bar = Callable[[str, int], Callable[[int], None]]


@dataclass(frozen=True)
class _IsolationSummary:
    rounds: int  # runs of each class
    seconds: float
    unconverged: list[str]  # names of the classes whose D_r did not converge


@dataclass
class _Run:
    """One training run's state between its steps."""

    config: TrainConfig
    probes: _Probes
    conninfo: str
    progress: Progress
    bar: Bar | None
    dialect: Dialect
    rng: random.Random
    query_of: dict[str, int]  # fingerprint → TPC-H query number
    isolation: _IsolationSummary | None = None
    speed: Speed | None = None

    def query(self, q: int, rng: random.Random | None = None) -> str:
        params = draw_parameters(q, rng if rng is not None else self.rng, self.config.tpch)
        return render_query(q, params, self.dialect)


@dataclass
class _Concurrent:
    """What the concurrent run measured."""

    estimator: Estimator
    recorder: Recorder
    load: LoadResult
    cpu: float | None  # the OS's CPU seconds for the database during the run
    interrupted: bool


def train(
    config: TrainConfig,
    proxy: BackgroundProxy,
    conninfo: str,
    progress: Progress = _quiet,
    bar: Bar | None = None,
) -> TrainResult:
    """Run both phases through ``proxy`` (clients connect with ``conninfo``; it is in front of
    a database with TPC-H loaded at ``config.tpch``) and return the model (the caller saves
    it). The proxy's limits are the caller's to restore: this sets its MPL for the concurrent
    run."""
    if not config.classes:
        raise ValueError("no classes to train")
    dialect: Dialect = "duckdb" if config.is_duckdb else "postgres"
    run = _Run(
        config=config,
        probes=_Probes(config, proxy),
        conninfo=conninfo,
        progress=progress,
        bar=bar,
        dialect=dialect,
        rng=random.Random(config.seed),
        query_of=_fingerprints(config.classes, dialect, config.tpch),
    )
    before = speed.measure()
    progress(f"machine speed: {before.speed:,.0f} {speed.UNIT}")
    profiles = _isolation(run)
    measured = _concurrent(run, profiles)
    after = speed.measure()
    run.speed = Speed(before=before.speed, after=after.speed, unit=speed.UNIT)
    if abs(run.speed.change) > SPEED_CHANGE:
        progress(f"warning: {_speed_note(run.speed)}")
    estimates = measured.estimator.estimates()
    missing = [run.query_of.get(f, f) for f in profiles if f not in estimates]
    if missing:
        what = "interrupted before" if measured.interrupted else "in the concurrent run,"
        raise RuntimeError(
            f"{what} classes {missing} never completed; no model written "
            "(train longer or with more clients)"
        )
    model = _model(run, profiles, measured)
    return TrainResult(model, _checks(run, measured), measured.load, measured.interrupted)


def _isolation(run: _Run) -> dict[str, dict[str, Any]]:
    """Phase 1: each class alone at MPL 1, the classes interleaved round-robin until every
    class's D_r has converged or the time cap is reached; the profiles it gives."""
    config = run.config
    k = len(config.classes)
    run.progress(
        f"isolation: {k} classes round-robin, MPL 1, at least {config.isolation_reps} runs "
        f"each, until D_r is within ±{CONVERGED:.0%} (95 %) or {config.isolation_seconds:g} s"
    )
    iso = Estimator(config.cores, keep_series=True)
    iso_jobs = run.probes.jobs({}, profile=True)
    recorder = run.probes.record(iso, iso_jobs, min(config.interval / 5, 0.005))
    cap = max(1, int(config.isolation_seconds))
    tick = run.bar("isolation", cap) if run.bar else None
    with psycopg.connect(run.conninfo, autocommit=True) as conn:
        for q in config.classes:  # warm caches and plans once, unrecorded
            conn.execute(run.query(q))
        recorder.start()
        started = time.monotonic()
        try:
            rounds = 0
            while True:
                for q in config.classes:  # one run of each per round: drift hits all alike
                    conn.execute(run.query(q)).fetchall()
                rounds += 1
                elapsed = time.monotonic() - started
                if tick:
                    tick(min(int(elapsed), cap))
                if rounds < config.isolation_reps:
                    continue
                with recorder.lock:
                    durations = _durations(iso.completed)
                if elapsed >= config.isolation_seconds or all(
                    _converged(durations.get(f, [])) for f in run.query_of
                ):
                    break
        finally:
            recorder.stop()
    seconds = time.monotonic() - started
    if isinstance(iso_jobs, DuckDBJobs):
        measured = iso_jobs.profiled, iso_jobs.memory, iso_jobs.spilled, iso_jobs.latency
    else:
        measured = {}, {}, {}, {}
    profiles = _isolation_profiles(iso, run.query_of, *measured, threads=config.cores)
    if not config.is_duckdb:
        _explained_memory(run, profiles)
    run.isolation = _IsolationSummary(rounds, seconds, _unconverged(run, profiles))
    for f, p in profiles.items():
        low, high = p["D_low"], p["D_high"]
        interval = f"[{low:.4g}, {high:.4g}]" if low is not None else "[no 95 % interval]"
        run.progress(
            f"  Q{run.query_of[f]}: D_r {p['D']:.4g} s {interval} IQR {p['D_iqr']:.3g} s, "
            f"{p['D_runs']} runs, f_r {p['f']} ({_fork_text(p)})"
            + (f", M_r {p['M'] / 2**20:.3g} MB" if p["M"] is not None else "")
            + (f", spills {p['spill'] / 2**20:.3g} MB" if p["spill"] else "")
            + (
                f", {p['work_mem_units']:.3g}× work_mem at most"
                if p.get("work_mem_units") is not None
                else ""
            )
            + ("" if p["converged"] else " — not converged")
        )
    for f, p in profiles.items():
        disagree = _fork_disagreement(p)
        if disagree:
            run.progress(f"  note: Q{run.query_of[f]}: {disagree}")
    if run.isolation.unconverged:
        run.progress(
            f"isolation: D_r did not converge within ±{CONVERGED:.0%} in "
            f"{seconds:.0f} s for {', '.join(run.isolation.unconverged)}"
        )
    return profiles


def _fork_text(p: dict[str, Any]) -> str:
    """Where f_r came from and the runs by fork size: "DuckDB's profiler 2: 40; /proc 1: 3,
    2: 37"."""
    sampled = f"/proc {fork_runs_text(p['f_runs'])}"
    if p["f_engine"]:
        sampled = f"{p['f_source']} {fork_runs_text(p['f_engine'])}; {sampled}"
    return f"runs by fork size, {sampled}"


def _fork_disagreement(p: dict[str, Any]) -> str:
    """A note when the /proc samples give another f_r than the database's own report."""
    if not p["f_engine"] or not p["f_runs"]:
        return ""
    sampled = fork_quantile(p["f_runs"])
    if sampled == p["f"]:
        return ""
    return (
        f"the /proc samples give f_r {sampled}, the {p['f_source']} {p['f']}; f_r is the "
        "database's (the samples of a short run are few)"
    )


MEMORY_RUNS = 3  # PostgreSQL: statements of each class run under EXPLAIN ANALYZE for M_r
CONVERGED = 0.05  # the half-width of D_r's 95 % interval, relative to D_r, that is enough


def _durations(completed: list[Completed]) -> dict[str, list[float]]:
    """Each class's run times (admission to completion) so far."""
    out: dict[str, list[float]] = {}
    for c in completed:
        out.setdefault(c.klass, []).append(c.completed - c.admitted)
    return out


def _converged(durations: list[float]) -> bool:
    """Whether the 95 % interval of the median is within ±5 % of it."""
    interval = median_interval(durations)
    if interval is None:
        return False
    d = statistics.median(durations)
    return interval[0] >= (1 - CONVERGED) * d and interval[1] <= (1 + CONVERGED) * d


def _unconverged(run: _Run, profiles: dict[str, dict[str, Any]]) -> list[str]:
    return [f"Q{run.query_of[f]}" for f, p in profiles.items() if not p["converged"]]


def _concurrent(run: _Run, profiles: dict[str, dict[str, Any]]) -> _Concurrent:
    """Phase 2: the closed-loop FCFS run, sampled every Δ; Ctrl-C stops it early."""
    config = run.config
    run.progress(
        f"concurrent: {config.concurrency} clients, FCFS, "
        f"MPL {config.mpl or 'unlimited'}, {config.duration:g} s, Δ = {config.interval:g} s"
    )
    run.probes.set_mpl(config.mpl)
    fork = {f: int(p["f"]) for f, p in profiles.items()}
    estimator = Estimator(config.cores, fork)
    weights = {f: p["parallelism"] for f, p in profiles.items()}
    recorder = run.probes.record(estimator, run.probes.jobs(weights), config.interval)
    cpu_before = run.probes.os_cpu()
    recorder.start()
    try:
        load, interrupted = _closed_load(run)
    finally:
        recorder.stop()
    if isinstance(recorder.jobs, PostgresJobs):
        time.sleep(0.2)  # let the postmaster reap the last workers and backends
        for klass, seconds in recorder.jobs.finish().items():
            estimator.add_cpu(klass, seconds)
    cpu_after = run.probes.os_cpu()
    cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before else None
    return _Concurrent(estimator, recorder, load, cpu, interrupted)


def _closed_load(run: _Run) -> tuple[LoadResult, bool]:
    """The load generator on a thread of its own, so that Ctrl-C here stops it cleanly;
    whether it was interrupted."""
    config = run.config
    mix = Mix("training", {q: 1 / len(config.classes) for q in config.classes})
    stop = threading.Event()
    outcome: dict[str, LoadResult] = {}
    failure: list[BaseException] = []
    finished = threading.Event()  # not Thread.join: a join interrupted by Ctrl-C is unreliable

    def load() -> None:
        try:
            outcome["load"] = run_closed(
                run.conninfo,
                mix,
                clients=config.concurrency,
                duration=config.duration,
                scale_factor=config.tpch,
                dialect=run.dialect,
                seed=config.seed,
                stop=stop,
            )
        except BaseException as e:  # reported by the caller
            failure.append(e)
        finally:
            finished.set()

    loader = threading.Thread(target=load, name="load", daemon=True)
    started = time.monotonic()
    loader.start()
    interrupted = False
    tick = run.bar("concurrent", int(config.duration)) if run.bar else None
    try:
        while not finished.wait(0.25):
            if tick:
                tick(min(int(time.monotonic() - started), int(config.duration)))
    except KeyboardInterrupt:
        interrupted = True
        run.progress("interrupted: stopping the load and waiting for statements in flight")
        stop.set()
        finished.wait()
    if "load" not in outcome:
        raise RuntimeError(f"the load generator failed: {failure[0] if failure else '?'}")
    return outcome["load"], interrupted


def _model(run: _Run, profiles: dict[str, dict[str, Any]], measured: _Concurrent) -> EtaModel:
    """The η model from the isolation profiles and the concurrent run's estimates."""
    config = run.config
    estimates = measured.estimator.estimates()
    q_intervals = measured.estimator.q_intervals()
    u_intervals = measured.estimator.u_intervals()
    a_intervals = measured.estimator.a_intervals(list(profiles))
    classes = []
    for f, p in profiles.items():
        e = estimates[f]
        q = run.query_of[f]
        qi = q_intervals.get(f)
        ui = u_intervals.get(f)
        classes.append(
            ClassProfile(
                fingerprint=f,
                name=f"Q{q}",
                sample_sql=run.query(q, random.Random(q)),
                D=p["D"],
                D_low=p["D_low"],
                D_high=p["D_high"],
                D_runs=p["D_runs"],
                f=int(p["f"]),
                f_runs=p["f_runs"],
                f_engine=p["f_engine"],
                f_source=p["f_source"],
                converged=p["converged"],
                phases=tuple(Phase(threads=n, duration=d) for n, d in p["phases"]),
                U=e.U,
                U_low=None if ui is None else min(ui[0], e.U),
                U_high=None if ui is None else max(ui[1], e.U),
                Q=e.Q,
                # the batch means average to Q but for rounding: keep Q inside, and ≥ 0
                Q_low=None if qi is None else max(0.0, min(qi[0], e.Q)),
                Q_high=None if qi is None else max(qi[1], e.Q),
                A=e.A,
                count=e.count,
                M=p["M"],
                spill=p["spill"],
                work_mem_units=p.get("work_mem_units"),
            )
        )
    return EtaModel(
        backend="duckdb" if config.is_duckdb else "postgresql",
        dataset=f"tpch sf {config.tpch:g}",
        cores=config.cores,
        mpl=config.mpl,
        sample_interval=config.interval,
        notes="; ".join(_notes(run, measured)),
        speed=run.speed,
        classes=tuple(classes),
        A_matrix=tuple(tuple(row) for row in measured.estimator.a_matrix(list(profiles))),
        A_low=() if a_intervals is None else tuple(map(tuple, a_intervals[0])),
        A_high=() if a_intervals is None else tuple(map(tuple, a_intervals[1])),
    ).with_eta()


def _notes(run: _Run, measured: _Concurrent) -> list[str]:
    """The model file's notes: how it was trained and what its numbers rest on."""
    notes = [
        f"trained on {run.config.concurrency} closed-loop clients for "
        f"{measured.estimator.window():.1f} s",
    ]
    iso = run.isolation
    if iso is not None:
        notes.append(
            f"isolation: {iso.rounds} round-robin runs per class in {iso.seconds:.0f} s "
            f"(at least {run.config.isolation_reps}, cap {run.config.isolation_seconds:g} s); "
            "D_r is the median run with a distribution-free 95 % interval"
        )
        if iso.unconverged:
            notes.append(
                f"D_r not within ±{CONVERGED:.0%} at 95 % for {', '.join(iso.unconverged)}"
            )
    if run.speed is not None and abs(run.speed.change) > SPEED_CHANGE:
        notes.append(_speed_note(run.speed))
    if isinstance(measured.recorder.jobs, RemotePostgresJobs):
        notes.append(
            "remote server: tasks counted from pg_stat_activity and CPU estimated as each "
            "active process's share of the cores (no /proc)"
        )
    if isinstance(measured.recorder.jobs, DuckDBJobs):
        notes.append(
            "DuckDB: threads in execution and their CPU from /proc, shared among the "
            "statements in flight by each class's parallelism alone (DuckDB's profiler)"
        )
    if measured.interrupted:
        notes.append("interrupted: a partial run")
    return notes


SPEED_CHANGE = 0.10  # a larger change of the machine's speed during training is warned of


def _speed_note(s: Speed) -> str:
    return (
        f"the machine's speed changed by {s.change:+.0%} during training "
        f"({s.before:,.0f} → {s.after:,.0f} {s.unit}); its numbers rest on a machine "
        "that was not the same throughout"
    )


def _checks(run: _Run, measured: _Concurrent) -> Checks:
    """The estimates against the OS's CPU count and Little's law."""
    estimates = measured.estimator.estimates()
    window = measured.estimator.window()
    little = {
        f"Q{run.query_of[f]}": (
            estimates[f].Q,
            estimates[f].throughput * estimates[f].thread_seconds,
        )
        for f in run.query_of
    }
    return Checks(
        window=window,
        u_sum=sum(e.U for e in estimates.values()),
        os_cpu=measured.cpu,
        model_cpu=sum(e.U for e in estimates.values()) * window * run.config.cores,
        little=little,
        sampler_cpu=measured.recorder.sampler_cpu / window if window else 0.0,
        samples=measured.recorder.samples,
    )


def _isolation_profiles(
    iso: Estimator,
    query_of: dict[str, int],
    profiled: dict[Hashable, float],
    memory: dict[Hashable, float] | None = None,
    spilled: dict[Hashable, float] | None = None,
    latency: dict[Hashable, float] | None = None,
    threads: int = 1,
) -> dict[str, dict[str, Any]]:
    """D_r, phases, f_r and the parallelism of each class from its isolation runs. Where the
    backend's profiler measured a run's CPU (DuckDB), parallelism is CPU over wall time; else
    the sampled thread-seconds over wall time. Where it measured each run's memory, M_r is
    the 90th percentile of the runs' (their largest with fewer than ten runs) and the spill
    the mean."""
    by_class: dict[str, list[Any]] = {}
    for c in iso.completed:
        by_class.setdefault(c.klass, []).append(c)
    missing = [q for f, q in query_of.items() if f not in by_class]
    if missing:
        raise RuntimeError(f"isolation runs of queries {missing} were not seen by the proxy")
    profiles: dict[str, dict[str, Any]] = {}
    for f in query_of:
        runs = by_class[f]
        durations = [c.completed - c.admitted for c in runs]
        d = statistics.median(durations)
        interval = median_interval(durations)
        forks = [fork_size(c) for c in runs]
        f_runs = dict(sorted(Counter(forks).items()))
        # DuckDB: each run's fork size from its profiler (CPU over DuckDB's own wall time)
        reported = [
            engine_fork(profiled[c.job] / latency[c.job], threads)
            for c in runs
            if latency and c.job in profiled and latency.get(c.job, 0) > 0
        ]
        f_engine = dict(sorted(Counter(reported).items()))
        nominal = fork_quantile(f_engine or f_runs)
        typical = [c for c, n in zip(runs, forks, strict=True) if n == nominal] or runs
        phases = _scaled(pooled_phases(typical) or [(nominal, d)], nominal, d)
        busy = statistics.fmean(
            profiled.get(c.job, c.thread_seconds) / max(c.completed - c.admitted, 1e-9)
            for c in runs
        )
        memories = [memory[c.job] for c in runs if memory and c.job in memory]
        spills = [spilled[c.job] for c in runs if spilled and c.job in spilled]
        profiles[f] = {
            "M": memory_quantile(memories),
            "spill": statistics.fmean(spills) if spills else None,
            "D": d,
            "D_low": interval[0] if interval else None,
            "D_high": interval[1] if interval else None,
            "D_iqr": interquartile_range(durations),
            "D_runs": len(runs),
            "converged": _converged(durations),
            "f": nominal,
            "f_runs": f_runs,
            "f_engine": f_engine,
            "f_source": "DuckDB's profiler" if f_engine else "/proc samples",
            "phases": phases,
            "parallelism": busy or 1.0,
        }
    return profiles


def _explained_memory(run: _Run, profiles: dict[str, dict[str, Any]]) -> None:
    """PostgreSQL: each class's M_r, spill and work_mem units from what EXPLAIN (ANALYZE,
    BUFFERS) reports of its operators (``training.pgmemory``), over MEMORY_RUNS statements of
    the class (one for a class that takes a second or more), run straight on the server after
    the isolation runs: the largest memory, the mean spill, the most units. The same reports
    give each statement's processes (1 + the parallel workers launched): f_r is taken from
    them, the /proc samples of the isolation runs its cross-check."""
    rng = random.Random(run.config.seed + 1)  # (the concurrent run's draws stay as they were)
    try:
        with psycopg.connect(run.config.backend, autocommit=True) as conn:
            for f, q in run.query_of.items():
                runs = MEMORY_RUNS if profiles[f]["D"] < 1.0 else 1
                found = [explain_memory(conn, run.query(q, rng)) for _ in range(runs)]
                p = profiles[f]
                p["M"] = max(e.memory for e in found)
                p["spill"] = statistics.fmean(e.spill for e in found)
                p["work_mem_units"] = max(e.units for e in found)
                p["f_engine"] = dict(sorted(Counter(e.processes for e in found).items()))
                p["f_source"] = "PostgreSQL's workers launched"
                p["f"] = fork_quantile(p["f_engine"])
                p["phases"] = _scaled(p["phases"], p["f"], p["D"])
    except (psycopg.Error, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        run.progress(f"warning: no memory measured ({why}): M_r stays unknown")


def memory_quantile(memories: list[float]) -> float | None:
    """What a class reserves: the 90th percentile of its runs' memory, the largest below ten
    runs (None: not measured)."""
    if not memories:
        return None
    if len(memories) < 10:
        return max(memories)
    return statistics.quantiles(memories, n=10, method="inclusive")[-1]


def fork_size(run: Completed) -> int:
    """One isolation run's nominal fork size: the median thread count over its first tenth
    (the first slice ``pooled_phases`` gives for that run alone); 1 without samples."""
    phases = pooled_phases([run])
    return phases[0][0] if phases else 1


def _scaled(phases: list[tuple[int, float]], f: int, d: float) -> list[tuple[int, float]]:
    """The pooled fork profile starting with ``f`` threads (the runs' 90 % fork size)
    and lasting ``d`` (the median run), its phases' shares of the run kept."""
    if phases[0][0] != f:
        phases = [(f, phases[0][1]), *phases[1:]]
    merged: list[tuple[int, float]] = []
    for n, length in phases:
        if merged and merged[-1][0] == n:
            merged[-1] = (n, merged[-1][1] + length)
        else:
            merged.append((n, length))
    total = sum(length for _, length in merged)
    if total <= 0:
        return [(f, d)]
    return [(n, length * d / total) for n, length in merged]
