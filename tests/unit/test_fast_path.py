"""The connection's fast path against its general path, through the real connection object.

A ``ClientConnection`` with the real gate and scheduler (MPL 1) and transports that record what
they are given is driven by random scenarios: batches of every shape in one read, several per
read or cut anywhere; server replies cut anywhere (with rows whose bytes look like a
ReadyForQuery); another connection holding the only slot so statements queue, up to a full
queue; cancels of queued statements; transactions (bypass); the backend or the client dying.
The same scenario with the fast path switched off must write the same bytes both ways and
leave the scheduler and the session in the same state, and at the end all capacity is back.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from admission import Limits, Scheduler
from admission.classify import QueryClass
from proxy.gate import AdmissionGate
from proxy.server import BackendAddress, ClientConnection, ProxyServer
from proxy.wire import protocol as pg
from proxy.wire.framing import FrameScanner
from proxy.wire.session import (
    SPEEDUPS,
    FastClient,
    FastServer,
    ProxySession,
    SendToServer,
    Submit,
    fast_client,
    fast_server,
)
from tests.unit.test_wire import (
    AUTH_OK,
    RFQ,
    _split,
    bind,
    cstr,
    execute,
    extended_batches,
    m,
    parse,
    startup,
)

# the Python methods, and the C module when it is built
IMPLEMENTATIONS: list[Impl] = [(ProxySession.fast_client, ProxySession.fast_server)]
if SPEEDUPS:
    IMPLEMENTATIONS.append((fast_client, fast_server))

_NAMES = ("", "a")
_SQL = ("select 1", "select * from t where a = 2", "begin", "commit", "set x = 1")


class Recording:
    """A transport that keeps what it is given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class FakeBackend:
    def __init__(self) -> None:
        self.transport = Recording()


class Waiter:
    def admitted(self, job: object) -> None:
        pass

    def refused(self, job: object, sqlstate: str, message: str) -> None:
        pass


@dataclass
class Outcome:
    to_server: bytes = b""
    to_client: bytes = b""
    stats: tuple[int, ...] = ()
    names: tuple[object, ...] = ()
    fast_used: int = 0
    trace: list[tuple[object, ...]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


NOTIFY = m("A", b"\0\0\0\x07" + cstr("chan") + cstr("Z\0\0\0\x05I"))  # asynchronous


def _replies(
    sent: bytes, answered: int, status: list[bytes], most: int = 1 << 30
) -> tuple[bytes, int]:
    """What a server answers to (at most ``most`` of) the messages in ``sent`` it has not
    answered yet, and how many it has answered then."""
    scanner = FrameScanner()
    out = b""
    count = 0
    row = m("D", b"\0\x01\0\0\0\x06Z\0\0\0\x05I")  # a value that looks like a ReadyForQuery
    for frame in scanner.feed(sent):
        if frame.type not in (pg.QUERY, pg.SYNC):
            continue
        count += 1
        if count <= answered:
            continue
        if count > answered + most:
            return out, count - 1
        text = frame.body.lower()
        if frame.type == pg.QUERY and text.startswith(b"begin"):
            status[0] = b"T"
        elif frame.type == pg.QUERY and text.startswith(b"commit"):
            status[0] = b"I"
        out += row + m("C", cstr("SELECT 1")) + pg.ready_for_query(status[0])
    return out, count


Impl = tuple[FastClient, FastServer] | None  # a fast path's two functions, or None: none


class _Connection(ClientConnection):
    """(with a __dict__: a scenario puts its own fast path on the instance)"""


def run_scenario(steps: list[tuple[object, ...]], fast: Impl) -> Outcome:
    async def run() -> Outcome:
        scheduler = Scheduler(None, "fcfs", Limits(mpl=1))
        gate = AdmissionGate(scheduler, max_queue=2)  # a third waiting statement: 53300
        server = ProxyServer(gate, BackendAddress("127.0.0.1", 1))
        conn = _Connection(server)
        conn.session.fast_path = fast is not None
        if fast is not None:
            conn._fast_client, conn._fast_server = fast  # type: ignore[method-assign, assignment]
        client = Recording()
        conn.transport = client  # type: ignore[assignment]
        conn.session.client_data(startup())  # the backend is connected by hand below
        backend = FakeBackend()
        conn.backend = backend  # type: ignore[assignment]
        conn._server_write = backend.transport.write  # what _connect does once connected
        conn.from_server(AUTH_OK + RFQ)
        answered = 0
        status = [b"I"]
        blockers: list[str] = []
        outcome = Outcome()
        klass = QueryClass("fp:other", "other")
        for step_number, step in enumerate(steps):
            kind = step[0]
            if kind == "client" and not client.closed:
                for chunk in _split(b"".join(step[1]), step[2]):  # type: ignore[arg-type]
                    conn.data_received(chunk)
                    outcome.fast_used += conn.session._fast_job is not None
            elif kind == "server" and not backend.transport.closed:
                _, cuts, most, notify = step
                sent = bytes(backend.transport.data)
                reply, answered = _replies(sent, answered, status, most)  # type: ignore[arg-type]
                for chunk in _split(reply + NOTIFY * notify, cuts):  # type: ignore[arg-type, operator]
                    conn.from_server(chunk)
            elif kind == "block":
                blockers.append(f"blocker-{step_number}")
                gate.admit(blockers[-1], klass, False, "other", Waiter())
            elif kind == "unblock" and blockers:
                gate.release(blockers.pop(0))
            elif kind == "cancel":
                for job in conn.session.active_jobs:
                    gate.cancel(job)
            elif kind == "server_lost":
                conn.backend_lost(None)
                backend.transport.closed = True
            elif kind == "client_lost":
                conn.connection_lost(None)
                client.closed = True
            outcome.trace.append(
                (
                    conn.session.transaction_status,
                    scheduler.in_service,
                    scheduler.queued,
                    len(client.data),
                    len(backend.transport.data),
                    tuple(c.name for c in scheduler.model.classes),  # classified alike
                )
            )
        outcome.to_server = bytes(backend.transport.data)
        outcome.to_client = bytes(client.data)
        s = scheduler.stats
        outcome.stats = (s.submitted, s.admitted, s.bypassed, s.completed, s.cancelled)
        session = conn.session
        outcome.names = (
            dict(session._statements),
            dict(session._portals),
            session.transaction_status,
            session.state,
        )
        # the end: everything is answered, the blockers leave, the client goes
        reply, answered = _replies(outcome.to_server, answered, status)
        if not backend.transport.closed:
            conn.from_server(reply)
        for blocker in blockers:
            gate.release(blocker)
        if not client.closed:
            conn.connection_lost(None)
        outcome.left = [f"in service {scheduler.in_service}", f"queued {scheduler.queued}"]
        return outcome

    return asyncio.run(run())


_batch = st.one_of(
    st.sampled_from(_SQL).map(lambda sql: m("Q", cstr(sql))),
    extended_batches(_NAMES, _SQL),
    st.sampled_from(_NAMES).map(lambda name: m("C", b"S" + cstr(name)) + m("S")),
    st.tuples(st.sampled_from(_NAMES), st.sampled_from(_NAMES)).map(
        lambda t: execute(t[0]) + bind(t[0], t[1]) + execute(t[0]) + m("S")  # out of order
    ),
    st.tuples(st.sampled_from(_NAMES), st.sampled_from(_NAMES), st.sampled_from(_NAMES)).map(
        lambda t: bind(t[0], t[1]) + execute(t[0]) + execute(t[2]) + m("S")  # two portals
    ),
    st.just(m("d", m("Q", cstr("select 2")))),  # COPY data (outside a COPY) holding a Query
)
_cuts = st.lists(st.integers(0, 5_000), max_size=3)
_one = st.tuples(st.just("client"), st.lists(_batch, min_size=1, max_size=1), st.just([]))
_reply = st.tuples(st.just("server"), st.just([]), st.just(1), st.just(False))
_REPLY = ("server", [], 1, False)
_event = st.sampled_from(["block", "unblock", "cancel", "server_lost", "client_lost"])
_step = st.one_of(
    _one,  # the usual cycle (one batch, then its reply) is drawn more often than the rest
    _reply,
    _one,
    _reply,
    st.tuples(st.just("client"), st.lists(_batch, min_size=1, max_size=2), _cuts),
    st.tuples(st.just("server"), _cuts, st.sampled_from([1, 2, 1 << 30]), st.booleans()),
    st.tuples(st.sampled_from(["block", "unblock"])),
    st.tuples(_event),
)


_Q = m("Q", cstr("select 1"))


@given(st.lists(_step, max_size=14))
@settings(max_examples=600, deadline=None)
# a reply to an earlier batch with no job must not end the fast path's statement
@example([("client", [m("C", b"S\0") + m("S")], []), ("client", [_Q], []), _REPLY])
# a message after the ReadyForQuery, cut by the read, must wait for the rest of it
@example([("client", [_Q], []), ("server", [45], 1, True), ("client", [_Q], []), _REPLY])
# the first Execute decides the class, not a later one of another portal
@example(
    [
        ("client", [parse("a", "select 1") + m("S")], []),
        _REPLY,
        ("client", [bind("a", "a") + execute("a") + execute("") + m("S")], []),
        _REPLY,
    ]
)
# a Bind after an Execute: the Execute's portal is the one bound before
@example(
    [
        ("client", [parse("a", "select 1") + m("S")], []),
        _REPLY,
        ("client", [bind("a", "a") + execute("a") + m("S")], []),
        _REPLY,
        ("client", [execute("a") + bind("a", "") + execute("a") + m("S")], []),
        _REPLY,
    ]
)
# inside a transaction block statements bypass admission
@example([("client", [m("Q", cstr("begin"))], []), _REPLY, ("client", [_Q], []), _REPLY])
# a read that ends inside a message: the next one starts in the middle of it
@example([("client", [m("d", _Q)], [5]), _REPLY])
# a full queue refuses the statement inside the gate's admit (53300)
@example([("block",), ("block",), ("block",), ("client", [_Q], []), ("unblock",), _REPLY])
# a fast statement that has to wait keeps its place ahead of the next batch
@example([("block",), ("client", [_Q], []), ("client", [_Q], []), ("unblock",), _REPLY])
def test_fast_path_and_general_path_agree(steps: list[tuple[object, ...]]) -> None:
    general = run_scenario(steps, None)
    for impl in IMPLEMENTATIONS:
        _agree(run_scenario(steps, impl), general)


def _agree(fast: Outcome, general: Outcome) -> None:
    assert general.fast_used == 0
    assert fast.trace == general.trace
    assert fast.to_server == general.to_server
    assert fast.to_client == general.to_client
    assert fast.stats == general.stats
    assert fast.names == general.names
    assert fast.left == general.left == ["in service 0", "queued 0"]


def test_the_usual_cycle_takes_the_fast_path() -> None:
    sql = "select * from t where a = 2"
    steps: list[tuple[object, ...]] = [
        ("client", [parse("a", sql) + m("S")], []),
        ("server", [], 1, False),
    ]
    for _ in range(3):
        steps += [("client", [bind("", "a") + execute() + m("S")], []), ("server", [], 1, False)]
        steps += [("client", [m("Q", cstr(sql))], []), ("server", [], 1, False)]
    general = run_scenario(steps, None)
    fast = run_scenario(steps, IMPLEMENTATIONS[-1])
    assert fast.fast_used == 6  # every executing batch; the Parse alone has nothing to admit
    assert fast.stats == general.stats == (6, 6, 0, 6, 0)
    reply, _ = _replies(m("S"), 0, [b"I"])
    assert fast.to_client == general.to_client == AUTH_OK + RFQ + reply * 7


def test_the_c_fast_path_is_built_where_a_compiler_is() -> None:
    """The install builds proxy/wire/_speedups.c when it can; the server uses it then."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python fast path is used")
    assert SPEEDUPS or os.environ.get("ADMISSION_PURE_PYTHON")
    assert ClientConnection._fast_client is fast_client


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl[0].__qualname__)  # type: ignore[index]
def test_the_fast_path_waits_for_the_session_to_be_ready(impl: Impl) -> None:
    assert impl is not None
    session = ProxySession()
    query = m("Q", cstr("select 1"))
    assert impl[0](session, query) is None  # before the startup packet
    session.client_data(startup())
    assert impl[0](session, query) is None  # during authentication
    session.server_data(AUTH_OK + RFQ)
    submit = impl[0](session, query)
    assert submit is not None
    job, query_class, bypass, sql = submit
    assert sql == "select 1" and not bypass and query_class == session.classify(sql)
    assert impl[1](session, m("C", cstr("SELECT 1")) + RFQ) is None  # not forwarded yet
    session.fast_sent = True
    assert impl[1](session, m("C", cstr("SELECT 1"))) == 0
    assert impl[1](session, RFQ) == job
    assert impl[0](session, query) is not None
    session.fast_wait()  # it waits: the general path holds it now
    assert session.job_is_queued(session.active_jobs[0])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl[0].__qualname__)  # type: ignore[index]
def test_a_statement_or_portal_the_session_never_saw_is_admitted_not_bypassed(
    impl: Impl,
) -> None:
    """A Bind to a statement prepared with SQL PREPARE, or an Execute of a cursor from SQL
    DECLARE, runs real work: it is queued as EXECUTE / FETCH, never passed as empty text."""
    assert impl is not None
    for batch, expected in (
        (bind("", "from_sql") + execute("") + m("S", b""), 'EXECUTE "from_sql"'),
        (execute("cur") + m("S", b""), 'FETCH ALL FROM "cur"'),
    ):
        session = ProxySession()
        session.client_data(startup())
        session.server_data(AUTH_OK + RFQ)
        submit = impl[0](session, batch)
        if submit is None:  # the general path takes it
            (action,) = [a for a in session.client_data(batch) if isinstance(a, Submit)]
            assert not action.bypass and not action.query_class.control
            sql = action.sql
        else:
            _, query_class, bypass, sql = submit
            assert not bypass and not query_class.control
        assert sql == expected


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl[0].__qualname__)  # type: ignore[index]
def test_a_message_over_the_size_limit_goes_to_the_general_path(impl: Impl) -> None:
    assert impl is not None
    session = ProxySession(max_message=64)
    session.client_data(startup())
    session.server_data(AUTH_OK + RFQ)
    assert impl[0](session, m("Q", cstr("select " + "1" * 60))) is None
    assert impl[0](session, m("Q", cstr("select 1"))) is not None


def test_a_statement_forwarded_ahead_of_admit_and_then_refused_runs_uncounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection forwards a statement before ``admit`` only while the gate
    promises admission at once. Were the promise broken, the statement has already gone: it
    runs outside the count (and a warning says so) rather than being queued and sent again."""

    async def run() -> None:
        scheduler = Scheduler(None, "fcfs", Limits(mpl=1))
        gate = AdmissionGate(scheduler)
        conn = ClientConnection(ProxyServer(gate, BackendAddress("127.0.0.1", 1)))
        client = Recording()
        conn.transport = client  # type: ignore[assignment]
        conn.session.client_data(startup())
        backend = FakeBackend()
        conn.backend = backend  # type: ignore[assignment]
        conn._server_write = backend.transport.write
        conn.from_server(AUTH_OK + RFQ)
        assert gate.admit(10**9, QueryClass("fp:b", "b"), False, "x", Waiter())  # MPL 1 used
        gate._lane = 99  # a broken promise: the lane says yes, the MPL says no
        query = m("Q", cstr("select 1"))
        with caplog.at_level("WARNING", logger="admission.proxy"):
            conn.data_received(query)
        assert bytes(backend.transport.data) == query  # forwarded, once
        assert "not admitted at once" in caplog.text
        assert scheduler.running == 1 and scheduler.queued == 0  # not counted, not queued
        conn.from_server(m("C", cstr("SELECT 1")) + RFQ)
        assert bytes(client.data).endswith(RFQ) and not conn.session.statement_running
        gate.release(10**9)
        assert scheduler.running == 0 and scheduler.queued == 0
        conn.data_received(query)  # and the next statement is counted as usual
        assert scheduler.running == 1
        conn.from_server(m("C", cstr("SELECT 1")) + RFQ)
        assert scheduler.running == 0 and bytes(backend.transport.data) == query * 2

    asyncio.run(run())


def test_the_c_fast_path_contract_names_attributes_a_session_has() -> None:
    """``FAST_PATH_FIELDS`` is what the C module reads and writes by name: each is an
    attribute of a fresh session (but ``discarding`` and ``buffer``, its FrontendCore's, and
    ``control``, a class's)."""
    from proxy.wire.session import FAST_PATH_FIELDS

    session = ProxySession()
    owners = {
        "discarding": session._client,
        "buffer": session._client,
        "control": QueryClass("fp:x", "x"),
    }
    missing = [n for n in FAST_PATH_FIELDS if not hasattr(owners.get(n, session), n)]
    assert not missing
    assert len(set(FAST_PATH_FIELDS)) == len(FAST_PATH_FIELDS)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_sessions_of_one_gate_draw_job_ids_from_it(impl: Impl) -> None:
    gate = AdmissionGate(Scheduler(None, "fcfs", Limits()))
    ids = []
    for _ in range(2):
        session = ProxySession(job_ids=gate.job_ids)
        session.client_data(startup())
        session.server_data(AUTH_OK + RFQ)
        submit = impl[0](session, m("Q", cstr("select 1")))
        assert submit is not None
        ids.append(submit[0])
    assert len(set(ids)) == 2 and gate.new_job() not in ids


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl[0].__qualname__)  # type: ignore[index]
def test_a_statement_that_waited_untouched_goes_out_and_back_on_the_fast_path(impl: Impl) -> None:
    """The shell lets a queued statement wait as the fast path's (no ``fast_wait``): once
    admitted its bytes go out as they came and its reply is read by ``fast_server``; any other
    event first turns it into the queued batch the general path would hold."""
    assert impl is not None
    session = ProxySession()
    session.client_data(startup())
    session.server_data(AUTH_OK + RFQ)
    query = m("Q", cstr("select 1"))
    submit = impl[0](session, query)
    assert submit is not None
    job = submit[0]
    assert session.held_bytes == len(query)  # it waits: held
    assert session.fast_granted(job + 1) is None  # not its job
    assert session.fast_granted(job) == query
    assert session.fast_granted(job) is None  # once
    assert impl[1](session, m("C", cstr("SELECT 1")) + RFQ) == job
    # waiting, then the client sends more: the general path takes it over, in order
    submit = impl[0](session, query)
    assert submit is not None
    second = submit[0]
    actions = session.client_data(query)
    assert not any(isinstance(a, SendToServer) for a in actions)
    assert session.fast_granted(second) is None
    forwarded = [a for a in session.granted(second) if isinstance(a, SendToServer)]
    assert b"".join(a.data for a in forwarded) == query
