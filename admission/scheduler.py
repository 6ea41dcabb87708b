"""The admission scheduler: a requester (queues + policy) in front of a granter (capacity).

Theory of operation
-------------------
Jobs (statement executions) are ``submit``-ted with a class fingerprint and the current time.
Each class has a FIFO queue. Whenever capacity may have freed (a submit, a completion, released
tasks, a cancel, a limit or policy change, or a ``tick`` at a deadline) the scheduler *dispatches*:
it repeatedly picks a job and admits it while the granter has room.

The pick. If the oldest queued job has waited ``max_wait`` or more it is picked (aging).
Then, for a policy that ages in units of expected time (the latency policy: a ``due_scale`` per
class, D_r), a class's oldest job is *due* once it has waited ``due_factor`` × its class's scale;
of the due heads the largest wait/scale is picked (ties: earliest arrival), O(K) since a class's
oldest job has its class's largest ratio. Otherwise the policy's class
r* = argmax_r bias_r + Σ_c η[r][c]·N_c over non-empty classes is chosen, ties going to the
earliest arrival, and its oldest job is picked. N_c is the number
of class-c tasks in service *now*; the score vector η·N is kept up to date incrementally when
N changes, so a decision costs O(K) in the number of classes and nothing in the queue length.

The grant. A picked job fits when jobs in service < MPL and its nominal fork size f fits in the
thread budget: f ≤ N_fcr − n_fcr. In faithful mode (the thesis) a picked job that does not fit
blocks the queue until capacity frees (head-of-line). With ``backfill`` the best-scoring class
whose head fits is admitted instead; an aged or due job still blocks, or it would starve.

Overload (adaptive LIFO). With ``lifo_after`` set, once the queue has not been empty for that
long the scheduler is *overloaded*: the policy still chooses the class, but within a class, and
between classes of equal score, the newest statement goes first, and aging and due jobs wait.
Under a standing queue the oldest statements are the ones least likely to be worth answering
(their clients have waited longest and the queue timeout is closest), and serving them first
makes every statement wait the full queue; serving the newest keeps the admitted statements'
wait short while the queue timeout (and ``make_room``, for a bounded queue) sheds the oldest.
The queue's emptying ends it: at once FIFO again.

Capacity is given back by ``complete`` (all of it) or ``update_tasks`` (the simulator frees the
budget task by task). ``bypass`` jobs (session control, statements inside a transaction block)
are admitted at once and counted against capacity. A job whose fork size exceeds the whole
budget is admitted when the budget is entirely free, and holds all of it.

Classes. A fingerprint not in the model is learned as a class of its own, with the default
profile, until ``max_classes`` classes beyond the model's were learned; shapes beyond that share
one class, OTHER.

Preconditions: ``now`` never decreases between calls; job ids are unique among live jobs.
Nothing here reads a clock or does I/O: the proxy and the simulator both drive this object.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from admission.model import EtaModel
from admission.policies import Policy, policy_by_name

__all__ = [
    "DUE_FACTOR",
    "MAX_CLASSES",
    "OTHER",
    "Event",
    "Job",
    "JobState",
    "Limits",
    "Scheduler",
    "SchedulerStats",
]

# The latency policy's default: a job is due after waiting 20 × its class's D_r (chosen in the
# simulator on open load, benchmarks/open_policies.py).
DUE_FACTOR = 20.0

# Classes the scheduler learns live, at most (the model's own are always kept). Learning a
# class rebuilds the policy's K × K matrix, so each one costs O(K²): 3 ms at K = 256, 50 ms at
# 1,000 here; an application that sends ever new statement shapes (generated SQL, a fuzzer)
# would stall the event loop more with every one. Beyond the cap, new shapes share OTHER.
MAX_CLASSES = 256
OTHER = "(other)"  # the fingerprint and name of the class every shape beyond the cap shares

_RECOMPUTE_EVERY = 4096  # exact recomputation of η·N bounds floating-point drift
_NEVER = float("-inf")
_FOREVER = float("inf")


class JobState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed out"
    SHED = "shed"  # the oldest queued job, taken out under overload to make room


@dataclass(frozen=True, slots=True)
class Limits:
    """Granter capacity; ``None`` means unlimited."""

    mpl: int | None = None
    threads: int | None = None  # N_fcr, the thread budget
    memory: int | None = None  # bytes: the memory budget, M_r of each admitted job reserved
    backfill: bool = False
    max_wait: float | None = None  # aging: admit next after waiting this long
    queue_timeout: float | None = None  # fail a job still queued after this long
    # latency policy: a job is due once it waited due_factor × D_r of its class (None: never)
    due_factor: float | None = DUE_FACTOR
    # adaptive LIFO: the newest first once the queue has not been empty this long (None: never)
    lifo_after: float | None = None

    def __post_init__(self) -> None:
        for name in ("mpl", "threads", "memory"):
            value = getattr(self, name)
            # an MPL of 0 admits nothing (but bypass jobs): a proxy that holds no share of a
            # global budget (proxy.coordinator)
            if value is not None and value < (0 if name == "mpl" else 1):
                raise ValueError(f"{name} must be at least 1 (or unlimited), not {value}")
        for name in ("max_wait", "queue_timeout", "due_factor", "lifo_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, not {value}")


class _ClassState:
    """One class's queue and its tasks in service."""

    __slots__ = ("fingerprint", "fork", "index", "live", "memory", "name", "queue", "tasks")

    def __init__(self, fingerprint: str, name: str, index: int, fork: int, memory: int = 0) -> None:
        self.fingerprint, self.name, self.index, self.fork = fingerprint, name, index, fork
        self.memory = memory  # bytes a job of the class reserves (M_r; 0: not measured)
        self.queue: deque[Job] = deque()  # invariant: empty, or queue[0] is QUEUED
        self.live = 0  # queued jobs not cancelled or timed out
        self.tasks = 0  # N_c

    def __repr__(self) -> str:
        return f"<class {self.name} #{self.index}: {self.live} queued, {self.tasks} tasks>"


@dataclass(slots=True, eq=False)
class Job:
    id: Hashable
    klass: _ClassState
    arrival: float
    seq: int
    fork: int
    state: JobState = JobState.QUEUED
    admitted_at: float | None = None
    held: int = 0  # thread-budget units held
    memory: int = 0  # bytes it reserves under a memory budget (its class's M_r)
    memory_held: int = 0  # bytes of the memory budget held
    tasks: int = 0  # tasks in service, counted in N_c
    bypass: bool = False
    aged: bool = False
    due: bool = False  # picked as due by the latency policy's aging

    @property
    def fingerprint(self) -> str:
        return self.klass.fingerprint

    @property
    def class_name(self) -> str:
        return self.klass.name


@dataclass(slots=True)  # not frozen: frozen construction costs 4×, and one is made per change
class Event:
    """A visible change: submit, grant, release, cancel, timeout. Read-only by convention."""

    kind: str
    time: float
    job: Hashable
    class_name: str
    detail: str = ""


@dataclass(slots=True)
class SchedulerStats:
    submitted: int = 0
    admitted: int = 0
    bypassed: int = 0
    completed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    aged: int = 0  # picked by aging: max_wait, or the latency policy's due rule
    unknown_classes: int = 0
    newest_first: int = 0  # admitted newest-first under overload (adaptive LIFO)
    shed: int = 0  # oldest queued job shed by make_room
    over_cap: int = 0  # jobs of a new shape put in OTHER: the class cap was reached


class _Mode(Enum):
    """How the scores are kept (chosen from the η matrix's shape when the policy is compiled)."""

    STATIC = "static"  # η = 0: the score is the bias alone (FCFS, SEPT)
    ROW = "row"  # η[r][c] = a_r: the order is a's whenever anything is in service (−Q_r, U_r)
    FULL = "full"  # anything else: bias + η·N kept up to date (−A^c_r, P_{r,c})


# Enum member access is a descriptor call; the hot paths use these aliases instead.
_QUEUED, _RUNNING, _DONE = JobState.QUEUED, JobState.RUNNING, JobState.DONE
_STATIC, _ROW, _FULL = _Mode.STATIC, _Mode.ROW, _Mode.FULL


class Scheduler:
    """Requester + granter; see the module docstring for the theory of operation."""

    def __init__(
        self,
        model: EtaModel | None = None,
        policy: str | Policy = "fcfs",
        limits: Limits | None = None,
        listener: Callable[[Event], None] | None = None,
        on_grant: Callable[[Job, Sequence[int]], None] | None = None,
        on_finish: Callable[[Job, float], None] | None = None,
        max_classes: int | None = MAX_CLASSES,
    ) -> None:
        if max_classes is not None and max_classes < 1:
            raise ValueError(f"max_classes must be at least 1 (or unlimited), not {max_classes}")
        self.max_classes = max_classes
        self.model = model if model is not None else EtaModel()
        self.policy = policy if isinstance(policy, Policy) else policy_by_name(policy)
        self.limits = limits or Limits()
        # Observers (see ``observe``): None, or the one callable that tells all of them.
        self._on_event: Callable[[Event], None] | None = None
        self._on_grant: Callable[[Job, Sequence[int]], None] | None = None
        self._on_finish: Callable[[Job, float], None] | None = None
        self.observe(events=listener, grants=on_grant, finishes=on_finish)
        self.stats = SchedulerStats()
        self.timed_out: list[Job] = []  # filled by dispatch/tick; drivers drain it
        self._classes: list[_ClassState] = []
        self._by_fp: dict[str, _ClassState] = {}
        self._jobs: dict[Hashable, Job] = {}
        self._seq = 0
        self._now = _NEVER
        self.running = 0  # jobs in service (read-only outside, like queued)
        self.queued = 0  # jobs waiting (read-only outside; an attribute: read per statement)
        self._held = 0  # n_fcr: budget units held
        self._memory_held = 0  # bytes of the memory budget held
        self._n_total = 0
        self._tasks: list[int] = []  # N_c, by class index
        self._head_seq: list[int] = []  # arrival seq of each non-empty class's oldest job
        self._nonempty: list[int] = []  # indices of classes with queued jobs
        self._mode = _STATIC
        self._bias: list[float] = []
        self._row: list[float] = []  # a_r, in ROW mode
        self._eta = np.zeros((0, 0))  # η, in FULL mode
        self._columns: list[np.ndarray] = []  # columns[c][r] = η[r][c], in FULL mode
        self._fork_columns: list[np.ndarray] = []  # f_c · columns[c]: a grant or a release
        self._score = np.zeros(0)  # bias + η·N, in FULL mode
        self._flat_bias = self._flat_row = True  # every key equal: arrival order decides
        self._due_scale: list[float] | None = None  # per class, when the policy ages by it
        self._updates = 0
        # After a dispatch that ended blocked, the verdict stands until this time unless
        # something other than a submit to an already non-empty class happens.
        self._blocked_until = _NEVER
        self._busy_since = _NEVER  # when the queue last went from empty to non-empty
        self._learned = 0  # classes learned live, beyond the model's (what max_classes caps)
        self._base = frozenset(self.model.fingerprints)  # the model's own classes
        for c in self.model.classes:
            self._add_class_state(c.fingerprint, c.name, c.f, _memory(c.M))
        self._compile()

    # -- observation -----------------------------------------------------------------------

    def observe(
        self,
        *,
        events: Callable[[Event], None] | None = None,
        grants: Callable[[Job, Sequence[int]], None] | None = None,
        finishes: Callable[[Job, float], None] | None = None,
    ) -> None:
        """Register observers; each is called after those registered before it.

        ``events``: every visible change (``Event``), for logs, tests, training and the admin
        API. ``grants``: (job, N) right after each admission (A^c_r sampling). ``finishes``:
        (job, now) once per job when it leaves — done, cancelled or timed out (its state says
        which; arrival and admitted_at give its wait and response). Observers only read: they
        must not call back into the scheduler. One observer costs one call; more, one more.
        """
        self._on_event = _chain(self._on_event, events)
        self._on_grant = _chain(self._on_grant, grants)
        self._on_finish = _chain(self._on_finish, finishes)

    @property
    def in_service(self) -> int:
        return self.running

    @property
    def threads_in_use(self) -> int:
        return self._held

    @property
    def memory_in_use(self) -> int:
        """Bytes of the memory budget the running jobs hold (their classes' M_r)."""
        return self._memory_held

    @property
    def class_names(self) -> list[str]:
        return [st.name for st in self._classes]

    @property
    def fingerprints(self) -> list[str]:
        return [st.fingerprint for st in self._classes]

    def tasks_by_class(self) -> list[int]:
        """N_c for every class, in model order (a copy)."""
        return list(self._tasks)

    def queued_load(self) -> tuple[int, int]:
        """Threads (fork sizes) and memory (bytes, M_r) the queued jobs would take: what a
        proxy sharing a global budget asks for beyond what it holds (proxy.coordinator).
        O(queued): read at heartbeats, not per statement."""
        threads = memory = 0
        for st in self._classes:
            for job in st.queue:
                if job.state is _QUEUED:
                    threads += job.fork
                    memory += job.memory
        return threads, memory

    def queue_by_class(self) -> dict[str, int]:
        return {st.name: st.live for st in self._classes if st.live}

    def live_jobs(self) -> list[Job]:
        """Every job queued or in service (a copy)."""
        return list(self._jobs.values())

    def job(self, job_id: Hashable) -> Job | None:
        return self._jobs.get(job_id)

    def scores(self) -> list[float]:
        """The current score of every class (bias + η·N), for the admin API and tests."""
        if self._mode is _FULL:
            return [float(x) for x in self._score]
        if self._mode is _ROW:
            return [a * self._n_total for a in self._row]
        return list(self._bias)

    def class_index(self, fingerprint: str) -> int | None:
        st = self._by_fp.get(fingerprint)
        return None if st is None else st.index

    # -- commands --------------------------------------------------------------------------

    def submit(
        self,
        job_id: Hashable,
        fingerprint: str,
        now: float,
        *,
        name: str | None = None,
        fork: int | None = None,
        bypass: bool = False,
        sample_sql: str = "",
    ) -> list[Job]:
        """Queue a job (or admit it at once if ``bypass``); returns the jobs admitted now."""
        if now < self._now:
            self._advance(now)  # raises
        self._now = now
        jobs = self._jobs
        if job_id in jobs:
            raise ValueError(f"job {job_id!r} is already known to the scheduler")
        st = self._by_fp.get(fingerprint) or self._learn_class(fingerprint, name, sample_sql)
        job = Job(job_id, st, now, self._seq, st.fork if fork is None else max(1, fork))
        job.memory = st.memory
        self._seq += 1
        jobs[job_id] = job
        self.stats.submitted += 1
        if self._on_event is not None:
            self._emit("submit", job)
        if bypass:
            job.bypass = True
            self.stats.bypassed += 1
            self._blocked_until = _NEVER
            self._admit(job, now)
            return [job]
        if not self._nonempty:
            mpl = self.limits.mpl
            if (mpl is None or self.running < mpl) and self._fits(job):
                self._admit(job, now)  # nothing waits and it fits: the decision is trivial
                return [job]
        self._enqueue(st, job)
        if st.live > 1 and now < self._blocked_until:
            return []  # same heads, scores and capacity as the blocked decision just made
        return self._dispatch(now)

    def complete(self, job_id: Hashable, now: float) -> list[Job]:
        """The job finished (or its client or backend died): give back all it holds.

        Completing a queued job withdraws it; completing an unknown or finished job does
        nothing, so a driver may call this from every exit path.
        """
        if now < self._now:
            self._advance(now)  # raises
        self._now = now
        job = self._jobs.get(job_id)
        if job is None:
            return []
        if job.state is _QUEUED:
            return self._cancel(job, now)
        del self._jobs[job_id]
        tasks = job.tasks
        if tasks:
            job.tasks = 0
            st = job.klass  # _set_tasks(job, 0), written out
            st.tasks -= tasks
            self._tasks[st.index] = st.tasks
            self._n_total -= tasks
            if self._mode is _FULL:
                self._rescore(st, -tasks)
        self._held -= job.held
        job.held = 0
        self._memory_held -= job.memory_held
        job.memory_held = 0
        self.running -= 1
        job.state = _DONE
        self.stats.completed += 1
        if self._on_event is not None:
            self._emit("release", job)
        if self._on_finish is not None:
            self._on_finish(job, now)
        if not self._nonempty:
            self._blocked_until = _NEVER
            return []  # nothing waits: nothing to admit or time out (as _dispatch would find)
        return self._dispatch(now)

    def update_tasks(self, job_id: Hashable, tasks: int, release: int, now: float) -> list[Job]:
        """A running job now has ``tasks`` tasks in service and frees ``release`` budget units."""
        self._advance(now)
        job = self._jobs[job_id]
        if job.state is not _RUNNING:
            raise ValueError(f"job {job_id!r} is {job.state.value}, not running")
        self._set_tasks(job, tasks)
        self._blocked_until = _NEVER
        if release <= 0:
            return []
        freed = min(release, job.held)
        job.held -= freed
        self._held -= freed
        return self._dispatch(now) if freed else []

    def cancel(self, job_id: Hashable, now: float) -> list[Job]:
        """Withdraw a queued job (state CANCELLED). A running job is left to its driver."""
        self._advance(now)
        job = self._jobs.get(job_id)
        if job is None or job.state is not _QUEUED:
            return []
        return self._cancel(job, now)

    def tick(self, now: float) -> list[Job]:
        """Apply aging and queue timeouts due by ``now``; returns the jobs admitted."""
        self._advance(now)
        return self._dispatch(now)

    @property
    def timed(self) -> bool:
        """Whether ``next_deadline`` can name a time: aging, queue timeouts, or a policy that
        ages in units of expected time. A driver that sees False needs no timer."""
        limits = self.limits
        return (
            limits.max_wait is not None
            or limits.queue_timeout is not None
            or (self._due_scale is not None and limits.due_factor is not None)
        )

    def next_deadline(self) -> float | None:
        """When ``tick`` must next be called for aging, due jobs or timeouts to act on time."""
        if not self.timed:
            return None
        oldest = self._oldest()
        if oldest is None:
            return None
        times = []
        due, factor = self._due_scale, self.limits.due_factor
        if due is not None and factor is not None:
            # the earliest head to become due (one already due acts at the next capacity change)
            classes, now = self._classes, self._now
            soonest = _FOREVER
            for i in self._nonempty:
                due_at = classes[i].queue[0].arrival + factor * due[i]
                if now < due_at < soonest:
                    soonest = due_at
            if soonest < _FOREVER:
                times.append(soonest)
        if self.limits.max_wait is not None:
            # Once due, aging acts at the next capacity change: no tick can do more.
            aged_at = oldest.arrival + self.limits.max_wait
            if aged_at > self._now:
                times.append(aged_at)
        if self.limits.queue_timeout is not None:
            times.append(oldest.arrival + self.limits.queue_timeout)
        return min(times) if times else None

    def overloaded(self, now: float) -> bool:
        """Whether adaptive LIFO is on: ``lifo_after`` set and the queue not empty since at
        least that long before ``now`` (see the module docstring)."""
        after = self.limits.lifo_after
        return after is not None and self.queued > 0 and now - self._busy_since >= after

    def make_room(self, now: float) -> Job | None:
        """Under overload, shed the oldest queued job (state SHED) so that a new one can take
        its place in a full queue; the driver tells its client. None when not overloaded: the
        driver refuses the new job instead."""
        self._advance(now)
        if not self.overloaded(now):
            return None
        oldest = self._oldest()
        if oldest is None:
            return None
        self._pop_head(oldest.klass)  # (a class's head is its oldest live job)
        oldest.state = JobState.SHED
        del self._jobs[oldest.id]
        self.stats.shed += 1
        self._blocked_until = _NEVER  # the heads changed
        if self._on_event is not None:
            self._emit("shed", oldest, f"waited {now - oldest.arrival:g}s")
        if self._on_finish is not None:
            self._on_finish(oldest, now)
        return oldest

    def take_timed_out(self) -> list[Job]:
        """Jobs that timed out in the queue since the last call."""
        out, self.timed_out = self.timed_out, []
        return out

    def set_limits(self, limits: Limits, now: float) -> list[Job]:
        self._advance(now)
        self.limits = limits
        return self._dispatch(now)

    def set_policy(self, policy: str | Policy, now: float) -> list[Job]:
        self._advance(now)
        self.policy = policy if isinstance(policy, Policy) else policy_by_name(policy)
        self._compile()
        return self._dispatch(now)

    def set_model(self, model: EtaModel, now: float, *, base: bool = False) -> list[Job]:
        """Reload: the new model's classes first, then any class only seen live (its sample
        statement kept). ``base``: the model is one loaded anew (a file), whose classes are
        its own — ``max_classes`` caps the classes learned beyond them; otherwise (a model
        the live learning made) the classes learned so far still count."""
        self._advance(now)
        known = model.index()
        samples = {c.fingerprint: c.sample_sql for c in self.model.classes}
        for st in self._classes:
            if st.fingerprint not in known:
                model = model.with_class(st.fingerprint, st.name, samples.get(st.fingerprint, ""))
        if base:
            self._base = frozenset(model.fingerprints) - {
                st.fingerprint for st in self._classes if st.fingerprint not in known
            }
        self._learned = sum(1 for c in model.classes if c.fingerprint not in self._base)
        self.model = model
        by_fp = self._by_fp
        self._classes = []
        for i, c in enumerate(model.classes):
            st = by_fp.get(c.fingerprint) or _ClassState(c.fingerprint, c.name, i, c.f)
            st.index, st.fork, st.memory = i, c.f, _memory(c.M)
            self._classes.append(st)
        self._by_fp = {st.fingerprint: st for st in self._classes}
        self._tasks = [st.tasks for st in self._classes]
        self._head_seq = [st.queue[0].seq if st.live else 0 for st in self._classes]
        self._nonempty = [st.index for st in self._classes if st.live]
        self._compile()
        return self._dispatch(now)

    # -- internals -------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"time went backwards: {now} after {self._now}")
        self._now = now

    def _emit(self, kind: str, job: Job, detail: str = "") -> None:
        if self._on_event is not None:
            self._on_event(Event(kind, self._now, job.id, job.klass.name, detail))

    def _add_class_state(
        self, fingerprint: str, name: str, fork: int, memory: int = 0
    ) -> _ClassState:
        st = _ClassState(fingerprint, name, len(self._classes), fork, memory)
        self._classes.append(st)
        self._by_fp[fingerprint] = st
        self._tasks.append(0)
        self._head_seq.append(0)
        return st

    def _learn_class(self, fingerprint: str, name: str | None, sample_sql: str) -> _ClassState:
        cap = self.max_classes
        if cap is not None and self._learned >= cap and fingerprint != OTHER:
            other = self._by_fp.get(OTHER)  # (not remembered per shape: that would grow too)
            self.stats.over_cap += 1
            return other or self._learn_class(OTHER, OTHER, "")
        self.model = self.model.with_class(fingerprint, name or fingerprint, sample_sql)
        self.stats.unknown_classes += 1
        self._learned += 1
        new = self.model.classes[-1]
        st = self._add_class_state(fingerprint, name or fingerprint, new.f, _memory(new.M))
        self._compile()
        return st

    # Queues. Invariant: a class's deque is empty or starts with a QUEUED job; _head_seq and
    # _nonempty describe exactly the classes with live > 0.

    def _enqueue(self, st: _ClassState, job: Job) -> None:
        if not self.queued:
            self._busy_since = job.arrival
        st.queue.append(job)
        st.live += 1
        self.queued += 1
        if st.live == 1:
            self._head_seq[st.index] = job.seq
            self._nonempty.append(st.index)

    def _settle(self, st: _ClassState) -> None:
        """Drop withdrawn jobs from the front of the queue and record the new head."""
        queue = st.queue
        while queue and queue[0].state is not _QUEUED:
            queue.popleft()
        if queue:
            self._head_seq[st.index] = queue[0].seq
        else:
            self._nonempty.remove(st.index)

    def _pop_head(self, st: _ClassState) -> Job:
        job = st.queue.popleft()
        st.live -= 1
        self.queued -= 1
        self._settle(st)
        return job

    # Scores.

    def _compile(self) -> None:
        prio = self.policy.build(self.model)
        k = len(self._classes)
        eta, self._bias = prio.eta, list(prio.bias)
        self._flat_bias = len(set(self._bias)) <= 1
        self._due_scale = list(prio.due_scale) if prio.due_scale else None
        matrix = np.array(eta, dtype=float).reshape(k, k)  # (K² checks in C, not Python)
        if not matrix.any():
            self._mode = _STATIC
        elif not any(self._bias) and bool((matrix == matrix[:, :1]).all()):
            self._mode = _ROW
            self._row = matrix[:, 0].tolist()
            self._flat_row = len(set(self._row)) <= 1
        else:
            self._mode = _FULL
            self._eta = matrix
            self._columns = [np.ascontiguousarray(self._eta[:, c]) for c in range(k)]
            self._fork_columns = [
                col * st.fork for col, st in zip(self._columns, self._classes, strict=True)
            ]
        self._recompute_scores()

    def _recompute_scores(self) -> None:
        self._updates = 0
        if self._mode is _FULL:
            self._score = np.array(self._bias) + self._eta @ np.array(self._tasks, dtype=float)

    def _set_tasks(self, job: Job, tasks: int) -> None:
        """The job now has ``tasks`` tasks in service (N_c follows). _admit and complete, once
        per statement each, do the same written out: a Python call costs more than the work."""
        delta = tasks - job.tasks
        if not delta:
            return
        job.tasks = tasks
        st = job.klass
        st.tasks += delta
        self._tasks[st.index] = st.tasks
        self._n_total += delta
        if self._mode is _FULL:
            self._rescore(st, delta)

    def _rescore(self, st: _ClassState, delta: int) -> None:
        """Class ``st`` has ``delta`` more tasks in service: update bias + η·N."""
        self._updates += 1
        if self._n_total == 0 or self._updates >= _RECOMPUTE_EVERY:
            self._recompute_scores()  # exact scores when idle: ties go to arrival order
        elif delta == st.fork:
            self._score += self._fork_columns[st.index]
        elif delta == -st.fork:
            self._score -= self._fork_columns[st.index]
        elif delta == -1:
            self._score -= self._columns[st.index]
        else:
            self._score += delta * self._columns[st.index]

    # Grants.

    def _admit(self, job: Job, now: float) -> None:
        job.state = _RUNNING
        job.admitted_at = now
        fork = job.tasks = job.fork  # (a queued job has no tasks in service)
        budget = self.limits.threads
        held = job.held = fork if budget is None or fork <= budget else budget
        self._held += held
        memory = self.limits.memory
        if memory is not None:
            job.memory_held = min(job.memory, memory)
            self._memory_held += job.memory_held
        self.running += 1
        st = job.klass  # _set_tasks(job, fork), written out
        st.tasks += fork
        self._tasks[st.index] = st.tasks
        self._n_total += fork
        if self._mode is _FULL:
            self._rescore(st, fork)
        if not job.bypass:
            self.stats.admitted += 1
        if self._on_event is not None:
            detail = "bypass" if job.bypass else "aged" if job.aged else "due" if job.due else ""
            self._emit("grant", job, detail)
        if self._on_grant is not None:
            self._on_grant(job, self._tasks)

    def _cancel(self, job: Job, now: float) -> list[Job]:
        """Take a queued job out (cancelled, or its client went away)."""
        st = job.klass
        job.state = JobState.CANCELLED
        st.live -= 1
        self.queued -= 1
        del self._jobs[job.id]
        if st.queue[0] is job:
            self._settle(st)
        self.stats.cancelled += 1
        if self._on_event is not None:
            self._emit("cancel", job)
        if self._on_finish is not None:
            self._on_finish(job, now)
        return self._dispatch(now)

    def _oldest(self) -> Job | None:
        if not self._nonempty:
            return None
        return self._classes[min(self._nonempty, key=self._head_seq.__getitem__)].queue[0]

    def _expire(self, now: float) -> None:
        timeout = self.limits.queue_timeout
        if timeout is None or not self._nonempty:
            return
        for i in list(self._nonempty):
            st = self._classes[i]
            while st.live and st.queue[0].arrival + timeout <= now:
                job = self._pop_head(st)
                job.state = JobState.TIMED_OUT
                del self._jobs[job.id]
                self.stats.timed_out += 1
                self.timed_out.append(job)
                self._emit("timeout", job, f"waited {now - job.arrival:g}s")
                if self._on_finish is not None:
                    self._on_finish(job, now)

    def _fits(self, job: Job) -> bool:
        """Whether the job's threads and memory fit beside what the running jobs hold. A job
        asking more than a whole budget asks for all of it: it runs alone (never deadlocked)."""
        limits = self.limits
        budget, memory = limits.threads, limits.memory
        if budget is not None and min(job.fork, budget) > budget - self._held:
            return False
        return memory is None or min(job.memory, memory) <= memory - self._memory_held

    def _pick(self, now: float) -> Job | None:
        """The job to admit next: an aged job, else the best head (that fits, in backfill)."""
        candidates = self._nonempty
        if not candidates:
            return None
        classes = self._classes
        max_wait = self.limits.max_wait
        if max_wait is not None:
            oldest = self._oldest()
            if oldest is not None and now - oldest.arrival >= max_wait:
                if not oldest.aged:
                    oldest.aged = True
                    self.stats.aged += 1
                return oldest
        due, factor = self._due_scale, self.limits.due_factor
        if due is not None and factor is not None:
            picked = self._most_due(now, due, factor)
            if picked is not None:
                return picked
        if self.limits.backfill:
            candidates = [i for i in candidates if self._fits(classes[i].queue[0])]
            if not candidates:
                return None
        mode = self._mode
        if mode is _FULL:
            keys, flat = self._score.tolist(), False
        elif mode is _ROW and self._n_total > 0:
            keys, flat = self._row, self._flat_row
        else:
            keys, flat = self._bias, self._flat_bias
        seq = self._head_seq
        if flat:
            best = min(candidates, key=seq.__getitem__)
        else:
            best = max(candidates, key=keys.__getitem__)
            top = keys[best]
            if keys.count(top) > 1:  # a tie (perhaps with an empty class): arrival decides
                best = min((i for i in candidates if keys[i] == top), key=seq.__getitem__)
        return classes[best].queue[0]

    def _pick_newest(self, candidates: list[int]) -> Job | None:
        """Overloaded: the policy's best class (or, in backfill, the best whose newest job
        fits), ties going to the latest arrival, and that class's newest job."""
        classes = self._classes
        tails: dict[int, Job] = {}
        for i in candidates:
            queue = classes[i].queue
            while queue[-1].state is not _QUEUED:  # withdrawn jobs left behind (cancel)
                queue.pop()  # (stops at the head at the latest: it is queued)
            tails[i] = queue[-1]
        if self.limits.backfill:
            candidates = [i for i in candidates if self._fits(tails[i])]
            if not candidates:
                return None
        mode = self._mode
        if mode is _FULL:
            keys = self._score.tolist()
        elif mode is _ROW and self._n_total > 0:
            keys = self._row
        else:
            keys = self._bias
        top = max(keys[i] for i in candidates)
        job = max((tails[i] for i in candidates if keys[i] == top), key=lambda j: j.seq)
        return job

    def _most_due(self, now: float, due: list[float], factor: float) -> Job | None:
        """The due head with the largest wait/scale (ties: earliest arrival), or None."""
        best: Job | None = None
        best_ratio = -1.0
        classes = self._classes
        for i in self._nonempty:
            head = classes[i].queue[0]
            scale = due[i]
            if now >= head.arrival + factor * scale:
                ratio = (now - head.arrival) / scale if scale > 0 else _FOREVER
                if (
                    best is None
                    or ratio > best_ratio
                    or (ratio == best_ratio and head.seq < best.seq)
                ):
                    best, best_ratio = head, ratio
        if best is not None and not best.due:
            best.due = True
            self.stats.aged += 1
        return best

    def _dispatch(self, now: float) -> list[Job]:
        if self.limits.queue_timeout is not None:
            self._expire(now)
        if not self._nonempty:
            self._blocked_until = _NEVER
            return []
        granted: list[Job] = []
        mpl = self.limits.mpl
        head_seq = self._head_seq
        self._blocked_until = _NEVER
        lifo = self.limits.lifo_after
        newest = lifo is not None and now - self._busy_since >= lifo
        while mpl is None or self.running < mpl:
            if newest:
                job = self._pick_newest(self._nonempty) if self._nonempty else None
            else:
                job = self._pick(now)
            if job is None or not self._fits(job):
                # head-of-line (faithful, or an aged job); backfill found nothing that fits
                deadline = self.next_deadline()
                self._blocked_until = _FOREVER if deadline is None else deadline
                break
            st = job.klass
            queue = st.queue
            st.live -= 1
            self.queued -= 1
            if queue[0] is not job:  # the newest, picked under overload
                queue.pop()
                self._admit(job, now)
                granted.append(job)
                continue
            queue.popleft()
            if queue and queue[0].state is _QUEUED:
                head_seq[st.index] = queue[0].seq
            else:
                self._settle(st)
            self._admit(job, now)
            granted.append(job)
        if newest:
            self.stats.newest_first += len(granted)
        return granted


def _memory(m: float | None) -> int:
    """A class's reservation in whole bytes (a model without memory: none)."""
    return 0 if m is None else math.ceil(m)


def _chain(first: Callable[..., None] | None, then: Callable[..., None] | None) -> Any:
    """One callable that calls ``first`` and then ``then`` (either may be None)."""
    if first is None or then is None:
        return first if then is None else then

    def both(*args: Any) -> None:
        first(*args)
        then(*args)

    return both
