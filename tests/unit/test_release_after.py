"""``Limits.release_after``: a statement in service that long gives its MPL slot to the queue
(at most MPL of them at once) and runs on beside the MPL, so that long statements cannot hold
every slot while short ones wait. The theory check (an M/M/2m queue) is in test_sim_theory."""

from __future__ import annotations

import asyncio

import pytest

from admission import ClassProfile, EtaModel, Limits, Scheduler
from admission.classify import QueryClass
from proxy.gate import AdmissionGate


def _model() -> EtaModel:
    return EtaModel(
        classes=(
            ClassProfile(fingerprint="short", name="short", D=0.01, f=1),
            ClassProfile(fingerprint="long", name="long", D=30.0, f=1),
        )
    )


def _ids(jobs: list) -> list:  # type: ignore[type-arg]
    return [j.id for j in jobs]


def test_long_statements_give_their_slots_to_waiting_short_ones() -> None:
    s = Scheduler(
        _model(), "latency", Limits(mpl=2, release_after=1.0, due_factor=None, short_lane=0)
    )
    assert _ids(s.submit("L1", "long", 0.0)) == ["L1"]
    assert _ids(s.submit("L2", "long", 0.2)) == ["L2"]
    assert s.submit("s1", "short", 0.5) == []  # both slots held
    assert s.next_deadline() == pytest.approx(1.0)  # L1 in service 1 s by then
    assert s.tick(0.9) == []
    assert _ids(s.tick(1.0)) == ["s1"]  # L1 released: its slot goes to the queue
    assert s.released_in_service == 1 and s.stats.released == 1
    assert s.in_service == 3
    assert s.submit("s2", "short", 1.1) == []  # L2 not yet 1 s; the MPL counts L2 and s1
    assert s.next_deadline() == pytest.approx(1.2)
    assert _ids(s.tick(s.next_deadline())) == ["s2"]  # L2 released as well
    assert s.released_in_service == 2 and s.in_service == 4
    assert s.submit("s3", "short", 1.3) == []
    assert s.next_deadline() is None  # (at most MPL released: no release to time)
    assert s.tick(5.0) == []  # s1 and s2 in service 4 s: two released already, no more
    assert s.in_service == 4
    # a released job leaving frees no counted slot, but leaves room for one more release:
    # s1 has been in service ≥ 1 s with s3 waiting
    assert _ids(s.complete("L1", 6.0)) == ["s3"]
    assert s.released_in_service == 2 and s.in_service == 4
    for job in ("L2", "s1", "s2", "s3"):
        s.complete(job, 7.0)
    assert s.in_service == 0 and s.released_in_service == 0 and s.queued == 0


def test_nothing_is_released_while_nothing_waits() -> None:
    s = Scheduler(_model(), "fcfs", Limits(mpl=1, release_after=0.5))
    s.submit("L", "long", 0.0)
    assert s.next_deadline() is None  # nothing queued: no timer
    assert s.tick(10.0) == []
    assert s.released_in_service == 0
    # a statement arriving later than release_after after the first: admitted at once
    assert _ids(s.submit("x", "short", 10.0)) == ["x"]
    assert s.released_in_service == 1


def test_without_release_after_the_mpl_holds() -> None:
    s = Scheduler(_model(), "fcfs", Limits(mpl=1))
    s.submit("L", "long", 0.0)
    assert s.submit("x", "short", 0.1) == []
    assert s.next_deadline() is None
    assert s.tick(100.0) == []
    assert s.released_in_service == 0 and s.stats.released == 0


def test_lifting_the_limit_keeps_the_released_out_of_the_mpl_until_they_end() -> None:
    s = Scheduler(_model(), "fcfs", Limits(mpl=1, release_after=0.5))
    s.submit("L", "long", 0.0)
    s.submit("a", "short", 0.1)
    assert _ids(s.tick(0.5)) == ["a"]
    s.set_limits(Limits(mpl=1), 0.6)
    assert s.released_in_service == 1
    assert s.submit("b", "short", 0.7) == []  # a holds the one slot
    assert s.tick(50.0) == []  # no release any more
    assert _ids(s.complete("a", 51.0)) == ["b"]
    s.complete("L", 52.0)
    assert s.released_in_service == 0
    s.complete("b", 53.0)
    assert s.in_service == 0


def test_switched_on_at_run_time_it_covers_the_statements_already_in_service() -> None:
    """An operator sets release_after (PUT /limits) because long statements hold every slot
    already: they count from when they were admitted."""
    s = Scheduler(_model(), "fcfs", Limits(mpl=1))
    s.submit("L", "long", 0.0)
    s.submit("x", "short", 1.0)
    assert _ids(s.set_limits(Limits(mpl=1, release_after=0.5), 2.0)) == ["x"]
    assert s.released_in_service == 1
    s.submit("y", "short", 2.1)
    assert s.next_deadline() is None  # L holds the one release an MPL of 1 allows
    assert s.complete("L", 2.2) == []
    assert s.next_deadline() == pytest.approx(2.5)  # x, admitted at 2.0
    assert _ids(s.tick(2.5)) == ["y"]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_release_after_must_be_a_positive_number(bad: float) -> None:
    with pytest.raises(ValueError, match="release_after"):
        Limits(mpl=1, release_after=bad)


def test_the_gate_arms_its_timer_for_the_release() -> None:
    """Through the live gate: the short statement waiting behind a long one is admitted when
    the long one has been in service release_after, by the gate's own timer."""

    class Client:
        def __init__(self) -> None:
            self.admitted_at: float | None = None

        def admitted(self, job: object) -> None:
            self.admitted_at = asyncio.get_running_loop().time()

        def refused(self, job: object, sqlstate: str, message: str) -> None:
            raise AssertionError(message)

    async def run() -> None:
        limits = Limits(
            mpl=1, release_after=0.15, due_factor=None, short_lane=0
        )  # (no other timer)
        gate = AdmissionGate(Scheduler(_model(), "latency", limits))
        long, short = QueryClass("long", "long"), QueryClass("short", "short")
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert gate.admit("L", long, False, "select long", Client())
        waiting = Client()
        gate.submit("s", short, False, "select short", waiting)
        assert waiting.admitted_at is None
        await asyncio.sleep(0.4)
        assert waiting.admitted_at is not None
        assert 0.14 <= waiting.admitted_at - started < 0.35
        assert gate.scheduler.released_in_service == 1
        gate.release("s")
        gate.release("L")
        # a released statement ending while another waits: the next release is timed too
        # (the gate must not think itself calm then)
        started = loop.time()
        assert gate.admit("L2", long, False, "select long", Client())
        second = Client()
        gate.submit("s2", short, False, "select short", second)
        await asyncio.sleep(0.2)  # L2 released at 0.15 s, s2 admitted in its place
        assert second.admitted_at is not None
        third = Client()
        gate.submit("t", short, False, "select short", third)
        gate.release("L2")  # s2 (admitted at ~0.15 s) is due at ~0.30 s: t goes then
        assert third.admitted_at is None and gate.scheduler.released_in_service == 0
        await asyncio.sleep(0.3)
        assert third.admitted_at is not None
        assert 0.28 <= third.admitted_at - started < 0.45
        gate.release("s2")
        gate.release("t")
        assert gate.scheduler.in_service == 0 and gate.scheduler.released_in_service == 0

    asyncio.run(run())
