"""Real clients through the proxy against a real PostgreSQL: they must notice nothing.

After each test the proxy's books must balance: nothing queued, nothing in service.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
import psycopg
import pytest
import trustme
from sqlalchemy import Integer, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from testing.pgcluster import USERS, Cluster
from testing.proxyharness import ProxyHarness


def connect(proxy: ProxyHarness, user: str = "postgres", **kw: object) -> psycopg.Connection:
    password = USERS[user][0] if user in USERS else None
    return psycopg.connect(
        host="127.0.0.1", port=proxy.port, user=user, dbname="postgres", password=password, **kw
    )  # type: ignore[arg-type]


def test_psql_queries_and_meta_commands(proxy: ProxyHarness, pg: Cluster) -> None:
    pg.psql("CREATE TABLE IF NOT EXISTS psql_t (id int primary key, v text)")
    result = subprocess.run(
        [
            "psql",
            f"{proxy.dsn_base} user=postgres dbname=postgres",
            "-X",
            "-A",
            "-t",
            "-c",
            "select 40 + 2",
            "-c",
            r"\dt",
            "-c",
            "select count(*) from pg_class",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "42"
    assert any("psql_t" in line for line in lines)
    proxy.wait_idle()


def test_psycopg_simple_extended_and_transactions(proxy: ProxyHarness) -> None:
    with connect(proxy) as conn:
        assert conn.execute("select %s::int + 1", (41,)).fetchone() == (42,)  # extended
        with psycopg.ClientCursor(conn) as cur:  # simple protocol, client-side binding
            cur.execute("select %s || 'b'", ("a",))
            assert cur.fetchone() == ("ab",)
        conn.execute("create temporary table tx (x int)")
        with conn.transaction():
            conn.execute("insert into tx values (1), (2)")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert conn.execute("select sum(x) from tx").fetchone() == (3,)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1/0")
        conn.rollback()
        assert conn.execute("select 'still usable'").fetchone() == ("still usable",)
    proxy.wait_idle()


def test_psycopg_prepared_and_pipeline_mode(proxy: ProxyHarness) -> None:
    with connect(proxy) as conn:
        for i in range(8):  # psycopg prepares a statement after a few executions
            assert conn.execute("select %s::int * 2", (i,), prepare=True).fetchone() == (2 * i,)
        with conn.pipeline():
            cursors = [conn.execute("select %s::int + 100", (i,)) for i in range(20)]
            conn.execute("create temporary table pipe (x int)")
            conn.cursor().executemany("insert into pipe values (%s)", [(i,) for i in range(50)])
        assert [c.fetchone() for c in cursors] == [(i + 100,) for i in range(20)]
        assert conn.execute("select count(*) from pipe").fetchone() == (50,)
    proxy.wait_idle()


def test_psycopg_copy_both_directions(proxy: ProxyHarness) -> None:
    with connect(proxy) as conn:
        conn.execute("create temporary table c (id int, label text)")
        with conn.cursor().copy("COPY c FROM STDIN") as copy:
            for i in range(5000):
                copy.write_row((i, f"row {i}"))
        assert conn.execute("select count(*), max(id) from c").fetchone() == (5000, 4999)
        rows = 0
        with conn.cursor().copy("COPY (select * from c order by id) TO STDOUT") as copy:
            for _row in copy.rows():
                rows += 1
        assert rows == 5000
    proxy.wait_idle()


def test_psycopg_server_side_cursor(proxy: ProxyHarness) -> None:
    with connect(proxy) as conn, conn.transaction(), conn.cursor(name="ssc") as cur:
        cur.itersize = 100
        cur.execute("select g from generate_series(1, 1000) g")
        assert sum(row[0] for row in cur) == 500500
    proxy.wait_idle()


def test_notifications_are_relayed(proxy: ProxyHarness) -> None:
    with connect(proxy, autocommit=True) as listener, connect(proxy, autocommit=True) as sender:
        listener.execute("LISTEN jobs")
        sender.execute("NOTIFY jobs, 'hello'")
        sender.execute("select pg_notify('jobs', 'again')")
        received = []
        for note in listener.notifies(timeout=5, stop_after=2):
            received.append(note.payload)
        assert received == ["hello", "again"]
    proxy.wait_idle()


def test_asyncpg_prepared_statements_and_transactions(proxy: ProxyHarness) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=proxy.port, user="postgres", database="postgres"
        )
        try:
            stmt = await conn.prepare("select $1::int * $2::int")
            assert [await stmt.fetchval(i, 3) for i in range(5)] == [0, 3, 6, 9, 12]
            await conn.execute("create temporary table a (x int, y text)")
            await conn.executemany(
                "insert into a values ($1, $2)", [(i, str(i)) for i in range(100)]
            )
            async with conn.transaction():
                await conn.execute("delete from a where x < 50")
            assert await conn.fetchval("select count(*) from a") == 50
            records = await conn.fetch("select x, y from a order by x limit 3")
            assert [tuple(r) for r in records] == [(50, "50"), (51, "51"), (52, "52")]
            async with conn.transaction():
                cursor = await conn.cursor("select g from generate_series(1, 300) g")
                assert len(await cursor.fetch(120)) == 120
        finally:
            await conn.close()

    asyncio.run(run())
    proxy.wait_idle()


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "orm_items"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(50))


def test_sqlalchemy_orm_round_trip(proxy: ProxyHarness) -> None:
    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/postgres")
    try:
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            session.add_all([Item(id=i, name=f"item {i}") for i in range(10)])
            session.commit()
        with Session(engine) as session:
            names = session.scalars(select(Item.name).where(Item.id >= 8).order_by(Item.id)).all()
            assert names == ["item 8", "item 9"]
        Base.metadata.drop_all(engine)
    finally:
        engine.dispose()
    proxy.wait_idle()


@pytest.mark.parametrize("mode", ["simple", "extended", "prepared"])
def test_pgbench_through_the_proxy(proxy: ProxyHarness, pg: Cluster, mode: str) -> None:
    dsn = f"{proxy.dsn_base} user=postgres dbname=postgres"
    init = subprocess.run(
        ["pgbench", "-i", "-s", "1", "-q", dsn], capture_output=True, text=True, timeout=120
    )
    assert init.returncode == 0, init.stderr
    run = subprocess.run(
        ["pgbench", "-M", mode, "-c", "4", "-j", "2", "-t", "200", "-n", dsn],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "number of failed transactions: 0" in run.stdout
    assert "number of transactions actually processed: 800/800" in run.stdout
    proxy.wait_idle()


@pytest.mark.parametrize("user", ["scram_user", "md5_user"])
def test_password_authentication_passes_through(proxy: ProxyHarness, user: str) -> None:
    with connect(proxy, user=user) as conn:
        assert conn.execute("select current_user").fetchone() == (user,)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host="127.0.0.1", port=proxy.port, user=user, password="wrong", dbname="postgres"
        )
    proxy.wait_idle()


def test_many_concurrent_clients(proxy: ProxyHarness) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            with connect(proxy) as conn:
                for i in range(20):
                    assert conn.execute("select %s::int", (n * 100 + i,)).fetchone() == (
                        n * 100 + i,
                    )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert time.monotonic() - start < 60
    proxy.wait_idle()


def test_tls_termination(make_proxy: Callable[..., ProxyHarness], tmp_path: Path) -> None:
    """With a certificate the proxy answers SSLRequest with 'S' and speaks TLS to the client
    (the backend connection stays plain); without one, clients that require TLS are told no."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    proxy = make_proxy(tls=context)
    with connect(proxy, sslmode="verify-full", sslrootcert=str(ca_file)) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("select 'secret'").fetchone() == ("secret",)
    plain = make_proxy()
    with pytest.raises(psycopg.OperationalError, match="does not support SSL"):
        connect(plain, sslmode="require")
    proxy.wait_idle()
    plain.wait_idle()


def test_notices_are_relayed(proxy: ProxyHarness) -> None:
    with connect(proxy, autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("DO $$ BEGIN RAISE NOTICE 'from the server'; END $$")
        assert notices == ["from the server"]
    proxy.wait_idle()
