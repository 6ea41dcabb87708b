"""The admission gate on an event loop, without sockets: who is told what, and when."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission import ClassProfile, EtaModel, Limits, Scheduler
from admission.classify import QueryClass
from proxy.gate import AdmissionGate

A, B = QueryClass("fp:a", "A"), QueryClass("fp:b", "B")


class Recorder:
    def __init__(self) -> None:
        self.told: list[tuple[str, int]] = []

    def admitted(self, job: int) -> None:
        self.told.append(("admitted", job))

    def refused(self, job: int, sqlstate: str, message: str) -> None:
        self.told.append((sqlstate, job))


def test_admit_answers_at_once_when_it_can_and_tells_the_waiter_otherwise() -> None:
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=1)))
        first, second = Recorder(), Recorder()
        assert gate.admit(1, A, False, "select 1", first) is True
        assert first.told == []  # the caller goes on; nobody is called back
        assert gate.admit(2, A, False, "select 1", second) is False
        assert second.told == []
        gate.release(1)
        assert second.told == [("admitted", 2)]
        gate.release(2)
        assert gate.scheduler.in_service == 0

    asyncio.run(run())


def test_what_arrives_is_counted_admitted_queued_or_refused_but_not_bypassed() -> None:
    # the adaptive MPL's demand: a statement turned away by a full queue arrived all the same
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=1)), max_queue=1)
        told = Recorder()
        assert gate.admit(1, A, False, "select 1", told)  # runs
        assert not gate.admit(2, A, False, "select 1", told)  # waits
        assert not gate.admit(3, A, False, "select 1", told)  # refused: the queue is full
        assert gate.admit(4, B, True, "begin", told)  # bypasses admission
        assert told.told == [("53300", 3)]
        assert gate.scheduler.arrivals_by_class() == {"fp:a": 3, "fp:b": 0}

    asyncio.run(run())


def test_grants_made_by_a_release_reach_their_own_waiters_in_order() -> None:
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=1)))
        waiters = {job: Recorder() for job in (1, 2, 3)}
        assert gate.admit(1, A, False, "a", waiters[1])
        assert not gate.admit(2, B, False, "b", waiters[2])
        gate.release(1)  # 2 is admitted by this release: told through its own waiter
        assert waiters[2].told == [("admitted", 2)]
        assert not gate.admit(3, A, False, "a", waiters[3])
        assert waiters[3].told == []
        gate.release(2)
        assert waiters[3].told == [("admitted", 3)]

    asyncio.run(run())


def test_with_a_queue_timeout_every_grant_goes_through_the_waiter() -> None:
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=1, queue_timeout=0.05)))
        first, second = Recorder(), Recorder()
        assert gate.admit(1, A, False, "a", first)  # nothing queued, no timer: at once
        assert first.told == []
        assert not gate.admit(2, A, False, "a", second)
        assert gate._timer is not None and gate._calm is None  # 2's deadline
        await asyncio.sleep(0.2)
        assert second.told == [("57014", 2)]
        gate.release(1)
        assert gate.scheduler.in_service == 0 and gate.scheduler.queued == 0

    asyncio.run(run())


def test_submit_keeps_telling_the_waiter() -> None:
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=2)))
        waiter = Recorder()
        gate.submit(1, A, False, "a", waiter)
        assert waiter.told == [("admitted", 1)]

    asyncio.run(run())


def test_limits_changed_behind_the_gates_back_end_the_shortcut() -> None:
    """Aging set on the scheduler directly, not through ``apply``: the next statement still
    goes the long way, which arms the timer that ages the one queued behind it."""

    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=1)))
        first, second = Recorder(), Recorder()
        assert gate.admit(1, A, False, "a", first) is True
        gate.release(1)
        gate.scheduler.set_limits(Limits(mpl=1, max_wait=0.05), gate.now)
        assert gate.admit(2, A, False, "a", first) is False  # told through the waiter
        assert first.told == [("admitted", 2)]
        assert gate.admit(3, B, False, "b", second) is False
        assert gate._timer is not None  # armed at job 3's aging deadline
        gate.release(2)
        assert second.told == [("admitted", 3)]
        gate.release(3)
        assert gate.scheduler.in_service == 0

    asyncio.run(run())


def test_an_admission_asked_for_during_a_delivery_is_told_after_it() -> None:
    """A waiter that submits its next statement from inside its callback is told about that
    one through the FIFO, after the callback returns: callbacks never nest."""

    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=2)))
        told: list[str] = []

        class Chained(Recorder):
            def admitted(self, job: int) -> None:
                told.append(f"start {job}")
                if job == 2:
                    gate.release(1)  # room for one more, nothing queued: calm
                    assert gate.admit(3, A, False, "a", self) is False
                told.append(f"end {job}")

        waiter = Chained()
        assert gate.admit(1, A, False, "a", waiter) is True
        assert gate.admit(9, A, False, "a", waiter) is True
        assert gate.admit(2, A, False, "a", waiter) is False  # queued
        gate.release(9)  # admits 2
        assert told == ["start 2", "end 2", "start 3", "end 3"]
        for job in (2, 3):
            gate.release(job)
        assert gate.scheduler.in_service == 0

    asyncio.run(run())


def test_deliveries_left_by_a_raising_callback_go_out_with_the_next_release() -> None:
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=1)))

        class Raising(Recorder):
            def admitted(self, job: int) -> None:
                assert gate.cancel(3)  # its refusal waits in the FIFO behind this callback
                raise RuntimeError("a bug in a callback")

        calm = Recorder()
        assert gate.admit(1, A, False, "a", calm) is True
        assert gate.admit(2, A, False, "a", Raising()) is False
        assert gate.admit(3, A, False, "a", calm) is False
        with pytest.raises(RuntimeError):
            gate.release(1)  # admits 2, whose callback raises
        assert calm.told == []
        gate.release(2)  # admits nothing, but the refusal left in the FIFO goes out now
        assert calm.told == [("57014", 3)]
        assert gate.scheduler.in_service == 0 and gate.scheduler.queued == 0

    asyncio.run(run())


def test_the_lane_is_open_only_when_admission_is_certain() -> None:
    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=2)))
        assert gate._lane == 2 and gate.admits_at_once()
        assert gate.admit(1, A, False, "a", Recorder())
        assert gate.admits_at_once()
        assert gate.admit(2, A, False, "a", Recorder())
        assert not gate.admits_at_once()  # the MPL is reached
        gate.release(2)
        assert gate.admits_at_once()
        gate.scheduler.set_limits(Limits(mpl=2), gate.now)  # behind the gate's back
        assert not gate.admits_at_once()  # until the gate has seen the new limits
        gate.release(1)
        assert gate.admits_at_once()
        gate.set_limits(Limits(mpl=2, threads=4))
        assert gate._lane == -1 and not gate.admits_at_once()  # a thread budget
        for limits in (Limits(mpl=1, max_wait=1.0), Limits(mpl=1, queue_timeout=1)):
            gate.set_limits(limits)
            assert gate._lane == 1 and gate.admits_at_once(), limits  # no timer armed yet
            assert gate.admit(3, A, False, "a", Recorder())
            assert not gate.admit(4, A, False, "a", Recorder())  # queued: a timer is armed
            assert gate._lane == -1 and not gate.admits_at_once(), limits
            gate.release(3)  # admits 4: nothing queued, the timer goes
            assert gate._lane == 1 and not gate.admits_at_once()  # (4 holds the MPL)
            gate.release(4)
            assert gate.admits_at_once()
        gate.set_limits(Limits())
        assert gate._lane > 1_000_000 and gate.admits_at_once()  # no MPL
        assert AdmissionGate(Scheduler(None, "fcfs", Limits()), max_queue=0)._lane == -1

    asyncio.run(run())


def test_the_lane_is_shut_inside_a_delivery() -> None:
    """A callback runs while the gate delivers: a statement it submits is told through the
    FIFO, so it must not be forwarded ahead of ``admit`` either."""

    async def run() -> None:
        gate = AdmissionGate(Scheduler(None, "fcfs", Limits(mpl=3)))
        seen: list[bool] = []

        class Looking(Recorder):
            def admitted(self, job: int) -> None:
                gate.release(1)  # room again, nothing queued
                seen.append(gate.admits_at_once())
                gate.wake()  # the gate runs its bookkeeping from inside the delivery
                seen.append(gate.admits_at_once())

        for job in (1, 8, 9):
            assert gate.admit(job, A, False, "a", Recorder())
        assert not gate.admit(2, A, False, "a", Looking())
        gate.release(9)  # admits 2: its callback looks
        assert seen == [False, False]
        assert gate.admits_at_once()  # open again once the delivery is over
        for job in (2, 8):
            gate.release(job)
        assert gate.scheduler.running == 0

    asyncio.run(run())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["admit", "bypass", "release", "cancel", "limits", "behind"]),
            st.integers(min_value=0, max_value=7),
        ),
        max_size=40,
    )
)
def test_a_statement_in_the_lane_is_always_admitted_at_once(
    steps: list[tuple[str, int]],
) -> None:
    """Whatever happened before (grants, releases, cancels, limits changed through the gate
    or behind it, aging, timeouts, a thread budget), a statement submitted while the lane is
    open is admitted at once: the connection has already forwarded it."""
    limits_choices = [
        Limits(mpl=1),
        Limits(mpl=3),
        Limits(),
        Limits(mpl=2, threads=2),
        Limits(mpl=2, max_wait=5.0),
        Limits(mpl=2, queue_timeout=5.0),
    ]

    async def run() -> None:
        model = EtaModel(
            classes=(
                ClassProfile(fingerprint="fp:a", name="A", D=1, f=1),
                ClassProfile(fingerprint="fp:b", name="B", D=1, f=2),  # two threads
            )
        )
        gate = AdmissionGate(Scheduler(model, "fcfs", Limits(mpl=2)), max_queue=4)
        live: list[int] = []
        classes = [A, B]
        for n, (step, arg) in enumerate(steps, start=1):
            if step in ("admit", "bypass"):
                lane = gate.admits_at_once()
                admitted = gate.admit(n, classes[arg % 2], step == "bypass", "x", Recorder())
                assert admitted or not lane, (n, step)
                live.append(n)
            elif step == "release" and live:
                gate.release(live.pop(arg % len(live)))
            elif step == "cancel" and live:
                gate.cancel(live[arg % len(live)])
            elif step == "limits":
                limits = limits_choices[arg % len(limits_choices)]
                gate.set_limits(limits)
            elif step == "behind":
                gate.scheduler.set_limits(limits_choices[arg % len(limits_choices)], gate.now)
        for job in live:
            gate.release(job)
        assert gate.scheduler.running == 0

    asyncio.run(run())


class Warned(Recorder):
    def warn(self, job: int, message: str) -> None:
        self.told.append((message, job))


def test_a_statement_larger_than_the_memory_budget_runs_alone_and_its_client_is_told() -> None:
    model = EtaModel(
        classes=(
            ClassProfile(fingerprint="fp:a", name="A", D=0.1, f=1, M=300 * 2**20),
            ClassProfile(fingerprint="fp:b", name="B", D=0.1, f=1, M=10 * 2**20),
        )
    )

    async def run() -> None:
        gate = AdmissionGate(Scheduler(model, "fcfs", Limits(mpl=4, memory=100 * 2**20)))
        small, big, after = Warned(), Warned(), Warned()
        assert gate.admit(1, B, False, "b", small) and small.told == []  # fits: nothing said
        assert not gate.admit(2, A, False, "a", big)  # waits for the server to empty
        ((message, job),) = big.told
        assert job == 2 and "class A take 300 MiB" in message and "budget (100 MiB)" in message
        assert "runs alone" in message
        assert not gate.admit(3, B, False, "b", after)  # FCFS: behind the big one
        gate.release(1)
        assert big.told[-1] == ("admitted", 2) and after.told == []
        gate.release(2)
        assert after.told == [("admitted", 3)]

    asyncio.run(run())
