"""Transaction pooling (``--pool-mode transaction``) against a real PostgreSQL, with real clients.

Many clients share a few server connections: each test checks what the clients see (results,
their own settings and prepared statements, clear errors for what a shared connection cannot
carry) and what the server sees (never more connections than the pool), and that the proxy's
books balance afterwards.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import httpx
import psycopg
import pytest
from sqlalchemy import Integer, String, create_engine, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from admission import Limits
from proxy.pool import PoolConfig
from testing.pgcluster import USERS, Cluster
from testing.proxyharness import ProxyHarness
from testing.rawclient import RawClient, startup_packet

POOL_APP = "admission pool"


@pytest.fixture
def pooled(make_proxy: Callable[..., ProxyHarness]) -> Callable[..., ProxyHarness]:
    def make(size: int = 3, **kwargs: object) -> ProxyHarness:
        config = PoolConfig(
            size=size,
            idle_timeout=float(kwargs.pop("idle_timeout", 600.0)),  # type: ignore[arg-type]
            password=kwargs.pop("password", None),  # type: ignore[arg-type]
            max_prepared=int(kwargs.pop("max_prepared", 200)),  # type: ignore[call-overload]
        )
        return make_proxy(pool=config, **kwargs)

    return make


def dsn(proxy: ProxyHarness, user: str = "postgres", **extra: str) -> str:
    password = USERS[user][0] if user in USERS else ""
    parts = [f"host=127.0.0.1 port={proxy.port} user={user} dbname=postgres"]
    if password:
        parts.append(f"password={password}")
    parts += [f"{k}={v}" for k, v in extra.items()]
    return " ".join(parts)


def server_connections(pg: Cluster) -> int:
    return int(
        pg.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND usename = 'postgres' "
            "AND query NOT LIKE '%pg_stat_activity%'"
        )
    )


def pool_pids(pg: Cluster) -> list[int]:
    out = pg.psql(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
        "AND pid <> pg_backend_pid() AND query NOT LIKE '%pg_stat_activity%' "
        "AND usename = 'postgres'"
    )
    return [int(line) for line in out.split()]


@pytest.fixture
def sampler(pg: Cluster) -> Iterator[list[int]]:
    """The server's client connections, sampled every 20 ms while the test runs."""
    seen: list[int] = []
    stop = threading.Event()

    def run() -> None:
        with psycopg.connect(
            f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid() AND application_name = %s",
                    (POOL_APP,),
                ).fetchone()
                seen.append(row[0] if row else 0)
                time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield seen
    stop.set()
    thread.join(5)


def test_many_psycopg_clients_share_few_server_connections(
    pooled: Callable[..., ProxyHarness], pg: Cluster, sampler: list[int]
) -> None:
    proxy = pooled(size=3)
    pg.psql("DROP TABLE IF EXISTS pool_t; CREATE TABLE pool_t (client int, n int)")
    errors: list[str] = []

    def work(client: int) -> None:
        try:
            with psycopg.connect(dsn(proxy)) as conn:  # transactions (not autocommit)
                for n in range(15):
                    with conn.transaction():
                        conn.execute("INSERT INTO pool_t VALUES (%s, %s)", (client, n))
                        got = conn.execute(
                            "SELECT count(*) FROM pool_t WHERE client = %s", (client,)
                        ).fetchone()
                        assert got == (n + 1,), got
                    value = conn.execute("SELECT %s::int * 2", (n,), prepare=n % 2 == 0)
                    assert value.fetchone() == (2 * n,)
                    conn.commit()  # (else the next block would be a savepoint inside it)
        except Exception as e:
            errors.append(f"{client}: {e!r}")

    threads = [threading.Thread(target=work, args=(c,)) for c in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert pg.psql("SELECT count(*) FROM pool_t") == str(24 * 15)
    assert sampler and max(sampler) <= 3, max(sampler)
    status = proxy.call(lambda: proxy.pools.status())[0]
    assert status["opened"] <= 3 and status["waited"] == 0, status
    assert status["handovers"] >= 24 * 15
    proxy.wait_idle()


def test_a_transaction_is_isolated_and_keeps_its_connection(
    pooled: Callable[..., ProxyHarness], pg: Cluster
) -> None:
    proxy = pooled(size=2)
    pg.psql("DROP TABLE IF EXISTS pool_iso; CREATE TABLE pool_iso (v int)")
    with psycopg.connect(dsn(proxy)) as a, psycopg.connect(dsn(proxy), autocommit=True) as b:
        a.execute("INSERT INTO pool_iso VALUES (1)")
        pid = a.execute("SELECT pg_backend_pid()").fetchone()
        for _ in range(5):  # b's statements take the other connection meanwhile
            assert b.execute("SELECT count(*) FROM pool_iso").fetchone() == (0,)
        assert a.execute("SELECT pg_backend_pid()").fetchone() == pid
        a.commit()
        assert b.execute("SELECT count(*) FROM pool_iso").fetchone() == (1,)
        a.execute("INSERT INTO pool_iso VALUES (2)")
        a.rollback()
        assert b.execute("SELECT count(*) FROM pool_iso").fetchone() == (1,)
    proxy.wait_idle()


def test_prepared_statements_follow_a_client_between_connections(
    pooled: Callable[..., ProxyHarness],
) -> None:
    proxy = pooled(size=2)
    with (
        psycopg.connect(dsn(proxy), autocommit=True, prepare_threshold=0) as a,
        psycopg.connect(dsn(proxy), autocommit=True, prepare_threshold=0) as b,
    ):
        pids: set[int] = set()
        for n in range(12):
            # a holds a transaction on one connection now and then, so b moves
            if n % 3 == 0:
                with a.transaction():
                    a.execute("SELECT 1")
                    row = b.execute("SELECT pg_backend_pid(), %s::int + 1", (n,)).fetchone()
            else:
                row = b.execute("SELECT pg_backend_pid(), %s::int + 1", (n,)).fetchone()
            assert row is not None and row[1] == n + 1
            pids.add(row[0])
            assert a.execute("SELECT %s::text || 'x'", (str(n),)).fetchone() == (f"{n}x",)
        assert len(pids) == 2, pids  # the same prepared statement ran on both connections
    status = proxy.call(lambda: proxy.pools.status())[0]
    assert status["opened"] == 2
    proxy.wait_idle()


def test_asyncpg_with_its_statement_cache(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=3)

    async def main() -> None:
        conns = [
            await asyncpg.connect(
                host="127.0.0.1", port=proxy.port, user="postgres", database="postgres"
            )
            for _ in range(10)
        ]

        async def work(conn: asyncpg.Connection, k: int) -> None:
            for i in range(20):
                assert await conn.fetchval("SELECT $1::int + $2::int", i, k) == i + k
                async with conn.transaction():
                    rows = await conn.fetch(
                        "SELECT oid FROM pg_class WHERE relname = $1", "pg_class"
                    )
                    assert len(rows) == 1
                stmt = await conn.prepare("SELECT $1::text || '!'")
                assert await stmt.fetchval(str(i)) == f"{i}!"

        await asyncio.wait_for(asyncio.gather(*(work(c, k) for k, c in enumerate(conns))), 60)
        for conn in conns:
            await conn.close()

    asyncio.run(main())
    status = proxy.call(lambda: proxy.pools.status())[0]
    assert status["opened"] <= 3 and status["waited"] == 0
    proxy.wait_idle()


def test_pgbench_prepared_and_extended(
    pooled: Callable[..., ProxyHarness], pg: Cluster, sampler: list[int]
) -> None:
    proxy = pooled(size=4)
    direct = f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres"
    subprocess.run(
        ["pgbench", "-i", "-s", "1", "-q", direct], check=True, capture_output=True, timeout=120
    )
    runs = (
        ["-S", "-M", "prepared", "-c", "40"],  # 40 clients, 4 connections
        ["-M", "extended", "-c", "12"],  # TPC-B: multi-statement transactions
    )
    for args in runs:
        result = subprocess.run(
            ["pgbench", *args, "-j", "2", "-t", "50", "-n", dsn(proxy)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert "number of failed transactions: 0" in result.stdout, result.stdout
    assert sampler and max(sampler) <= 4
    proxy.wait_idle()


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "pool_items"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(50))


def test_sqlalchemy_orm(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=2)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/postgres"
    engine = create_engine(url, pool_size=6)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([Item(id=i, name=f"item {i}") for i in range(20)])
        session.commit()
    with Session(engine) as session:
        names = session.scalars(select(Item.name).where(Item.id < 3).order_by(Item.id)).all()
        assert names == ["item 0", "item 1", "item 2"]
        assert session.execute(text("SELECT count(*) FROM pool_items")).scalar() == 20
    engine.dispose()
    proxy.wait_idle()


def test_settings_are_the_clients_own(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=1)  # one connection: every client gets the same one
    with (
        psycopg.connect(
            dsn(proxy, application_name="first", options="'-c DateStyle=German'"), autocommit=True
        ) as a,
        psycopg.connect(dsn(proxy), autocommit=True) as b,
    ):
        a.execute("SET search_path = pg_catalog, public")
        a.execute("SET statement_timeout = '7s'")
        for _ in range(3):
            assert b.execute("SHOW application_name").fetchone() == ("",)
            assert b.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
            assert b.execute("SHOW statement_timeout").fetchone() == ("0",)
            assert b.execute("SHOW search_path").fetchone() == ('"$user", public',)
            assert a.execute("SHOW application_name").fetchone() == ("first",)
            assert a.execute("SHOW DateStyle").fetchone() == ("German, DMY",)
            assert a.execute("SHOW statement_timeout").fetchone() == ("7s",)
            assert a.execute("SHOW search_path").fetchone() == ("pg_catalog, public",)
        a.execute("RESET statement_timeout")
        b.execute("SELECT 1")
        assert a.execute("SHOW statement_timeout").fetchone() == ("0",)
    proxy.wait_idle()


@pytest.mark.parametrize(
    "sql",
    [
        "LISTEN pool_channel",
        "SELECT pg_advisory_lock(7)",
        "CREATE TEMP TABLE pool_tmp (x int)",
        "PREPARE pool_p AS SELECT 1",
        "DECLARE pool_c CURSOR WITH HOLD FOR SELECT 1",
    ],
)
def test_session_features_are_refused_clearly(
    pooled: Callable[..., ProxyHarness], sql: str
) -> None:
    proxy = pooled(size=1)
    with psycopg.connect(dsn(proxy), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="transaction pool mode"):
            conn.execute(sql)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
    proxy.wait_idle()


@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_a_refusal_inside_a_transaction_aborts_it_as_postgresql_would(
    pooled: Callable[..., ProxyHarness], pg: Cluster, protocol: str
) -> None:
    """An error inside a transaction block aborts the transaction: the client hears status E,
    what it sends next fails with 25P02 until it ends the block, and its COMMIT rolls back —
    for the proxy's own refusal too (the server's transaction is aborted with it), never a
    COMMIT that keeps half a transaction."""
    proxy = pooled(size=1)
    pg.psql("CREATE TABLE IF NOT EXISTS pool_refused (x int)")
    pg.psql("TRUNCATE pool_refused")
    with psycopg.connect(dsn(proxy)) as conn:
        # (a ClientCursor sends a Query message, psycopg's own cursor Parse/Bind/Execute/Sync)
        cursor = psycopg.ClientCursor(conn) if protocol == "simple" else conn.cursor()
        execute = cursor.execute
        conn.execute("INSERT INTO pool_refused VALUES (1)")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="transaction pool mode"):
            execute("LISTEN pool_channel")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.commit()  # (PostgreSQL ends a failed block with a ROLLBACK, whatever it is told)
        assert conn.execute("SELECT count(*) FROM pool_refused").fetchone() == (0,)
        conn.rollback()
        # a savepoint takes the block back, as on PostgreSQL
        conn.execute("INSERT INTO pool_refused VALUES (2)")
        conn.execute("SAVEPOINT s")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            execute("SELECT pg_advisory_lock(7)")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.commit()
        assert conn.execute("SELECT x FROM pool_refused").fetchall() == [(2,)]
        # the proxy's own statement is gone from the server connection (pool of one)
        left = conn.execute(
            "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'DO $admission$%%'"
        ).fetchall()
        assert left == [], left
        conn.commit()
    proxy.wait_idle()
    assert proxy.call(lambda: proxy.pools.status())[0]["sv_active"] == 0


def _in_one_write(proxy: ProxyHarness, pg: Cluster, table: str, middle: str) -> list[Any]:
    """BEGIN, an INSERT into ``table`` (made empty first), ``middle`` and COMMIT, each a Query
    of its own, sent in one write; the replies up to the fourth ReadyForQuery."""
    pg.psql(f"CREATE TABLE IF NOT EXISTS {table} (x int)")
    pg.psql(f"TRUNCATE {table}")
    with RawClient(proxy.port) as raw:
        raw.login()
        raw.queries("BEGIN", f"INSERT INTO {table} VALUES (1)", middle, "COMMIT")
        return raw.replies(4)


def test_a_stopping_proxy_cancels_what_a_terminated_client_left_running(
    pooled: Callable[..., ProxyHarness], pg: Cluster
) -> None:
    """A client sends a long statement and Terminate at once: the statement runs on, as on
    PostgreSQL — until the proxy stops, which cancels it with the others (its server
    connection is closed with the pool; left running it would hold capacity nobody counts)."""
    from proxy.wire import protocol

    slow = "SELECT pg_sleep(30) /* terminated */"
    running = f"SELECT count(*) FROM pg_stat_activity WHERE query = '{slow}' AND state = 'active'"
    proxy = pooled(size=1)
    with RawClient(proxy.port) as raw:
        raw.login()
        raw.send(protocol.message(b"Q", slow.encode() + b"\0") + protocol.message(b"X", b""))
        deadline = time.monotonic() + 10
        while pg.psql(running).strip() != "1" and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert pg.psql(running).strip() == "1"  # still running after the Terminate
        stopped = time.monotonic()
        proxy.call(proxy.server.close)  # what serve does on SIGTERM
        while pg.psql(running).strip() != "0" and time.monotonic() - stopped < 10:
            time.sleep(0.05)
        assert pg.psql(running).strip() == "0"
        assert time.monotonic() - stopped < 3.0  # cancelled, not run for 30 s


def test_a_transaction_sent_in_one_write_runs(
    pooled: Callable[..., ProxyHarness], pg: Cluster
) -> None:
    """BEGIN, INSERT, SELECT and COMMIT pipelined through a pool of one: the statements after
    the BEGIN belong to its transaction and its connection — they must not queue for the slot
    that transaction holds (they did, and waited for ever)."""
    proxy = pooled(size=1)
    got = _in_one_write(proxy, pg, "pool_piped_ok", "SELECT 1")
    assert [body for kind, body in got if kind == b"Z"] == [b"T", b"T", b"T", b"I"], got
    assert pg.psql("SELECT count(*) FROM pool_piped_ok").strip() == "1"
    proxy.wait_idle()


def test_a_refusal_in_a_pipelined_transaction_rolls_it_back(
    pooled: Callable[..., ProxyHarness], pg: Cluster
) -> None:
    """BEGIN, INSERT, a refused LISTEN and COMMIT sent in one write, each a Query of its own:
    the COMMIT rolls back, as on PostgreSQL, and each ReadyForQuery says what the server's
    transaction is then."""
    proxy = pooled(size=1)
    got = _in_one_write(proxy, pg, "pool_piped", "LISTEN pool_channel")
    ready = [body for kind, body in got if kind == b"Z"]
    tags = [body for kind, body in got if kind == b"C"]
    errors = [body for kind, body in got if kind == b"E"]
    assert ready == [b"T", b"T", b"E", b"I"], got
    assert tags == [b"BEGIN\0", b"INSERT 0 1\0", b"ROLLBACK\0"], got
    assert len(errors) == 1 and b"C0A000" in errors[0]
    assert pg.psql("SELECT count(*) FROM pool_piped").strip() == "0"
    proxy.wait_idle()
    assert proxy.call(lambda: proxy.pools.status())[0]["sv_active"] == 0


def test_the_proxys_failing_statement_leaves_nothing_on_the_server(pg: Cluster) -> None:
    """What the proxy sends to abort a server transaction: ParseComplete, BindComplete, the
    error, ReadyForQuery E, then its Close in a Sync of its own (the server skips the rest of
    a failed Sync): nothing named stays behind on that server connection."""
    from proxy.wire import protocol
    from proxy.wire.session import _ABORT, _own_statement

    raw = RawClient(pg.port)  # (straight to PostgreSQL)
    try:
        raw.send(startup_packet("postgres", "postgres"))
        raw.replies(1)
        raw.send(protocol.message(b"Q", b"BEGIN\0"))
        assert raw.replies(1)[-1] == (b"Z", b"T")
        raw.send(_own_statement(_ABORT, failing=True))
        got = raw.replies(2)
        assert [kind for kind, _ in got] == [b"1", b"2", b"E", b"Z", b"3", b"Z"]
        assert b"C0A000" in got[2][1] and got[3][1] == got[5][1] == b"E"
        raw.send(protocol.message(b"Q", b"ROLLBACK\0"))
        raw.replies(1)
        raw.send(protocol.message(b"Q", b"SELECT name FROM pg_prepared_statements\0"))
        assert [kind for kind, _ in raw.replies(1)] == [b"T", b"C", b"Z"]  # no row
    finally:
        raw.sock.close()


def test_a_server_connection_keeps_at_most_max_prepared_statements(
    pooled: Callable[..., ProxyHarness],
) -> None:
    """Beyond ``max_prepared`` the least recently used statements of other clients are closed
    on the server when the connection changes hands; a client finds its own again (prepared
    again where they went) and its results are right."""
    proxy = pooled(size=1, max_prepared=3)
    texts = [f"SELECT {i} + %s::int" for i in range(4)]

    def on_server(conn: psycopg.Connection[Any]) -> list[str]:
        rows = conn.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE '_ap_%%' ORDER BY name"
        ).fetchall()
        return [name for (name,) in rows]

    with (
        psycopg.connect(dsn(proxy), autocommit=True) as a,
        psycopg.connect(dsn(proxy), autocommit=True) as b,
    ):
        for sql in texts[:2]:
            assert a.execute(sql, (10,), prepare=True).fetchone() == (texts.index(sql) + 10,)
        for sql in texts[2:]:
            assert b.execute(sql, (10,), prepare=True).fetchone() == (texts.index(sql) + 10,)
        # four prepared; handed to b again, the least recently used of a's is closed
        assert len(on_server(b)) == 3
        # a's first is prepared again for a, and the least recently used of b's closed
        assert a.execute(texts[0], (1,), prepare=True).fetchone() == (1,)
        assert len(on_server(a)) == 3
        for i, sql in enumerate(texts):  # both find theirs, wherever they went
            client = a if i < 2 else b
            assert client.execute(sql, (5,), prepare=True).fetchone() == (i + 5,)
        assert len(on_server(a)) <= 3
    proxy.wait_idle()
    pools = proxy.call(lambda: proxy.pools.status())
    assert pools[0]["evicted"] >= 2 and pools[0]["sv_active"] == 0


def test_what_lives_inside_a_transaction_works(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=1)
    with psycopg.connect(dsn(proxy)) as conn:
        conn.execute("CREATE TEMP TABLE pool_scratch (x int) ON COMMIT DROP")
        conn.execute("INSERT INTO pool_scratch VALUES (1), (2)")
        conn.execute("SELECT pg_advisory_xact_lock(11)")
        assert conn.execute("SELECT sum(x) FROM pool_scratch").fetchone() == (3,)
        conn.commit()
    proxy.wait_idle()


def test_server_connections_killed_idle_and_in_use(
    pooled: Callable[..., ProxyHarness], pg: Cluster
) -> None:
    proxy = pooled(size=2)
    with psycopg.connect(dsn(proxy), autocommit=True) as a:
        assert a.execute("SELECT 1").fetchone() == (1,)
        # killed while idle in the pool: the next statement gets a new connection
        pg.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE application_name = '{POOL_APP}'"
        )
        deadline = time.monotonic() + 5
        while proxy.call(lambda: proxy.pools.status())[0]["sv_idle"] and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert a.execute("SELECT 2").fetchone() == (2,)
        # killed while in use: that client hears why; the others go on
        with psycopg.connect(dsn(proxy), autocommit=True) as b:
            done = threading.Event()
            failure: list[BaseException] = []

            def sleeper() -> None:
                try:
                    b.execute("SELECT pg_sleep(30)")
                except psycopg.Error as e:
                    failure.append(e)
                done.set()

            thread = threading.Thread(target=sleeper)
            thread.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                out = pg.psql(
                    "SELECT pid FROM pg_stat_activity WHERE query = "
                    "'SELECT pg_sleep(30)' AND state = 'active'"
                )
                if out:
                    break
                time.sleep(0.05)
            pg.psql(f"SELECT pg_terminate_backend({int(out.split()[0])})")
            assert done.wait(10)
            thread.join()
            assert failure and isinstance(failure[0], psycopg.OperationalError)
        for n in range(5):
            assert a.execute("SELECT %s::int", (n,)).fetchone() == (n,)
    proxy.wait_idle()


def test_a_client_that_dies_inside_a_transaction(
    pooled: Callable[..., ProxyHarness], pg: Cluster
) -> None:
    proxy = pooled(size=1)
    dying = psycopg.connect(dsn(proxy))
    dying.execute("SELECT 1")  # BEGIN … : a transaction open on the only connection
    dying.pgconn.finish()  # gone without COMMIT or ROLLBACK
    with psycopg.connect(dsn(proxy), autocommit=True) as other:
        assert other.execute("SELECT 42").fetchone() == (42,)
    status = proxy.call(lambda: proxy.pools.status())[0]
    assert status["closed"] >= 1  # the connection left inside a transaction was not reused
    proxy.wait_idle()


def test_cancel_reaches_the_statement_on_its_connection(
    pooled: Callable[..., ProxyHarness],
) -> None:
    proxy = pooled(size=2)
    with psycopg.connect(dsn(proxy), autocommit=True) as conn:
        timer = threading.Timer(0.5, conn.cancel_safe)  # (cancel() holds the GIL)
        timer.start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(20)")
        assert time.monotonic() - started < 10
        assert conn.execute("SELECT 1").fetchone() == (1,)
    proxy.wait_idle()


def test_a_cancel_in_flight_keeps_the_connection_from_the_next_client(
    pooled: Callable[..., ProxyHarness],
) -> None:
    """A cancel sent while A holds the pool's one connection (idle in its transaction, which
    PostgreSQL ignores): A commits at once, and B, waiting, gets the connection once the
    server has taken the cancel — never a cancelled statement, never a connection stuck."""
    proxy = pooled(size=1)
    with psycopg.connect(dsn(proxy)) as a, psycopg.connect(dsn(proxy), autocommit=True) as b:
        a.execute("SELECT 1")  # in its transaction: it holds the connection
        for _ in range(5):
            a.cancel_safe()
            a.commit()  # released, with cancels possibly still on their way
            assert b.execute("SELECT pg_sleep(0.05), 7").fetchone() == ("", 7)
            a.execute("SELECT 1")
        a.commit()
    status = proxy.call(lambda: proxy.pools.status())
    assert status[0]["sv_active"] == 0 and status[0]["opened"] == 1
    proxy.wait_idle()


def test_the_client_limit(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=1, max_client_conn=2)
    with psycopg.connect(dsn(proxy)), psycopg.connect(dsn(proxy)):
        with pytest.raises(psycopg.OperationalError, match="too many clients") as caught:
            psycopg.connect(dsn(proxy))
        assert "53300" in str(caught.value) or caught.value.sqlstate in (None, "53300")
    with psycopg.connect(dsn(proxy), autocommit=True) as conn:  # room again
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert proxy.server.clients_refused == 1
    proxy.wait_idle()


@pytest.mark.parametrize("user", ["scram_user", "md5_user"])
def test_password_authentication_on_both_sides(
    pooled: Callable[..., ProxyHarness], user: str
) -> None:
    password = USERS[user][0]
    proxy = pooled(size=1, password=password)
    with psycopg.connect(dsn(proxy, user), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (user,)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(dsn(proxy, user).replace(password, "wrong"))
    proxy.wait_idle()


def test_no_password_for_the_pool_is_a_clear_error(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=1)  # the client authenticates; the pool has nothing to log in with
    with (
        psycopg.connect(dsn(proxy, "scram_user"), autocommit=True) as conn,
        pytest.raises(psycopg.OperationalError, match="PGPASSWORD"),
    ):
        conn.execute("SELECT 1")
    proxy.wait_idle()


def test_idle_server_connections_are_closed(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=2, idle_timeout=0.3)
    with psycopg.connect(dsn(proxy), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        deadline = time.monotonic() + 5
        while proxy.call(lambda: proxy.pools.status())[0]["sv_idle"] and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert proxy.call(lambda: proxy.pools.status())[0]["sv_idle"] == 0
        assert conn.execute("SELECT 2").fetchone() == (2,)  # a new one when needed
    proxy.wait_idle()


def test_admission_orders_the_pool(pooled: Callable[..., ProxyHarness]) -> None:
    """The MPL is at most the pool size, and a client waits in the scheduler's queue."""
    proxy = pooled(size=2, limits=Limits(mpl=8))
    assert proxy.scheduler.limits.mpl == 2
    results: list[float] = []

    def sleeper() -> None:
        with psycopg.connect(dsn(proxy), autocommit=True) as conn:
            started = time.monotonic()
            conn.execute("SELECT pg_sleep(0.4)")
            results.append(time.monotonic() - started)

    threads = [threading.Thread(target=sleeper) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    state = proxy.state()
    assert state["in_service"] == 2 and state["queued"] == 2, state
    for t in threads:
        t.join(10)
    assert sorted(results)[-1] >= 0.75  # the last two waited for the first two
    status = proxy.call(lambda: proxy.pools.status())[0]
    assert status["waited"] == 0  # they waited in admission, not for a connection
    proxy.wait_idle()


def test_pools_in_status_and_metrics(pooled: Callable[..., ProxyHarness]) -> None:
    proxy = pooled(size=2, admin=True)
    with psycopg.connect(dsn(proxy), autocommit=True) as conn:
        for n in range(3):
            conn.execute("SELECT %s::int", (n,))
    status = httpx.get(f"{proxy.admin_url}/status").json()
    (pool,) = status["pools"]
    assert pool["database"] == "postgres" and pool["user"] == "postgres"
    assert pool["sv_idle"] + pool["sv_active"] == pool["opened"] - pool["closed"] >= 1
    assert pool["handovers"] >= 3 and pool["pool_size"] == 2
    metrics = httpx.get(f"{proxy.admin_url}/metrics").text
    assert 'admission_pool_handovers_total{database="postgres",user="postgres"}' in metrics
    assert 'admission_pool_size{database="postgres",user="postgres"} 2.0' in metrics
    proxy.wait_idle()


def test_logins_the_database_trusts_are_answered_by_the_proxy(
    pooled: Callable[..., ProxyHarness],
) -> None:
    proxy = pooled(size=1, password=USERS["scram_user"][0])
    with psycopg.connect(dsn(proxy), autocommit=True) as first:  # relayed: PostgreSQL trusts it
        assert first.execute("SELECT 1").fetchone() == (1,)
    assert proxy.server.logins_answered == 0
    for name in ("second", "third"):
        with psycopg.connect(dsn(proxy, application_name=name), autocommit=True) as conn:
            assert conn.info.parameter_status("application_name") == name
            assert conn.info.parameter_status("server_version")
            assert conn.execute("SHOW application_name").fetchone() == (name,)
    assert proxy.server.logins_answered == 2
    # a login that asks for a setting, or a password, goes to the database every time
    with psycopg.connect(dsn(proxy, options="'-c DateStyle=German'"), autocommit=True) as c:
        assert c.execute("SHOW DateStyle").fetchone() == ("German, DMY",)
    for _ in range(2):
        with psycopg.connect(dsn(proxy, "scram_user"), autocommit=True) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("scram_user",)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(dsn(proxy, "scram_user").replace("scram-pass", "wrong"))
    assert proxy.server.logins_answered == 2
    proxy.wait_idle()


def test_pipelines_with_prepared_statements_between_connections(
    pooled: Callable[..., ProxyHarness],
) -> None:
    """psycopg's pipeline mode: Parses, Binds and Syncs back to back while the connection
    still owes replies — what the proxy must prepare goes only where nothing is owed."""
    proxy = pooled(size=2)
    with (
        psycopg.connect(dsn(proxy), autocommit=True, prepare_threshold=0) as a,
        psycopg.connect(dsn(proxy), prepare_threshold=0) as b,
    ):
        for rnd in range(6):
            b.execute("SELECT %s::int", (rnd,))  # b holds a connection (its transaction)
            with a.pipeline():
                cursors = [a.execute("SELECT %s::int * 3", (n,)) for n in range(5)]
                cursors += [a.execute("SELECT %s::text || 'p'", (str(n),)) for n in range(5)]
            got = [c.fetchone() for c in cursors]
            assert got == [(n * 3,) for n in range(5)] + [(f"{n}p",) for n in range(5)]
            b.commit()
    proxy.wait_idle()


def test_settings_set_by_a_queued_statement_are_kept(
    pooled: Callable[..., ProxyHarness],
) -> None:
    proxy = pooled(size=1)
    with (
        psycopg.connect(dsn(proxy), autocommit=True) as c,
        psycopg.connect(dsn(proxy), autocommit=True) as d,
    ):
        with c.pipeline():
            c.execute("SET search_path = pg_catalog")
            c.execute("SELECT set_config('work_mem', '77MB', false)")
        assert d.execute("SHOW work_mem").fetchone() == ("4MB",)
        assert c.execute("SHOW work_mem").fetchone() == ("77MB",)
        assert c.execute("SHOW search_path").fetchone() == ("pg_catalog",)
    proxy.wait_idle()
