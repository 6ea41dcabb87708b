"""The sampler: every Δ, how many tasks each statement in flight has in execution.

A ``Recorder`` listens to the proxy's scheduler (admissions and completions, on the proxy's
event loop) and runs a sampling thread; both feed one ``Estimator`` under a lock. What a task is
depends on the backend:

* ``PostgresJobs``: the statement's backend process and its parallel workers, read from /proc by
  pid; in execution means state R, and the fork profile counts them running or not. CPU per
  statement = the backend's CPU from admission to completion (read at both instants) + each
  worker's CPU as last sampled; the workers' unseen last moments are recovered at the end.
  ``PostgresTicks`` (what ``serve`` uses): no /proc read per statement — each Δ every backend
  that served a statement since the last sample is read once, and its CPU since then is shared
  among those statements by the time each held it (a few reads per Δ, at any rate).
* ``RemotePostgresJobs``: a server on another machine, so no /proc: active leaders and workers
  from ``pg_stat_activity``; CPU is *estimated* as each active process's share of M cores.
* ``DuckDBJobs``: DuckDB's threads run in this process and serve whichever statement needs
  them, so the threads in execution, and the CPU they use, are split among the statements in
  flight in proportion to their class's parallelism in isolation (from DuckDB's profiler).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from training.estimate import Estimator, attribute
from training.proc import PostgresProbe, TaskReading, ThreadProbe, children

__all__ = ["DuckDBJobs", "PostgresJobs", "PostgresTicks", "Recorder", "RemotePostgresJobs"]

log = logging.getLogger("admission.profile")


class Jobs(Protocol):
    exact_cpu: bool

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None: ...

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        """Tasks in execution per job, and (where the probe sees them) tasks alive per job."""
        ...

    def end(self, job: Hashable) -> float | None: ...

    def settle(self, events: Sequence[Event], now: float) -> None:
        """Before a deferring ``Recorder`` replays ``events``: what they need read."""
        ...


# A scheduler event as a deferring ``Recorder`` keeps it: (admitted?, job, class, pid, when).
Event = tuple[bool, Hashable, str | None, int | None, float]  # class None: bypass


NO_WORKERS: frozenset[int] = frozenset()


@dataclass(slots=True)
class _PgJob:
    leader: int
    base: float
    leader_cpu: float
    workers: dict[int, float] = field(default_factory=dict)  # worker pid → CPU last seen
    earlier: set[int] | frozenset[int] = field(default_factory=set)  # an earlier one's, exiting
    start: float = 0.0  # per tick: when it was admitted
    charged: float = 0.0  # per tick: the backend's CPU shared out to it so far


class PostgresJobs:
    """Backends and parallel workers of the statements in flight, from /proc.

    A worker's CPU after its last sample is not seen while it lives; when the postmaster reaps
    it, its whole CPU lands in the postmaster's cutime. ``finish`` compares the growth of that
    count with the CPU last seen of every process that has since exited (each child of the
    postmaster is read once when the window opens, so backends that leave during the run are
    covered too) and hands the remainder — the workers' unseen tails — to the classes whose
    workers exited, in proportion to their number.
    """

    exact_cpu = True

    def __init__(self) -> None:
        self.probe = PostgresProbe()
        self.jobs: dict[Hashable, _PgJob] = {}
        self.klass: dict[Hashable, str] = {}
        self.reaped_at_start: float | None = None
        self.last_cpu: dict[int, float] = {}  # every process read: pid → CPU last seen
        self.worker_class: dict[int, str] = {}

    def _open_window(self) -> None:
        postmaster = self.probe.postmaster
        top = self.probe.read(postmaster) if postmaster is not None else None
        if postmaster is None or top is None:
            return
        self.reaped_at_start = top.children_cpu
        for pid in children(postmaster):
            reading = self.probe.read(pid)
            if reading is not None:
                self.last_cpu.setdefault(pid, reading.cpu)

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None:
        if pid is None:
            return
        reading = self.probe.read(pid)
        cpu = reading.cpu if reading is not None else 0.0
        # The backend's previous statement may have workers that have not exited yet: they
        # are not this statement's.
        earlier = set(self.probe.workers().get(pid, ()))
        self.jobs[job] = _PgJob(pid, cpu, cpu, earlier=earlier)
        self.klass[job] = klass
        self.last_cpu[pid] = cpu
        if self.reaped_at_start is None:
            self._open_window()

    def _worker(self, j: _PgJob, klass: str, pid: int) -> bool:
        """Read one of ``j``'s workers; whether it is running."""
        reading = self.probe.read(pid)
        if reading is None:
            return False
        j.workers[pid] = self.last_cpu[pid] = reading.cpu
        self.worker_class[pid] = klass
        return reading.running

    def settle(self, events: Sequence[Event], now: float) -> None:
        pass  # read at each admission and completion (``PostgresTicks``: once per sample)

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        workers = self._workers_now()
        tasks: dict[Hashable, float] = {}
        forks: dict[Hashable, float] = {}
        for job, j in self.jobs.items():
            leader = self._leader(j.leader)
            n = 0
            mine = [w for w in workers.get(j.leader, ()) if w not in j.earlier]
            forks[job] = 1 + len(mine)
            if leader is not None:
                n += leader.running
                j.leader_cpu = self.last_cpu[j.leader] = leader.cpu
            for pid in mine:
                n += self._worker(j, self.klass[job], pid)
            tasks[job] = n
        return tasks, forks

    def _leader(self, pid: int) -> TaskReading | None:
        return self.probe.read(pid)

    def _workers_now(self) -> dict[int, list[int]]:
        return self.probe.workers()

    def end(self, job: Hashable) -> float | None:
        j = self.jobs.pop(job, None)
        klass = self.klass.pop(job, "")
        if j is None:
            return None
        for pid in self.probe.workers().get(j.leader, ()):  # workers still exiting
            if pid not in j.earlier:
                self._worker(j, klass, pid)
        leader = self.probe.read(j.leader)
        if leader is not None:
            j.leader_cpu = self.last_cpu[j.leader] = leader.cpu
        return (j.leader_cpu - j.base) + sum(j.workers.values())

    def prune(self) -> None:
        """Forget the processes of statements no longer in flight (a sampler that runs for
        ever would otherwise keep every backend and parallel worker it ever read)."""
        keep = set()
        for j in self.jobs.values():
            keep.add(j.leader)
            keep.update(j.workers)
            keep.update(j.earlier)
        keep.update(self._kept())
        self.last_cpu = {pid: cpu for pid, cpu in self.last_cpu.items() if pid in keep}
        self.worker_class = {pid: k for pid, k in self.worker_class.items() if pid in keep}

    def _kept(self) -> set[int]:
        """Processes ``prune`` keeps beyond those of the statements in flight."""
        return set()

    def finish(self) -> dict[str, float]:
        """CPU seconds per class that exited workers used after their last sample."""
        postmaster = self.probe.postmaster
        top = self.probe.read(postmaster) if postmaster is not None else None
        if postmaster is None or top is None or self.reaped_at_start is None:
            return {}
        alive = set(children(postmaster))
        gone = [p for p in self.last_cpu if p not in alive]
        tail = top.children_cpu - self.reaped_at_start - sum(self.last_cpu[p] for p in gone)
        gone_workers = [self.worker_class[p] for p in gone if p in self.worker_class]
        if tail <= 0 or not gone_workers:
            return {}
        per_class: dict[str, int] = {}
        for klass in gone_workers:
            per_class[klass] = per_class.get(klass, 0) + 1
        return {k: tail * n / len(gone_workers) for k, n in per_class.items()}


class PostgresTicks(PostgresJobs):
    """``PostgresJobs`` for a proxy that serves: nothing read per statement (what ``serve``'s
    live profile uses; a /proc read at every admission and completion cost a workload of short
    statements most of its throughput).

    Each Δ (``settle``, before the notes of the admissions and completions since the last
    sample are replayed) every backend that held a statement since then is read once, and its
    CPU since its previous reading is shared among the statements it held in that span by the
    time each held it. Statements that passed admission (session control, statements inside a
    transaction block) take their share of that time too, and their share is dropped: they are
    not learned, as they are not when each statement is read at its ends. So a statement is
    charged exactly its backend's CPU when it is the only one that backend served in a Δ; where
    several shared one Δ, the split is by time held, not by CPU (a statement that waits on a
    lock, a sleep or its client is charged some of its neighbours' CPU, within that Δ only).

    Every backend is read once when first seen among the postmaster's children (each sample
    lists them), so a statement's span starts from a baseline. The statements of a backend
    newer than the last sample (whose CPU so far is its connection's setup too), or gone by
    the next one, are left unmeasured (``end`` gives None, as for a job whose CPU is not
    known), not charged 0. Workers are
    counted as in ``PostgresJobs`` but only as sampled: a worker's CPU after its last sample is
    not seen (``finish`` is for a training run's end).
    """

    def __init__(self) -> None:
        super().__init__()
        self.read_at: dict[int, float] = {}  # backend → when its CPU was last read
        self.started: dict[int, int] = {}  # process → its start: a reused pid is a new process
        self.readings: dict[int, TaskReading] = {}  # the backends read at this sample
        self.seen_workers: dict[int, list[int]] = {}  # at the last sample, by leader
        self.starts: dict[Hashable, float] = {}  # admitted since the last sample: when
        self.owed: dict[Hashable, float] = {}  # … and what they were charged before ``begin``
        self.unmeasured: set[Hashable] = set()  # charged nothing for a span: CPU unknown
        self.passing: dict[Hashable, tuple[int, float]] = {}  # bypass jobs: backend, since
        self._workers: dict[int, list[int]] = {}

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None:
        if pid is None:
            return
        seen = self.seen_workers.get(pid)
        j = _PgJob(pid, 0.0, 0.0, earlier=set(seen) if seen else NO_WORKERS)
        j.start = self.starts.pop(job, 0.0)
        j.charged = self.owed.pop(job, 0.0)
        self.jobs[job] = j
        self.klass[job] = klass

    def settle(self, events: Sequence[Event], now: float) -> None:
        stops: dict[Hashable, float] = {}
        begun: list[tuple[Hashable, int, float]] = []
        for admitted, job, klass, pid, at in events:
            if not admitted:
                stops[job] = at
            elif pid is None:
                continue
            elif klass is None:
                self.passing[job] = (pid, at)
            else:
                begun.append((job, pid, at))
                self.starts[job] = at
        spans: dict[int, list[tuple[Hashable, float, float]]] = {}
        for job, j in self.jobs.items():
            spans.setdefault(j.leader, []).append((job, j.start, stops.get(job, now)))
        for job, pid, at in begun:
            spans.setdefault(pid, []).append((job, at, stops.get(job, now)))
        for job, (pid, at) in self.passing.items():
            spans.setdefault(pid, []).append((job, at, stops.get(job, now)))
        self.readings = {}
        for pid, held in spans.items():
            self._charge(pid, held, now)
        for job in stops:
            self.passing.pop(job, None)
        if self.reaped_at_start is None:  # (once a backend has named the postmaster)
            self._open_window()

    def _charge(self, pid: int, held: list[tuple[Hashable, float, float]], now: float) -> None:
        reading = self.probe.read(pid)
        if reading is None:  # the backend is gone (its client left): what it used, unknown
            self.unmeasured.update(job for job, _, _ in held if job not in self.passing)
            return
        self.readings[pid] = reading
        same = self.started.get(pid) == reading.started
        before = self.last_cpu.get(pid) if same else None
        since = self.read_at.get(pid) if same else None
        self.last_cpu[pid], self.read_at[pid] = reading.cpu, now
        self.started[pid] = reading.started
        if before is None:  # newer than the last sample's list (or the first sample): its
            # CPU so far is its connection's setup too, not only these statements'
            self.unmeasured.update(job for job, _, _ in held if job not in self.passing)
            return
        if since is None:
            since = min(start for _, start, _ in held)
        weights = {job: max(0.0, min(stop, now) - max(start, since)) for job, start, stop in held}
        if not any(weights.values()):
            weights = dict.fromkeys(weights, 1.0)
        for job, share in attribute(max(0.0, reading.cpu - before), weights).items():
            j = self.jobs.get(job)
            if j is not None:
                j.charged += share
            elif job not in self.passing:
                self.owed[job] = self.owed.get(job, 0.0) + share

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        tasks, forks = super().sample()  # (its ``workers`` lists the postmaster's children)
        workers = self.seen_workers = self._workers
        parallel = {pid for group in workers.values() for pid in group}
        listed = set(self.probe.children)
        for pid in [p for p in self.started if p not in listed]:  # gone: a pid used again
            del self.started[pid]  # is another process, read afresh
        for pid in listed:  # a baseline for each backend new since the last sample
            if pid not in self.started and pid not in parallel:
                reading = self.probe.read(pid)
                if reading is not None:
                    self.last_cpu[pid], self.started[pid] = reading.cpu, reading.started
        return tasks, forks

    def _workers_now(self) -> dict[int, list[int]]:
        self._workers = self.probe.workers()
        return self._workers

    def _leader(self, pid: int) -> TaskReading | None:
        return self.readings.get(pid)  # read by ``settle`` at this sample

    def end(self, job: Hashable) -> float | None:
        j = self.jobs.pop(job, None)
        self.klass.pop(job, None)
        self.owed.pop(job, None)
        if job in self.unmeasured:
            self.unmeasured.discard(job)
            return None
        if j is None:
            return None
        return j.charged + sum(j.workers.values())  # its workers as last sampled

    def _kept(self) -> set[int]:
        alive = set(self.probe.children)  # (as the last sample listed them)
        self.passing = {job: v for job, v in self.passing.items() if v[0] in alive}
        self.read_at = {pid: at for pid, at in self.read_at.items() if pid in alive}
        self.started = {pid: at for pid, at in self.started.items() if pid in alive}
        return alive  # a backend's reading is its next statement's baseline


class RemotePostgresJobs:
    """A server without /proc access: ``pg_stat_activity`` counts active processes."""

    exact_cpu = False

    def __init__(self, conninfo: str, cores: int) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.cores = cores
        self.jobs: dict[Hashable, int] = {}
        self.cpu: dict[Hashable, float] = {}
        # cores each job was estimated to use at the last sample, held until the next one
        # (the estimator's own hold for tasks), charged for the time that actually passed:
        # a nominal interval per sample overcounts whenever samples come late
        self._rate: dict[Hashable, float] = {}
        self._at: float | None = None

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None:
        if pid is not None:
            self.jobs[job] = pid
            self.cpu[job] = 0.0

    def _charge(self, now: float) -> None:
        if self._at is not None and now > self._at:
            dt = now - self._at
            for job, rate in self._rate.items():
                if job in self.cpu:
                    self.cpu[job] += rate * dt  # an estimate: see the model's notes
        self._at = now

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        rows = self.conn.execute(
            "select coalesce(leader_pid, pid), count(*) from pg_stat_activity "
            "where state = 'active' and pid <> pg_backend_pid() group by 1"
        ).fetchall()
        self._charge(time.monotonic())
        active = {int(leader): int(n) for leader, n in rows}
        total = sum(active.values()) or 1
        share = min(1.0, self.cores / total)
        tasks: dict[Hashable, float] = {}
        self._rate = {}
        for job, pid in self.jobs.items():
            n = active.get(pid, 0)
            tasks[job] = n
            self._rate[job] = n * share
        return tasks, None

    def settle(self, events: Sequence[Event], now: float) -> None:
        pass  # nothing read per statement

    def end(self, job: Hashable) -> float | None:
        self.jobs.pop(job, None)
        rate = self._rate.pop(job, 0.0)
        if rate and self._at is not None and job in self.cpu:
            self.cpu[job] += rate * max(0.0, time.monotonic() - self._at)
        return self.cpu.pop(job, None)


class DuckDBJobs:
    """DuckDB's threads in this process, shared out among the statements in flight.

    Each Δ, the threads in execution and the CPU the database's threads used since the last
    sample (both from /proc) are split among the statements in flight in proportion to their
    class's weight (its parallelism alone). DuckDB's profiler also reports each statement's
    CPU (``profiled``), but under contention its operator timings count time spent waiting for
    a core, so the split of the OS's own count is what U_r is made of.
    """

    exact_cpu = True

    def __init__(self, probe: ThreadProbe, weights: Mapping[str, float] | None = None) -> None:
        self.probe = probe
        self.weights = dict(weights or {})
        self.jobs: dict[Hashable, float] = {}
        self.cpu: dict[Hashable, float] = {}
        self.profiled: dict[Hashable, float] = {}
        self.memory: dict[Hashable, float] = {}  # the profiler's bytes allocated, per job
        self.spilled: dict[Hashable, float] = {}
        self.latency: dict[Hashable, float] = {}  # DuckDB's own wall time, per job
        self.last_cpu: float | None = None

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None:
        self.jobs[job] = self.weights.get(klass, 1.0)
        self.cpu[job] = 0.0

    def measured(
        self,
        job: Hashable,
        cpu: float | None,
        memory: float | None = None,
        spilled: float | None = None,
        latency: float | None = None,
    ) -> None:
        if cpu is not None:
            self.profiled[job] = self.profiled.get(job, 0.0) + cpu
            if latency is not None:
                self.latency[job] = self.latency.get(job, 0.0) + latency
        if memory is not None:  # several statements in one job: the largest
            self.memory[job] = max(self.memory.get(job, 0.0), memory)
        if spilled is not None:
            self.spilled[job] = self.spilled.get(job, 0.0) + spilled

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        running, cpu = self.probe.read()
        used = cpu - self.last_cpu if self.last_cpu is not None else 0.0
        self.last_cpu = cpu
        if not self.jobs:
            return {}, None
        for job, share in attribute(used, self.jobs).items():
            self.cpu[job] += share
        return attribute(running, self.jobs), None

    def settle(self, events: Sequence[Event], now: float) -> None:
        pass  # nothing read per statement

    def end(self, job: Hashable) -> float | None:
        self.jobs.pop(job, None)
        return self.cpu.pop(job, None)


class Recorder:
    """Scheduler events and periodic samples into one ``Estimator``.

    ``describe(job)`` gives a granted job's class key and its backend pid (or None); it runs on
    the proxy's loop inside the scheduler's listener, while the job is known to the gate.

    ``deferred`` (what ``serve`` uses): an admission or completion is only noted, with its
    time, without a lock; the sampling thread replays the notes in order at its next sample
    (``Jobs.settle`` first), so the estimator sees exactly what it would have seen at once and
    the proxy's loop does no /proc read and takes no lock per statement.
    """

    def __init__(
        self,
        estimator: Estimator,
        jobs: Jobs,
        describe: Callable[[Hashable], tuple[str, int | None]],
        interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        deferred: bool = False,
    ) -> None:
        self.deferred = deferred
        self.events: deque[Event] = deque()  # deferred: appended by the loop, taken here
        self.failure: str | None = None  # why sampling stopped by itself
        self.estimator = estimator
        self.jobs = jobs
        self.describe = describe
        self.interval = interval
        self.clock = clock
        self.lock = threading.Lock()
        self.recording = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.sampler_cpu = 0.0  # the sampling thread's own CPU seconds
        self.sampler_tid: int | None = None

    # the scheduler's listener (the proxy's event loop)

    def on_event(self, event: Any) -> None:
        if not self.recording or event.detail == "bypass":
            return
        if event.kind == "grant":
            klass, pid = self.describe(event.job)
            self.admitted(event.job, klass, pid)
        elif event.kind == "release":
            self.released(event.job)

    def admitted(self, job: Hashable, klass: str, pid: int | None) -> None:
        """A statement of class ``klass`` (served by process ``pid``, if one) was admitted."""
        if self.deferred:
            self.events.append((True, job, klass, pid, self.clock()))  # deque: thread-safe
            return
        with self.lock:
            self._admit(job, klass, pid, self.clock())

    def released(self, job: Hashable) -> None:
        """A statement left: its tasks and CPU are counted to its end."""
        if self.deferred:
            self.events.append((False, job, "", None, self.clock()))
            return
        with self.lock:
            self._release(job, self.clock())

    def _admit(self, job: Hashable, klass: str, pid: int | None, at: float) -> None:
        self.jobs.begin(job, klass, pid)
        self.estimator.admit(job, klass, at)

    def _release(self, job: Hashable, at: float) -> None:
        if job in self.estimator.jobs:
            cpu = self.jobs.end(job)
            self.estimator.complete(job, at, cpu)

    def flush(self) -> None:
        """Deferred: replay what was noted so far (the sampling thread does, every Δ)."""
        with self.lock:
            try:
                self._replay(self.clock())
            except Exception as e:
                self._failed(e)

    def passed(self, job: Hashable, pid: int | None) -> None:
        """Deferred: a statement that passed admission (session control, inside a transaction
        block) holds backend ``pid``: not learned, but a share of that backend's time."""
        if self.deferred:
            self.events.append((True, job, None, pid, self.clock()))

    def passed_done(self, job: Hashable) -> None:
        if self.deferred:
            self.events.append((False, job, None, None, self.clock()))

    def _replay(self, now: float) -> None:
        """Deferred: the events noted up to ``now``, in order (under the lock)."""
        events: list[Event] = []
        queue = self.events
        while queue and queue[0][4] <= now:
            events.append(queue.popleft())
        jobs, estimator = self.jobs, self.estimator
        jobs.settle(events, now)
        last = estimator.last if estimator.last is not None else -math.inf
        begin, admit, end, complete = jobs.begin, estimator.admit, jobs.end, estimator.complete
        in_flight = estimator.jobs
        for admitted, job, klass, pid, at in events:  # (``_admit`` and ``_release``, inlined)
            if klass is None:
                continue  # a bypass statement: its backend's time only (``settle``)
            if at < last:  # (noted just after a sample read the clock)
                at = last
            if admitted:
                begin(job, klass, pid)
                admit(job, klass, at)
            elif job in in_flight:
                complete(job, at, end(job))

    # sampling

    def start(self) -> None:
        self.recording = True
        self.events.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        while self.sampler_tid is None:
            time.sleep(0.001)

    def stop(self) -> None:
        """Take a last sample and stop; jobs still in flight stay unfinished."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.recording = False

    def sample_now(self) -> None:
        with self.lock:
            if self.deferred:
                now = self.clock()
                self._replay(now)
                tasks, forks = self.jobs.sample()
            else:
                tasks, forks = self.jobs.sample()
                now = self.clock()
            self.estimator.sample(now, tasks, forks)
            self.samples += 1

    def _run(self) -> None:
        self.sampler_tid = threading.get_native_id()
        started = time.thread_time()
        next_at = self.clock()
        try:
            while True:
                self.sample_now()
                next_at += self.interval
                if self._stop.wait(max(0.0, next_at - self.clock())):
                    break
            self.sample_now()
        except Exception as e:  # nothing is noted for ever for a thread that is gone
            self._failed(e)
        self.sampler_cpu = time.thread_time() - started

    def _failed(self, e: Exception) -> None:
        log.error("the sampler failed and stopped", exc_info=e)
        self.failure = f"{type(e).__name__}: {e}"
        self.recording = False
        self.events.clear()
