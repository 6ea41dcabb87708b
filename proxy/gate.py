"""The admission gate: the pure ``Scheduler`` on an asyncio event loop.

The gate passes the monotonic clock to the scheduler, arms a timer at the scheduler's next deadline
(aging, queue timeouts), bounds the queue (a full queue answers at once instead of growing), and
turns grants into callbacks. Callbacks are delivered one at a time from a FIFO, never nested: a
callback that releases a job (and so admits others) only appends to the FIFO.

Every job submitted is eventually released exactly once — by ``release`` (its statement ended,
its client or backend died), by a rejection (timeout, cancel, queue full; the scheduler already
forgot it) — so capacity always comes back.

The interface, in the vocabulary of CockroachDB's admission package: a requester ``admit``-s
(or ``submit``-s) a job under an id from ``new_job``/``job_ids`` and is told through its
``AdmissionClient`` interface; ``release`` gives the capacity back. ``admits_at_once()`` is the
granter's side-effect-free "would it be granted now" for the fast path: nothing queued, room
under the MPL, no thread budget, no timer armed; the connection then forwards the statement
first and admits it after, so the database starts on it while the scheduler does its
bookkeeping. Control changes are methods (``set_policy``, ``set_limits``, ``set_model``);
whoever wants to watch registers an observer on the scheduler (``Scheduler.observe``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from admission.classify import QueryClass
from admission.model import EtaModel
from admission.policies import Policy
from admission.scheduler import Job, JobState, Limits, Scheduler
from admission.workloads import WorkloadConfig
from proxy.wire import protocol as pg

__all__ = ["AdmissionClient", "AdmissionGate", "GateStats"]

TIMER_SLACK = 0.001  # s: a deadline's timer fires this much after it (see ``_arm_timer``)


class AdmissionClient(Protocol):
    """Whoever submitted a job (a client connection): told once, either way."""

    def admitted(self, job: int) -> None: ...

    def refused(self, job: int, sqlstate: str, message: str) -> None: ...

    def warn(self, job: int, message: str) -> None:
        """A NOTICE for the client about ``job``, ahead of its results."""
        ...

    @property
    def backend_pid(self) -> int | None:
        """The database process that runs this client's statements, when there is one (the
        training sampler attributes that process's threads to the job)."""
        ...

    @property
    def parameters(self) -> dict[str, str]:
        """The client's startup parameters (user, database, application_name, …): what a
        workload class matches on."""
        ...


@dataclass(slots=True)
class GateStats:
    queue_full: int = 0
    shed: int = 0  # the oldest queued statement, to make room under overload
    timed_out: int = 0
    cancelled: int = 0


class AdmissionGate:
    def __init__(self, scheduler: Scheduler, *, max_queue: int | None = 10_000) -> None:
        self.scheduler = scheduler
        self.max_queue = max_queue
        self.stats = GateStats()
        # work memory granted to the statements admitted, bytes in total (the relay's
        # --grant-work-mem, which keeps it current; None: no grants), for the admin API
        self.work_mem_grant: int | None = None
        # the lease keeper when the MPL is a global budget (proxy.coordinator), for the admin API
        self.coordinator: Any = None
        # the relay's server connection pools in transaction pool mode (proxy.pool), likewise
        self.pools: Any = None
        # the embedded DuckDB's connections shared by its sessions (its ``Cursors``), or None
        self.cursors: Any = None
        # the limit on writing transactions (proxy.contention: the embedded DuckDB's, or the
        # relay's with --contention), or None
        self.contention: Any = None
        # job ids: unique among everything this gate sees (sessions draw from it directly)
        self.job_ids = itertools.count(1)
        self._waiters: dict[int, AdmissionClient] = {}
        self._deliveries: deque[tuple[Callable[..., None], tuple[object, ...]]] = deque()
        self._delivering = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        # The scheduler's clock: the monotonic clock itself, not the loop's. uvloop's
        # ``loop.time()`` counts whole milliseconds and is read once per loop iteration, so a
        # statement of 0.3 ms measured 0 or 1 ms and every D_r learned was a multiple of 1 ms.
        self._clock: Callable[[], float] = time.monotonic
        # the loop the timer is armed on (get_running_loop() checks the pid, a system call,
        # every time: looked up once)
        self._loop: asyncio.AbstractEventLoop | None = None
        # The scheduler's limits while the gate is calm — no timer armed (aging and queue
        # timeouts arm one only while a queued statement has a deadline) — else None. Calm, a
        # grant to the job just submitted and a release that admits nothing have nothing more
        # to do (no deadline moves, nothing times out); ``s.limits is self._calm`` asks it in
        # one test, twice per statement. Set by ``_arm_timer``, which ends every ``_after``;
        # limits changed behind the gate's back are a new object, so the test fails and
        # ``_after`` runs.
        self._calm: Limits | None = None
        # The lane: while ``scheduler.limits is _calm``, a statement submitted when nothing is
        # queued and fewer than ``_lane`` statements are in service is admitted at once
        # (``admits_at_once``). -1 when there is no such promise: not calm, a thread budget
        # (whether a job fits depends on its class's fork), a zero queue limit, or inside a
        # delivery.
        self._lane = -1
        self._arm_timer()

    @property
    def now(self) -> float:
        return self._clock()

    def new_job(self) -> int:
        """A fresh job id."""
        return next(self.job_ids)

    def admits_at_once(self) -> bool:
        """Whether a statement ``admit``-ted now is certain to be admitted at once (True is a
        promise; False promises nothing). No side effects: the fast path asks it first and
        forwards the statement before admitting it."""
        s = self.scheduler
        return not s.queued and s.running < self._lane and s.limits is self._calm

    def submit(
        self, job: int, query_class: QueryClass, bypass: bool, sql: str, waiter: AdmissionClient
    ) -> None:
        """Queue a statement; ``waiter.admitted(job)`` or ``waiter.refused(job, …)`` follows."""
        if self.admit(job, query_class, bypass, sql, waiter):
            waiter.admitted(job)

    def admit(
        self, job: int, query_class: QueryClass, bypass: bool, sql: str, waiter: AdmissionClient
    ) -> bool:
        """``submit`` for a caller that goes on at once when it may: True means admitted now
        (``waiter`` is not told); False means ``waiter`` is told later, either way."""
        s = self.scheduler
        if (
            not bypass
            and self.max_queue is not None
            and s.queued >= self.max_queue
            and not self._make_room()
        ):
            self.stats.queue_full += 1
            # it arrived all the same: part of the demand the adaptive MPL must carry
            s.refused(query_class.fingerprint, query_class.name, sql)
            message = (
                f"too many statements waiting for admission (queue limit {self.max_queue}); "
                "try again later"
            )
            self._deliver([(waiter.refused, (job, pg.SQLSTATE_TOO_MANY, message))])
            return False
        self._waiters[job] = waiter
        tenant = tier = None
        workloads = s.workloads
        if workloads is not None:
            tenant, tier = workloads.assign(waiter.parameters, sql)
        granted = s.submit(
            job,
            query_class.fingerprint,
            self._clock(),
            name=query_class.name,
            bypass=bypass,
            sample_sql=sql,
            tenant=tenant,
            tier=tier,
        )
        if s.limits.memory is not None and not bypass:
            self._warn_oversized(job, waiter)
        if (
            len(granted) == 1
            and granted[0].id == job
            and s.limits is self._calm
            and not self._delivering  # (inside a delivery the FIFO tells it: never nested)
            and not self._deliveries  # (a statement shed to make room is told first)
        ):
            return True  # the usual case: nothing waits, no timers, nothing else to tell
        self._after(granted)
        return False

    def _warn_oversized(self, job: int, waiter: AdmissionClient) -> None:
        """A statement whose class takes more memory than the whole budget runs alone (the
        scheduler never deadlocks on it); its client is told why it waits for an empty server."""
        budget, queued = self.scheduler.limits.memory, self.scheduler.job(job)
        if budget is None or queued is None or queued.memory <= budget:
            return
        waiter.warn(
            job,
            f"statements of class {queued.klass.name} take {queued.memory / 2**20:.0f} MiB at "
            f"their peak (as measured), more than the whole memory budget "
            f"({budget / 2**20:.0f} MiB): this one runs alone, once nothing else holds memory",
        )

    def _make_room(self) -> bool:
        """A full queue under overload sheds its oldest statement (adaptive LIFO: it would be
        admitted last); False when the scheduler is not overloaded."""
        shed = self.scheduler.make_room(self._clock())
        if shed is None:
            return False
        self.stats.shed += 1
        waiter = self._waiters.pop(shed.id, None)  # type: ignore[call-overload]
        if waiter is not None:
            message = (
                f"shed under overload after waiting {self.now - shed.arrival:.1f} s for "
                f"admission: the queue is full (limit {self.max_queue}) and newer statements "
                "are admitted first; try again later"
            )
            self._deliveries.append((waiter.refused, (shed.id, pg.SQLSTATE_TOO_MANY, message)))
        return True

    def release(self, job: int) -> None:
        """The statement ended (or its connection died): give its capacity back."""
        self._waiters.pop(job, None)
        s = self.scheduler
        granted = s.complete(job, self._clock())
        if granted or s.limits is not self._calm:  # (else the usual release: nothing to do)
            self._after(granted)

    def client(self, job: int) -> AdmissionClient | None:
        """Who submitted ``job`` (while it is queued or in service)."""
        return self._waiters.get(job)

    def is_queued(self, job: int) -> bool:
        record = self.scheduler.job(job)
        return record is not None and record.state is JobState.QUEUED

    def cancel(self, job: int, reason: str = "canceling statement due to user request") -> bool:
        """Withdraw a queued job; its client is told ``57014``. False if it was not queued."""
        if not self.is_queued(job):
            return False
        waiter = self._waiters.pop(job, None)
        granted = self.scheduler.cancel(job, self.now)
        self.stats.cancelled += 1
        if waiter is not None:
            self._deliveries.append((waiter.refused, (job, pg.SQLSTATE_QUERY_CANCELED, reason)))
        self._after(granted)
        return True

    def wake(self) -> None:
        """Re-run the decision now."""
        self._after(self.scheduler.tick(self.now))

    # -- control: the jobs a change admits are told, like any other grant ----------------

    def set_policy(self, policy: str | Policy) -> None:
        self._after(self.scheduler.set_policy(policy, self.now))

    def set_limits(self, limits: Limits) -> None:
        if self.pools is not None:  # transaction pooling: never more than the connections
            size = self.pools.config.size
            mpl = size if not limits.mpl else min(limits.mpl, size)
            limits = dataclasses.replace(limits, mpl=mpl)
        self._after(self.scheduler.set_limits(limits, self.now))

    def set_workloads(self, config: WorkloadConfig) -> None:
        """Serve a reloaded workload-classes config."""
        self._after(self.scheduler.set_workloads(config, self.now))
        self._open_lane()

    def set_pressure(self, value: float) -> None:
        """The feedback signal background work is throttled by (admission.workloads)."""
        self._after(self.scheduler.set_pressure(value, self.now))

    def set_model(self, model: EtaModel, *, base: bool = False) -> None:
        """Serve ``model``; ``base``: one loaded anew (see ``Scheduler.set_model``)."""
        self._after(self.scheduler.set_model(model, self.now, base=base))

    # -- internals -------------------------------------------------------------------------

    def _after(self, granted: list[Job]) -> None:
        batch: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        for job in granted:
            waiter = self._waiters.get(job.id)  # type: ignore[call-overload]
            if waiter is not None:
                batch.append((waiter.admitted, (job.id,)))
        timed_out = self.scheduler.take_timed_out() if self.scheduler.timed_out else ()
        for job in timed_out:
            waiter = self._waiters.pop(job.id, None)  # type: ignore[call-overload]
            self.stats.timed_out += 1
            if waiter is not None:
                message = (
                    f"canceling statement due to queue timeout: it waited "
                    f"{self.now - job.arrival:.1f} s for admission (limit "
                    f"{self.scheduler.queue_timeout_of(job)} s)"
                )
                batch.append((waiter.refused, (job.id, pg.SQLSTATE_QUERY_CANCELED, message)))
        if batch or self._deliveries:
            self._deliver(batch)
        self._arm_timer()

    def _deliver(self, items: list[tuple[Callable[..., None], tuple[object, ...]]]) -> None:
        self._deliveries.extend(items)
        if self._delivering:
            return
        self._delivering = True
        self._lane = -1
        try:
            while self._deliveries:
                callback, args = self._deliveries.popleft()
                callback(*args)
        finally:
            self._delivering = False
            if self._deliveries:  # a callback raised: the next admit or release delivers
                self._calm = None
            # (the lane stays shut until _arm_timer, which ends every _after, opens it)

    def _arm_timer(self) -> None:
        """Arm the timer at the scheduler's next deadline when aging, queue timeouts or the
        latency policy's due rule may need one, and note whether the gate is calm (see
        ``__init__``)."""
        limits = self.scheduler.limits
        if self.scheduler.timed or self._timer is not None:
            deadline = self.scheduler.next_deadline()
            if deadline != self._timer_at:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                self._timer_at = deadline
                if deadline is not None:
                    loop = self._loop
                    if loop is None:
                        loop = self._loop = asyncio.get_running_loop()
                    # (in the loop's time, which may count whole milliseconds from the start
                    # of its iteration: a millisecond later, so that it never fires before the
                    # deadline; one that still did would find nothing due and arm again)
                    delay = max(deadline - self._clock(), 0.0) + TIMER_SLACK
                    self._timer = loop.call_later(delay, self._on_timer)
        # No timer armed: no queued statement has a deadline (one that had would have armed
        # it), so until a statement is queued — which takes the long way — nothing can time
        # out and no deadline can move. Never calm with workload classes: a release there can
        # make a deadline out of nothing (the DRR hold's end, background's start once the
        # foreground goes idle), which only ``_after`` arms. Nor while statements wait under
        # release_after or a short lane: a statement beside the MPL ending makes room for
        # another release, or for the lane to open once a statement runs long enough, whose
        # deadline only ``_after`` arms.
        s = self.scheduler
        calm = (
            self._timer is None
            and s.workloads is None
            and not ((limits.release_after is not None or s.short_lane is not None) and s.queued)
        )
        self._calm = limits if calm else None
        self._open_lane()

    def _open_lane(self) -> None:
        """Set ``_lane`` (see ``__init__``) from the calm limits."""
        limits = self._calm
        if (
            limits is None
            or self._delivering
            or limits.threads is not None
            or (self.max_queue is not None and self.max_queue < 1)
            or self.scheduler.workloads is not None  # (a tenant's limits, background's gate)
        ):
            self._lane = -1
        else:
            self._lane = sys.maxsize if limits.mpl is None else limits.mpl

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.wake()
