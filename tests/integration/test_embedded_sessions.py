"""Sessions of the embedded DuckDB server share DuckDB connections between transactions.

An idle client holds no DuckDB connection; a transaction, a half-read result or state of the
session's own in DuckDB (a temporary table, a DuckDB SET or variable, a PRAGMA) keeps one. What
the session holds in the proxy (prepared statements, PostgreSQL settings) follows it from one
connection to the next. Real clients, real sockets, the connections counted by the backend.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import duckdb
import psycopg
import pytest

from admission import Limits
from proxy.wire import protocol as pg
from testing.embeddedharness import Embedded


def _table(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("create table items (id integer primary key, name varchar)")
    con.execute("insert into items values (1, 'tea'), (2, 'cake')")


@pytest.fixture
def embedded() -> Iterator[Embedded]:
    server = Embedded(Limits(mpl=4), _table)
    yield server
    server.close()


def _cursors(embedded: Embedded) -> dict[str, int]:
    status: dict[str, int] = embedded.call(lambda: embedded.backend.cursors.status())
    return status


def _settled(embedded: Embedded, lent: int = 0) -> dict[str, int]:
    """The counts once the server has seen ``lent`` connections lent (a client's departure
    reaches it a moment after the client closed its socket)."""
    deadline = time.monotonic() + 10
    while (status := _cursors(embedded))["lent"] != lent and time.monotonic() < deadline:
        time.sleep(0.01)
    return status


def _connect(embedded: Embedded, user: str = "app", autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1", port=embedded.port, user=user, dbname="app", autocommit=autocommit
    )


def test_idle_clients_hold_no_duckdb_connection(embedded: Embedded) -> None:
    clients = [_connect(embedded) for _ in range(40)]
    try:
        assert _cursors(embedded)["opened"] == 0  # connecting costs none
        for i, conn in enumerate(clients):
            assert conn.execute("select count(*) + %s from items", (i,)).fetchone() == (2 + i,)
        status = _cursors(embedded)
        assert status["lent"] == 0
        assert status["opened"] == 1  # one after the other: the same connection each time
        assert status["reused"] == 39
        assert status["idle"] == 1
    finally:
        for conn in clients:
            conn.close()


def test_a_transaction_keeps_its_connection_until_it_ends(embedded: Embedded) -> None:
    with _connect(embedded, autocommit=False) as writer, _connect(embedded) as reader:
        writer.execute("insert into items values (3, 'jam')")
        assert _cursors(embedded)["lent"] == 1  # idle in its transaction, still holding it
        for _ in range(5):  # other sessions run beside it without seeing its write
            assert reader.execute("select count(*) from items").fetchone() == (2,)
        assert writer.execute("select count(*) from items").fetchone() == (3,)
        writer.commit()
        assert _cursors(embedded)["lent"] == 0
        assert reader.execute("select count(*) from items").fetchone() == (3,)
        writer.execute("insert into items values (4, 'bun')")
        writer.rollback()
        assert _cursors(embedded)["lent"] == 0
        assert reader.execute("select count(*) from items").fetchone() == (3,)


def test_a_failed_statement_outside_a_transaction_gives_a_clean_connection_back(
    embedded: Embedded,
) -> None:
    with _connect(embedded) as a, _connect(embedded) as b:
        with pytest.raises(psycopg.errors.UndefinedTable):
            a.execute("select * from nowhere")
        assert _cursors(embedded)["lent"] == 0
        assert b.execute("select count(*) from items").fetchone() == (2,)
        b.execute("begin")  # a transaction starts on the connection given back
        b.execute("insert into items values (9, 'pie')")
        assert _cursors(embedded)["lent"] == 1
        b.execute("commit")
        assert a.execute("select name from items where id = 9").fetchone() == ("pie",)


@pytest.mark.parametrize(
    ("setup", "check", "expected"),
    [
        (
            "create temp table mine as select 42 as x",
            "select x from mine",
            (42,),
        ),
        ("set variable mine = 7", "select getvariable('mine')", (7,)),
        (
            "create temporary macro mine(a) as a + 1",
            "select mine(41)",
            (42,),
        ),
    ],
)
def test_state_of_a_session_in_duckdb_keeps_its_connection(
    embedded: Embedded, setup: str, check: str, expected: tuple[Any, ...]
) -> None:
    owner = _connect(embedded)
    owner.execute(setup)
    others = [_connect(embedded) for _ in range(3)]
    try:
        assert _cursors(embedded)["lent"] == 1  # kept while the session is idle
        for _ in range(3):
            for other in others:
                assert other.execute("select count(*) from items").fetchone() == (2,)
                try:  # never sees the owner's state: no connection of the owner's is lent
                    row = other.execute(check).fetchone()
                except psycopg.Error:
                    row = None
                assert row != expected
            assert owner.execute(check).fetchone() == expected
        closed = _cursors(embedded)["closed"]
        owner.close()
        status = _settled(embedded)
        assert status["lent"] == 0 and status["closed"] == closed + 1  # closed, not kept
        with _connect(embedded) as later:
            try:
                row = later.execute(check).fetchone()
            except psycopg.Error:
                row = None
            assert row != expected
    finally:
        owner.close()
        for other in others:
            other.close()


def test_each_user_gets_connections_of_its_own(embedded: Embedded) -> None:
    with _connect(embedded, "alice") as alice, _connect(embedded, "bob") as bob:
        for _ in range(3):
            assert alice.execute("select pg_get_userbyid(10)").fetchone() == ("alice",)
            assert bob.execute("select pg_get_userbyid(10)").fetchone() == ("bob",)
        status = _cursors(embedded)
        assert status["opened"] == 2 and status["lent"] == 0


def test_prepared_statements_and_settings_follow_a_session_between_connections(
    embedded: Embedded,
) -> None:
    with _connect(embedded, autocommit=False) as holder, _connect(embedded) as client:
        holder.execute("select 1")  # holds the idle connection inside its transaction
        client.execute("set application_name = 'mover'")
        for i in range(8):  # psycopg prepares server-side after 5 runs of one statement
            if i % 2:
                holder.commit()  # the connection goes back to the idle set...
            else:
                holder.execute("select 1")  # ...or is held again: the client moves
            row = client.execute("select name from items where id = %s", (1 + i % 2,)).fetchone()
            assert row == (("tea",) if i % 2 == 0 else ("cake",))
        assert client.execute("show application_name").fetchone() == ("mover",)
        holder.commit()
    assert _settled(embedded)["lent"] == 0


def test_asyncpg_with_its_statement_cache_across_shared_connections(embedded: Embedded) -> None:
    async def main() -> list[int]:
        conns = [
            await asyncpg.connect(host="127.0.0.1", port=embedded.port, user="app", database="app")
            for _ in range(6)
        ]
        try:

            async def client(conn: asyncpg.Connection, k: int) -> int:
                total = 0
                for i in range(20):
                    total += await conn.fetchval("select count(*) + $1::int from items", k + i)
                    async with conn.transaction():
                        total += await conn.fetchval("select $1::int", i)
                return total

            return list(await asyncio.gather(*(client(c, k) for k, c in enumerate(conns))))
        finally:
            for conn in conns:
                await conn.close()

    totals = asyncio.run(main())
    expected = [sum(2 + k + i for i in range(20)) + sum(range(20)) for k in range(6)]
    assert totals == expected
    status = _settled(embedded)
    assert status["lent"] == 0
    assert status["opened"] <= 6  # never more than the clients running at once


def test_random_seed_of_a_session_stays_its_own(embedded: Embedded) -> None:
    seeded = duckdb.connect()
    seeded.execute("select setseed(0.5)")
    expected = seeded.execute("select random()").fetchone()
    with _connect(embedded) as a, _connect(embedded) as b:
        a.execute("select setseed(0.5)")
        assert b.execute("select random()").fetchone() != expected  # not a's seed
        assert a.execute("select random()").fetchone() == expected


def test_describe_on_an_idle_session_knows_the_session_functions(embedded: Embedded) -> None:
    """asyncpg prepares (Parse, Describe) every statement: with no DuckDB connection of its
    own the session describes on the backend's, which has the PostgreSQL functions too."""

    async def main() -> tuple[object, object]:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=embedded.port, user="carol", database="app"
        )
        try:
            user = await conn.fetchval("select pg_catalog.pg_get_userbyid(10)")
            encoding = await conn.fetchval("select pg_catalog.pg_encoding_to_char(6)")
            return user, encoding
        finally:
            await conn.close()

    assert asyncio.run(main()) == ("carol", "UTF8")


def _portal(name: bytes, sql: str, binary: bool = False) -> bytes:
    parse = pg.message(b"P", name + b"\0" + sql.encode() + b"\0\0\0")
    formats = b"\0\x01\0\x01" if binary else b"\0\0"
    return parse + pg.message(b"B", name + b"\0" + name + b"\0" + b"\0\0" + b"\0\0" + formats)


def _execute(name: bytes, limit: int = 0) -> bytes:
    return pg.message(b"E", name + b"\0" + struct.pack("!i", limit))


def _exchange(embedded: Embedded, data: bytes) -> list[tuple[bytes, bytes]]:
    startup = b"user\0app\0database\0app\0\0"
    packet = struct.pack("!II", len(startup) + 8, pg.PROTOCOL_3_0) + startup
    with socket.create_connection(("127.0.0.1", embedded.port), timeout=60) as sock:
        sock.sendall(packet + data + pg.message(b"X"))
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    out, pos = [], 0
    while pos + 5 <= len(reply):
        kind, length = reply[pos : pos + 1], struct.unpack("!i", reply[pos + 1 : pos + 5])[0]
        out.append((bytes(kind), bytes(reply[pos + 5 : pos + 1 + length])))
        pos += 1 + length
    return out


def test_portals_end_with_their_transaction_and_a_failed_one_reads_nothing_more(
    embedded: Embedded,
) -> None:
    """A portal read in part that fails while the rest is read (binary rows: the row path,
    50,000 at a time) and a plain one both end at the Sync that ends their implicit
    transaction, as in PostgreSQL: executing them later is 34000, never rows of whatever
    runs on the DuckDB connection since (another session's, once it went back)."""
    failing = (
        "select case when i > 120000 then error('boom') else 'a' || i end from range(200000) t(i)"
    )
    data = (
        _portal(b"p", failing, binary=True)
        + _execute(b"p", 10)
        + pg.message(b"S")
        + _portal(b"q", "select 42")
        + pg.message(b"S")
        + _execute(b"p")
        + pg.message(b"S")
        + _execute(b"q")
        + pg.message(b"S")
    )
    messages = _exchange(embedded, data)
    errors = [body for kind, body in messages if kind == b"E"]
    assert len(errors) == 3, errors
    assert b"boom" in errors[0]
    assert all(b"C34000" in e and b"does not exist" in e for e in errors[1:])
    assert sum(1 for kind, _ in messages if kind == b"D") <= 10  # only what p sent before
    assert _settled(embedded)["lent"] == 0


def test_status_shows_the_duckdb_connections() -> None:
    """``/status → duckdb_connections`` and ``/metrics`` of ``admission serve`` (the embedded
    default)."""
    from proxy.admin import _status
    from proxy.app import BackgroundProxy, ProxyConfig

    proxy = BackgroundProxy(ProxyConfig(backend=None, listen_port=0, limits=Limits(mpl=2)))
    try:
        with (
            psycopg.connect(proxy.conninfo(), autocommit=True) as a,
            psycopg.connect(proxy.conninfo(), autocommit=False) as b,
        ):
            b.execute("select 2")  # inside its transaction: holds one
            a.execute("select 1")  # opens another, given back
            shown = proxy.call(lambda: _status(proxy.gate))["duckdb_connections"]
            assert shown["lent"] == 1 and shown["idle"] == 1 and shown["opened"] == 2
            assert shown["keep"] >= 8
            metrics = {
                family.name: family.samples[0].value
                for family in proxy.call(lambda: list(proxy.metrics.collect()))
                if family.name.startswith("admission_duckdb_connections")
            }
            assert metrics["admission_duckdb_connections_lent"] == 1
            assert metrics["admission_duckdb_connections_idle"] == 1
            assert metrics["admission_duckdb_connections_opened"] == 2
            b.commit()
    finally:
        proxy.close()
