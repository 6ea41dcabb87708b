"""Adaptive LIFO under overload: the newest statement first once the queue has stood for
``lifo_after``, the oldest shed to make room in a full queue, FIFO again once it empties."""

from __future__ import annotations

import asyncio

from admission import ClassProfile, EtaModel, Limits, Scheduler
from admission.classify import QueryClass
from admission.scheduler import JobState
from proxy.gate import AdmissionGate


def _granted(s: Scheduler, done: int, now: float) -> list[object]:
    return [j.id for j in s.complete(done, now)]


def test_fifo_until_the_queue_has_stood_for_lifo_after() -> None:
    s = Scheduler(None, "fcfs", Limits(mpl=1, lifo_after=1.0))
    s.submit(0, "fp:a", 0.0)  # admitted
    for i in (1, 2, 3):
        s.submit(i, "fp:a", 0.1 * i)
    assert not s.overloaded(0.9)
    assert _granted(s, 0, 0.9) == [1]  # queued since 0.1: not yet 1 s
    assert s.overloaded(1.2)
    assert _granted(s, 1, 1.2) == [3]  # the newest
    assert s.stats.newest_first == 1
    assert _granted(s, 3, 1.3) == [2]
    assert s.queued == 0 and not s.overloaded(5.0)


def test_the_queue_emptying_ends_the_overload() -> None:
    s = Scheduler(None, "fcfs", Limits(mpl=1, lifo_after=1.0))
    s.submit(0, "fp:a", 0.0)
    s.submit(1, "fp:a", 0.0)
    assert _granted(s, 0, 2.0) == [1]  # (alone in the queue: newest and oldest)
    s.submit(2, "fp:a", 2.5)  # the queue was empty: a new busy period starts here
    s.submit(3, "fp:a", 2.6)
    assert not s.overloaded(3.0)
    assert _granted(s, 1, 3.0) == [2]  # FIFO again


def test_without_lifo_after_the_order_stays_fifo() -> None:
    s = Scheduler(None, "fcfs", Limits(mpl=1))
    s.submit(0, "fp:a", 0.0)
    for i in (1, 2, 3):
        s.submit(i, "fp:a", 0.0)
    assert not s.overloaded(100.0)
    assert s.make_room(100.0) is None
    assert _granted(s, 0, 100.0) == [1]


def test_the_policy_still_picks_the_class() -> None:
    """SEPT under overload: the short class first, its newest statement; the long class's
    newer statement waits."""
    model = EtaModel(
        classes=(
            ClassProfile(fingerprint="fp:short", name="short", D=0.1, f=1, U=0.5, Q=1.0),
            ClassProfile(fingerprint="fp:long", name="long", D=5.0, f=1, U=0.5, Q=1.0),
        ),
        A_matrix=((1.0, 1.0), (1.0, 1.0)),
    )
    s = Scheduler(model, "sept", Limits(mpl=1, lifo_after=0.5))
    s.submit(0, "fp:long", 0.0)
    s.submit(1, "fp:short", 0.1)
    s.submit(2, "fp:short", 0.2)
    s.submit(3, "fp:long", 0.3)
    assert _granted(s, 0, 1.0) == [2]
    assert _granted(s, 2, 1.1) == [1]
    assert _granted(s, 1, 1.2) == [3]


def test_cancelled_newest_jobs_are_skipped() -> None:
    s = Scheduler(None, "fcfs", Limits(mpl=1, lifo_after=0.0))
    s.submit(0, "fp:a", 0.0)
    for i in (1, 2, 3):
        s.submit(i, "fp:a", 0.0)
    s.cancel(3, 0.5)
    s.complete(2, 0.5)  # a client that went away while queued
    assert _granted(s, 0, 1.0) == [1]
    assert s.queued == 0 and s.in_service == 1


def test_make_room_sheds_the_oldest_only_under_overload() -> None:
    finished: list[tuple[object, JobState]] = []
    s = Scheduler(None, "fcfs", Limits(mpl=1, lifo_after=1.0))
    s.observe(finishes=lambda job, now: finished.append((job.id, job.state)))
    s.submit(0, "fp:a", 0.0)
    s.submit(1, "fp:b", 0.0)
    s.submit(2, "fp:a", 0.5)
    assert s.make_room(0.5) is None
    shed = s.make_room(1.5)
    assert shed is not None and shed.id == 1 and shed.state is JobState.SHED
    assert finished == [(1, JobState.SHED)]
    assert s.queued == 1 and s.stats.shed == 1 and s.job(1) is None
    assert _granted(s, 0, 2.0) == [2]


def test_a_full_queue_under_overload_sheds_its_oldest_with_53300() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.told: list[tuple[str, int]] = []

        def admitted(self, job: int) -> None:
            self.told.append(("admitted", job))

        def refused(self, job: int, sqlstate: str, message: str) -> None:
            self.told.append((sqlstate, job))

    async def run() -> None:
        a = QueryClass("fp:a", "A")
        gate = AdmissionGate(
            Scheduler(None, "fcfs", Limits(mpl=1, lifo_after=0.5, queue_timeout=10)),
            max_queue=2,
        )
        who = {i: Recorder() for i in range(6)}
        assert gate.admit(0, a, False, "select 1", who[0])
        gate.submit(1, a, False, "select 1", who[1])
        gate.submit(2, a, False, "select 1", who[2])
        gate.submit(3, a, False, "select 1", who[3])  # full, not yet overloaded: refused
        assert who[3].told == [("53300", 3)]
        await asyncio.sleep(0.55)
        gate.submit(4, a, False, "select 1", who[4])  # overloaded: the oldest makes room
        assert who[1].told == [("53300", 1)] and who[4].told == []
        assert gate.stats.shed == 1 and gate.stats.queue_full == 1
        gate.release(0)
        assert who[4].told == [("admitted", 4)]  # the newest first
        gate.release(4)
        assert who[2].told == [("admitted", 2)]
        gate.release(2)
        assert gate.scheduler.in_service == 0 and gate.scheduler.queued == 0

    asyncio.run(run())


def test_shapes_beyond_the_class_cap_share_one_class() -> None:
    from admission.scheduler import OTHER

    s = Scheduler(None, "fcfs", Limits(mpl=1), max_classes=4)
    for i in range(10):
        s.submit(i, f"fp:{i}", float(i))
    assert s.class_names == ["fp:0", "fp:1", "fp:2", "fp:3", OTHER]
    assert s.queue_by_class()[OTHER] == 6
    assert s.stats.over_cap == 6 and s.stats.unknown_classes == 5
    for i in range(10):  # every job still runs, in arrival order
        assert [j.id for j in s.complete(i, 10.0 + i)] == ([i + 1] if i < 9 else [])


def test_a_model_larger_than_the_cap_keeps_its_classes() -> None:
    from admission.scheduler import OTHER

    model = EtaModel(
        classes=tuple(
            ClassProfile(fingerprint=f"fp:{i}", name=f"c{i}", D=1.0, f=1, U=0.5, Q=1.0)
            for i in range(3)
        ),
        A_matrix=tuple(tuple(1.0 for _ in range(3)) for _ in range(3)),
    )
    s = Scheduler(model, "min-a", Limits(mpl=1), max_classes=2)
    s.submit(0, "fp:2", 0.0)
    # the cap counts the classes learned beyond the model's: two more, then OTHER
    for i, fp in enumerate(("fp:new", "fp:new2", "fp:new3"), start=1):
        s.submit(i, fp, 0.0)
    assert s.class_names == ["c0", "c1", "c2", "fp:new", "fp:new2", OTHER]
    # a model the live learning made keeps counting what was learned: still capped
    s.set_model(s.model, 1.0)
    s.submit(4, "fp:new4", 1.0)
    assert s.class_names[-1] == OTHER and s.stats.over_cap == 2
    # a model loaded anew (a saved file, reloaded) is the model's own: two more beyond it
    s.set_model(s.model, 2.0, base=True)
    s.submit(5, "fp:new5", 2.0)
    assert s.class_names[-1] == "fp:new5"
