"""Learning while serving, through the real front ends: a class whose statements become five
times slower is followed within 50 executions (its D_r within 20 % of what a client measures),
on PostgreSQL and on the embedded DuckDB; and ``admission serve`` saves what it learned."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from admission import Limits
from admission.model import EtaModel
from proxy.learning import LiveModel
from testing.embeddedharness import Embedded
from testing.proxyharness import ProxyHarness

FOLLOWS_WITHIN = 50  # executions after the change
CLOSE = 0.20  # the estimate within this share of the service time clients see


def _follow_drift(
    conn: psycopg.Connection[Any],
    call: Callable[[Callable[[], Any]], Any],
    learning: LiveModel,
    before: str,
    after: str,
) -> tuple[int, float, float]:
    """Run ``before`` 32 times, then ``after`` until the class's D_r is within CLOSE of the
    median time a client measures for ``after``: (executions of ``after``, D_r, that
    median)."""
    for _ in range(32):
        conn.execute(before)
    call(learning.refresh)
    seen_by = learning.estimator.seen
    fingerprint = max(seen_by, key=lambda fp: seen_by[fp])  # the class of ``before``

    def estimate() -> float:
        model = learning.gate.scheduler.model
        (d,) = [c.D for c in model.classes if c.fingerprint == fingerprint]
        return d

    seen: list[float] = []
    d = call(estimate)
    for n in range(1, FOLLOWS_WITHIN + 1):
        start = time.perf_counter()
        conn.execute(after)
        seen.append(time.perf_counter() - start)
        call(learning.refresh)
        d = call(estimate)
        client = statistics.median(seen)
        if abs(d - client) <= CLOSE * client:
            return n, d, client
    return FOLLOWS_WITHIN + 1, d, statistics.median(seen)


def test_relay_follows_a_class_that_grows_five_times(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(policy="latency", limits=Limits(mpl=2))
    learning = proxy.call(lambda: LiveModel(proxy.gate))
    with psycopg.connect(
        proxy.dsn_base + " user=postgres dbname=postgres", autocommit=True
    ) as conn:
        n, estimate, client = _follow_drift(
            conn, proxy.call, learning, "select pg_sleep(0.02)", "select pg_sleep(0.1)"
        )
    print(f"relay: followed after {n} executions: D_r {estimate:.3f} s, clients {client:.3f} s")
    assert n <= FOLLOWS_WITHIN, f"D_r {estimate:.3f} s, clients see {client:.3f} s"
    assert estimate > 4 * 0.02  # it moved with the class, not by a hair


def test_embedded_follows_a_class_that_grows_five_times() -> None:
    e = Embedded(Limits(mpl=2), policy="latency")
    try:
        learning = e.call(lambda: LiveModel(e.server.gate))
        with e.connect() as conn:
            conn.execute("select count(*) from range(4000000)")  # warm
            n, estimate, client = _follow_drift(
                conn,
                e.call,
                learning,
                "select sum(i) from range(4000000) t(i)",
                "select sum(i) from range(20000000) t(i)",
            )
        print(
            f"embedded: followed after {n} executions: D_r {estimate:.3f} s, clients {client:.3f} s"
        )
        assert n <= FOLLOWS_WITHIN, f"D_r {estimate:.3f} s, clients see {client:.3f} s"
    finally:
        e.close()


@contextlib.contextmanager
def _serve(
    path: Path | None = None, *, args: list[str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], psycopg.Connection[Any]]]:
    """``admission serve`` (the real command, on uvloop) learning into ``path`` with the latency
    policy at MPL 2 — or, given ``args`` and no path, with those arguments alone — and a client
    connection to it; stopped with SIGINT on the way out."""
    assert (path is None) != (args is None), "a model path or the arguments, not both"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("admission")),
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            *(
                ["--model", str(path), "--policy", "latency", "--mpl", "2"]
                if args is None
                else args
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = psycopg.connect(
                    f"host=127.0.0.1 port={port} user=app dbname=app", autocommit=True
                )
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"serve did not start: {proc.stdout.read() if proc.stdout else ''}")
                time.sleep(0.2)
        with conn:
            yield proc, conn
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out


def test_serve_learns_without_a_model_and_saves_it(tmp_path: Any) -> None:
    """``admission serve --model FILE`` where FILE does not exist yet: it serves, learns the
    classes it sees, and writes them to FILE on shutdown."""
    path = tmp_path / "learned.json"
    with _serve(path) as (_, conn):
        for _ in range(12):
            conn.execute("select sum(i) from range(200000) t(i)")
            conn.execute("select 1 + 1")
        time.sleep(2.5)  # one look at the estimates (every 2 s)
        assert not path.exists()  # saved every few minutes and on shutdown, not at once
    model = EtaModel.load(path)
    live = [c for c in model.classes if c.live]
    assert len(live) == 2
    assert os.path.getsize(path) > 0


def test_serve_without_a_model_learns_and_tunes_its_mpl() -> None:
    """``admission serve`` on the embedded DuckDB with no model and no --mpl: the recommended
    policy, learning, under ``--mpl auto`` started from this machine's cores, a statement in
    service a second giving its slot to the queue (an MPL or a release given is kept), writing
    transactions under the contention limit; with --no-learn (nothing to order by) everything
    is admitted, as before."""
    # (arguments, policy, --mpl auto, MPL, --release-after)
    cases: tuple[tuple[list[str], str, bool, int | None, float | None], ...] = (
        ([], "latency", True, os.cpu_count(), 1.0),
        (["--release-after", "0"], "latency", True, os.cpu_count(), None),  # (asked: off)
        (["--mpl", "3"], "latency", False, 3, None),  # (an MPL given: kept, the policy too)
        (["--no-learn"], "fcfs", False, None, None),
        (["--no-contention"], "latency", True, os.cpu_count(), 1.0),
    )
    for extra, policy, auto, mpl, release in cases:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            admin = s.getsockname()[1]
        with _serve(args=["--admin", f"127.0.0.1:{admin}", *extra]) as (_, conn):
            conn.execute("select 1 + 1")
            status = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=10).json()
        assert status["policy"] == policy, status["policy"]
        assert status["limits"]["mpl"] == mpl, status["limits"]
        assert status["limits"]["release_after"] == release, status["limits"]
        # writing transactions limited while they conflict, unless asked not to
        assert (status["contention"] is None) == ("--no-contention" in extra), status
        if auto:
            assert status["mpl_auto"]["enabled"], status["mpl_auto"]
            assert status["learning"] is not None
        else:
            assert status["mpl_auto"] is None


def _learned_model(tmp_path: Path) -> Path:
    """A model file ``admission serve`` learned (two classes, saved on its way out)."""
    path = tmp_path / "learned.json"
    with _serve(path) as (_, conn):
        for _ in range(6):
            conn.execute("select sum(i) from range(200000) t(i)")
            conn.execute("select 1 + 1")
        time.sleep(2.5)  # one look at the estimates (every 2 s): saved on the way out
    assert path.exists()
    return path


def test_serve_with_a_model_gives_slots_back_where_it_chose_the_mpl(tmp_path: Any) -> None:
    """With --model and no --mpl, serve runs at the model's recommended MPL and a statement in
    service a second gives its slot to the queue, as without a model; with --mpl auto too; an
    MPL number given stays a hard cap, and --release-after 0 turns the release off."""
    path = _learned_model(tmp_path)
    cases: tuple[tuple[list[str], float | None], ...] = (
        ([], 1.0),
        (["--mpl", "auto"], 1.0),
        (["--mpl", "2"], None),
        (["--release-after", "0"], None),
    )
    for extra, release in cases:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            admin = s.getsockname()[1]
        with _serve(args=["--model", str(path), "--admin", f"127.0.0.1:{admin}", *extra]) as (
            _,
            conn,
        ):
            conn.execute("select 1 + 1")
            status = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=10).json()
        assert status["policy"] == "latency", status["policy"]
        assert status["limits"]["mpl"], status["limits"]
        assert status["limits"]["release_after"] == release, (extra, status["limits"])


def test_serve_times_statements_shorter_than_a_millisecond(tmp_path: Any) -> None:
    """The D_r ``admission serve`` learns for a statement that takes a fraction of a millisecond
    is that fraction: above zero, below what its client measures around it, and not a
    multiple of half a millisecond (the event loop's clock, which uvloop keeps in whole
    milliseconds read once per iteration, made each statement's time 0 or 1 ms)."""
    path = tmp_path / "learned.json"
    seen: list[float] = []
    with _serve(path) as (_, conn):
        for _ in range(64):
            start = time.perf_counter()
            conn.execute("select 1 + 1").fetchall()
            seen.append(time.perf_counter() - start)
        time.sleep(2.5)  # one look at the estimates (every 2 s)
    (learned,) = [c for c in EtaModel.load(path).classes if "1 + 1" in c.sample_sql]
    client = statistics.median(seen)
    assert learned.live > 0
    assert 0 < learned.D < client, (
        f"D_r {learned.D * 1e3:.3f} ms, the client saw {client * 1e3:.3f} ms"
    )
    # (a median of 32 such: 0, ½ or 1 ms)
    assert abs(learned.D * 2e3 - round(learned.D * 2e3)) > 1e-6, f"D_r {learned.D * 1e3} ms"


def test_embedded_classes_not_measured_start_from_duckdbs_cost_estimate() -> None:
    """The embedded server's planner (EXPLAIN's estimated cardinalities) gives every class a
    cost; a class seen fewer than five times gets D_r = its cost × the median D_r per unit of
    cost of the measured classes, and keeps the cost in the model."""
    e = Embedded(Limits(mpl=2), policy="latency")
    try:
        learning = e.call(lambda: LiveModel(e.server.gate, planner=e.backend.plan_cost))
        measured = (
            "select sum(i) from range(1000000) t(i)",
            "select count(*) from range(4000000) t(i) where i % 3 = 0",
            "select max(i + 1) from range(16000000) t(i)",
        )
        with e.connect() as conn:
            for sql in measured:
                for _ in range(8):
                    conn.execute(sql)
            for _ in range(2):
                conn.execute("select min(i * 2) from range(8000000) t(i)")

        task = e.call(learning.plan)
        deadline = time.monotonic() + 30
        while task is not None and not task.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        e.call(learning.refresh)
        model = e.call(lambda: e.server.gate.scheduler.model)
    finally:
        e.close()
    classes = {c.sample_sql: c for c in model.classes}
    known = [classes[sql] for sql in measured]
    assert all(c.live == 8 and c.cost for c in known)
    new = next(c for c in model.classes if "min(i * 2)" in c.sample_sql)
    assert new.live == 0 and new.cost == pytest.approx(16_000_001)
    scale = statistics.median(c.D / c.cost for c in known if c.cost)
    assert new.D == pytest.approx(scale * new.cost)


def test_relay_classes_not_measured_start_from_postgresqls_cost_estimate(
    make_proxy: Callable[..., ProxyHarness], pg: Any
) -> None:
    """In front of PostgreSQL, with a connection to EXPLAIN on (``--explain-dsn``): the same
    prior from the plan's Total Cost."""
    from proxy.planner import PostgresPlanner

    proxy = make_proxy(policy="latency", limits=Limits(mpl=2))
    planner = PostgresPlanner(f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres")
    learning = proxy.call(lambda: LiveModel(proxy.gate, planner=planner.plan_cost))
    measured = (
        "select count(*) from generate_series(1, 100000)",
        "select sum(x) from generate_series(1, 200000) as x where x % 3 = 0",
        "select max(x + 1) from generate_series(1, 400000) as x",
    )
    with psycopg.connect(
        proxy.dsn_base + " user=postgres dbname=postgres", autocommit=True
    ) as conn:
        for sql in measured:
            for _ in range(8):
                conn.execute(sql)
        for _ in range(2):
            conn.execute("select min(x * 2) from generate_series(1, 300000) as x")
        conn.execute("select x from generate_series(1, 30000) as x order by x desc limit 3")
        conn.execute("select %s::int", (1,))  # a parameter ($1): no plan to ask for
    task = proxy.call(learning.plan)
    deadline = time.monotonic() + 30
    while task is not None and not task.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.call(learning.refresh)
    proxy.call(planner.close)
    model = proxy.call(lambda: proxy.gate.scheduler.model)
    classes = {c.sample_sql: c for c in model.classes}
    known = [classes[sql] for sql in measured]
    assert all(c.live == 8 and c.cost for c in known)
    new = next(c for c in model.classes if "min(x * 2)" in c.sample_sql)
    assert new.live == 0 and new.cost is not None and new.cost > 0
    scale = statistics.median(c.D / c.cost for c in known if c.cost)
    assert new.D == pytest.approx(scale * new.cost)
    assert next(c for c in model.classes if "$1" in c.sample_sql).cost is None
    # the plan's work_mem units come with the cost: none for an aggregate, one for a sort
    assert new.work_mem_units == 0
    assert next(c for c in model.classes if "order by" in c.sample_sql).work_mem_units == 1


def test_the_planners_explain_one_select_and_never_run_what_follows() -> None:
    """A class's sample holding several statements (``select 1; drop table t``) is not
    EXPLAINed: either planner would run the rest, with the proxy's rights."""
    import asyncio

    from proxy.backends.embedded import DuckDBBackend
    from proxy.planner import plannable

    assert plannable("select count(*) from lineitem where l_quantity < 24")
    assert plannable("with x as (select 1) select * from x")
    for sql in (
        "select 1; drop table t",
        "select 1; select 2",
        "insert into t values (1)",
        "select $1",
        "explain analyze select 1",
        "select from where",
    ):
        assert not plannable(sql), sql
    backend = DuckDBBackend(workers=1)
    try:
        backend.connection.execute("create table t as select 1 as x")
        assert asyncio.run(backend.plan_cost("select x from t")) is not None
        assert asyncio.run(backend.plan_cost("select 1; drop table t")) is None
        assert asyncio.run(backend.plan_cost("with d as (select 1) select * from d")) is not None
        assert backend.connection.execute("select count(*) from t").fetchone() == (1,)
    finally:
        backend.close()


def test_embedded_learns_each_classs_memory_from_a_sample_of_its_statements() -> None:
    """While learning, the first statements of a class and then one in MEMORY_EVERY run with
    DuckDB's profiler on; a statement that took more memory than its class's M_r raises M_r to
    what it took, and the memory budget reserves it from then on. Statements not sampled run
    with the profiler off."""
    from proxy.learning import MEMORY_EVERY, MEMORY_FIRST

    e = Embedded(Limits(mpl=2, memory=2**40), policy="fcfs")
    try:
        learning = e.call(lambda: LiveModel(e.server.gate))
        e.call(lambda: e.server.sample(learning.memory_wanted, learning.memory_measured))
        profiled: list[bool] = []
        e.call(lambda: e.server.sample(lambda fp: True, lambda m: profiled.append(True)))
        hashing = (
            "select count(*), sum(n) from "
            "(select i % 200000 as k, count(*) as n from range(2000000) t(i) group by k)"
        )
        scanning = "select sum(i) from range(1000000) t(i)"
        with e.connect() as conn:
            for _ in range(MEMORY_FIRST + 2):
                conn.execute(hashing).fetchall()
                conn.execute(scanning).fetchall()
        e.call(learning.refresh)
        model = e.call(lambda: e.server.gate.scheduler.model)
        memory = {c.sample_sql: c.M for c in model.classes}
        seen = e.call(lambda: dict(learning._memory_seen))
    finally:
        e.close()
    assert memory[hashing] is not None and memory[hashing] > 1 << 20, memory  # a hash table
    assert (memory[scanning] or 0) < memory[hashing]
    assert sorted(seen.values()) == [MEMORY_FIRST + 2] * 2
    assert len(profiled) == 2 * (MEMORY_FIRST + 2)  # (the second sampler wants every one)
    assert learning.memory_wanted("x") and MEMORY_EVERY > MEMORY_FIRST


@pytest.mark.parametrize("with_model", [False, True], ids=["no model", "a model"])
def test_the_default_lets_a_short_statement_past_long_ad_hoc_ones(
    with_model: bool, tmp_path: Any
) -> None:
    """``admission serve`` with no model, or with one and no --mpl: as many long statements
    of shapes it never measured as it has slots (--mpl auto starts at the cores; with a model,
    its recommended MPL) hold every one; a short statement of a new shape cannot
    take the short lane (it admits measured classes only), yet it is answered within seconds
    — the long ones give their slots to the queue after a second in service — where a hard
    MPL would keep it waiting for as long as they run (here: until cancelled)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        admin = s.getsockname()[1]
    args = ["--admin", f"127.0.0.1:{admin}"]
    if with_model:
        args += ["--model", str(_learned_model(tmp_path))]
    with _serve(args=args) as (_, conn):
        # (one per slot: past MPL released beside the MPL, the next ones hold the slots again)
        status = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=10).json()
        longs = status["limits"]["mpl"]
        assert 1 <= longs <= 8 and status["limits"]["release_after"] == 1.0, status["limits"]
        dsn = f"host=127.0.0.1 port={conn.info.port} user=app dbname=app"
        holders = [psycopg.connect(dsn, autocommit=True) for _ in range(longs)]
        failures: list[BaseException] = []

        def hold(c: psycopg.Connection[Any], i: int) -> None:
            try:  # (minutes of work; cancelled below)
                c.execute(f"select sum(i % 7) from range(10000000000) long_{i}(i)")
            except psycopg.errors.QueryCanceled:
                return
            except BaseException as e:  # (reported by the test)
                failures.append(e)

        threads = [threading.Thread(target=hold, args=(c, i)) for i, c in enumerate(holders)]
        for t in threads:
            t.start()
        # (without the release it would wait until they end: they are cancelled after 20 s)
        stop = threading.Timer(20, lambda: [c.cancel_safe() for c in holders])
        try:
            time.sleep(1.5)  # every slot held
            stop.start()
            started = time.monotonic()
            assert conn.execute("select 42 as answer").fetchone() == (42,)
            waited = time.monotonic() - started
        finally:
            stop.cancel()
            for c in holders:
                c.cancel_safe()
            for t in threads:
                t.join(timeout=30)
            for c in holders:
                c.close()
    assert not failures, failures
    assert waited < 5.0, f"the short statement waited {waited:.1f} s behind the long ones"
