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


def _engaged(control: ContentionControl, now: float = 0.0) -> str:
    """Five writers in progress, four abort (overwhelming: judged before the window is
    whole): the limit is set, to 1. Returns the fifth."""
    txs = _holding(control, 5, now)
    for tx in txs[:3]:
        control.finish(tx, now, aborted=True)
        assert control.limit is None
    control.finish(txs[3], now, aborted=True)
    assert control.limit == 1
    return txs[4]


def test_no_limit_until_transactions_abort_in_earnest_then_half_of_those_in_progress() -> None:
    control = ContentionControl()
    txs = _holding(control, 12)
    assert control.finish(txs[0], 1.0, aborted=False) == []
    for tx in txs[1:4]:
        control.finish(tx, 1.0, aborted=True)
        assert control.limit is None  # (a few aborts: judged on the whole window)
    control.finish(txs[4], 1.0, aborted=True)  # four of five: overwhelming, judged now
    assert control.limit == 4  # seven in progress with it: half of them
    assert control.cuts == 1 and control.aborts == 4 and control.commits == 1


def test_a_window_with_more_than_a_fifth_aborted_cuts_at_its_end() -> None:
    control = ContentionControl(ContentionConfig(abort_share=0.2, window=32))
    now = 0.0
    for i in range(31):  # eight aborts spread over the window: never overwhelming
        now += 0.01
        assert control.request(i, now)
        control.finish(i, now, aborted=i % 4 == 2)
        assert control.limit is None
    assert control.request(31, now)
    control.finish(31, now, aborted=False)  # 32 outcomes, 8 aborted, in 0.30 s
    assert control.limit is None  # (but not yet half a second long)
    assert control.request(32, 0.6)
    control.finish(32, 0.6, aborted=False)  # 8 of 33 in 0.59 s
    assert control.limit == 1 and control.cuts == 1


def test_a_few_aborts_early_in_a_window_do_not_cut() -> None:
    # one in ten abort, two in a row: judged at every abort, as it once was, two aborts
    # among the first outcomes were a cut (more than a fifth of the outcomes so far)
    control = ContentionControl(ContentionConfig(abort_share=0.2, window=32))
    now = 0.0
    for i in range(640):
        now += 0.01
        assert control.request(i, now)
        control.finish(i, now, aborted=i % 20 in (0, 1))
    assert control.limit is None and control.aborts == 64


def test_aborts_now_and_then_never_set_a_limit() -> None:
    control = ContentionControl(ContentionConfig(abort_share=0.2, window=32))
    now = 0.0
    for i in range(400):  # one in ten aborts, evenly spread
        now += 0.01
        assert control.request(i, now)
        control.finish(i, now, aborted=i % 10 == 0)
    assert control.limit is None and control.aborts == 40


def test_an_abort_of_a_transaction_older_than_the_cut_does_not_cut_again() -> None:
    control = ContentionControl()
    txs = _holding(control, 12)
    for tx in txs[:4]:
        control.finish(tx, 1.0, aborted=True)
    first = control.limit
    assert first is not None
    for tx in txs[4:10]:  # they began before the cut: it is not judged by them
        control.finish(tx, 1.1, aborted=True)
    assert control.limit == first
    assert control.aborts == 10 and control.cuts == 1


def test_waiters_enter_first_come_first_served_as_places_free() -> None:
    control = ContentionControl()
    holder = _engaged(control, 1.0)
    assert not control.request("a", 1.0)
    assert not control.request("b", 1.0)
    assert control.waiting == {"a": None, "b": None}
    assert control.finish(holder, 1.2, aborted=False) == ["a"]
    control.touch("a", 1.2, running=True)
    assert not control.request("c", 1.3)
    assert control.finish("a", 1.4, aborted=False) == ["b"]
    assert list(control.waiting) == ["c"]


def test_a_holder_idle_in_its_transaction_stops_counting_after_idle_after() -> None:
    control = ContentionControl(ContentionConfig(idle_after=0.5))
    holder = _engaged(control, 1.0)
    control.touch(holder, 1.0, running=False)  # its statement ended; the client thinks
    assert not control.request("w", 1.1)
    assert control.next_deadline(1.1) == pytest.approx(1.5)
    assert control.tick(1.4) == []
    assert control.tick(1.5) == ["w"]
    # a running statement counts for run_after (5 s) of its run
    control.touch("w", 1.5, running=True)
    assert not control.request("x", 6.0)
    assert control.next_deadline(6.0) == pytest.approx(6.5)
    assert control.tick(6.4) == []
    assert control.tick(6.5) == ["x"]


def test_raised_by_one_after_limit_commits_and_the_backoff_while_it_holds_back() -> None:
    control = ContentionControl(ContentionConfig(min_backoff=0.5, max_backoff=4.0))
    holder = _engaged(control)
    control.finish(holder, 0.0, aborted=False)  # (older than the cut: not counted)
    assert control.request("n", 0.1)
    control.finish("n", 0.2, aborted=False)
    assert control.limit == 1  # a commit, but within the backoff of the cut
    assert control.request("late", 0.6)
    control.finish("late", 0.6, aborted=False)
    assert control.limit == 2 and control.raises == 1
    # a raise taken back by the next cut doubles the backoff
    for pair in (("p1", "p2"), ("p3", "p4")):  # (all four abort: overwhelming)
        assert all(control.request(tx, 0.7) for tx in pair)
        for tx in pair:
            control.finish(tx, 0.8, aborted=True)
    assert control.limit == 1 and control.backoff == 1.0
    assert control.request("ok", 2.0)
    control.finish("ok", 2.0, aborted=False)
    assert control.limit == 2
    # two commits while someone waits: raised again, and two raises in a row halve it
    for tx in ("a", "b", "c"):
        control.request(tx, 3.0)
    assert list(control.waiting) == ["c"]
    assert control.finish("a", 3.0, aborted=False) == ["c"]
    control.finish("b", 3.0, aborted=False)
    assert control.limit == 3 and control.backoff == 0.5
    # with nobody held back, commits do not raise it
    control.finish("c", 3.1, aborted=False)
    for i in range(10):
        assert control.request(i, 3.2)
        control.finish(i, 3.2, aborted=False)
    assert control.limit == 3


def test_the_backoff_never_passes_its_maximum() -> None:
    control = ContentionControl(ContentionConfig(min_backoff=0.5, max_backoff=2.0))
    control.finish(_engaged(control), 0.0, aborted=False)
    now = 0.0
    for _ in range(10):  # raised to 2, taken back at once: 1 again
        now += control.backoff
        assert control.request("a", now)
        control.finish("a", now, aborted=False)
        assert control.limit == 2
        for pair in (("b", "c"), ("d", "e")):
            assert all(control.request(tx, now) for tx in pair)
            for tx in pair:
                control.finish(tx, now, aborted=True)
        assert control.limit == 1
    assert control.backoff == 2.0


def test_the_limit_is_forgotten_after_forget_after_without_an_abort() -> None:
    control = ContentionControl(ContentionConfig(forget_after=10.0, run_after=100.0))
    _engaged(control, 1.0)
    assert not control.request("w", 2.0)
    assert control.next_deadline(2.0) == pytest.approx(11.0)
    assert control.tick(11.0) == ["w"]
    assert control.limit is None
    assert control.request("free", 11.0)


def test_waiters_queued_when_the_limit_is_lifted_are_not_left_waiting() -> None:
    """A writer asking after the limit's time is up but before the tick that lifts it: the
    limit is lifted then and there, and the next deadline is at once, for everyone queued."""
    control = ContentionControl(ContentionConfig(forget_after=10.0))
    holder = _engaged(control, 0.0)
    assert not control.request("d", 1.0)
    assert not control.request("e", 10.0005)  # (queued behind d, FIFO)
    assert control.limit is None
    assert control.next_deadline(10.0005) == 10.0005
    assert control.tick(10.001) == ["d", "e"]
    assert control.status(10.001)["limit"] is None and holder in control.holders


def test_the_status_shows_a_limit_lifted_by_time_before_anyone_asks() -> None:
    control = ContentionControl(ContentionConfig(forget_after=10.0))
    _engaged(control, 0.0)
    assert control.status(5.0)["limit"] == 1
    assert control.status(10.0)["limit"] is None


def test_a_place_at_once_whatever_the_limit() -> None:
    control = ContentionControl()
    holder = _engaged(control, 0.0)
    assert not control.request("queued", 0.1)
    assert control.request("batch", 0.1, at_once=True)  # (beyond the limit, ahead of the queue)
    assert control.counted(0.1) == 2 and list(control.waiting) == ["queued"]
    control.finish("batch", 0.2, aborted=False)
    assert control.finish(holder, 0.3, aborted=False) == ["queued"]


def test_withdrawn_waiters_and_holders_give_their_turn_and_place_up() -> None:
    control = ContentionControl()
    holder = _engaged(control, 1.0)
    assert not control.request("a", 1.0)
    assert not control.request("b", 1.0)
    assert control.withdraw("a", 1.1) == []
    assert control.withdraw(holder, 1.2) == ["b"]  # (no feedback: neither commit nor abort)
    assert control.commits == 0 and control.aborts == 4


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
    with pytest.raises(ValueError):
        ContentionConfig(abort_share=1.0)
    with pytest.raises(ValueError):
        ContentionConfig(run_after=0)


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


def _closed_loop(
    control: ContentionControl | None, clients: int, rows: int, seconds: float, cores: int = 2
) -> tuple[int, int]:
    """``clients`` clients each running transactions back to back (retrying an abort at once),
    each writing one of ``rows`` rows and needing 10 ms of CPU; the engine shares ``cores``
    cores among the transactions running (processor sharing, stepped every 0.5 ms) and fails
    one at its end if another that wrote its row committed while it ran (first committer
    wins). Through ``control`` (None: no limit). Returns (commits, aborts)."""
    import random

    rng = random.Random(7)
    service, dt = 0.010, 0.0005
    running: dict[int, list[float]] = {}  # client → [start, row, CPU so far]
    committed: dict[float, float] = {}  # row → its last commit
    commits = aborts = 0
    now = 0.0

    def start(client: int) -> None:
        running[client] = [now, float(rng.randrange(rows)), 0.0]
        if control is not None:
            control.touch(client, now, running=True)

    def begin(client: int) -> None:
        if control is None or control.request(client, now):
            start(client)

    for client in range(clients):
        begin(client)
    while now < seconds:
        now += dt
        if running:
            step = dt * min(1.0, cores / len(running))
            ended = []
            for client, state in running.items():
                state[2] += step
                if state[2] >= service:
                    ended.append(client)
            for client in ended:
                began, row, _ = running.pop(client)
                aborted = committed.get(row, -1.0) > began
                if aborted:
                    aborts += 1
                else:
                    commits += 1
                    committed[row] = now
                if control is not None:
                    for waiter in control.finish(client, now, aborted):
                        start(int(waiter))  # type: ignore[call-overload]
                begin(client)
        if control is not None and control.waiting:
            for waiter in control.tick(now):
                start(int(waiter))  # type: ignore[call-overload]
    return commits, aborts


@pytest.mark.parametrize(
    ("clients", "rows", "least"),
    [
        (8, 1, 3.5),  # one hot row: every pair conflicts (pgbench's branch row at scale 1)
        (32, 1, 12.0),
        (8, 2, 1.8),
        (8, 5, 0.9),
        (4, 5, 0.8),  # (the worst seen: at 2 it loses one in five, at 1 a core idles)
        (8, 20, 0.85),
        (16, 20, 1.2),
        (8, 100, 0.95),
        (8, 100_000, 0.98),  # writers that hardly meet
    ],
)
def test_commits_against_no_limit_on_two_cores_from_one_hot_row_to_none(
    clients: int, rows: int, least: float
) -> None:
    """On two cores, aborted work takes the CPU committed work needs: the limit pays
    wherever writers meet often, and costs little where they rarely do."""
    free_commits, _ = _closed_loop(None, clients, rows, 10.0)
    control = ContentionControl()
    commits, aborts = _closed_loop(control, clients, rows, 10.0)
    assert commits >= least * free_commits, (commits, free_commits, control.status(10.0))
    # (aborts up to the share a window may have uncut: the price it accepts for concurrency)
    assert aborts <= max(control.config.abort_share * (commits + aborts), 1), (aborts, commits)


@pytest.mark.parametrize(
    ("sql", "writes"),
    [
        ("UPDATE t SET a = 1", True),
        ("/* the ORM's comment */ update t set a = 1", True),
        ("-- a comment\ninsert into t values (1)", True),
        ("(update t set a = 1)", True),
        ("with x as (select 1) update t set a = 1", True),
        ("select * from t where id = 1 for update", True),  # (row locks: 40001 too)
        ("execute upd(1)", True),
        ("begin; delete from t", True),
        ("call p()", True),
        ("select last_update, updated from t", False),
        ("SELECT abalance FROM pgbench_accounts WHERE aid = 1", False),
        ("begin", False),
        ("commit", False),
    ],
)
def test_the_relay_tells_statements_that_write_by_their_text(sql: str, writes: bool) -> None:
    from proxy.server import _WRITES

    assert (_WRITES.search(sql) is not None) is writes
