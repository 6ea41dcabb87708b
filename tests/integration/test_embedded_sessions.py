"""Sessions of the embedded DuckDB server share DuckDB connections between transactions.

An idle client holds no DuckDB connection; a transaction, a half-read result or state of the
session's own in DuckDB (a temporary table, a DuckDB SET or variable, a PRAGMA) keeps one. What
the session holds in the proxy (prepared statements, PostgreSQL settings) follows it from one
connection to the next. Real clients, real sockets, the connections counted by the backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import duckdb
import psycopg
import pytest

from admission import Limits
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
        assert b.execute("begin") is not None  # a transaction starts on the returned one
        b.execute("commit")


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
            await asyncpg.connect(
                host="127.0.0.1", port=embedded.port, user="app", database="app"
            )
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
