"""The pure parts of transaction pooling (proxy.pool): what is refused, settings, statement
renaming, SCRAM. The pool itself is tested against a real PostgreSQL in
tests/integration/test_pooling.py."""

from __future__ import annotations

import asyncio

import pytest

from proxy.pool import (
    Link,
    Pool,
    PoolConfig,
    Pools,
    Statements,
    _Scram,
    client_settings,
    may_set,
    pooling_refusal,
    server_name,
    settings_query,
)
from proxy.server import BackendAddress
from proxy.wire import protocol as pg


@pytest.mark.parametrize(
    "sql",
    [
        "LISTEN x",
        "select 1; listen x",
        "SELECT pg_advisory_lock(1)",
        "select pg_try_advisory_lock_shared (1, 2)",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
        "create temporary table t (x int)",
        "CREATE TEMP TABLE t AS SELECT 1",
        "PREPARE p AS SELECT 1",
        "  execute p",
        "SET ROLE someone",
        "set session authorization someone",
    ],
)
def test_session_features_are_refused(sql: str) -> None:
    why = pooling_refusal(sql)
    assert why is not None and "--pool-mode session" in why


@pytest.mark.parametrize(
    ("sql", "sets"),
    [
        ("SET search_path = x", True),
        ("select 1; reset all", True),
        ("  discard all", True),
        ("SELECT set_config('a.b', '1', false)", True),
        ("SELECT 1", False),
        ("UPDATE t SET x = 1", False),  # (an UPDATE's SET is not a session's)
        ("SELECT settings FROM t", False),
    ],
)
def test_statements_that_may_change_settings_are_told_again_from_the_kept_answer(
    sql: str, sets: bool
) -> None:
    assert may_set(sql) is sets
    assert may_set(sql) is sets  # (the second answer from the text's kept one)


def test_the_kept_answers_are_bounded() -> None:
    from proxy import pool

    for i in range(5000):
        may_set(f"SELECT {i}")
    assert 0 < len(pool._SETS) <= 4096
    assert may_set("x" * 5000 + "; set a = 1") and "x" * 5000 + "; set a = 1" not in pool._SETS


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "SELECT pg_advisory_xact_lock(1)",
        "CREATE TEMP TABLE t (x int) ON COMMIT DROP",
        "SELECT * FROM listeners WHERE prepared",
        "UPDATE t SET listen = 1",
        "DEALLOCATE ALL",
        "SET LOCAL ROLE someone",
        "DO $$ BEGIN PERFORM 1; EXECUTE format('SELECT 1'); END $$",
        "CREATE FUNCTION f() RETURNS void AS $body$ BEGIN EXECUTE 'x'; END $body$ LANGUAGE plpgsql",
        "INSERT INTO t VALUES ('call me; listen to this')",
        "SELECT 1 WHERE note = 'with hold' -- ; LISTEN x",
        "",
    ],
)
def test_what_a_shared_connection_carries_passes(sql: str) -> None:
    assert pooling_refusal(sql) is None


def test_client_settings_from_the_startup_packet() -> None:
    settings = client_settings(
        {
            "user": "u",
            "database": "d",
            "application_name": "app",
            "DateStyle": "ISO",
            "options": r"-c search_path=a,b --statement-timeout=5s -cwork_mem=8MB -c x=a\ b",
        }
    )
    assert settings == {
        "application_name": "app",
        "datestyle": "ISO",
        "search_path": "a,b",
        "statement_timeout": "5s",
        "work_mem": "8MB",
        "x": "a b",
    }
    assert client_settings({"user": "u"}) == {"application_name": ""}


def test_settings_query() -> None:
    assert settings_query({"a": "1"}, {"a": "1"}) is None
    query = settings_query({"a": "1", "gone": "x"}, {"a": "2", "b": "it's"})
    assert query is not None
    assert query[5:-1].decode() == (
        "RESET \"gone\"; SELECT set_config('a', '2', false), set_config('b', 'it''s', false)"
    )


def _link() -> Link:
    pools = Pools(
        PoolConfig(size=2),
        BackendAddress("127.0.0.1", 5432),
        connect=_no_connect,
        now=lambda: 0.0,
    )
    return Link(Pool(pools, "u", "d"), 0.0)


async def _no_connect(factory: object) -> asyncio.Transport:
    raise OSError("no database in a unit test")


def _messages(data: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        kind = data[pos : pos + 1]
        length = int.from_bytes(data[pos + 1 : pos + 5], "big")
        out.append((kind, data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out


def parse(name: bytes, sql: bytes) -> bytes:
    return pg.message(b"P", name + b"\0" + sql + b"\0\0\0")


def bind(statement: bytes) -> bytes:
    return pg.message(b"B", b"\0" + statement + b"\0\0\0\0\0\0\0")


SYNC = pg.message(b"S")


def test_statements_are_renamed_and_prepared_where_missing() -> None:
    link, other = _link(), _link()
    client = Statements()
    out = link._rewrite(parse(b"s1", b"SELECT 1") + bind(b"s1") + SYNC, client)
    sname = server_name(b"SELECT 1\0\0\0")
    assert _messages(out) == [
        (b"P", sname + b"\0SELECT 1\0\0\0"),
        (b"B", b"\0" + sname + b"\0\0\0\0\0\0\0"),
        (b"S", b""),
    ]
    # the same client takes another connection: attach prepares what it lacks, first
    prelude = other.attach(client, {})
    assert [m[0] for m in _messages(prelude)] == [b"C", b"P", b"S"]
    assert other.attach(client, {}) == b""  # (now it has it)
    assert len(other._swallow) == 1
    out = other._rewrite(bind(b"s1") + SYNC, client)
    assert _messages(out)[0] == (b"B", b"\0" + sname + b"\0\0\0\0\0\0\0")
    # a client's Close leaves the connection's statement for whoever runs that text next
    out = other._rewrite(pg.message(b"C", b"Ss1\0") + SYNC, client)
    assert _messages(out)[0] == (b"C", b"S_ap_none\0")
    assert sname in other.prepared and b"s1" not in client.names
    # another client parses the same text where it exists: a name of its own, no prelude
    second = Statements()
    out = other._rewrite(parse(b"mine", b"SELECT 1") + SYNC, second)
    renamed = second.names[b"mine"][0]
    assert renamed != sname and _messages(out)[0][1].startswith(renamed + b"\0")
    # unnamed statements and unknown names pass untouched
    data = parse(b"", b"SELECT 2") + bind(b"") + bind(b"nobody") + SYNC
    assert link._rewrite(data, Statements()) == data


def test_settings_go_first_when_they_differ() -> None:
    link = _link()
    prelude = link.attach(Statements(), {"application_name": "a"})
    assert _messages(prelude) == [(b"Q", b"SELECT set_config('application_name', 'a', false)\0")]
    assert link.attach(Statements(), {"application_name": "a"}) == b""


def test_a_failed_prelude_forgets_what_it_prepared() -> None:
    link = _link()
    client = Statements()
    link._rewrite(parse(b"s", b"SELECT 1"), client)
    other = _link()
    other.attach(client, {})
    sname = client.names[b"s"][0]
    assert sname in other.prepared
    other.ready = True
    error = pg.error_response("42P01", "relation does not exist")
    other.data_received(error + pg.ready_for_query(b"I"))
    assert sname not in other.prepared and not other._swallow


def test_terminate_is_not_forwarded() -> None:
    link = _link()
    assert link._rewrite(SYNC + pg.message(b"X"), Statements()) == SYNC


def test_sql_deallocate_of_a_protocol_statement() -> None:
    link = _link()
    client = Statements()
    link._rewrite(parse(b"_pg3_0", b"SELECT 1"), client)
    sname = client.names[b"_pg3_0"][0]
    out = link._deallocate(pg.message(b"Q", b"DEALLOCATE _pg3_0\0"), client)
    assert out == pg.message(b"Q", b'DEALLOCATE "' + sname + b'"\0')
    assert sname not in link.prepared and not client.names
    link._rewrite(parse(b"a", b"SELECT 3"), client)
    query = pg.message(b"Q", b"deallocate all;\0")
    assert link._deallocate(query, client) == query
    assert not link.prepared and not client.names


def test_scram_matches_rfc_7677() -> None:
    scram = _Scram("pencil", nonce="rOprNGfwEbeRWgbNEkqO", user="user")
    assert scram.first().endswith(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    final = scram.final(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert scram.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    assert not scram.verify(b"v=AAAA")
    with pytest.raises(ValueError):
        _Scram("pencil", nonce="abc").final(b"r=xyz,s=AAAA,i=1")


def test_pool_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="pool-size"):
        PoolConfig(size=0)
    with pytest.raises(ValueError):
        PoolConfig(idle_timeout=0)


class _Waiter:
    def __init__(self) -> None:
        self.granted: list[Link] = []

    def link_granted(self, link: Link) -> None:
        self.granted.append(link)

    def link_failed(self, message: str) -> None:
        raise AssertionError(message)


def test_a_link_with_a_cancel_on_its_way_goes_to_no_one_else_until_it_is_through() -> None:
    """A CancelRequest for client A's statement still travelling when A releases the link
    would stop the next client's statement on it: the link is parked until the server has
    taken the cancel (PgBouncer ≥ 1.19 does the same)."""
    link = _link()
    pool = link.pool
    link.ready = True
    a, b = _Waiter(), _Waiter()
    pool.idle.append(link)
    assert pool.acquire(a, 0.0) is link  # type: ignore[arg-type]
    pool.cancel_sent(link)
    pool.release(link, 0.0)  # A is done before the cancel is through
    assert link.parked and link in pool.busy and pool.size == 1
    pool.waiting.append((b, 0.0))  # type: ignore[arg-type]  # B waits for a link
    assert b.granted == [] and pool.idle == []
    pool.cancel_sent(link)  # a second cancel: parked until both are through
    pool.cancel_done(link)
    assert b.granted == [] and link.parked
    pool.cancel_done(link)
    assert b.granted == [link] and not link.parked and link.owner is b
    assert pool.status()["parked"] == 1
    # without a waiter a link whose cancel is through goes back to the idle ones
    pool.cancel_sent(link)
    pool.release(link, 0.0)
    pool.cancel_done(link)
    assert pool.idle == [link] and link not in pool.busy
    # a cancel through before the release changes nothing
    assert pool.acquire(a, 0.0) is link  # type: ignore[arg-type]
    pool.cancel_sent(link)
    pool.cancel_done(link)
    pool.release(link, 0.0)
    assert pool.idle == [link] and pool.status()["parked"] == 2
