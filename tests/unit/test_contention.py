"""The limit on writing transactions (admission.contention): AIMD on serialization failures,
holders that count while busy, FIFO waiters, the limit forgotten."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.contention import ContentionConfig, ContentionControl


def _holding(control: ContentionControl, n: int, now: float = 0.0) -> list[str]:
    txs = [f"t{i}" for i in range(n)]
    for tx in txs:
        assert control.request(tx, now)
        control.touch(tx, now, running=True)
    return txs


def test_no_limit_until_a_transaction_aborts_then_half_of_those_in_progress() -> None:
    control = ContentionControl()
    txs = _holding(control, 8)
    assert control.limit is None
    assert control.finish(txs[0], 1.0, aborted=False) == []
    assert control.limit is None  # (commits alone never set one)
    control.finish(txs[1], 1.0, aborted=True)
    assert control.limit == 3  # seven in progress with it: half of them
    assert control.cuts == 1


def test_an_abort_of_a_transaction_older_than_the_cut_does_not_cut_again() -> None:
    control = ContentionControl()
    txs = _holding(control, 8)
    control.finish(txs[0], 1.0, aborted=True)
    first = control.limit
    for tx in txs[1:4]:  # they began before the cut: it is not judged by them
        control.finish(tx, 1.1, aborted=True)
    assert control.limit == first
    assert control.aborts == 4 and control.cuts == 1


def test_waiters_enter_first_come_first_served_as_places_free() -> None:
    control = ContentionControl()
    txs = _holding(control, 2)
    control.finish(txs[0], 1.0, aborted=True)  # 2 in progress: limit 1
    assert control.limit == 1
    assert not control.request("a", 1.0)
    assert not control.request("b", 1.0)
    assert control.waiting == {"a": None, "b": None}
    assert control.finish(txs[1], 1.2, aborted=False) == ["a"]
    control.touch("a", 1.2, running=True)
    assert not control.request("c", 1.3)
    assert control.finish("a", 1.4, aborted=False) == ["b"]
    assert list(control.waiting) == ["c"]


def test_a_holder_idle_in_its_transaction_stops_counting_after_idle_after() -> None:
    control = ContentionControl(ContentionConfig(idle_after=0.5))
    txs = _holding(control, 2)
    control.finish(txs[0], 1.0, aborted=True)
    control.touch(txs[1], 1.0, running=False)  # its statement ended; the client thinks
    assert not control.request("w", 1.1)
    assert control.next_deadline(1.1) == pytest.approx(1.5)
    assert control.tick(1.4) == []
    assert control.tick(1.5) == ["w"]
    # a running statement keeps counting however long it runs
    control.touch("w", 1.5, running=True)
    assert not control.request("x", 9.0)
    assert control.next_deadline(9.0) == pytest.approx(1.0 + 60.0)  # (only the forgetting)


def test_raised_by_one_after_limit_commits_and_the_backoff() -> None:
    config = ContentionConfig(min_backoff=0.5, max_backoff=4.0)
    control = ContentionControl(config)
    txs = _holding(control, 4)
    control.finish(txs[0], 0.0, aborted=True)  # → 2
    for tx in txs[1:]:
        control.finish(tx, 0.0, aborted=False)  # (older than the cut: not counted)
    assert control.limit == 2
    for i in range(2):
        assert control.request(f"n{i}", 0.1)
        control.finish(f"n{i}", 0.2, aborted=False)
    assert control.limit == 2  # two commits, but within the backoff of the cut
    assert control.request("late", 0.6)
    control.finish("late", 0.6, aborted=False)
    assert control.limit == 3 and control.raises == 1
    # a raise taken back by the next abort doubles the backoff
    assert control.request("probe", 0.7)
    control.finish("probe", 0.8, aborted=True)
    assert control.limit == 1 and control.backoff == 1.0
    # two raises in a row halve it again
    for t in (2.0, 3.0):
        assert control.request(f"ok{t}", t)
        control.finish(f"ok{t}", t, aborted=False)
    assert control.limit == 2
    for t in (3.1, 3.2):
        assert control.request(f"ok{t}", t)
        control.finish(f"ok{t}", t, aborted=False)
    assert control.limit == 3 and control.backoff == 0.5


def test_the_backoff_never_passes_its_maximum() -> None:
    control = ContentionControl(ContentionConfig(min_backoff=0.5, max_backoff=2.0))
    _holding(control, 2)
    control.finish("t0", 0.0, aborted=True)
    control.finish("t1", 0.0, aborted=False)
    now = 0.0
    for _ in range(10):  # raise to 2, taken back at once: 1 again
        now += control.backoff
        assert control.request("a", now)
        control.finish("a", now, aborted=False)
        assert control.limit == 2
        assert control.request("b", now)
        control.finish("b", now, aborted=True)
        assert control.limit == 1
    assert control.backoff == 2.0


def test_the_limit_is_forgotten_after_forget_after_without_an_abort() -> None:
    control = ContentionControl(ContentionConfig(forget_after=10.0))
    txs = _holding(control, 2)
    control.finish(txs[0], 1.0, aborted=True)
    assert not control.request("w", 2.0)
    assert control.next_deadline(2.0) == pytest.approx(11.0)
    assert control.tick(11.0) == ["w"]
    assert control.limit is None
    assert control.request("free", 11.0)


def test_withdrawn_waiters_and_holders_give_their_turn_and_place_up() -> None:
    control = ContentionControl()
    txs = _holding(control, 2)
    control.finish(txs[0], 1.0, aborted=True)
    assert not control.request("a", 1.0)
    assert not control.request("b", 1.0)
    assert control.withdraw("a", 1.1) == []
    assert control.withdraw(txs[1], 1.2) == ["b"]  # (no feedback: neither commit nor abort)
    assert control.commits == 0 and control.aborts == 1


def test_shapes_that_began_writers_are_remembered_within_a_bound() -> None:
    control = ContentionControl(ContentionConfig(max_starters=2))
    assert not control.starts_writer("a")
    control.learn_starter("a")
    control.learn_starter("b")
    assert control.starts_writer("a")  # (used: the most recent now)
    control.learn_starter("c")
    assert control.starts_writer("a") and control.starts_writer("c")
    assert not control.starts_writer("b")


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        ContentionConfig(idle_after=0)
    with pytest.raises(ValueError):
        ContentionConfig(min_backoff=2.0, max_backoff=1.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["request", "start", "end", "commit", "abort", "withdraw", "tick"]),
            st.integers(0, 7),
            st.floats(0.0, 3.0),
        ),
        max_size=80,
    )
)
def test_places_are_given_under_the_limit_in_order_and_all_come_back(
    ops: list[tuple[str, int, float]],
) -> None:
    control = ContentionControl(ContentionConfig(idle_after=0.5, forget_after=5.0))
    now = 0.0
    order: list[str] = []  # waiters, in the order they asked
    for op, n, dt in ops:
        now += dt
        tx = f"t{n}"
        counted = control.counted(now)
        limit = control.limit
        if op == "request":
            if tx in control.waiting:
                continue
            held = tx in control.holders
            free = not control.waiting and (limit is None or counted < limit)
            got = control.request(tx, now)
            if held or free:
                assert got
            if not got:
                order.append(tx)
            admitted: list[object] = []
        elif op in ("start", "end"):
            control.touch(tx, now, running=op == "start")
            admitted = []
        elif op in ("commit", "abort"):
            if tx in control.waiting:
                continue
            admitted = control.finish(tx, now, aborted=op == "abort")
        elif op == "withdraw":
            admitted = control.withdraw(tx, now)
            if tx in order:
                order.remove(tx)
        else:
            admitted = control.tick(now)
        assert not set(control.waiting) & set(control.holders)
        for got in admitted:  # first come, first served
            assert got == order.pop(0)
        if control.waiting:  # nobody waits while there is room
            assert control.limit is not None and control.counted(now) >= control.limit
    # every holder ends: every waiter holds a place in the end
    for _ in range(100):
        if not control.holders:
            break
        for tx in list(control.holders):
            for got in control.finish(tx, now, aborted=False):
                assert got == order.pop(0)
    assert not control.waiting and not order
