"""The limit on writing transactions on the embedded DuckDB (admission.contention), with real
clients: pgbench's TPC-B-like script, whose every transaction updates the one branch row, and
psycopg sessions that write the same row, read only, wait, cancel and go away."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest

from admission import Limits
from admission.contention import ContentionConfig
from proxy.admin import _status
from proxy.app import BackgroundProxy, ProxyConfig
from testing.pgcluster import Cluster


def _proxy(contention: ContentionConfig | None, limits: Limits | None = None) -> BackgroundProxy:
    return BackgroundProxy(
        ProxyConfig(
            backend=None,
            listen_port=0,
            limits=limits or Limits(mpl=4),
            contention=contention,
        )
    )


def _table(proxy: BackgroundProxy) -> None:
    """Table t: rows 1, 2 and 3, each v = 0."""
    with psycopg.connect(proxy.conninfo(), autocommit=True) as conn:
        conn.execute("create table t (id int primary key, v int)")
        conn.execute("insert into t values (1, 0), (2, 0), (3, 0)")


@pytest.fixture
def proxy() -> Iterator[BackgroundProxy]:
    # (idle_after long enough that a holder idle between the test's steps still counts)
    proxy = _proxy(ContentionConfig(idle_after=5.0))
    try:
        _table(proxy)
        yield proxy
    finally:
        proxy.close()


@contextmanager
def _engaged(
    contention: ContentionConfig, limits: Limits | None = None
) -> Iterator[BackgroundProxy]:
    """A proxy with table t whose limit is engaged (at 1: ``_conflict``), closed after."""
    proxy = _proxy(contention, limits)
    try:
        _table(proxy)
        _conflict(proxy)
        yield proxy
    finally:
        proxy.close()


def _contention(proxy: BackgroundProxy) -> dict[str, Any]:
    shown: dict[str, Any] = proxy.call(lambda: _status(proxy.gate))["contention"]
    return shown


def _pgbench(proxy: BackgroundProxy, *args: str) -> str:
    dsn = proxy.conninfo()
    run = subprocess.run(
        ["pgbench", *args, dsn], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode in (0, 2), run.stderr  # (2: some transactions failed)
    return run.stdout


def _failed(stdout: str) -> tuple[int, int]:
    processed = failed = None
    for line in stdout.splitlines():
        if line.startswith("number of transactions actually processed:"):
            processed = int(line.split(":")[1].split("/")[0])
        if line.startswith("number of failed transactions:"):
            failed = int(line.split(":")[1].split("(")[0])
    assert processed is not None and failed is not None, stdout
    return processed, failed


def test_pgbench_tpcb_stops_failing_on_its_branch_row_under_the_limit() -> None:
    """Eight pgbench clients, no retries: without the limit most transactions fail on the
    branch row (40001); with it almost none do, and no update is lost either way."""
    shares = {}
    for contention in (None, ContentionConfig()):
        proxy = _proxy(contention)
        try:
            init = subprocess.run(
                ["pgbench", "-i", "-s", "1", "-q", proxy.conninfo()],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert init.returncode == 0, init.stderr
            out = _pgbench(proxy, "-c", "8", "-j", "2", "-T", "4", "-n")
            processed, failed = _failed(out)
            shares[contention is not None] = failed / (processed + failed)
            if contention is not None:
                shown = _contention(proxy)
                assert shown["limit"] in (1, 2) and shown["cuts"] >= 1, shown
                assert shown["holders"] == 0 and shown["waiting"] == 0, shown
            with psycopg.connect(proxy.conninfo(), autocommit=True) as conn:
                assert conn.execute(
                    "select (select sum(bbalance) from pgbench_branches) = (select sum(delta) "
                    "from pgbench_history)"
                ).fetchone() == (True,)
        finally:
            proxy.close()
    assert shares[False] > 0.4, shares
    assert shares[True] < 0.1, shares


def _conflict(proxy: BackgroundProxy) -> None:
    """Five transactions write row 1: all but the first fail (40001), and with four of four
    aborted (overwhelming: judged before the window is whole) the limit is set, to 1."""
    with (
        psycopg.connect(proxy.conninfo()) as a,
        psycopg.connect(proxy.conninfo()) as b,
        psycopg.connect(proxy.conninfo()) as c,
        psycopg.connect(proxy.conninfo()) as d,
        psycopg.connect(proxy.conninfo()) as e,
    ):
        a.execute("update t set v = v + 1 where id = 1")
        for late in (b, c, d, e):
            with pytest.raises(psycopg.errors.SerializationFailure):
                late.execute("update t set v = v + 1 where id = 1")
            late.rollback()
        a.commit()
    assert _contention(proxy)["limit"] == 1


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as e:  # (the test reads it)
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_for(predicate: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_writer_waits_for_the_holder_and_goes_on_when_it_commits(
    proxy: BackgroundProxy,
) -> None:
    _conflict(proxy)
    with (
        psycopg.connect(proxy.conninfo()) as a,
        psycopg.connect(proxy.conninfo()) as b,
    ):
        a.execute("update t set v = v + 1 where id = 1")  # holds the one place
        thread, out = _in_thread(lambda: b.execute("update t set v = v + 1 where id = 2"))
        _wait_for(lambda: _contention(proxy)["waiting"] == 1)
        assert not out  # (it did not run beside a)
        a.commit()
        thread.join(10)
        assert out and not isinstance(out[0], Exception), out
        b.commit()
    shown = _contention(proxy)
    assert shown["holders"] == 0 and shown["waiting"] == 0 and shown["waited"] >= 1


def test_read_only_transactions_and_autocommit_reads_take_no_place(
    proxy: BackgroundProxy,
) -> None:
    _conflict(proxy)
    with (
        psycopg.connect(proxy.conninfo()) as a,
        psycopg.connect(proxy.conninfo()) as reader,
        psycopg.connect(proxy.conninfo(), autocommit=True) as auto,
    ):
        a.execute("update t set v = v + 1 where id = 1")  # holds the one place
        waited = _contention(proxy)["waited"]
        assert reader.execute("select sum(v) from t").fetchone() is not None
        assert reader.execute("select count(*) from t").fetchone() == (3,)
        reader.commit()
        assert auto.execute("select max(v) from t").fetchone() is not None
        shown = _contention(proxy)
        assert shown["waited"] == waited and shown["holders"] == 1, shown
        a.commit()


def test_a_transaction_that_read_before_it_wrote_is_held_back_at_its_first_read_next_time(
    proxy: BackgroundProxy,
) -> None:
    """DuckDB's snapshot starts with a transaction's first statement: a read-then-write
    transaction must wait before its read, which is known once one of its shape wrote."""
    _conflict(proxy)
    with psycopg.connect(proxy.conninfo()) as b:
        b.execute("select v from t where id = 3")  # (its shape not known to write yet)
        b.execute("update t set v = v + 1 where id = 3")
        b.commit()
    assert _contention(proxy)["writing_starters"] == 1
    with (
        psycopg.connect(proxy.conninfo()) as a,
        psycopg.connect(proxy.conninfo()) as b,
    ):
        a.execute("update t set v = v + 1 where id = 1")  # holds the one place
        thread, out = _in_thread(lambda: b.execute("select v from t where id = 3").fetchone())
        _wait_for(lambda: _contention(proxy)["waiting"] == 1)
        a.commit()
        thread.join(10)
        assert out and not isinstance(out[0], Exception), out
        b.execute("update t set v = v + 1 where id = 3")
        b.commit()


def test_a_cancel_ends_the_wait_for_a_place(proxy: BackgroundProxy) -> None:
    _conflict(proxy)
    with (
        psycopg.connect(proxy.conninfo()) as a,
        psycopg.connect(proxy.conninfo()) as b,
    ):
        a.execute("update t set v = v + 1 where id = 1")
        thread, out = _in_thread(lambda: b.execute("update t set v = v + 1 where id = 2"))
        _wait_for(lambda: _contention(proxy)["waiting"] == 1)
        b.cancel_safe()  # (cancel() holds the GIL the in-process server needs)
        thread.join(10)
        assert out and isinstance(out[0], psycopg.errors.QueryCanceled), out
        b.rollback()
        assert _contention(proxy)["waiting"] == 0
        a.commit()
    assert _contention(proxy)["holders"] == 0


def _held_past_the_queue_timeout(a: psycopg.Connection, b: psycopg.Connection) -> None:
    """``a`` takes the one place; ``b``'s write waits for it and is refused (57014) at the
    queue timeout (0.5 s), then rolls back."""
    a.execute("update t set v = v + 1 where id = 1")
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled, match="queue timeout"):
        b.execute("update t set v = v + 1 where id = 2")
    assert 0.4 < time.monotonic() - started < 5
    b.rollback()


def test_a_wait_for_a_place_ends_at_the_queue_timeout() -> None:
    with _engaged(ContentionConfig(idle_after=5.0), Limits(mpl=4, queue_timeout=0.5)) as proxy:
        with (
            psycopg.connect(proxy.conninfo()) as a,
            psycopg.connect(proxy.conninfo()) as b,
        ):
            _held_past_the_queue_timeout(a, b)
            shown = _contention(proxy)
            assert shown["waiting"] == 0 and shown["timed_out"] == 1 and shown["holders"] == 1
            a.commit()
            b.execute("update t set v = v + 1 where id = 2")  # its turn now, at once
            b.commit()
        assert _contention(proxy)["holders"] == 0
        metrics = proxy.call(lambda: generate_latest(proxy.metrics.registry).decode())
        assert "admission_contention_timed_out_total 1.0" in metrics


def test_clients_that_go_away_give_their_place_and_their_turn_up(
    proxy: BackgroundProxy,
) -> None:
    _conflict(proxy)
    a = psycopg.connect(proxy.conninfo())
    b = psycopg.connect(proxy.conninfo())
    a.execute("update t set v = v + 1 where id = 1")
    thread, _ = _in_thread(lambda: b.execute("update t set v = v + 1 where id = 2"))
    _wait_for(lambda: _contention(proxy)["waiting"] == 1)
    # gone while it waits (its socket shut under the waiting thread, the way a dying
    # client's is: psycopg's own close would wait for the statement)
    gone = socket.socket(fileno=os.dup(b.pgconn.socket))
    gone.shutdown(socket.SHUT_RDWR)
    gone.close()
    thread.join(10)
    b.close()
    _wait_for(lambda: _contention(proxy)["waiting"] == 0)  # (its turn given up: a still holds)
    assert _contention(proxy)["holders"] == 1
    a.close()  # (gone while it holds: rolled back)
    _wait_for(lambda: _contention(proxy)["holders"] == 0)
    assert _contention(proxy)["waiting"] == 0
    with psycopg.connect(proxy.conninfo()) as c:  # the place is free
        c.execute("update t set v = v + 1 where id = 2")
        c.commit()
        assert c.execute("select v from t where id = 1").fetchone() == (1,)


def test_a_holder_idle_in_its_transaction_holds_no_one_back_past_idle_after() -> None:
    with (
        _engaged(ContentionConfig(idle_after=0.3)) as proxy,
        psycopg.connect(proxy.conninfo()) as a,
        psycopg.connect(proxy.conninfo()) as b,
    ):
        a.execute("update t set v = v + 1 where id = 1")  # then sits idle
        waited = _contention(proxy)["waited"]
        started = time.monotonic()
        b.execute("update t set v = v + 1 where id = 2")
        assert time.monotonic() - started < 5.0  # (0.3 s, on a slow machine more)
        assert _contention(proxy)["waited"] == waited + 1  # (it did wait for a)
        b.commit()
        a.commit()


def test_the_benchmark_runs_without_pgbench_as_the_demo_runs_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``scripts/demo``'s last step: ``benchmarks.contention`` with its own TPC-B-like client
    against real ``admission serve`` processes (no figures asserted: a smoke run)."""
    from benchmarks.contention import main

    assert (
        main(["--driver", "python", "--settings", "none,on", "--rounds", "1", "--seconds", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "tpcb    none   tps" in out and "tpcb    on     tps" in out, out
    assert "tpcb: with the contention limit" in out, out


# -- in front of PostgreSQL (serve --backend … --contention): SERIALIZABLE transactions fail
# with 40001 where two write the same row, as DuckDB's do


def _pg_proxy(
    pg: Cluster, contention: ContentionConfig | None, db: str, limits: Limits | None = None
) -> BackgroundProxy:
    from proxy.server import parse_backend

    return BackgroundProxy(
        ProxyConfig(
            backend=parse_backend(f"{pg.url}/{db}"),
            listen_port=0,
            limits=limits or Limits(mpl=4),
            contention=contention,
        )
    )


@contextmanager
def _pg_engaged(
    pg: Cluster, db: str, limits: Limits | None = None
) -> Iterator[tuple[BackgroundProxy, str]]:
    """A relay to ``db`` whose limit is engaged (at 1: ``_pg_conflict``; holders idle up to
    5 s still count), and its DSN; closed after."""
    proxy = _pg_proxy(pg, ContentionConfig(idle_after=5.0), db, limits)
    dsn = proxy.conninfo(user="postgres", dbname=db)
    try:
        _pg_conflict(proxy, dsn, pg)
        yield proxy, dsn
    finally:
        proxy.close()


def _pg_conflict(proxy: BackgroundProxy, dsn: str, pg: Cluster) -> None:
    """Four SERIALIZABLE transactions wait on a fifth's row lock and fail (40001) when it
    commits: with four of five aborted (overwhelming) the limit is set, to 1."""
    with (
        psycopg.connect(dsn) as a,
        psycopg.connect(dsn) as b,
        psycopg.connect(dsn) as c,
        psycopg.connect(dsn) as d,
        psycopg.connect(dsn) as e,
    ):
        a.execute("update t set v = v + 1 where id = 1")
        late = (b, c, d, e)
        waits = [
            _in_thread(
                lambda conn=conn: conn.execute(  # type: ignore[misc]
                    "update t set v = v + 1 where id = 1"
                )
            )
            for conn in late
        ]
        # (straight to PostgreSQL: the four hold the proxy's four MPL slots)
        with psycopg.connect(pg.dsn(), autocommit=True) as watch:

            def blocked() -> int:
                row = watch.execute(
                    "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
                ).fetchone()
                return row[0] if row else 0

            _wait_for(lambda: blocked() == len(late))  # all wait on a's row lock
        a.commit()
        for thread, out in waits:
            thread.join(10)
            assert out and isinstance(out[0], psycopg.errors.SerializationFailure), out
        for conn in late:
            conn.rollback()
    assert _contention(proxy)["limit"] == 1


@pytest.fixture
def serializable_db(pg: Cluster) -> Iterator[str]:
    """A database of its own whose transactions are SERIALIZABLE by default."""
    name = "contention_serializable"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"drop database if exists {name}")
        conn.execute(f"create database {name}")
        conn.execute(f"alter database {name} set default_transaction_isolation = serializable")
    with psycopg.connect(pg.dsn(dbname=name), autocommit=True) as conn:
        conn.execute("create table t (id int primary key, v int)")
        conn.execute("insert into t values (1, 0), (2, 0), (3, 0)")
    try:
        yield name
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute(f"drop database if exists {name} with (force)")


def test_pgbench_serializable_through_the_relay_stops_failing_under_the_limit(
    pg: Cluster, serializable_db: str
) -> None:
    init = subprocess.run(
        ["pgbench", "-i", "-s", "1", "-q", pg.dsn(dbname=serializable_db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert init.returncode == 0, init.stderr
    shares = {}
    for contention in (None, ContentionConfig()):
        proxy = _pg_proxy(pg, contention, serializable_db)
        try:
            dsn = proxy.conninfo(user="postgres", dbname=serializable_db)
            run = subprocess.run(
                ["pgbench", "-c", "8", "-j", "2", "-T", "4", "-n", dsn],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode in (0, 2), run.stderr
            processed, failed = _failed(run.stdout)
            shares[contention is not None] = failed / (processed + failed)
            if contention is not None:
                shown = _contention(proxy)
                assert shown["cuts"] >= 1 and shown["holders"] == 0, shown
        finally:
            proxy.close()
    assert shares[False] > 0.3, shares
    assert shares[True] < 0.1, shares


def test_the_relay_refuses_a_writer_held_past_the_queue_timeout(
    pg: Cluster, serializable_db: str
) -> None:
    with _pg_engaged(pg, serializable_db, Limits(mpl=4, queue_timeout=0.5)) as (proxy, dsn):
        with (
            psycopg.connect(dsn) as a,
            psycopg.connect(dsn) as b,
            psycopg.connect(dsn) as c,
        ):
            _held_past_the_queue_timeout(a, b)
            assert _contention(proxy)["timed_out"] == 1
            # the next waiter is placed when a commits, and b's session goes on
            thread, out = _in_thread(lambda: c.execute("update t set v = v + 1 where id = 3"))
            _wait_for(lambda: _contention(proxy)["waiting"] == 1)
            a.commit()
            thread.join(10)
            assert out and not isinstance(out[0], Exception), out
            c.commit()
            assert b.execute("select v from t order by id").fetchall() == [(2,), (0,), (1,)]
            b.commit()
        shown = _contention(proxy)
        assert shown["holders"] == 0 and shown["waiting"] == 0, shown


def test_the_relay_holds_a_writer_for_its_place_and_a_cancel_ends_the_wait(
    pg: Cluster, serializable_db: str
) -> None:
    with _pg_engaged(pg, serializable_db) as (proxy, dsn):
        with (
            psycopg.connect(dsn) as a,
            psycopg.connect(dsn) as b,
            psycopg.connect(dsn) as c,
        ):
            a.execute("update t set v = v + 1 where id = 1")  # holds the one place
            thread, out = _in_thread(lambda: b.execute("update t set v = v + 1 where id = 2"))
            _wait_for(lambda: _contention(proxy)["waiting"] == 1)
            b.cancel_safe()
            thread.join(10)
            assert out and isinstance(out[0], psycopg.errors.QueryCanceled), out
            b.rollback()
            thread, out = _in_thread(lambda: c.execute("update t set v = v + 1 where id = 3"))
            _wait_for(lambda: _contention(proxy)["waiting"] == 1)
            assert not out
            a.commit()
            thread.join(10)
            assert out and not isinstance(out[0], Exception), out
            c.commit()
        shown = _contention(proxy)
        assert shown["holders"] == 0 and shown["waiting"] == 0, shown
        with psycopg.connect(dsn) as check:
            assert check.execute("select v from t order by id").fetchall() == [(2,), (0,), (1,)]
