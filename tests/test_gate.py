"""The admission gate on an event loop, without sockets: who is told what, and when."""

from __future__ import annotations

import asyncio

import pytest

from admission import Limits, Scheduler
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
        assert not gate.admit(1, A, False, "a", first)  # a timer is armed: no shortcut
        assert first.told == [("admitted", 1)]
        assert not gate.admit(2, A, False, "a", second)
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
