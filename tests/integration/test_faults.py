"""The fault matrix, on both front ends: the relay in front of a real PostgreSQL server and the
embedded DuckDB server.

A fault must cost only the client it happens to. For each one the test checks what that client
is told (the error and its SQLSTATE, as the README documents them), that the gate's capacity in
use and its queue come back to 0 (read from the scheduler on the proxy's loop), that another
client connected through the fault goes on unharmed, and that what a committed transaction
wrote is still there while what an unfinished one wrote never shows.

Clients are real: psycopg for everything a driver does, raw sockets where a driver cannot help
— a client that dies without a word is a socket closed with SO_LINGER 0, which sends an RST.
Faults that exist only where there is a separate database server (its connection terminated,
the server stopped and started again) run on the relay alone.
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import psycopg
import pytest

from admission import ClassProfile, EtaModel, Limits
from proxy.admin import AdminMetrics, create_app
from proxy.app import AdminServer
from proxy.backends.embedded.session import DuckDBSession
from proxy.gate import AdmissionGate
from testing.embeddedharness import Embedded
from testing.pgcluster import Cluster, free_port, start_cluster
from testing.proxyharness import ProxyHarness
from testing.rawclient import RawClient, startup_packet

RELAY, EMBEDDED = "relay", "embedded"


# -- raw protocol: what a driver will not do (die mid-statement, read a startup error) -----


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def _query(sql: str) -> bytes:
    return _message(b"Q", sql.encode() + b"\0")


def error_fields(body: bytes) -> dict[str, str]:
    """An ErrorResponse's fields by their one-letter code (C: SQLSTATE, M: message)."""
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[part[:1].decode()] = part[1:].decode("utf-8", "replace")
    return fields


def startup_error(port: int, user: str, dbname: str) -> dict[str, str]:
    """Connect, send the startup packet, and return the fields of the error the server answers
    with (psycopg does not expose a connection failure's SQLSTATE)."""
    client = RawClient(port)
    try:
        client.send(startup_packet(user, dbname))
        replies = client.read_until(b"E", b"Z")
    finally:
        client.sock.close()
    errors = [body for kind, body in replies if kind == b"E"]
    assert errors, f"no error at startup: {replies}"
    return error_fields(errors[0])


# -- the two front ends behind one face --------------------------------------------------


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:
            result.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"not reached in {timeout} s: {what}")


class Front:
    """One front end under test, as the tests see it: where clients connect, the scheduler's
    books, the database underneath (read directly, not through the proxy) and a table of
    committed rows, ``ledger``, that no fault may lose."""

    kind: str
    port: int
    user: str
    dbname: str
    table: str
    gate: AdmissionGate
    admin_url: str = ""

    def call(self, fn: Callable[[], Any]) -> Any:
        raise NotImplementedError

    def connections(self) -> int:
        raise NotImplementedError

    def long_sql(self, marker: str) -> str:
        """A statement that runs until it is stopped (and can be), carrying ``marker``."""
        raise NotImplementedError

    def running(self, marker: str) -> int:
        """Statements carrying ``marker`` executing inside the database now."""
        raise NotImplementedError

    def remember_sessions(self) -> None:
        """Keep every client's database session alive in the test from now on, so that only
        the server, not the garbage collector, can end what a dead client left open."""

    def rows(self) -> list[tuple[int, str]]:
        """The ledger as the database has it committed, read around the proxy."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def connect(self, **kw: Any) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            dbname=self.dbname,
            autocommit=True,
            **kw,
        )

    def run(self, sql: str) -> list[tuple[Any, ...]]:
        """``sql`` on a connection of its own."""
        with self.connect() as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def raw(self) -> RawClient:
        """A raw client that completed its startup (trust) and read up to ReadyForQuery."""
        client = RawClient(self.port)
        client.send(startup_packet(self.user, self.dbname))
        replies = client.read_until(b"Z")
        assert replies and replies[-1][0] == b"Z", f"startup failed: {replies}"
        return client

    def commit(self, key: int, note: str) -> None:
        self.run(f"insert into {self.table} values ({key}, '{note}')")

    def state(self) -> dict[str, int]:
        def read() -> dict[str, int]:
            s = self.gate.scheduler
            return {"in_service": s.in_service, "threads": s.threads_in_use, "queued": s.queued}

        state: dict[str, int] = self.call(read)
        state["connections"] = self.call(self.connections)
        return state

    def wait_idle(self, connections: int = 0, timeout: float = 10.0) -> None:
        """Capacity in use and the queue back to 0, and no more than ``connections`` clients."""
        seen: dict[str, int] = {}

        def idle() -> bool:
            seen.update(self.state())
            busy = seen["in_service"] or seen["threads"] or seen["queued"]
            return not busy and seen["connections"] <= connections

        wait_for(idle, timeout, f"the gate back to idle with {connections} clients: {seen}")


class RelayFront(Front):
    kind = RELAY
    user = dbname = "postgres"

    def __init__(self, pg: Cluster, **harness: Any) -> None:
        self.pg = pg
        self.table = f"ledger_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            direct.execute(f"create table {self.table} (id integer primary key, note text)")
        self.harness = ProxyHarness(pg.port, **harness)
        self.port = self.harness.port
        self.gate = self.harness.gate
        self.admin_url = self.harness.admin_url

    def call(self, fn: Callable[[], Any]) -> Any:
        return self.harness.call(fn)

    def connections(self) -> int:
        return len(self.harness.server.connections)

    def long_sql(self, marker: str) -> str:
        return f"select pg_sleep(60), '{marker}'"

    def running(self, marker: str) -> int:
        with psycopg.connect(self.pg.dsn(), autocommit=True) as direct:
            row = direct.execute(
                "select count(*) from pg_stat_activity where state = 'active' "
                "and query like %s and pid <> pg_backend_pid()",
                (f"%{marker}%",),
            ).fetchone()
        assert row is not None
        return int(row[0])

    def rows(self) -> list[tuple[int, str]]:
        with psycopg.connect(self.pg.dsn(), autocommit=True) as direct:
            return direct.execute(f"select id, note from {self.table} order by id").fetchall()

    def close(self) -> None:
        try:
            self.harness.close()
        finally:
            with psycopg.connect(self.pg.dsn(), autocommit=True) as direct:
                direct.execute(f"drop table if exists {self.table}")


def _pause(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _embedded_setup(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("create table ledger (id integer primary key, note varchar)")
    # the blocker statements the tests queue others behind: pg_sleep, as on PostgreSQL
    con.create_function("pg_sleep", _pause, ["DOUBLE"], "DOUBLE", side_effects=True)


class EmbeddedFront(Front):
    kind = EMBEDDED
    user = dbname = "app"
    table = "ledger"

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        policy: str = "fcfs",
        max_queue: int | None = 10_000,
        model: EtaModel | None = None,
        model_path: Path | None = None,
        admin: bool = False,
    ) -> None:
        self.harness = Embedded(limits or Limits(), _embedded_setup, workers=4, policy=policy)
        self.port = self.harness.port
        self.gate = self.harness.server.gate
        self.admin: AdminServer | None = None
        # every session seen: whether the database still runs a dead client's work
        self._sessions: list[DuckDBSession] = []

        def configure() -> None:
            self.gate.max_queue = max_queue
            if model is not None:
                self.gate.set_model(model)

        self.call(configure)
        if admin:
            port = free_port()
            app = create_app(self.gate, AdminMetrics(self.gate.scheduler), model_path=model_path)
            self.admin = AdminServer(app, "127.0.0.1", port)
            self.call(self.admin.start)
            self.admin_url = f"http://127.0.0.1:{port}"

    def call(self, fn: Callable[[], Any]) -> Any:
        return self.harness.call(fn)

    def connections(self) -> int:
        return len(self.harness.server.connections)

    def long_sql(self, marker: str) -> str:
        # DuckDB checks for an interrupt between vectors: this stops at once when told to
        return f"select count(*), '{marker}' from range(100000000000) t(x) where x % 7 = 3"

    def running(self, marker: str) -> int:
        self.remember_sessions()
        result: int = self.call(lambda: sum(1 for s in self._sessions if s.running))
        return result

    def remember_sessions(self) -> None:
        def remember() -> None:
            for conn in self.harness.server.connections:
                if conn.session is not None and conn.session not in self._sessions:
                    self._sessions.append(conn.session)

        self.call(remember)

    def rows(self) -> list[tuple[int, str]]:
        cursor = self.harness.backend.plain_cursor()  # a connection of its own
        try:
            return [
                (int(i), str(n))
                for i, n in cursor.execute("select id, note from ledger order by id").fetchall()
            ]
        finally:
            cursor.close()

    def close(self) -> None:
        try:
            if self.admin is not None:
                self.call(self.admin.stop)
        finally:
            self.harness.close()


MakeFront = Callable[..., Front]


@pytest.fixture
def make_front(request: pytest.FixtureRequest) -> Iterator[MakeFront]:
    """``make_front(limits=…, max_queue=…, model=…, model_path=…, admin=…)`` on the backend
    the test is parametrized with."""
    kind = request.param
    started: list[Front] = []

    def make(**kw: Any) -> Front:
        front: Front
        if kind == RELAY:
            front = RelayFront(request.getfixturevalue("pg"), **kw)
        else:
            front = EmbeddedFront(**kw)
        started.append(front)
        return front

    yield make
    for front in started:
        front.close()


def both(*, relay: str | None = None, embedded: str | None = None) -> pytest.MarkDecorator:
    """Parametrize over both front ends; a reason marks that backend's case as a known bug
    (strict: the test still runs and must keep failing until the bug is fixed)."""

    def case(kind: str, bug: str | None) -> Any:
        marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
        return pytest.param(kind, marks=marks, id=kind)

    return pytest.mark.parametrize(
        "make_front", [case(RELAY, relay), case(EMBEDDED, embedded)], indirect=True
    )


relay_only = pytest.mark.parametrize("make_front", [pytest.param(RELAY, id=RELAY)], indirect=True)


@pytest.fixture
def stdin_is_null() -> Iterator[None]:
    """Standard input on /dev/null for the test: a server that wrongly reads its own stdin
    (instead of the client's COPY data) then fails at once instead of waiting on a terminal."""
    saved = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        yield
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(null)


def assert_unaffected(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    assert conn.execute("select 'unaffected'").fetchone() == ("unaffected",)


# -- the client dies -------------------------------------------------------------------------


@both()
def test_client_killed_while_queued(make_front: MakeFront) -> None:
    """The dead client's statement leaves the queue at once and never runs."""
    front = make_front(limits=Limits(mpl=1))
    front.commit(1, "committed before")
    with front.connect() as bystander:
        blocker = in_thread(lambda: front.run("select pg_sleep(2.5)"))
        wait_for(lambda: front.state()["in_service"] == 1, what="the blocker admitted")
        victim = front.raw()
        victim.send(_query(f"insert into {front.table} values (2, 'queued, then killed')"))
        wait_for(lambda: front.state()["queued"] == 1, what="the victim queued")
        victim.reset()
        wait_for(lambda: front.state()["queued"] == 0, 0.8, "the dead client's statement gone")
        assert front.state()["in_service"] == 1  # the blocker runs on, untouched
        blocker[0].join(15)
        assert not isinstance(blocker[1][0], BaseException), blocker[1]
        front.wait_idle(connections=1)
        assert_unaffected(bystander)
    assert front.rows() == [(1, "committed before")]  # withdrawn: the INSERT never ran


@both()
def test_client_killed_while_running(make_front: MakeFront) -> None:
    """Capacity comes back and the database stops the work nobody will read."""
    front = make_front(limits=Limits(mpl=1))
    front.commit(1, "committed before")
    marker = f"killed_running_{uuid.uuid4().hex[:6]}"
    with front.connect() as bystander:
        victim = front.raw()
        victim.send(_query(front.long_sql(marker)))
        wait_for(lambda: front.running(marker) == 1, what="the victim's statement running")
        assert front.state()["in_service"] == 1
        victim.reset()
        front.wait_idle(connections=1)
        wait_for(lambda: front.running(marker) == 0, what="the database stopped the statement")
        assert_unaffected(bystander)  # at MPL 1: the capacity really came back
    assert front.rows() == [(1, "committed before")]


@both()
def test_client_killed_idle_in_transaction(make_front: MakeFront) -> None:
    """The dead client's transaction rolls back: its writes never show and hold nothing."""
    front = make_front(limits=Limits(mpl=1))
    front.commit(1, "committed before")
    with front.connect() as bystander:
        victim = front.raw()
        victim.send(
            _query(
                f"begin; insert into {front.table} values (2, 'never committed'); "
                f"update {front.table} set note = 'dirty' where id = 1"
            )
        )
        replies = victim.read_until(b"Z")
        assert not [body for kind, body in replies if kind == b"E"], replies
        assert replies[-1] == (b"Z", b"T")  # idle in a transaction
        front.remember_sessions()
        victim.reset()
        front.wait_idle(connections=1)
        assert front.rows() == [(1, "committed before")]
        # the rows it wrote are free for others (lock_timeout: fail rather than hang)
        with front.connect(options="-c lock_timeout=5000") as other:
            other.execute(f"update {front.table} set note = 'updated after' where id = 1")
            other.execute(f"insert into {front.table} values (2, 'inserted after')")
        assert_unaffected(bystander)
    assert front.rows() == [(1, "updated after"), (2, "inserted after")]
    front.wait_idle()


@both()
@pytest.mark.usefixtures("stdin_is_null")
def test_client_killed_during_copy_from_stdin(make_front: MakeFront) -> None:
    """Half a COPY from a client that dies is rolled back; capacity comes back."""
    front = make_front(limits=Limits(mpl=1))
    front.commit(1, "committed before")
    with front.connect() as bystander:
        victim = front.raw()
        victim.send(_query(f"copy {front.table} (id, note) from stdin"))
        replies = victim.read_until(b"G", b"E", b"Z")
        kind, body = replies[-1] if replies else (b"", b"")
        if kind == b"E":  # a backend without COPY FROM STDIN must say so, and nothing more
            fields = error_fields(body)
            assert fields.get("C") == "0A000", f"COPY FROM STDIN refused with {fields}"
            victim.reset()
            front.wait_idle(connections=1)
            assert front.rows() == [(1, "committed before")]
            return
        assert kind == b"G", f"no CopyInResponse: {replies}"
        victim.send(b"".join(_message(b"d", f"{i}\thalf a copy\n".encode()) for i in (2, 3, 4)))
        wait_for(lambda: front.running(front.table) == 1, what="the COPY running")
        assert front.state()["in_service"] == 1  # a COPY holds its capacity until it ends
        victim.reset()
        front.wait_idle(connections=1)
        wait_for(lambda: front.running(front.table) == 0, what="the COPY ended on the server")
        assert front.rows() == [(1, "committed before")]
        with bystander.cursor().copy(f"copy {front.table} (id, note) from stdin") as copy:
            copy.write_row((5, "copied by another client"))
    assert front.rows() == [(1, "committed before"), (5, "copied by another client")]
    front.wait_idle()


# -- the database goes away (the relay: a separate server) ----------------------------------


@relay_only
def test_server_connection_terminated_mid_statement(make_front: MakeFront) -> None:
    """pg_terminate_backend: the client hears 57P01 (then 08006), the next one is admitted."""
    front = make_front(limits=Limits(mpl=1))
    assert isinstance(front, RelayFront)
    front.commit(1, "committed before")
    marker = f"terminated_{uuid.uuid4().hex[:6]}"
    with front.connect() as bystander:
        victim = in_thread(lambda: front.run(front.long_sql(marker)))
        wait_for(lambda: front.running(marker) == 1, what="the victim's statement running")
        queued = in_thread(lambda: front.run("select 'admitted next'"))
        wait_for(lambda: front.state()["queued"] == 1, what="a statement queued behind it")
        front.pg.psql(
            "select pg_terminate_backend(pid) from pg_stat_activity "
            f"where query like '%{marker}%' and pid <> pg_backend_pid()"
        )
        victim[0].join(15)
        error = victim[1][0]
        assert isinstance(error, psycopg.OperationalError), victim[1]
        assert error.sqlstate in ("57P01", "08006"), (error.sqlstate, error)
        queued[0].join(15)
        assert queued[1] == [[("admitted next",)]], queued[1]
        front.wait_idle(connections=1)
        assert_unaffected(bystander)
    assert front.rows() == [(1, "committed before")]


def _pg_ctl(cluster: Cluster, *args: str) -> None:
    command = cluster._cmd(str(cluster.bin / "pg_ctl"), "-D", str(cluster.data), *args)
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def test_database_stopped_and_restarted() -> None:
    """While the database is down new clients hear 08001 and nothing is held; once it is back
    on the same port the same proxy serves again, with every committed row."""
    cluster = start_cluster()  # a server of its own: the shared one stays up for the others
    harness = ProxyHarness(cluster.port, limits=Limits(mpl=2))
    through = f"{harness.dsn_base} user=postgres dbname=postgres"

    def connect() -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(through, autocommit=True)

    def at_the_stop() -> int:
        return int(
            cluster.psql(
                "select count(*) from pg_stat_activity where query like '%at the stop%' "
                "and pid <> pg_backend_pid()"
            )
        )

    try:
        with connect() as conn:
            conn.execute("create table ledger (id integer primary key, note text)")
            conn.execute("insert into ledger values (1, 'committed before the stop')")
        idle = connect()
        running = in_thread(lambda: connect().execute("select pg_sleep(60), 'at the stop'"))
        wait_for(lambda: at_the_stop() == 1, what="a statement running at the stop")
        assert harness.state()["in_service"] == 1
        _pg_ctl(cluster, "-m", "fast", "-w", "stop")
        running[0].join(15)
        error = running[1][0]
        assert isinstance(error, psycopg.OperationalError), running[1]
        assert error.sqlstate in ("57P01", "08006"), (error.sqlstate, error)
        harness.wait_idle(connections=0)  # the idle client's backend went too
        for _ in range(3):  # every new client, not only the first
            fields = startup_error(harness.port, "postgres", "postgres")
            assert fields["C"] == "08001", fields
            assert fields["S"] == "FATAL" and "cannot connect to the database" in fields["M"]
        with pytest.raises(psycopg.OperationalError, match="cannot connect to the database"):
            connect()
        with pytest.raises(psycopg.OperationalError):
            idle.execute("select 'the old connection'")
        idle.close()
        harness.wait_idle(connections=0)
        options = (
            f"-p {cluster.port} -k {cluster.socket_dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )
        log = str(cluster.data.parent / "log")
        _pg_ctl(cluster, "-o", options, "-w", "-l", log, "start")
        with connect() as conn:  # the same proxy, not restarted
            assert conn.execute("select 'serving again'").fetchone() == ("serving again",)
            rows = conn.execute("select id, note from ledger order by id").fetchall()
            assert rows == [(1, "committed before the stop")]
        harness.wait_idle(connections=0)
    finally:
        try:
            harness.close()
        finally:
            cluster.stop()


# -- cancel ---------------------------------------------------------------------------------


@both()
def test_cancel_of_a_queued_statement(make_front: MakeFront) -> None:
    """57014 at once, withdrawn from the queue (it never runs), the connection usable."""
    front = make_front(limits=Limits(mpl=1))
    front.commit(1, "committed before")
    blocker = in_thread(lambda: front.run("select pg_sleep(2.0)"))
    wait_for(lambda: front.state()["in_service"] == 1, what="the blocker admitted")
    with front.connect() as conn:
        queued = in_thread(
            lambda: conn.execute(f"insert into {front.table} values (2, 'cancelled')")
        )
        wait_for(lambda: front.state()["queued"] == 1, what="the statement queued")
        conn.cancel_safe()  # (the legacy cancel() holds the GIL; the proxy runs in-process)
        queued[0].join(15)
        error = queued[1][0]
        assert isinstance(error, psycopg.errors.QueryCanceled), queued[1]
        assert error.sqlstate == "57014"
        assert front.state()["queued"] == 0 and front.state()["in_service"] == 1
        blocker[0].join(15)
        assert not isinstance(blocker[1][0], BaseException), blocker[1]
        assert_unaffected(conn)
    front.wait_idle()
    assert front.rows() == [(1, "committed before")]


@both()
def test_cancel_of_a_running_statement(make_front: MakeFront) -> None:
    """The database stops it, 57014, the next queued statement is admitted."""
    front = make_front(limits=Limits(mpl=1))
    front.commit(1, "committed before")
    marker = f"cancel_running_{uuid.uuid4().hex[:6]}"
    with front.connect() as conn:
        running = in_thread(lambda: conn.execute(front.long_sql(marker)))
        wait_for(lambda: front.running(marker) == 1, what="the statement running")
        queued = in_thread(lambda: front.run("select 'admitted next'"))
        wait_for(lambda: front.state()["queued"] == 1, what="a statement queued behind it")
        conn.cancel_safe()
        running[0].join(15)
        error = running[1][0]
        assert isinstance(error, psycopg.errors.QueryCanceled), running[1]
        assert error.sqlstate == "57014"
        queued[0].join(15)
        assert queued[1] == [[("admitted next",)]], queued[1]
        wait_for(lambda: front.running(marker) == 0, what="the statement stopped")
        assert_unaffected(conn)
    front.wait_idle()
    assert front.rows() == [(1, "committed before")]


# -- the gate says no ------------------------------------------------------------------------


@both()
def test_queue_full_answers_53300(make_front: MakeFront) -> None:
    front = make_front(limits=Limits(mpl=1), max_queue=1)
    front.commit(1, "committed before")
    blocker = in_thread(lambda: front.run("select pg_sleep(1.5)"))
    wait_for(lambda: front.state()["in_service"] == 1, what="the blocker admitted")
    queued = in_thread(lambda: front.run(f"insert into {front.table} values (2, 'waited')"))
    wait_for(lambda: front.state()["queued"] == 1, what="one statement queued")
    with front.connect() as conn:
        with pytest.raises(psycopg.errors.TooManyConnections) as refused:
            conn.execute(f"insert into {front.table} values (3, 'refused')")
        assert refused.value.sqlstate == "53300"
        assert "queue limit 1" in str(refused.value)
        for thread, result in (blocker, queued):
            thread.join(15)
            assert not isinstance(result[0], BaseException), result
        assert_unaffected(conn)  # the refusal cost the connection nothing
    front.wait_idle()
    assert front.rows() == [(1, "committed before"), (2, "waited")]


@both()
def test_queue_timeout_answers_57014(make_front: MakeFront) -> None:
    front = make_front(limits=Limits(mpl=1, queue_timeout=0.3))
    front.commit(1, "committed before")
    blocker = in_thread(lambda: front.run("select pg_sleep(1.5)"))
    wait_for(lambda: front.state()["in_service"] == 1, what="the blocker admitted")
    with front.connect() as conn:
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="queue timeout") as timed_out:
            conn.execute(f"insert into {front.table} values (2, 'too late')")
        assert 0.25 < time.monotonic() - started < 0.9
        assert timed_out.value.sqlstate == "57014"
        assert front.state()["queued"] == 0 and front.state()["in_service"] == 1
        blocker[0].join(15)
        assert not isinstance(blocker[1][0], BaseException), blocker[1]
        assert_unaffected(conn)
    front.wait_idle()
    assert front.rows() == [(1, "committed before")]


# -- a broken model file at reload -----------------------------------------------------------

MODEL = EtaModel(
    classes=(
        ClassProfile(fingerprint="hint:short", name="short", D=0.1, f=1, Q=1),
        ClassProfile(fingerprint="hint:long", name="long", D=2.0, f=1, Q=3),
    )
)
GARBAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "wrong-shape": lambda good: b'{"classes": "all of them"}',
    "not-text": lambda good: bytes(range(256)) * 8,
    "too-deep": lambda good: b"[" * 100_000,
}


@both()
@pytest.mark.parametrize(
    "garbage",
    [
        "truncated",
        "empty",
        "wrong-shape",
        "not-text",
        "too-deep",
    ],
)
def test_reload_of_a_garbage_model_is_refused(
    make_front: MakeFront, tmp_path: Path, garbage: str
) -> None:
    """The admin API refuses the reload with 422 and a message naming the file; the old model
    keeps serving; a good file afterwards reloads (so the refusal was the garbage's)."""
    path = tmp_path / "model.json"
    MODEL.save(path)
    front = make_front(
        limits=Limits(mpl=2), policy="sept", model=EtaModel.load(path), model_path=path, admin=True
    )
    old = front.call(lambda: front.gate.scheduler.model)
    path.write_bytes(GARBAGE[garbage](path.read_bytes()))
    with httpx.Client(base_url=front.admin_url, timeout=15) as admin:
        refused = admin.post("/model/reload")
        # Nothing is asserted before the proxy's loop has run once more: a failed reload's
        # traceback is logged there, and Python 3.11's AST state, which traceback formatting
        # uses, is not safe against pytest formatting this test's failure at the same time.
        kept = front.call(lambda: front.gate.scheduler.model)
        assert refused.status_code == 422, (refused.status_code, refused.text)
        detail = refused.json()["detail"]
        assert "not reloaded" in detail and str(path) in detail, detail
        assert kept is old
        assert admin.get("/eta").json()["classes"] == ["short", "long"]
        with front.connect() as conn:  # statements still classified by the old model
            assert conn.execute("/* admission:class=short */ select 1").fetchone() == (1,)
        assert front.call(lambda: front.gate.scheduler.class_names) == ["short", "long"]
        newer = EtaModel(
            classes=(*MODEL.classes, ClassProfile(fingerprint="hint:mid", name="mid", D=0.5, f=1))
        )
        newer.save(path)
        assert admin.post("/model/reload").json()["classes"] == 3
    front.wait_idle()
