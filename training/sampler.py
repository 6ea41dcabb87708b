"""The sampler: every Δ, how many tasks each statement in flight has in execution.

A ``Recorder`` listens to the proxy's scheduler (admissions and completions, on the proxy's
event loop) and runs a sampling thread; both feed one ``Estimator`` under a lock. What a task is
depends on the backend:

* ``PostgresJobs``: the statement's backend process and its parallel workers, read from /proc by
  pid; in execution means state R, and the fork profile counts them running or not. CPU per
  statement = the backend's CPU from admission to completion (read at both instants) + each
  worker's CPU as last sampled; the workers' unseen last moments are recovered at the end.
  ``per_tick`` (what ``serve`` uses): no /proc read per statement — each Δ every backend that
  served a statement since the last sample is read once, and its CPU since then is shared
  among those statements by the time each held it (a few reads per Δ, at any rate).
* ``RemotePostgresJobs``: a server on another machine, so no /proc: active leaders and workers
  from ``pg_stat_activity``; CPU is *estimated* as each active process's share of M cores.
* ``DuckDBJobs``: DuckDB's threads run in this process and serve whichever statement needs
  them, so the threads in execution, and the CPU they use, are split among the statements in
  flight in proportion to their class's parallelism in isolation (from DuckDB's profiler).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from training.estimate import Estimator, attribute
from training.proc import PostgresProbe, TaskReading, ThreadProbe, children

__all__ = ["DuckDBJobs", "PostgresJobs", "Recorder", "RemotePostgresJobs"]


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
Event = tuple[bool, Hashable, str, int | None, float]


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

    def __init__(self, per_tick: bool = False) -> None:
        """``per_tick``: read each backend once per sample, not at every admission and
        completion (``settle``; what the proxy uses while serving: a /proc read per statement
        costs a short-statement workload most of its throughput)."""
        self.probe = PostgresProbe()
        self.per_tick = per_tick
        self.jobs: dict[Hashable, _PgJob] = {}
        self.klass: dict[Hashable, str] = {}
        self.reaped_at_start: float | None = None
        self.last_cpu: dict[int, float] = {}  # every process read: pid → CPU last seen
        self.worker_class: dict[int, str] = {}
        # per tick: when each backend was last read, this sample's readings of the backends,
        # the workers seen at the last sample (by leader), CPU owed to jobs not begun yet
        self.read_at: dict[int, float] = {}
        self.readings: dict[int, TaskReading] = {}
        self.seen_workers: dict[int, list[int]] = {}
        self.owed: dict[Hashable, float] = {}
        self.starts: dict[Hashable, float] = {}

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
        if self.per_tick:  # nothing read: ``settle`` did, for the whole interval
            seen = self.seen_workers.get(pid)
            j = _PgJob(pid, 0.0, 0.0, earlier=set(seen) if seen else NO_WORKERS)
            j.start = self.starts.pop(job, 0.0)
            j.charged = self.owed.pop(job, 0.0)
            self.jobs[job] = j
            self.klass[job] = klass
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
        """Per tick, before ``events`` (admissions and completions since the last sample, in
        order) are replayed: read once every backend that held a statement since then, and
        share its CPU since its last reading among those statements by the time each held it
        in that span (the whole of it: between statements a session's backend idles; a
        backend's first reading is its baseline, so its first statements here are charged
        nothing)."""
        if not self.per_tick:
            return
        stops: dict[Hashable, float] = {}
        begun: list[tuple[Hashable, int, float]] = []
        for admitted, job, _klass, pid, at in events:
            if not admitted:
                stops[job] = at
            elif pid is not None:
                begun.append((job, pid, at))
                self.starts[job] = at
        spans: dict[int, list[tuple[Hashable, float, float]]] = {}
        for job, j in self.jobs.items():
            spans.setdefault(j.leader, []).append((job, j.start, stops.get(job, now)))
        for job, pid, at in begun:
            spans.setdefault(pid, []).append((job, at, stops.get(job, now)))
        self.readings = {}
        for pid, held in spans.items():
            reading = self.probe.read(pid)
            if reading is None:
                continue
            self.readings[pid] = reading
            before, since = self.last_cpu.get(pid), self.read_at.get(pid)
            self.last_cpu[pid], self.read_at[pid] = reading.cpu, now
            if before is None:
                continue
            since = since if since is not None else min(start for _, start, _ in held)
            weights = {
                job: max(0.0, min(stop, now) - max(start, since)) for job, start, stop in held
            }
            if not any(weights.values()):
                weights = dict.fromkeys(weights, 1.0)
            for job, share in attribute(max(0.0, reading.cpu - before), weights).items():
                held_by = self.jobs.get(job)
                if held_by is not None:
                    held_by.charged += share
                else:
                    self.owed[job] = self.owed.get(job, 0.0) + share
        if self.reaped_at_start is None:  # (once a backend has named the postmaster)
            self._open_window()  # every other backend's baseline

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        workers = self.probe.workers()
        tasks: dict[Hashable, float] = {}
        forks: dict[Hashable, float] = {}
        for job, j in self.jobs.items():
            leader = self.readings.get(j.leader) if self.per_tick else self.probe.read(j.leader)
            n = 0
            mine = [w for w in workers.get(j.leader, ()) if w not in j.earlier]
            forks[job] = 1 + len(mine)
            if leader is not None:
                n += leader.running
                j.leader_cpu = self.last_cpu[j.leader] = leader.cpu
            for pid in mine:
                n += self._worker(j, self.klass[job], pid)
            tasks[job] = n
        if self.per_tick:
            self.seen_workers = workers
        return tasks, forks

    def end(self, job: Hashable) -> float | None:
        j = self.jobs.pop(job, None)
        klass = self.klass.pop(job, "")
        if j is None:
            self.owed.pop(job, None)
            return None
        if self.per_tick:  # its backend's share, and its workers as last sampled
            return j.charged + sum(j.workers.values())
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
        if self.per_tick:  # a backend's reading is its next statement's baseline
            postmaster = self.probe.postmaster
            alive = set(children(postmaster)) if postmaster is not None else set()
            keep.update(pid for pid in self.read_at if pid in alive)
            self.read_at = {pid: at for pid, at in self.read_at.items() if pid in keep}
        self.last_cpu = {pid: cpu for pid, cpu in self.last_cpu.items() if pid in keep}
        self.worker_class = {pid: k for pid, k in self.worker_class.items() if pid in keep}

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


class RemotePostgresJobs:
    """A server without /proc access: ``pg_stat_activity`` counts active processes."""

    exact_cpu = False

    def __init__(self, conninfo: str, cores: int, interval: float) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.cores = cores
        self.interval = interval
        self.jobs: dict[Hashable, int] = {}
        self.cpu: dict[Hashable, float] = {}

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None:
        if pid is not None:
            self.jobs[job] = pid
            self.cpu[job] = 0.0

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        rows = self.conn.execute(
            "select coalesce(leader_pid, pid), count(*) from pg_stat_activity "
            "where state = 'active' and pid <> pg_backend_pid() group by 1"
        ).fetchall()
        active = {int(leader): int(n) for leader, n in rows}
        total = sum(active.values()) or 1
        share = min(1.0, self.cores / total)
        tasks: dict[Hashable, float] = {}
        for job, pid in self.jobs.items():
            n = active.get(pid, 0)
            tasks[job] = n
            self.cpu[job] += n * share * self.interval  # an estimate: see the model's notes
        return tasks, None

    def settle(self, events: Sequence[Event], now: float) -> None:
        pass  # nothing read per statement

    def end(self, job: Hashable) -> float | None:
        self.jobs.pop(job, None)
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
            self._replay(self.clock())

    def _replay(self, now: float) -> None:
        """Deferred: the events noted up to ``now``, in order (under the lock)."""
        events: list[Event] = []
        queue = self.events
        while queue and queue[0][4] <= now:
            events.append(queue.popleft())
        self.jobs.settle(events, now)
        for admitted, job, klass, pid, at in events:
            if admitted:
                self._admit(job, klass, pid, at)
            else:
                self._release(job, at)

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
        while True:
            self.sample_now()
            next_at += self.interval
            if self._stop.wait(max(0.0, next_at - self.clock())):
                break
        self.sample_now()
        self.sampler_cpu = time.thread_time() - started
