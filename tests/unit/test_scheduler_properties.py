"""Property tests of the scheduler under random interleavings (hypothesis state machine).

Invariants: a non-bypass grant never exceeds the MPL, the thread budget or the memory budget;
every admitted job is released exactly once; no job is lost or admitted twice; the incrementally
kept scores equal η·N recomputed from scratch; and once every client is done all capacity is
back.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from admission import ClassProfile, EtaModel, Event, Limits, Scheduler
from admission.policies import POLICIES

CLASSES = ("A", "B", "C")


def _model() -> EtaModel:
    profiles = [
        ClassProfile(fingerprint="A", name="A", D=1, f=1, U=0.3, Q=2.0, M=100),
        ClassProfile(fingerprint="B", name="B", D=4, f=3, U=0.5, Q=5.0, M=700.5),
        ClassProfile(fingerprint="C", name="C", D=2, f=6, U=0.1, Q=1.0),  # memory unknown
    ]
    a = ((2.5, 1.0, 3.0), (4.0, 6.0, 2.0), (0.5, 1.5, 1.2))
    return EtaModel(classes=tuple(profiles), A_matrix=a)


limits_strategy = st.builds(
    Limits,
    mpl=st.one_of(st.none(), st.integers(1, 5)),
    threads=st.one_of(st.none(), st.integers(1, 12)),
    memory=st.one_of(st.none(), st.integers(50, 1600)),
    backfill=st.booleans(),
    max_wait=st.one_of(st.none(), st.floats(0, 5)),
    queue_timeout=st.one_of(st.none(), st.floats(0.5, 10)),
    due_factor=st.one_of(st.none(), st.floats(0, 30)),
    lifo_after=st.one_of(st.none(), st.floats(0, 4)),
    release_after=st.one_of(st.none(), st.floats(0.1, 4)),
    short_lane=st.one_of(st.none(), st.floats(1, 8)),
)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(sorted(POLICIES)), limits=limits_strategy)
    def start(self, policy: str, limits: Limits) -> None:
        self.now = 0.0
        self.next_id = 0
        self.queued: set[int] = set()
        self.running: set[int] = set()
        self.bypass: set[int] = set()
        self.ended: set[int] = set()
        self.granted_ever: set[int] = set()
        self.released: set[int] = set()  # in service, their MPL slot given back
        self.s = Scheduler(_model(), policy, limits, listener=self.on_event)

    def on_event(self, e: Event) -> None:
        job = int(e.job)  # type: ignore[call-overload]
        if e.kind == "grant":
            assert job not in self.granted_ever, f"job {job} admitted twice"
            self.granted_ever.add(job)
            if e.detail != "bypass":
                assert job in self.queued, f"job {job} admitted without being queued"
                self.queued.discard(job)
                if e.detail == "short":
                    self.short_lane_grant(job)
                # the granter admits only what fits, bypass work and lowered limits included
                lim = self.s.limits
                if lim.mpl is not None and e.detail != "short":  # (the lane: beside the MPL)
                    counted = self.s.in_service - self.s.released_in_service
                    assert counted <= lim.mpl, "MPL exceeded by a grant"
                if lim.threads is not None:
                    assert self.s.threads_in_use <= lim.threads, "thread budget exceeded"
                if lim.memory is not None:
                    assert self.s.memory_in_use <= lim.memory, "memory budget exceeded"
            self.running.add(job)
        elif e.kind == "release":
            assert job in self.running, f"job {job} released but not running"
            self.running.discard(job)
            self.released.discard(job)
            self.ended.add(job)
        elif e.kind == "overrun":
            assert job in self.running, f"job {job} gave back a slot it does not hold"
            assert job not in self.released, f"job {job} gave back its slot twice"
            lim = self.s.limits
            assert lim.release_after is not None and lim.mpl is not None
            job_ = self.s.job(job)
            assert job_ is not None and job_.admitted_at is not None
            assert self.now - job_.admitted_at >= lim.release_after, "released too early"
            assert self.s.queued, "released with nothing waiting"
            self.released.add(job)
            assert len(self.released) <= lim.mpl, "more released than the MPL"
        elif e.kind in ("cancel", "timeout", "shed"):
            assert job in self.queued, f"job {job} withdrawn but not queued"
            self.queued.discard(job)
            self.ended.add(job)

    def short_lane_grant(self, job: int) -> None:
        """A grant beside a full MPL: with the lane on, of a class with a measured D_r, at most
        1/short_lane of the least expected remaining time of those holding the MPL."""
        lim, s = self.s.limits, self.s
        assert lim.short_lane is not None and lim.mpl is not None, "a short grant without a lane"
        job_ = s.job(job)
        assert job_ is not None and job_.klass.known, "a class never measured took the lane"
        counted = [
            j
            for j in (s.job(i) for i in self.running)
            if j is not None and not j.released and j.admitted_at is not None
        ]
        assert len(counted) >= lim.mpl, "the lane admitted beside an MPL that was not full"
        least = min(
            (j.klass.demand if j.klass.known else 2 * (self.now - j.admitted_at))  # type: ignore[operator]
            - (self.now - j.admitted_at)  # type: ignore[operator]
            for j in counted
        )
        assert job_.klass.demand * lim.short_lane <= least * (1 + 1e-9), "not short enough"
        self.released.add(job)
        assert len(self.released) <= lim.mpl, "more beside the MPL than the MPL"

    @rule(
        cls=st.sampled_from((*CLASSES, "NEW1", "NEW2")),
        bypass=st.booleans(),
        fork=st.one_of(st.none(), st.integers(1, 20)),
    )
    def submit(self, cls: str, bypass: bool, fork: int | None) -> None:
        job = self.next_id
        self.next_id += 1
        if bypass:
            self.bypass.add(job)
        else:
            self.queued.add(job)
        self.s.submit(job, cls, self.now, fork=fork, bypass=bypass)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.running)))
        self.s.complete(job, self.now)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), release=st.integers(0, 4))
    def release_tasks(self, data: st.DataObject, release: int) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        job = self.s.job(job_id)
        assert job is not None
        self.s.update_tasks(job_id, max(0, job.tasks - release), release, self.now)

    @precondition(lambda self: self.queued)
    @rule(data=st.data(), by_client=st.booleans())
    def withdraw(self, data: st.DataObject, by_client: bool) -> None:
        job = data.draw(st.sampled_from(sorted(self.queued)))
        if by_client:
            self.s.complete(job, self.now)
        else:
            self.s.cancel(job, self.now)

    @rule()
    def make_room(self) -> None:
        oldest = min(self.queued, default=None)  # ids are given in arrival order
        shed = self.s.make_room(self.now)
        if shed is not None:
            assert shed.id == oldest, "make_room shed a job other than the oldest"
            assert self.s.job(shed.id) is None

    @rule(dt=st.floats(0, 3))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.s.tick(self.now)
        deadline = self.s.next_deadline()
        assert deadline is None or deadline > self.now, "a tick would not make progress"

    @rule(limits=limits_strategy)
    def change_limits(self, limits: Limits) -> None:
        self.s.set_limits(limits, self.now)

    @rule(policy=st.sampled_from(sorted(POLICIES)))
    def change_policy(self, policy: str) -> None:
        self.s.set_policy(policy, self.now)

    @invariant()
    def books_balance(self) -> None:
        s = self.s
        assert s.queued == len(self.queued)
        assert s.in_service == len(self.running)
        held = sum(j.held for j in (s.job(i) for i in self.running) if j is not None)
        assert s.threads_in_use == held >= 0
        memory = sum(j.memory_held for j in (s.job(i) for i in self.running) if j is not None)
        assert s.memory_in_use == memory >= 0
        assert s.released_in_service == len(self.released)
        total = len(self.queued) + len(self.running) + len(self.ended)
        assert total == self.next_id, "a job was lost"

    @invariant()
    def a_release_due_is_not_left_waiting(self) -> None:
        """While statements wait behind a full MPL with fewer than MPL released, no statement
        has been in service release_after without having given its slot back."""
        s = self.s
        lim = s.limits
        if lim.release_after is None or lim.mpl is None or not s.queued:
            return
        if s.released_in_service >= lim.mpl or s.in_service - s.released_in_service < lim.mpl:
            return
        for job_id in self.running:
            job = s.job(job_id)
            assert job is not None and job.admitted_at is not None
            if not job.released:
                assert job.admitted_at + lim.release_after > self.now, f"{job_id} not released"

    @invariant()
    def scores_are_exact(self) -> None:
        s = self.s
        prio = s.policy.build(s.model)
        n = s.tasks_by_class()
        for r, got in enumerate(s.scores()):
            want = prio.bias[r] + sum(prio.eta[r][c] * n[c] for c in range(len(n)))
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (r, got, want)

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        s = self.s
        s.set_limits(Limits(), self.now)  # unlimited: everything queued is admitted
        for job in sorted(self.running):
            s.complete(job, self.now)
        assert not self.queued and not self.running
        assert s.in_service == 0 and s.threads_in_use == 0 and s.queued == 0
        assert s.memory_in_use == 0
        assert s.released_in_service == 0
        assert s.tasks_by_class() == [0] * len(s.tasks_by_class())
        assert self.granted_ever | self.ended >= set(range(self.next_id))


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_capacity_never_exceeded_at_grant() -> None:
    """Direct check of the granter: with a fixed budget, a flood of submissions admits exactly
    what fits and the rest waits."""
    s = Scheduler(_model(), "min-a", Limits(mpl=4, threads=7))
    for i in range(50):
        s.submit(i, CLASSES[i % 3], float(i))
        assert s.in_service <= 4 and s.threads_in_use <= 7
    assert s.in_service + s.queued == 50


def test_observers_are_registered_not_replaced() -> None:
    """Two observers of each kind both hear every change, in the order registered."""
    heard: list[tuple[str, object]] = []
    s = Scheduler(None, "fcfs", Limits(mpl=1), listener=lambda e: heard.append(("e1", e.kind)))
    s.observe(events=lambda e: heard.append(("e2", e.kind)))
    s.observe(grants=lambda job, n: heard.append(("g1", job.id)))
    s.observe(grants=lambda job, n: heard.append(("g2", job.id)))
    s.observe(finishes=lambda job, now: heard.append(("f1", job.state.value)))
    s.observe(finishes=lambda job, now: heard.append(("f2", job.state.value)))
    s.submit(1, "fp:a", 0.0)
    s.complete(1, 1.0)
    kinds = [who for who, _ in heard]
    assert kinds[:2] == ["e1", "e2"]  # submit
    assert ["g1", "g2"] == [k for k in kinds if k.startswith("g")]
    assert [("f1", "done"), ("f2", "done")] == [h for h in heard if h[0].startswith("f")]
    assert kinds.count("e1") == kinds.count("e2") >= 3  # submit, grant, release


def test_the_memory_budget_by_hand() -> None:
    """Faithful: a job whose M_r does not fit waits, and so does everything behind it; with
    backfill a smaller one goes past; a job bigger than the whole budget runs alone."""
    s = Scheduler(_model(), "fcfs", Limits(memory=1000))
    assert [j.id for j in s.submit(1, "B", 0.0)] == [1]  # 701 of 1000
    assert s.memory_in_use == 701
    assert s.submit(2, "B", 0.1) == []  # 1402 > 1000: waits
    assert s.submit(3, "A", 0.2) == []  # fits, but FCFS is faithful: behind 2
    assert [j.id for j in s.complete(1, 1.0)] == [2, 3]
    assert s.memory_in_use == 801
    s.complete(2, 2.0)
    s.complete(3, 2.0)
    assert s.memory_in_use == 0

    s = Scheduler(_model(), "fcfs", Limits(memory=1000, backfill=True))
    s.submit(1, "B", 0.0)
    assert s.submit(2, "B", 0.1) == []
    assert [j.id for j in s.submit(3, "A", 0.2)] == [3]  # backfilled past 2
    assert [j.id for j in s.submit(4, "C", 0.3)] == [4]  # memory unknown: reserves none
    assert s.memory_in_use == 801

    s = Scheduler(_model(), "fcfs", Limits(memory=500))
    assert [j.id for j in s.submit(1, "B", 0.0)] == [1]  # 701 > 500: admitted, alone
    assert s.memory_in_use == 500
    assert s.submit(2, "A", 0.1) == []
    assert [j.id for j in s.complete(1, 1.0)] == [2]


def test_a_class_learned_live_reserves_the_default_profiles_memory() -> None:
    s = Scheduler(_model(), "fcfs", Limits(memory=10_000))
    s.submit(1, "unseen", 0.0, name="unseen")
    job = s.job(1)
    assert job is not None and job.memory == math.ceil(_model().default_profile().M or 0) > 0
