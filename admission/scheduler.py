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

Beside the MPL. Two options let a statement run while the MPL is full, at most MPL of them at
once, counted apart (``released_in_service``) and still within the thread and memory budgets:
``release_after`` gives the slot of a statement in service that long to the queue, and the
*short lane* (``short_lane``) admits a queued statement whose class's D_r is at most
1/short_lane of the least expected remaining time of those holding the MPL (D_r minus time in
service, but at least half D_r; for a class not measured yet, as long as it has run). The MPL
cannot preempt a long statement for a short one; the lane gets most of what preemption would
(shortest remaining first), for about the short statement's own D_r of delay to those in
service.

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

Tenants and tiers. With a workload config (``admission.workloads``) every job belongs to a
tenant and a tier, and its class queue is its *lane*'s (one per tenant and tier). The pick then
chooses the lane first — aged foreground heads, then the highest tier with work and room,
deficit round robin among that tier's tenants by weight (with the hold rule), background only
when the foreground is idle and predicted to stay so — and the policy orders the lane's
classes as above. Tenant limits (MPL, threads, memory share, queue timeout) apply on top of the
global ones. Without one there is a single lane and nothing of this costs anything.

Classes. A fingerprint not in the model is learned as a class of its own, with the default
profile, until ``max_classes`` classes beyond the model's were learned; shapes beyond that share
one class, OTHER.

Preconditions: ``now`` never decreases between calls; job ids are unique among live jobs.
Nothing here reads a clock or does I/O: the proxy and the simulator both drive this object.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from admission.model import ClassProfile, EtaModel
from admission.policies import Policy, policy_by_name
from admission.policies.latency import SHORT_LANE
from admission.workloads import DEFAULT_WORKLOAD, IdlePredictor, Tier, Workload, WorkloadConfig

__all__ = [
    "DUE_FACTOR",
    "MAX_CLASSES",
    "OTHER",
    "SHORT_LANE",
    "Event",
    "Job",
    "JobState",
    "Limits",
    "Scheduler",
    "SchedulerStats",
]

# The latency policy's default: a job is due after waiting 10 × its class's D_r. Chosen in the
# simulator over 14 mixes of trained TPC-H classes (benchmarks/tail_frontier.py): against 20,
# a median 1–4 points less mean reduction for 6–7 points less p99 and a worst p99 of 1.54× the
# best FCFS pool's instead of 1.83× (at ρ = 0.95); a lower factor costs more mean for little.
DUE_FACTOR = 10.0

# Classes the scheduler learns live, at most (the model's own are always kept). Learning a
# class rebuilds the policy's K × K matrix, so each one costs O(K²): 3 ms at K = 256, 50 ms at
# 1,000 here; an application that sends ever new statement shapes (generated SQL, a fuzzer)
# would stall the event loop more with every one. Beyond the cap, new shapes share OTHER.
MAX_CLASSES = 256
OTHER = "(other)"  # the fingerprint and name of the class every shape beyond the cap shares

_RECOMPUTE_EVERY = 4096  # exact recomputation of η·N bounds floating-point drift
_NEVER = float("-inf")
_FOREVER = float("inf")
# a statement that has run this many times its class's D_tail is one of the class's rare long
# ones (see _left); under contention a statement of an even class runs past D_tail, not twice it
_PAST_TAIL = 2.0
# and one that has run this many times its D_tail gives its MPL slot up (see _release_long)
_LONG_RUN = 4.0
# at most this many times the MPL statements are beside it as long runs at once (_release_long)
_LONG_BESIDE = 2


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
    # a statement in service this long (s) gives its MPL slot to the queue and runs on beside
    # it, at most MPL of them at once (None: never; see ``Scheduler._release_overrun``)
    release_after: float | None = None
    # short lane: with the MPL full, a queued statement whose class is expected to take at most
    # 1/short_lane of the least expected remaining time of those in service is admitted beside
    # the MPL, at most MPL of them at once (see ``Scheduler._admit_short``); None: the policy's
    # own (``Policy.short_lane``: the latency policy's SHORT_LANE, no other has one); 0: never
    short_lane: float | None = None

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
        if self.release_after is not None and not 0 < self.release_after < math.inf:
            raise ValueError(
                f"release_after must be a positive number of seconds, not {self.release_after}"
            )
        lane = self.short_lane
        if lane is not None and lane != 0 and not 1 <= lane < math.inf:
            raise ValueError(
                "short_lane is how many times shorter than the remaining time of those in "
                f"service a statement must be to pass the MPL: at least 1 (0: no lane), not {lane}"
            )


class _ClassState:
    """One class: its aggregate queue count and its tasks in service (its queues are per lane)."""

    __slots__ = (
        "arrived",
        "cost",
        "demand",
        "fingerprint",
        "fork",
        "index",
        "known",
        "live",
        "long",
        "memory",
        "name",
        "tail",
        "tasks",
    )

    def __init__(
        self,
        fingerprint: str,
        name: str,
        index: int,
        fork: int,
        memory: int = 0,
        demand: float = 1.0,
        known: bool = True,
    ) -> None:
        self.fingerprint, self.name, self.index, self.fork = fingerprint, name, index, fork
        self.memory = memory  # bytes a job of the class reserves (M_r; 0: not measured)
        self.demand = demand  # D_r (s), as the model has it
        self.cost = _cost(demand)  # expected service: what a tenant's DRR deficit is charged
        # whether cost is a measured D_r (the model's own classes, trained or measured live)
        # rather than the prior of a class first seen live: only such may take the short lane
        self.known = known
        # twice the service time 9 in 10 of the class's statements end within (D_tail), and
        # four times it (∞: not known; ``_past_tail``)
        self.tail = _FOREVER
        self.long = _FOREVER
        self.live = 0  # queued jobs not cancelled or timed out, in every lane
        self.tasks = 0  # N_c
        self.arrived = 0  # jobs submitted to be admitted or refused (not bypass), ever

    def __repr__(self) -> str:
        return f"<class {self.name} #{self.index}: {self.live} queued, {self.tasks} tasks>"


class _Tenant:
    """A workload class (admission.workloads): its weight, limits and what it holds."""

    __slots__ = (
        "admitted",
        "completed",
        "held",
        "memory_held",
        "mpl",
        "name",
        "queue_timeout",
        "running",
        "service",
        "threads",
        "wait",
        "weight",
        "workload",
    )

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.name = workload.name
        self.weight = workload.weight
        self.mpl, self.threads = workload.mpl, workload.threads
        self.queue_timeout = workload.queue_timeout
        self.running = 0  # its jobs in service
        self.held = 0  # thread-budget units its jobs hold
        self.memory_held = 0
        self.admitted = self.completed = 0
        self.service = 0.0  # statement-seconds in service, of its completed jobs
        self.wait = 0.0  # seconds its admitted jobs waited, in total


class _Lane:
    """One tenant's statements of one tier: a FIFO queue per statement class, a DRR deficit.

    Invariants: ``queues[i]`` is empty or starts with a QUEUED job; ``head_seq`` and
    ``nonempty`` describe exactly the classes with ``lives[i] > 0``; ``live`` is their sum."""

    __slots__ = (
        "deficit",
        "head_seq",
        "hold_until",
        "live",
        "lives",
        "max_wait",
        "nonempty",
        "queues",
        "running",
        "tenant",
        "tier",
    )

    def __init__(self, tenant: _Tenant, tier: int, k: int) -> None:
        self.tenant, self.tier = tenant, tier
        self.queues: list[deque[Job]] = [deque() for _ in range(k)]
        self.lives = [0] * k  # queued jobs by class
        self.head_seq = [0] * k  # arrival seq of each non-empty class's oldest job
        self.nonempty: list[int] = []  # indices of classes with queued jobs
        self.live = 0
        self.running = 0
        self.deficit = 0.0  # DRR: expected service (s) it may still start this round
        self.hold_until: float | None = None  # DRR hold rule: keeps its turn until then
        self.max_wait: float | None = None  # aging (batch tiers: into the top tier)

    def grow(self, k: int) -> None:
        while len(self.queues) < k:
            self.queues.append(deque())
            self.lives.append(0)
            self.head_seq.append(0)

    def __repr__(self) -> str:
        return f"<lane {self.tenant.name}/{Tier(self.tier).label}: {self.live} queued>"


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
    released: bool = False  # beside the MPL: past release_after, or by the short lane
    # beside the MPL as one of its class's rare long runs (``Scheduler._release_long``): in the
    # lane past twice its class's tail, or holding the MPL past four times it
    overran: bool = False
    lane: Any = None  # the _Lane it queues in (its tenant and tier)
    cost: float = 0.0  # the expected service charged to its tenant's DRR deficit

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
    released: int = 0  # jobs that gave their MPL slot back after release_after in service
    short: int = 0  # jobs admitted beside a full MPL by the short lane
    long: int = 0  # jobs beside the MPL as their class's rare long runs (``_release_long``)


class _Mode(Enum):
    """How the scores are kept (chosen from the η matrix's shape when the policy is compiled)."""

    STATIC = "static"  # η = 0: the score is the bias alone (FCFS, SEPT)
    ROW = "row"  # η[r][c] = a_r: the order is a's whenever anything is in service (−Q_r, U_r)
    FULL = "full"  # anything else: bias + η·N kept up to date (−A^c_r, P_{r,c})


# Enum member access is a descriptor call; the hot paths use these aliases instead.
_QUEUED, _RUNNING, _DONE = JobState.QUEUED, JobState.RUNNING, JobState.DONE
_INTERACTIVE, _BATCH, _BACKGROUND = int(Tier.INTERACTIVE), int(Tier.BATCH), int(Tier.BACKGROUND)
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
        workloads: WorkloadConfig | None = None,
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
        # foreground jobs in service in the order admitted, while release_after is set; and
        # how many of them gave their MPL slot back (``_release_overrun``)
        self._in_service: dict[Hashable, Job] = {}
        self._released = 0
        self._overran = 0  # released as one of their class's rare long runs (_release_long)
        self._lane_factor = _lane_factor(self.limits, self.policy)  # (None: no short lane)
        self._seq = 0
        self._now = _NEVER
        self.running = 0  # jobs in service (read-only outside, like queued)
        self.queued = 0  # jobs waiting (read-only outside; an attribute: read per statement)
        self._held = 0  # n_fcr: budget units held
        self._memory_held = 0  # bytes of the memory budget held
        self._n_total = 0
        self._tasks: list[int] = []  # N_c, by class index
        # Tenants and tiers (admission.workloads). Without a workload config there is one
        # lane, every job's, and the decision is the policy's alone.
        self.workloads = workloads
        self._multi = workloads is not None
        self._tenants: dict[str, _Tenant] = {}
        # DRR weights set in place of the configured ones (set_tenant_weights), kept across a
        # reload of the workload config and given to tenants made after them
        self._weights: dict[str, float] = {}
        self._lane_by_key: dict[tuple[str, int], _Lane] = {}
        self._lanes: list[_Lane] = []
        self._rings: list[list[_Lane]] = [[] for _ in Tier]  # DRR order, per tier
        self._cursor = [0 for _ in Tier]
        self._quantum = 1.0  # DRR quantum of weight 1 (s of expected service), from the model
        self._served = 0  # statements whose service time the quantum and costs have followed
        self._fg = 0  # foreground (not background) jobs queued or in service
        self._bg_running = 0
        self.idle = IdlePredictor(idle_wait_fixed=workloads.idle_wait) if workloads else None
        self.pressure = 0.0  # the feedback signal background work is throttled by
        self.held_for = 0  # decisions that left capacity idle under the DRR hold rule
        self._skip: set[_Lane] = set()  # lanes set aside within one decision (backfill)
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
        self._lane0 = self._lane(DEFAULT_WORKLOAD, Tier.INTERACTIVE)
        for c in self.model.classes:
            st = self._add_class_state(c.fingerprint, c.name, c.f, _memory(c.M), c.D)
            st.tail, st.long = _past_tail(c)
        self._set_quantum()
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
    def released_in_service(self) -> int:
        """Statements in service that gave their MPL slot back (``Limits.release_after``)."""
        return self._released

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

    def arrivals_by_class(self) -> dict[str, int]:
        """Fingerprint → jobs of the class submitted for admission so far, and those
        ``refused`` (bypass not counted): what arrives, whatever the MPL lets through (the
        adaptive MPL's demand)."""
        return {st.fingerprint: st.arrived for st in self._classes}

    def refused(self, fingerprint: str, name: str | None = None, sample_sql: str = "") -> None:
        """A job of the class arrived and was turned away before ``submit`` (a full queue):
        counted as an arrival of its class — learned now if new, as ``submit`` would — and
        nothing else changes."""
        st = self._by_fp.get(fingerprint) or self._learn_class(fingerprint, name, sample_sql)
        st.arrived += 1

    def set_tenant_weights(self, weights: Mapping[str, float] | None) -> None:
        """DRR weights for the tenants in place of their configured ones (``None``, or a
        tenant not named or not positive: its configured weight). A proxy sharing a global
        budget (proxy.coordinator) weighs its tenants by the units the global split gave each
        of them here, so that its units are spent the way the split counted them — not split
        again by configured weight, which would move a tenant's share across proxies."""
        self._weights = {
            name: w for name, w in (weights or {}).items() if w is not None and 0 < w < math.inf
        }
        for t in self._tenants.values():
            self._weigh(t)

    def _weigh(self, t: _Tenant) -> None:
        t.weight = self._weights.get(t.name, t.workload.weight)

    def tenant_load(self) -> dict[tuple[str, bool], tuple[float, int, int, int]]:
        """Per (tenant, background): its weight and what its statements in service hold and
        its queued ones would take — statements, threads (fork sizes), memory (bytes) — the
        demand a proxy sharing a global budget reports by tenant (proxy.coordinator). Without
        a workload config, one tenant: ``default``. O(live jobs): read at heartbeats."""
        load: dict[tuple[str, bool], list[int]] = {}
        weight: dict[tuple[str, bool], float] = {}
        for job in self._jobs.values():
            if job.state is not _QUEUED and job.state is not _RUNNING:
                continue
            lane = job.lane
            key = (lane.tenant.name, lane.tier == _BACKGROUND)
            entry = load.get(key)
            if entry is None:
                entry = load[key] = [0, 0, 0]
                weight[key] = lane.tenant.workload.weight  # the configured one
            entry[0] += 1
            if job.state is _RUNNING:
                entry[1] += job.held
                entry[2] += job.memory_held
            else:
                entry[1] += job.fork
                entry[2] += job.memory
        return {k: (weight[k], v[0], v[1], v[2]) for k, v in load.items()}

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
        tenant: str | None = None,
        tier: int | None = None,
    ) -> list[Job]:
        """Queue a job (or admit it at once if ``bypass``); returns the jobs admitted now.
        ``tenant`` and ``tier``: its workload class and priority (``admission.workloads``;
        ignored without a workload config; by default the tenant's own tier)."""
        if now < self._now:
            self._advance(now)  # raises
        self._now = now
        jobs = self._jobs
        if job_id in jobs:
            raise ValueError(f"job {job_id!r} is already known to the scheduler")
        st = self._by_fp.get(fingerprint) or self._learn_class(fingerprint, name, sample_sql)
        job = Job(job_id, st, now, self._seq, st.fork if fork is None else max(1, fork))
        job.memory = st.memory
        job.cost = st.cost
        if self._multi:
            lane = job.lane = self._lane(tenant, tier)
            if lane.tier != _BACKGROUND:
                self._fg += 1
                self.idle.arrival(now)  # type: ignore[union-attr]
        else:
            lane = job.lane = self._lane0
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
        st.arrived += 1
        if not self.queued:
            mpl = self.limits.mpl
            if (
                (mpl is None or self.running - self._bg_running - self._released < mpl)
                and self._fits(job)
                and (not self._multi or self._open(lane, now))
            ):
                self._admit(job, now)  # nothing waits and it fits: the decision is trivial
                return [job]
        self._enqueue(lane, st, job)
        if lane.lives[st.index] > 1 and now < self._blocked_until:
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
        self._memory_held -= job.memory_held
        if self._multi:
            self._account_release(job, now)
        job.held = 0
        job.memory_held = 0
        self.running -= 1
        if self._in_service:
            self._in_service.pop(job.id, None)
        if job.released:
            self._released -= 1
            if job.overran:
                self._overran -= 1
        job.state = _DONE
        self.stats.completed += 1
        if self._on_event is not None:
            self._emit("release", job)
        if self._on_finish is not None:
            self._on_finish(job, now)
        if not self.queued:
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
        if self._multi:
            job.lane.tenant.held -= freed
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
            self._multi  # (the DRR hold rule, batch aging, background start, tenant timeouts)
            or limits.max_wait is not None
            or limits.queue_timeout is not None
            or (self._due_scale is not None and limits.due_factor is not None)
            or (limits.release_after is not None and limits.mpl is not None)
            or (self._lane_factor is not None and limits.mpl is not None)
        )

    def next_deadline(self) -> float | None:
        """When ``tick`` must next be called for aging, due jobs or timeouts to act on time."""
        if not self.timed:
            return None
        oldest = self._oldest()
        if oldest is None:
            return None
        times = []
        now = self._now
        due, factor = self._due_scale, self.limits.due_factor
        if due is not None and factor is not None:
            # the earliest head to become due (one already due acts at the next capacity change)
            soonest = _FOREVER
            for lane in self._lanes:
                for i in lane.nonempty:
                    due_at = lane.queues[i][0].arrival + factor * due[i]
                    if now < due_at < soonest:
                        soonest = due_at
            if soonest < _FOREVER:
                times.append(soonest)
        release = self._release_at()
        if release is not None:
            times.append(release)
        lane_at = self._lane_at()
        if lane_at is not None:
            times.append(lane_at)
        if not self._multi:
            if self.limits.max_wait is not None:
                # Once due, aging acts at the next capacity change: no tick can do more.
                aged_at = oldest.arrival + self.limits.max_wait
                if aged_at > now:
                    times.append(aged_at)
            if self.limits.queue_timeout is not None:
                times.append(oldest.arrival + self.limits.queue_timeout)
            return min(times) if times else None
        for lane in self._lanes:
            if lane.hold_until is not None and lane.hold_until > now:
                times.append(lane.hold_until)
            if not lane.live:
                continue
            head = self._lane_oldest(lane)
            wait = self._max_wait(lane)
            if wait is not None and head.arrival + wait > now:
                times.append(head.arrival + wait)
            timeout = self._timeout(lane)
            if timeout is not None:
                times.append(head.arrival + timeout)
            if lane.tier == _BACKGROUND and not self._fg:
                start = self.idle.start_at()  # type: ignore[union-attr]
                if start is not None and start > now:
                    times.append(start)
        return min(times) if times else None

    def _release_at(self) -> float | None:
        """When the next statement holding the MPL gives its slot up — at ``release_after``
        in service (``_release_overrun``) or at four times its class's tail
        (``_release_long``) — if that can admit a queued one."""
        at = self._release_after_at()
        mpl = self.limits.mpl
        full = mpl is not None and self.running - self._bg_running - self._released >= mpl
        long_at = self._long_at(beside=False) if full else None
        if long_at is None or at is None:
            return long_at if at is None else at
        return min(at, long_at)

    def _release_after_at(self) -> float | None:
        """When the next statement in service reaches ``release_after``, if that can admit a
        queued one: the MPL full and fewer than MPL released."""
        after, mpl = self.limits.release_after, self.limits.mpl
        if after is None or mpl is None or self._released >= mpl:
            return None
        if self.running - self._bg_running - self._released < mpl:
            return None  # a slot is free already: what blocks the queue is not the MPL
        for job in self._in_service.values():
            if not job.released and job.admitted_at is not None:
                at = job.admitted_at + after
                return at if at > self._now else None
        return None

    def _lane_at(self) -> float | None:
        """When the short lane opens by time alone: a statement in service of a class not
        measured yet, or one past twice its class's tail, counts as having as long to go as it
        has run (``_left``), so it lets more through the longer it runs (one of a measured
        class within its tail only fewer); with the lane full, when one in it turns out a long
        run. None when no time will: the lane is off, the MPL is not full, nothing queued is
        of a measured class, or a statement of a measured class with no tail known has too
        little left."""
        factor, mpl = self._lane_factor, self.limits.mpl
        if factor is None or mpl is None or self._multi or self._released - self._overran >= mpl:
            # (full: it opens when one in it turns out a long run)
            return self._long_at(beside=True) if self._lane0.live else None
        if self.running - self._bg_running - self._released < mpl:
            return None
        classes = self._classes
        shortest = min(
            (classes[i].demand for i in self._lane0.nonempty if classes[i].known), default=None
        )
        if shortest is None:
            return None
        need = factor * shortest
        now = self._now
        at = now
        for job in self._in_service.values():
            if job.released or job.admitted_at is None or _left(job, now) >= need:
                continue
            st = job.klass
            # a measured class's statement: its D_r less what it ran only shrinks, until it is
            # past its class's tail and counts as long as it ran (never, with no tail known)
            opens = job.admitted_at + (max(need, st.tail) if st.known else need)
            if opens == _FOREVER:
                return None
            if opens > at:
                at = opens
        # (a nanosecond after: at that tick what it ran is past the need, rounding included)
        return at + 1e-9 if at > now else None

    def _long_at(self, beside: bool) -> float | None:
        """When the next statement in service turns out one of its class's rare long runs and
        gives its place up: holding the MPL (not ``beside``) at four times its class's tail
        (``_release_long``), in the lane (``beside``) at twice (``_admit_short``). None when
        none will, or the room beside the MPL for long runs is taken."""
        mpl = self.limits.mpl
        if self._lane_factor is None or mpl is None or self._multi:
            return None
        if self._overran >= _LONG_BESIDE * mpl:
            return None
        at = _FOREVER
        for job in self._in_service.values():
            if job.admitted_at is None or job.overran or job.released is not beside:
                continue
            past = job.admitted_at + (job.klass.tail if beside else job.klass.long)
            if past < at:
                at = past
        return at + 1e-9 if self._now < at < _FOREVER else None

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
        self._pop_head(oldest.lane, oldest.klass.index)  # (a class's head is its oldest)
        self._left(oldest, now)
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

    @property
    def short_lane(self) -> float | None:
        """The short lane's factor in force (``Limits.short_lane``, else the policy's), or
        None when there is none."""
        return self._lane_factor

    def set_limits(self, limits: Limits, now: float) -> list[Job]:
        self._advance(now)
        before = self._beside_mpl()
        self.limits = limits
        self._lane_factor = _lane_factor(limits, self.policy)
        self._track_service(before)
        return self._dispatch(now)

    def set_policy(self, policy: str | Policy, now: float) -> list[Job]:
        self._advance(now)
        before = self._beside_mpl()
        self.policy = policy if isinstance(policy, Policy) else policy_by_name(policy)
        self._lane_factor = _lane_factor(self.limits, self.policy)
        self._track_service(before)
        self._compile()
        return self._dispatch(now)

    def _beside_mpl(self) -> bool:
        """Whether statements may run beside the MPL (``release_after`` or a short lane): the
        jobs in service are then kept in the order admitted (``_in_service``)."""
        return self.limits.release_after is not None or self._lane_factor is not None

    def _track_service(self, before: bool) -> None:
        if not self._beside_mpl():
            self._in_service.clear()  # (a job released already stays out of the MPL)
        elif not before:  # switched on: the statements already in service count too
            running = [
                job
                for job in self._jobs.values()
                if job.state is _RUNNING and not (self._multi and job.lane.tier == _BACKGROUND)
            ]
            running.sort(key=lambda job: (job.admitted_at, job.seq))
            self._in_service = {job.id: job for job in running}

    def set_workloads(self, config: WorkloadConfig, now: float) -> list[Job]:
        """Serve a new workload config (a reload): tenants take their new weights, tiers of
        new statements and limits; a tenant no longer in it keeps its queued statements
        (weight 1, no limits; the config assigns new statements elsewhere). A scheduler
        started without tenants starts using them: every job so far is ``default``'s."""
        self._advance(now)
        if not self._multi:
            self._multi = True
            self._fg = len(self._jobs)
            self.idle = IdlePredictor()
            if self._fg:
                self.idle.arrival(now)
            lane, t = self._lane0, self._lane0.tenant
            for job in self._jobs.values():
                job.cost = 0.0  # (admitted uncharged: their release charges all they took)
                if job.state is _RUNNING:  # (one lane kept no books: they start now)
                    lane.running += 1
                    t.running += 1
                    t.held += job.held
                    t.memory_held += job.memory_held
        self.workloads = config
        self.idle.idle_wait_fixed = config.idle_wait  # type: ignore[union-attr]
        for t in self._tenants.values():
            try:
                workload = config.workload(t.name)
            except KeyError:
                workload = Workload(t.name)
            t.workload = workload
            self._weigh(t)  # (a weight a coordinator set stays until it sets another)
            t.mpl, t.threads, t.queue_timeout = (
                workload.mpl,
                workload.threads,
                workload.queue_timeout,
            )
        for lane in self._lanes:
            lane.max_wait = lane.tenant.workload.max_wait
            if lane.max_wait is None and lane.tier == _BATCH:
                lane.max_wait = config.batch_max_wait
        self._set_quantum()
        self._blocked_until = _NEVER
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
        old_index = {st.fingerprint: st.index for st in self._classes}
        self._classes = []
        for i, c in enumerate(model.classes):
            st = by_fp.get(c.fingerprint) or _ClassState(c.fingerprint, c.name, i, c.f)
            st.index, st.fork, st.memory, st.demand = i, c.f, _memory(c.M), c.D
            st.cost = _cost(c.D)
            st.known = c.fingerprint in self._base or _measured(c)
            st.tail, st.long = _past_tail(c)
            self._classes.append(st)
        self._by_fp = {st.fingerprint: st for st in self._classes}
        self._tasks = [st.tasks for st in self._classes]
        k = len(self._classes)
        for lane in self._lanes:
            queues: list[deque[Job]] = [deque() for _ in range(k)]
            lives = [0] * k
            for st in self._classes:
                j = old_index.get(st.fingerprint)
                if j is not None:
                    queues[st.index], lives[st.index] = lane.queues[j], lane.lives[j]
            lane.queues, lane.lives = queues, lives
            lane.head_seq = [q[0].seq if n else 0 for q, n in zip(queues, lives, strict=True)]
            lane.nonempty = [i for i in range(k) if lives[i]]
        self._set_quantum()
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
        self, fingerprint: str, name: str, fork: int, memory: int = 0, demand: float = 1.0
    ) -> _ClassState:
        st = _ClassState(fingerprint, name, len(self._classes), fork, memory, demand)
        self._classes.append(st)
        self._by_fp[fingerprint] = st
        self._tasks.append(0)
        for lane in self._lanes:
            lane.grow(len(self._classes))
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
        st = self._add_class_state(fingerprint, name or fingerprint, new.f, _memory(new.M), new.D)
        st.known = False  # (the default profile's D_r, a prior)
        self._compile()
        return st

    # Tenants and tiers.

    def _lane(self, tenant: str | None, tier: int | None = None) -> _Lane:
        """The lane of (tenant, tier), made on first use; an unknown tenant is ``default``."""
        name = tenant or DEFAULT_WORKLOAD
        t = self._tenants.get(name)
        if t is None:
            config = self.workloads
            try:
                workload = config.workload(name) if config else Workload(name)
            except KeyError:
                return self._lane(DEFAULT_WORKLOAD, tier)
            t = self._tenants[name] = _Tenant(workload)
            self._weigh(t)
        level = int(t.workload.tier) if tier is None else max(int(tier), int(t.workload.tier))
        lane = self._lane_by_key.get((name, level))
        if lane is None:
            lane = _Lane(t, level, len(self._classes))
            config = self.workloads
            lane.max_wait = t.workload.max_wait
            if lane.max_wait is None and level == _BATCH and config is not None:
                lane.max_wait = config.batch_max_wait
            self._lane_by_key[name, level] = lane
            self._lanes.append(lane)
            self._rings[level].append(lane)
        return lane

    def _set_quantum(self) -> None:
        """DRR's quantum for weight 1 (s): the mean service of a statement, so that a round
        admits about ``weight`` statements of a tenant (the batch size G_i of the paper). It
        starts from the model's median D_r and follows the service measured (``_measured``):
        a quantum far above the statements' real length would let a tenant keep its turn for
        many of them (coarse fairness), one far below costs only extra rounds."""
        if self._served:
            return
        costs = sorted(st.cost for st in self._classes)
        self._quantum = costs[len(costs) // 2] if costs else 1.0

    def queue_timeout_of(self, job: Job) -> float | None:
        """The queue timeout that applies to ``job``: its tenant's, else the global one."""
        return self._timeout(job.lane)

    def _max_wait(self, lane: _Lane) -> float | None:
        return lane.max_wait if lane.max_wait is not None else self.limits.max_wait

    def _timeout(self, lane: _Lane) -> float | None:
        t = lane.tenant.queue_timeout
        return t if t is not None else self.limits.queue_timeout

    def _tenant_ok(self, lane: _Lane) -> bool:
        """Whether the lane's tenant (and tier) has room under its own limits — for one of the
        lane's heads at least, so that a tenant at its own thread or memory limit never
        blocks another's statements — and the lane is not set aside by this decision."""
        if lane in self._skip:
            return False
        t = lane.tenant
        if t.mpl is not None and t.running >= t.mpl:
            return False
        if lane.tier == _BACKGROUND and self._bg_running >= self.workloads.background_mpl:  # type: ignore[union-attr]
            return False
        threads = t.threads
        share, memory = t.workload.memory_share, self.limits.memory
        cap = None if share is None or memory is None else int(share * memory)
        if threads is None and cap is None:
            return True
        if (threads is not None and t.held >= threads) or (
            cap is not None and t.memory_held >= cap
        ):
            return False
        if not lane.live:
            return True
        for i in lane.nonempty:
            head = lane.queues[i][0]
            if (threads is None or min(head.fork, threads) <= threads - t.held) and (
                cap is None or min(head.memory, cap) <= cap - t.memory_held
            ):
                return True
        return False

    def _open(self, lane: _Lane, now: float) -> bool:
        """A job of this lane may start now, nothing else waiting: its tenant has room and, for
        background work, the foreground is idle and predicted to stay so."""
        return self._tenant_ok(lane) and (lane.tier != _BACKGROUND or self._background_open(now))

    def _background_open(self, now: float) -> bool:
        """Background may start: no foreground statement queued or in service, the idle period
        is old enough (Busy-Bee: at once, or after the idle wait in a cluster of long busy
        periods), and the feedback signal is under its bound."""
        if self._fg:
            return False
        config = self.workloads
        bound = config.pressure_bound if config is not None else None
        if bound is not None and self.pressure > bound:
            return False
        start = self.idle.start_at()  # type: ignore[union-attr]
        return start is not None and now >= start

    def set_pressure(self, value: float, now: float) -> list[Job]:
        """The feedback signal (e.g. the database's CPU utilisation, 0–1): background work is
        not admitted while it is above the workload config's ``pressure_bound``."""
        self._advance(now)
        self.pressure = value
        return self._dispatch(now) if self.queued else []

    def _choose(self, now: float, aging: bool = True) -> tuple[_Lane | None, Job | None]:
        """Tenants mode: the lane to admit from (and the job, when aging picked it).

        1. Aging: a foreground lane's head that waited its lane's max_wait (batch: into the top
           tier) — the oldest such — goes first (not under overload: ``aging`` False).
        2. The highest tier with a lane that has work and room, DRR among its lanes.
        3. Background, when open, DRR among the background lanes.
        """
        oldest: Job | None = None
        for lane in self._lanes if aging else ():
            if lane.live and lane.tier != _BACKGROUND:
                wait = self._max_wait(lane)
                if wait is None:
                    continue
                head = self._lane_oldest(lane)
                if (
                    now >= head.arrival + wait  # (the same sum next_deadline names)
                    and (oldest is None or head.seq < oldest.seq)
                    and self._tenant_ok(lane)
                ):
                    oldest = head
        if oldest is not None:
            if not oldest.aged:
                oldest.aged = True
                self.stats.aged += 1
            return oldest.lane, oldest
        for tier in (_INTERACTIVE, _BATCH):
            ring = self._rings[tier]
            if any(lane.live and self._tenant_ok(lane) for lane in ring):
                return self._drr(tier, now), None
        ring = self._rings[_BACKGROUND]
        if (
            ring
            and self._background_open(now)
            and any(lane.live and self._tenant_ok(lane) for lane in ring)
        ):
            return self._drr(_BACKGROUND, now), None
        return None, None

    def _drr(self, tier: int, now: float) -> _Lane | None:
        """Deficit round robin over one tier's lanes (Algorithm 3 of Wang & Merchant): the
        current lane keeps its turn while it has tokens and work; with tokens, work in service
        and nothing queued it is *held* (None: leave the capacity idle) for up to ``hold``
        seconds; after the last lane every lane with work gets its quantum (as many rounds as
        the first lane able to go needs: deficits go negative when statements run longer than
        expected), and one with none loses its tokens."""
        ring = self._rings[tier]
        n = len(ring)
        cur = self._cursor[tier] % n
        hold = self.workloads.hold if self.workloads is not None else 0.0
        for _ in range(2 * n + 1):
            lane = ring[cur]
            if lane.deficit > 0:
                if lane.live and self._tenant_ok(lane):
                    self._cursor[tier] = cur
                    return lane
                if not lane.live and lane.running and hold > 0 and self._tenant_ok(lane):
                    if lane.hold_until is None:
                        lane.hold_until = now + hold
                    if now < lane.hold_until:
                        self._cursor[tier] = cur
                        self.held_for += 1
                        return None
            lane.hold_until = None
            cur += 1
            if cur == n:
                cur = 0
                self._replenish(ring)
        self._cursor[tier] = cur
        return None

    def _replenish(self, ring: list[_Lane]) -> None:
        waiting = [lane for lane in ring if lane.live and self._tenant_ok(lane)]
        rounds = 1
        if waiting:
            q = self._quantum
            rounds = max(
                1, min(math.floor(-lane.deficit / (q * lane.tenant.weight)) + 1 for lane in waiting)
            )
        for lane in ring:
            quantum = self._quantum * lane.tenant.weight
            if lane.live:
                lane.deficit += rounds * quantum
            elif lane.running:  # active, nothing queued: at most one quantum in hand
                lane.deficit = min(lane.deficit + rounds * quantum, quantum)
            else:
                lane.deficit = 0.0  # inactive: its tokens vanish (unused share goes to others)
        while waiting and all(lane.deficit <= 0 for lane in waiting):  # (rounding: one more)
            for lane in waiting:
                lane.deficit += self._quantum * lane.tenant.weight

    def _left(self, job: Job, now: float) -> None:
        """A queued job left without being admitted (cancelled, timed out, shed)."""
        if self._multi and job.lane.tier != _BACKGROUND:
            self._fg -= 1
            if not self._fg:
                self.idle.idle(now)  # type: ignore[union-attr]

    def _account_release(self, job: Job, now: float) -> None:
        """An admitted job left (tenants mode): its tenant gets its capacity back and is
        charged for the difference between the service it was expected to take and what it
        took."""
        lane = job.lane
        t = lane.tenant
        lane.running -= 1
        t.running -= 1
        t.held -= job.held
        t.memory_held -= job.memory_held
        t.completed += 1
        admitted = job.admitted_at if job.admitted_at is not None else now
        took = now - admitted
        t.service += took
        lane.deficit -= took - job.cost
        if not job.bypass:  # the costs and the quantum follow what statements take
            st = job.klass
            st.cost += 0.2 * (max(1e-4, took) - st.cost)
            self._quantum += 0.05 * (max(1e-4, took) - self._quantum)
            self._served += 1
        if lane.tier == _BACKGROUND:
            self._bg_running -= 1
        else:
            self._fg -= 1
            if not self._fg:
                self.idle.idle(now)  # type: ignore[union-attr]

    def tenant_stats(self, now: float | None = None) -> list[dict[str, Any]]:
        """Per tenant: weight, statements queued and in service, admitted, completed, service
        (statement-seconds of its completed statements) and total wait, for the admin API;
        with ``now``, also ``busy_seconds``: the service plus what its statements in service
        have had so far (the exact integral of its statements in service up to ``now``).
        Empty without tenants (one lane keeps no books)."""
        out: dict[str, dict[str, Any]] = {}
        if not self._multi:
            return []
        if now is not None:
            busy: dict[str, float] = {}
            for job in self._jobs.values():
                if job.state is _RUNNING and job.admitted_at is not None:
                    name = job.lane.tenant.name
                    busy[name] = busy.get(name, 0.0) + max(0.0, now - job.admitted_at)
        for lane in self._lanes:
            t = lane.tenant
            row = out.get(t.name)
            if row is None:
                row = out[t.name] = {
                    "tenant": t.name,
                    "weight": t.workload.weight,
                    "drr_weight": t.weight,  # another where a coordinator set one
                    "priority": Tier(t.workload.tier).label,
                    "queued": 0,
                    "running": t.running,
                    "threads": t.held,
                    "memory": t.memory_held,
                    "admitted": t.admitted,
                    "completed": t.completed,
                    "service_seconds": t.service,
                    "wait_seconds": t.wait,
                }
            row["queued"] += lane.live
        if now is not None:
            for row in out.values():
                row["busy_seconds"] = row["service_seconds"] + busy.get(row["tenant"], 0.0)
        return list(out.values())

    # Queues. Invariant (per lane): a class's deque is empty or starts with a QUEUED job;
    # head_seq and nonempty describe exactly the classes with lives[i] > 0.

    def _enqueue(self, lane: _Lane, st: _ClassState, job: Job) -> None:
        if not self.queued:
            self._busy_since = job.arrival
        i = st.index
        lane.queues[i].append(job)
        lane.lives[i] += 1
        lane.live += 1
        st.live += 1
        self.queued += 1
        if lane.lives[i] == 1:
            lane.head_seq[i] = job.seq
            lane.nonempty.append(i)

    def _settle(self, lane: _Lane, i: int) -> None:
        """Drop withdrawn jobs from the front of the queue and record the new head."""
        queue = lane.queues[i]
        while queue and queue[0].state is not _QUEUED:
            queue.popleft()
        if queue:
            lane.head_seq[i] = queue[0].seq
        else:
            lane.nonempty.remove(i)

    def _pop_head(self, lane: _Lane, i: int) -> Job:
        job = lane.queues[i].popleft()
        lane.lives[i] -= 1
        lane.live -= 1
        job.klass.live -= 1
        self.queued -= 1
        self._settle(lane, i)
        return job

    def _lane_oldest(self, lane: _Lane) -> Job:
        """The lane's oldest queued job (the lane has one)."""
        return lane.queues[min(lane.nonempty, key=lane.head_seq.__getitem__)][0]

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
        if (self.limits.release_after is not None or self._lane_factor is not None) and not (
            self._multi and job.lane.tier == _BACKGROUND  # (beside the MPL already)
        ):
            self._in_service[job.id] = job
        if self._multi:  # (one lane, no tenants: nothing to keep per tenant)
            lane = job.lane
            t = lane.tenant
            lane.running += 1
            t.running += 1
            t.held += held
            t.memory_held += job.memory_held
            t.admitted += 1
            t.wait += now - job.arrival
            lane.deficit -= job.cost
            lane.hold_until = None
            if lane.tier == _BACKGROUND:
                self._bg_running += 1
        st = job.klass  # _set_tasks(job, fork), written out
        st.tasks += fork
        self._tasks[st.index] = st.tasks
        self._n_total += fork
        if self._mode is _FULL:
            self._rescore(st, fork)
        if not job.bypass:
            self.stats.admitted += 1
        if self._on_event is not None:
            detail = (
                "bypass"
                if job.bypass
                else "aged"
                if job.aged
                else "due"
                if job.due
                else "short"
                if job.released
                else ""
            )
            self._emit("grant", job, detail)
        if self._on_grant is not None:
            self._on_grant(job, self._tasks)

    def _cancel(self, job: Job, now: float) -> list[Job]:
        """Take a queued job out (cancelled, or its client went away)."""
        st, lane = job.klass, job.lane
        i = st.index
        job.state = JobState.CANCELLED
        lane.lives[i] -= 1
        lane.live -= 1
        st.live -= 1
        self.queued -= 1
        del self._jobs[job.id]
        if lane.queues[i][0] is job:
            self._settle(lane, i)
        self._left(job, now)
        self.stats.cancelled += 1
        if self._on_event is not None:
            self._emit("cancel", job)
        if self._on_finish is not None:
            self._on_finish(job, now)
        return self._dispatch(now)

    def _oldest(self) -> Job | None:
        if not self.queued:
            return None
        if not self._multi:
            return self._lane_oldest(self._lane0)
        heads = [self._lane_oldest(lane) for lane in self._lanes if lane.live]
        return min(heads, key=lambda j: j.seq)

    def _timeouts(self) -> bool:
        """Whether any queued job can time out."""
        if self.limits.queue_timeout is not None:
            return True
        return self._multi and any(t.queue_timeout is not None for t in self._tenants.values())

    def _expire(self, now: float) -> None:
        for lane in self._lanes:
            timeout = self._timeout(lane)
            if timeout is None or not lane.live:
                continue
            for i in list(lane.nonempty):
                queue = lane.queues[i]
                while lane.lives[i] and queue[0].arrival + timeout <= now:
                    job = self._pop_head(lane, i)
                    job.state = JobState.TIMED_OUT
                    del self._jobs[job.id]
                    self._left(job, now)
                    self.stats.timed_out += 1
                    self.timed_out.append(job)
                    self._emit("timeout", job, f"waited {now - job.arrival:g}s")
                    if self._on_finish is not None:
                        self._on_finish(job, now)

    def _fits(self, job: Job) -> bool:
        """Whether the job's threads and memory fit beside what the running jobs hold. A job
        asking more than a whole budget asks for all of it: it runs alone (never deadlocked).
        With tenants, the same within its tenant's own thread and memory limits."""
        limits = self.limits
        budget, memory = limits.threads, limits.memory
        if budget is not None and min(job.fork, budget) > budget - self._held:
            return False
        if memory is not None and min(job.memory, memory) > memory - self._memory_held:
            return False
        if self._multi:
            t = job.lane.tenant
            if t.threads is not None and min(job.fork, t.threads) > t.threads - t.held:
                return False
            share = t.workload.memory_share
            if share is not None and memory is not None:
                cap = int(share * memory)
                if min(job.memory, cap) > cap - t.memory_held:
                    return False
        return True

    def _pick(self, now: float) -> Job | None:
        """The job to admit next: an aged job, else the best head (that fits, in backfill);
        with tenants, of the lane ``_choose`` gives."""
        if self._multi:
            try:
                while True:
                    lane, aged = self._choose(now)
                    if lane is None or aged is not None:
                        return aged
                    job = self._pick_in(lane, now)
                    if job is not None or not self.limits.backfill:
                        return job
                    self._skip.add(lane)  # backfill: nothing of this lane fits; another may
            finally:
                self._skip.clear()
        else:
            lane = self._lane0
            if not lane.nonempty:
                return None
            max_wait = self.limits.max_wait
            if max_wait is not None:
                oldest = self._lane_oldest(lane)
                if now >= oldest.arrival + max_wait:
                    if not oldest.aged:
                        oldest.aged = True
                        self.stats.aged += 1
                    return oldest
        return self._pick_in(lane, now)

    def _pick_in(self, lane: _Lane, now: float) -> Job | None:
        """The lane's job to admit next: its most due head, else its best head (that fits,
        in backfill; None when none does)."""
        candidates = lane.nonempty
        queues = lane.queues
        due, factor = self._due_scale, self.limits.due_factor
        if due is not None and factor is not None:
            picked = self._most_due(lane, now, due, factor)
            if picked is not None:
                return picked
        if self.limits.backfill:
            candidates = [i for i in candidates if self._fits(queues[i][0])]
            if not candidates:
                return None
        mode = self._mode
        if mode is _FULL:
            keys, flat = self._score.tolist(), False
        elif mode is _ROW and self._n_total > 0:
            keys, flat = self._row, self._flat_row
        else:
            keys, flat = self._bias, self._flat_bias
        seq = lane.head_seq
        if flat:
            best = min(candidates, key=seq.__getitem__)
        else:
            best = max(candidates, key=keys.__getitem__)
            top = keys[best]
            if keys.count(top) > 1:  # a tie (perhaps with an empty class): arrival decides
                best = min((i for i in candidates if keys[i] == top), key=seq.__getitem__)
        return queues[best][0]

    def _pick_newest(self, now: float) -> Job | None:
        """Overloaded: the policy's best class (or, in backfill, the best whose newest job
        fits), ties going to the latest arrival, and that class's newest job (with tenants,
        within the lane ``_choose`` gives)."""
        if self._multi:
            lane, _aged = self._choose(now, aging=False)  # (overloaded: aging waits)
            if lane is None:
                return None
        else:
            lane = self._lane0
        candidates = lane.nonempty
        if not candidates:
            return None
        tails: dict[int, Job] = {}
        for i in candidates:
            queue = lane.queues[i]
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

    def _most_due(self, lane: _Lane, now: float, due: list[float], factor: float) -> Job | None:
        """The due head with the largest wait/scale (ties: earliest arrival), or None."""
        best: Job | None = None
        best_ratio = -1.0
        queues = lane.queues
        for i in lane.nonempty:
            head = queues[i][0]
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

    def _release_overrun(self, now: float) -> None:
        """While statements wait, give the MPL slot of every statement in service for
        ``release_after`` or longer to the queue — the earliest admitted first, at most MPL of
        them released at once — so that a few long statements cannot hold every slot while
        short ones wait behind them (Db2's workload management remaps an activity after a
        time threshold; Redshift's monitoring rules hop it to another queue). A released
        statement runs on beside the MPL and keeps its threads and memory; in service there
        are so at most 2 × MPL statements. O(released + 1): the jobs in service are kept in
        the order admitted. It acts whenever something waits, also when what holds the queue
        back is the thread or memory budget or a tenant's own MPL (a released statement still
        counts in its tenant's): the release is then spent without admitting anyone."""
        mpl = self.limits.mpl
        after = self.limits.release_after
        assert mpl is not None and after is not None
        if not self.queued or self._released >= mpl:
            return
        for job in self._in_service.values():
            if job.released:
                continue
            # (the sum, as ``_release_at`` computes it: a timer set for it finds it due)
            if job.admitted_at is None or job.admitted_at + after > now:
                break
            job.released = True
            self._released += 1
            self.stats.released += 1
            if self._on_event is not None:
                self._emit("overrun", job, f"in service {now - job.admitted_at:.3g}s")
            if self._released >= mpl:
                break

    def _release_long(self, now: float, mpl: int) -> None:
        """With the MPL full and statements waiting, a statement holding the MPL past four times its
        class's tail (D_tail: what 9 in 10 of the class's statements end within) is one of
        the class's rare long runs — a range query that this time covers the whole table —
        not what its class's D_r let the policy expect: it gives its slot to the queue and
        runs on beside the MPL, like one past ``release_after`` but by its class's own
        measure. The shortest-first policy cannot know which run will be long; past its tail
        it knows, and what has run long tends to run on: least attained service first is
        what minimizes the mean for such a class. At most 2 × MPL statements are beside the
        MPL so at once, these and the lane's (``_admit_short``), so never more than 4 × MPL
        in service: without a bound an overload of long runs would all run at once, as with
        no admission control (in the simulator a bound of 1 × MPL left the heavy-tailed mix
        6–9 % more mean, the others the same or more). Four times the tail, not the lane's
        two: giving a slot up adds a statement on the cores, and one of an even class slowed
        by sharing runs past twice its tail — at twice, in the simulator a mix of five
        deterministic classes lost a quarter of its mean and half of its p99 at ρ 0.95 (the
        releases fed the sharing that made them); at four it and TPC-H ran the same
        (``benchmarks.short_lane``). Only with the short lane on (the latency policy): a
        faithful MPL keeps its slots. O(in service)."""
        if self._multi or self.running - self._bg_running - self._released < mpl:
            return
        overran = self._overran
        for job in self._in_service.values():
            if job.released or job.admitted_at is None:
                continue
            if now - job.admitted_at > job.klass.long:
                job.released = job.overran = True
                self._released += 1
                overran += 1
                self.stats.long += 1
                if self._on_event is not None:
                    self._emit("long", job, f"in service {now - job.admitted_at:.3g}s")
                if overran >= _LONG_BESIDE * mpl:
                    break
        self._overran = overran

    def _dispatch(self, now: float) -> list[Job]:
        if self.limits.queue_timeout is not None or (self._multi and self._timeouts()):
            self._expire(now)
        if not self.queued:
            self._blocked_until = _NEVER
            return []
        granted: list[Job] = []
        mpl = self.limits.mpl
        self._blocked_until = _NEVER
        lifo = self.limits.lifo_after
        newest = lifo is not None and now - self._busy_since >= lifo
        # (background statements run beside the MPL: at most [background] mpl of them, only
        # while no foreground statement is in service, so none ever waits for their slot)
        if self.limits.release_after is not None and mpl is not None:
            self._release_overrun(now)
        if self._lane_factor is not None and mpl is not None and self._overran < _LONG_BESIDE * mpl:
            self._release_long(now, mpl)
        while mpl is None or self.running - self._bg_running - self._released < mpl:
            job = self._pick_newest(now) if newest else self._pick(now)
            if job is None or not self._fits(job):
                # head-of-line (faithful, or an aged job); backfill found nothing that fits;
                # with tenants also a DRR hold or nothing a tier may start
                deadline = self.next_deadline()
                self._blocked_until = _FOREVER if deadline is None else deadline
                break
            self._take(job)
            self._admit(job, now)
            granted.append(job)
            if not self.queued:
                break
        if newest:
            self.stats.newest_first += len(granted)
        if self._lane_factor is not None and mpl is not None and self.queued:
            self._admit_short(now, mpl, self._lane_factor, granted)
        return granted

    def _take(self, job: Job) -> None:
        """Take a picked job out of its queue (its class's head, or under overload its newest)."""
        st, lane = job.klass, job.lane
        i = st.index
        queue = lane.queues[i]
        lane.lives[i] -= 1
        lane.live -= 1
        st.live -= 1
        self.queued -= 1
        if queue[0] is not job:  # the newest, picked under overload
            queue.pop()
            return
        queue.popleft()
        if queue and queue[0].state is _QUEUED:
            lane.head_seq[i] = queue[0].seq
        else:
            self._settle(lane, i)

    def _admit_short(self, now: float, mpl: int, factor: float, granted: list[Job]) -> None:
        """The short lane: with the MPL full, admit beside it the oldest statement of the shortest
        class whose D_r is at most 1/``factor`` of the least expected remaining time of the
        statements holding the MPL (``_left``: their class's D_r minus their time in
        service, at least half their D_r; for a class whose D_r is still a prior, or one
        past twice its class's tail, their time in service) — while fewer than MPL
        statements run beside it. A statement in the lane that runs past twice its class's
        tail is one of the class's rare long runs, not the short statement it was let in as:
        it gives its place up (at most 2 × MPL statements beside the MPL so at once, see
        ``_release_long``) — four range queries that each turned out to cover the whole
        table (two holding the MPL, two the lane) otherwise made point lookups queue 100–400
        ms behind them for the length of their runs. Shortest remaining first is what
        minimizes the mean response time (SRPT); the MPL cannot preempt, so a statement that
        would wait for a slot much longer than it runs is let in to share the cores instead,
        and what it costs the statements in service is about its own D_r.
        Only classes with a measured D_r (not a prior), within the thread and memory budgets,
        and without tenants (a tenant's MPL and DRR share decide there). O(in service + K)
        per admission."""
        if self._multi or self.running - self._bg_running - self._released < mpl:
            return  # (not the MPL that holds the queue back)
        remaining = _FOREVER
        overran = self._overran
        for job in self._in_service.values():
            if job.admitted_at is None:
                continue
            if not job.released:
                left = _left(job, now)
                if left < remaining:
                    remaining = left
            elif (
                not job.overran
                and overran < _LONG_BESIDE * mpl
                and now - job.admitted_at > job.klass.tail
            ):
                job.overran = True  # (one of its class's rare long runs: see the docstring)
                overran += 1
                self.stats.long += 1
        self._overran = overran
        limit = remaining / factor
        lane = self._lane0
        while self._released - overran < mpl and self.queued and limit > 0:
            best: Job | None = None
            for i in lane.nonempty:
                head = lane.queues[i][0]
                st = head.klass
                if not st.known or st.demand > limit:
                    continue
                if best is None or (st.demand, head.seq) < (best.klass.demand, best.seq):
                    best = head
            if best is None or not self._fits(best):
                return
            self._take(best)
            best.released = True
            self._released += 1
            self.stats.short += 1
            self._admit(best, now)
            granted.append(best)


def _left(job: Job, now: float) -> float:
    """What a statement in service is expected to have left, for the short lane. For a class
    not measured yet (its D_r a prior), as long as it has run — the only evidence there is.
    For a measured class, its D_r less what it has run, but never under half its D_r: D_r is
    an average, and a statement near or past it is neither at its end (a fixed service time
    would say nothing is left) nor at its start (a memoryless one would say all of D_r) — a
    long statement sharing the cores runs past the D_r it has alone. Counting nothing left
    shut the lane for every such statement until it ended (point lookups of 1 ms waited
    10–250 ms behind 150 ms scans on two cores, measured); counting what it ran let 15 ms
    statements in beside 150 ms ones that were about to end, and cost those the tail (in the
    simulator on TPC-H). Past twice its class's tail (``D_tail``: what 9 in 10 of the class's
    statements end within; once is not enough, a statement of an even class slowed by sharing
    the cores runs past it one time in ten), a statement is not one its D_r describes — one
    of the few long ones of a class of mostly short ones — and counts as having as long to go
    as it ran, like one of a class not measured: with half its class's D_r left, a 2 ms range
    query's rare 160 ms run shut the lane, and point lookups queued behind it."""
    ran = now - job.admitted_at  # type: ignore[operator]
    st = job.klass
    if st.known:
        if ran > st.tail:
            return max(ran, st.demand / 2)
        return max(st.demand - ran, st.demand / 2)
    return ran


def _past_tail(c: ClassProfile) -> tuple[float, float]:
    """The times in service past which a statement of class ``c`` is one of its rare long
    ones: for the lane (``_left``, ``_admit_short``) twice its D_tail, for its MPL slot
    (``Scheduler._release_long``) four times; never, while the tail is not known."""
    if not c.D_tail:
        return _FOREVER, _FOREVER
    return _PAST_TAIL * c.D_tail, _LONG_RUN * c.D_tail


def _cost(demand: float | None) -> float:
    """A class's expected service for DRR (s): its D_r, at least a millisecond."""
    return max(1e-3, float(demand or 0.0))


def _lane_factor(limits: Limits, policy: Policy) -> float | None:
    """The short lane's factor: the limits' (0: none), else the policy's own."""
    factor = policy.short_lane if limits.short_lane is None else limits.short_lane
    return factor or None


def _measured(c: ClassProfile) -> bool:
    """Whether a class's D_r was measured, in training or live (not a prior)."""
    return c.live > 0 or c.D_trained is not None or c.D_runs > 0 or c.count > 0


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
