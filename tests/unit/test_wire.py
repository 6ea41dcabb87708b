"""The sans-IO protocol layer, without sockets: framing, and the session state machine.

- The same stream fed whole, byte by byte or split at random points gives identical frames and
  identical actions.
- Fuzzed input raises nothing but ``ProtocolViolation`` from the scanner, and makes the session
  answer 08P01 and close, never crash.
- Scenarios: what is admitted, what bypasses, what passes without admission, and where the
  proxy's own errors land in the reply stream.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import protocol as pg
from proxy.wire.framing import STARTUP, FrameScanner
from proxy.wire.session import (
    Close,
    ConnectServer,
    ForwardCancel,
    ProxySession,
    Release,
    SendToClient,
    SendToServer,
    Submit,
)


def m(kind: str, body: bytes = b"") -> bytes:
    return pg.message(kind.encode(), body)


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def startup(user: str = "alice") -> bytes:
    body = struct.pack("!I", pg.PROTOCOL_3_0) + cstr("user") + cstr(user) + b"\0"
    return struct.pack("!I", len(body) + 4) + body


def parse(name: str, sql: str) -> bytes:
    return m("P", cstr(name) + cstr(sql) + b"\0\0")


def bind(portal: str, statement: str) -> bytes:
    return m("B", cstr(portal) + cstr(statement) + b"\0\0\0\0\0\0")


def execute(portal: str = "") -> bytes:
    return m("E", cstr(portal) + b"\0\0\0\0")


SYNC, FLUSH = m("S"), m("H")
RFQ = pg.ready_for_query(b"I")
RFQ_T = pg.ready_for_query(b"T")
KEY = m("K", struct.pack("!II", 4242, 99))
AUTH_OK = m("R", struct.pack("!I", 0))
QUERY_REPLY = m("C", cstr("SELECT 1")) + RFQ


def ready_session() -> ProxySession:
    s = ProxySession()
    actions = s.client_data(startup())
    assert isinstance(actions[0], ConnectServer)
    s.server_data(AUTH_OK + KEY + RFQ)
    return s


STREAM = (
    m("Q", cstr("select 1"))
    + parse("s1", "select $1::int")
    + bind("", "s1")
    + m("D", b"P\0")
    + execute()
    + SYNC
    + m("Q", cstr("BEGIN"))
    + m("Q", cstr("select 2"))
    + m("d", b"copy data")
    + m("X")
)


# -- framing -------------------------------------------------------------------------------


def _frames(chunks: list[bytes]) -> list[tuple[int, bytes]]:
    scanner = FrameScanner()
    out = []
    for chunk in chunks:
        out.extend((f.type, f.raw) for f in scanner.feed(chunk))
    return out


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def test_frames_whole_and_byte_by_byte_agree() -> None:
    whole = _frames([STREAM])
    assert [chr(t) for t, _ in whole] == list("QPBDESQQdX")
    assert _frames([bytes([b]) for b in STREAM]) == whole
    assert b"".join(raw for _, raw in whole) == STREAM


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_frames_at_random_split_points(cuts: list[int]) -> None:
    assert _frames(_split(STREAM, cuts)) == _frames([STREAM])


@given(st.binary(max_size=400))
@settings(max_examples=500)
def test_scanner_fuzz_raises_only_protocol_violation(data: bytes) -> None:
    for startup_mode in (True, False):
        scanner = FrameScanner(startup=startup_mode, max_message=1 << 16)
        try:
            for frame in scanner.feed(data):
                assert frame.type == STARTUP or 0 <= frame.type < 256
        except pg.ProtocolViolation:
            pass


def test_scanner_limits() -> None:
    with pytest.raises(pg.ProtocolViolation, match="invalid length"):
        FrameScanner().feed(b"Q\0\0\0\x02")
    with pytest.raises(pg.ProtocolViolation, match="limit 100"):
        FrameScanner(max_message=100).feed(b"Q" + struct.pack("!I", 1000))
    with pytest.raises(pg.ProtocolViolation, match="startup packet length"):
        FrameScanner(startup=True).feed(struct.pack("!I", 4) + b"\0" * 8)


# -- session: split invariance and fuzz ----------------------------------------------------


def _drive(chunks: list[bytes]) -> list[object]:
    """Feed client chunks to a ready session, granting every job at once."""
    s = ready_session()
    out: list[object] = []
    pending = [a for c in chunks for a in s.client_data(c)]
    while pending:
        action = pending.pop(0)
        out.append(action)
        if isinstance(action, Submit):
            pending[:0] = s.granted(action.job)
    return [_norm(a) for a in out]


def _norm(action: object) -> object:
    # jobs are numbered globally; compare shapes, and coalesce what goes to the server
    if isinstance(action, Submit):
        return ("submit", action.query_class.fingerprint, action.bypass)
    if isinstance(action, Release):
        return "release"
    return action


def _coalesce(actions: list[object]) -> list[object]:
    out: list[object] = []
    for a in actions:
        if isinstance(a, SendToServer) and out and isinstance(out[-1], SendToServer):
            out[-1] = SendToServer(out[-1].data + a.data)
        else:
            out.append(a)
    return out


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_session_actions_do_not_depend_on_how_bytes_arrive(cuts: list[int]) -> None:
    assert _coalesce(_drive(_split(STREAM, cuts))) == _coalesce(_drive([STREAM]))


@given(st.binary(max_size=300))
@settings(max_examples=300)
def test_session_fuzz_never_crashes(data: bytes) -> None:
    s = ready_session()
    actions = s.client_data(data)
    for action in actions:
        if isinstance(action, Close):
            assert any(isinstance(a, SendToClient) and b"08P01" in a.data for a in actions) or (
                "terminated" in action.reason
            )


@given(st.binary(max_size=300))
def test_session_fuzz_before_startup(data: bytes) -> None:
    ProxySession().client_data(data)  # must not raise


# -- session: scenarios --------------------------------------------------------------------


def test_ssl_and_gssenc_are_declined_then_startup_proceeds() -> None:
    s = ProxySession()
    ssl_request = struct.pack("!II", 8, pg.SSL_REQUEST_CODE)
    gss_request = struct.pack("!II", 8, pg.GSSENC_REQUEST_CODE)
    actions = s.client_data(gss_request + ssl_request)
    assert actions == [SendToClient(b"N"), SendToClient(b"N")]
    actions = s.client_data(startup("bob"))
    assert isinstance(actions[0], ConnectServer) and actions[0].parameters == {"user": "bob"}


def test_cancel_request_is_routed_by_key() -> None:
    s = ProxySession()
    actions = s.client_data(struct.pack("!IIII", 16, pg.CANCEL_REQUEST_CODE, 7, 8))
    assert actions[0] == ForwardCancel(7, 8) and isinstance(actions[1], Close)


def test_backend_key_and_transaction_status_are_tracked() -> None:
    s = ready_session()
    assert s.backend_key == (4242, 99)
    s.client_data(m("Q", cstr("BEGIN")))
    s.server_data(m("C", cstr("BEGIN")) + RFQ_T)
    assert s.transaction_status == b"T"


def test_simple_query_waits_for_its_grant_and_releases_on_ready() -> None:
    s = ready_session()
    (submit,) = s.client_data(m("Q", cstr("select * from t where a = 1")))
    assert isinstance(submit, Submit) and not submit.bypass
    assert s.job_is_queued(submit.job)
    assert s.granted(submit.job) == [SendToServer(m("Q", cstr("select * from t where a = 1")))]
    actions = s.server_data(m("T", b"\0\0") + QUERY_REPLY)
    assert actions[0] == SendToClient(m("T", b"\0\0") + QUERY_REPLY)
    assert actions[1] == Release(submit.job)


def test_control_statements_and_transactions_bypass() -> None:
    s = ready_session()
    (submit,) = s.client_data(m("Q", cstr("SET search_path = x")))
    assert isinstance(submit, Submit) and submit.bypass
    s.granted(submit.job)
    s.server_data(m("C", cstr("SET")) + RFQ_T)  # pretend a transaction is open now
    (inside,) = s.client_data(m("Q", cstr("select 1")))
    assert isinstance(inside, Submit) and inside.bypass


def test_multi_statement_query_bypasses_only_if_all_are_control() -> None:
    s = ready_session()
    (a,) = s.client_data(m("Q", cstr("BEGIN; select * from big; COMMIT")))
    assert isinstance(a, Submit) and not a.bypass


def test_parse_describe_without_execute_pass_without_admission() -> None:
    s = ready_session()
    batch = parse("s", "select $1") + m("D", b"Ss\0") + SYNC
    assert s.client_data(batch) == [SendToServer(batch)]
    assert s.active_jobs == []


def test_execute_of_a_named_statement_is_classified_by_its_parse() -> None:
    s = ready_session()
    s.client_data(parse("q9", "select * from lineitem where l_quantity > $1") + SYNC)
    s.server_data(m("1") + RFQ)
    (submit,) = s.client_data(bind("p", "q9") + execute("p") + SYNC)
    assert isinstance(submit, Submit)
    assert submit.sql == "select * from lineitem where l_quantity > $1"


def test_flush_forces_the_decision_and_the_rest_streams_through() -> None:
    s = ready_session()
    (submit,) = s.client_data(parse("", "select 1") + bind("", "") + execute() + FLUSH)
    assert isinstance(submit, Submit)
    (first,) = s.granted(submit.job)
    assert isinstance(first, SendToServer) and first.data.endswith(FLUSH)
    assert s.client_data(SYNC) == [SendToServer(SYNC)]
    assert s.server_data(m("C", cstr("SELECT 1")) + RFQ)[1] == Release(submit.job)


def test_pipelined_batches_are_submitted_in_order() -> None:
    s = ready_session()
    one = parse("", "select 1") + bind("", "") + execute() + SYNC
    two = parse("", "select 2") + bind("", "") + execute() + SYNC
    (first,) = s.client_data(one + two)
    assert isinstance(first, Submit) and first.sql == "select 1"
    forward, second = s.granted(first.job)
    assert forward == SendToServer(one) and isinstance(second, Submit)
    assert s.granted(second.job) == [SendToServer(two)]
    replies = s.server_data(RFQ + RFQ)
    assert replies[1:] == [Release(first.job), Release(second.job)]


def test_a_rejected_batch_is_answered_after_earlier_replies() -> None:
    s = ready_session()
    (first,) = s.client_data(m("Q", cstr("select 1")))
    s.granted(first.job)
    (second,) = s.client_data(m("Q", cstr("select 2")))
    # the second times out in the queue while the first still runs on the server
    assert s.rejected(second.job, "57014", "queue timeout") == []
    actions = s.server_data(QUERY_REPLY)
    assert isinstance(actions[0], SendToClient)
    data = actions[0].data
    assert data.startswith(QUERY_REPLY)
    assert b"C57014" in data[len(QUERY_REPLY) :] and data.endswith(RFQ)
    assert Release(first.job) in actions


def test_rejection_before_sync_discards_up_to_the_sync() -> None:
    s = ready_session()
    (submit,) = s.client_data(parse("", "select 1") + bind("", "") + execute() + FLUSH)
    (error,) = s.rejected(submit.job, "57014", "cancelled")
    assert isinstance(error, SendToClient) and b"C57014" in error.data
    assert s.client_data(execute() + SYNC) == [SendToClient(RFQ)]
    assert s.client_data(m("Q", cstr("select 3")))[0].__class__ is Submit


def test_terminate_and_loss_release_everything() -> None:
    # Terminate goes to the server after the statement before it (PostgreSQL answers that
    # first), and the server's close then ends the session without a word of the proxy's own
    s = ready_session()
    (submit,) = s.client_data(m("Q", cstr("select 1")))
    assert s.client_data(m("X")) == []
    assert s.granted(submit.job) == [SendToServer(m("Q", cstr("select 1")) + m("X"))]
    assert s.client_data(m("Q", cstr("select 2")))[0].__class__ is Submit  # COPY: not the end
    actions = s.server_lost()
    assert Release(submit.job) in actions and isinstance(actions[-1], Close)
    assert not any(isinstance(a, SendToClient) for a in actions)
    s = ready_session()
    (submit,) = s.client_data(m("Q", cstr("select 1")))
    s.granted(submit.job)
    lost = s.server_lost()
    assert isinstance(lost[0], SendToClient) and b"C08006" in lost[0].data
    assert Release(submit.job) in lost


def test_copy_data_follows_its_statement() -> None:
    s = ready_session()
    (submit,) = s.client_data(m("Q", cstr("COPY t FROM STDIN")) + m("d", b"1\n") + m("c"))
    forward = s.granted(submit.job)
    assert forward == [SendToServer(m("Q", cstr("COPY t FROM STDIN")) + m("d", b"1\n") + m("c"))]


# -- one batch per read, all in one read, or cut anywhere -----------------------------------

_NAMES = ("", "a", "b")
_SQL = ("select 1", "select $1::int", "select * from t where a = 2", "insert into t values (3)")


def extended_batches(names: Sequence[str], sqls: Sequence[str]) -> st.SearchStrategy[bytes]:
    """[Parse] Bind [Describe] Execute×(0–2) Sync, names and SQL drawn from these."""
    return st.tuples(
        st.booleans(),
        st.sampled_from(names),
        st.sampled_from(sqls),
        st.sampled_from(names),
        st.booleans(),
        st.integers(min_value=0, max_value=2),
    ).map(
        lambda t: (
            (parse(t[1], t[2]) if t[0] else b"")
            + bind(t[3], t[1])
            + (m("D", b"P" + cstr(t[3])) if t[4] else b"")
            + execute(t[3]) * t[5]
            + SYNC
        )
    )


_batches = st.one_of(
    st.sampled_from(_SQL).map(lambda sql: m("Q", cstr(sql))),
    extended_batches(_NAMES, _SQL),
    st.tuples(st.sampled_from(_NAMES), st.sampled_from(_SQL)).map(
        lambda t: parse(t[0], t[1]) + m("D", b"S" + cstr(t[0])) + SYNC
    ),
    st.tuples(st.sampled_from("SP"), st.sampled_from(_NAMES)).map(
        lambda t: m("C", t[0].encode() + cstr(t[1])) + SYNC
    ),
    st.tuples(st.sampled_from(_NAMES), st.sampled_from(_NAMES)).map(
        lambda t: execute(t[0]) + bind(t[0], t[1]) + execute(t[0]) + SYNC  # out of order
    ),
)


def _drive_state(chunks: list[bytes]) -> tuple[list[object], dict[str, str], dict[str, str]]:
    s = ready_session()
    out: list[object] = []
    pending = [a for c in chunks for a in s.client_data(c)]
    while pending:
        action = pending.pop(0)
        if isinstance(action, Submit):
            out.append(("submit", action.sql, action.bypass))
            pending[:0] = s.granted(action.job)
        else:
            out.append(_norm(action))
    return _coalesce(out), dict(s._statements), dict(s._portals)


@given(st.lists(_batches, min_size=1, max_size=6), st.lists(st.integers(0, 10_000), max_size=8))
@settings(max_examples=300)
def test_batches_read_one_by_one_at_once_or_cut_give_the_same_actions_and_names(
    batches: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(batches)
    one_by_one = _drive_state(batches)  # each read one whole batch
    assert one_by_one == _drive_state([stream])  # several batches in a read
    assert one_by_one == _drive_state(_split(stream, cuts))


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_server_replies_split_anywhere_relay_the_same_bytes(cuts: list[int]) -> None:
    s = ready_session()
    releases = 0
    for n in range(3):
        (submit,) = s.client_data(m("Q", cstr(f"select {n}")))
        assert isinstance(submit, Submit)
        s.granted(submit.job)
    row = m("D", b"\0\x01\0\0\0\x05ZZZZZ")  # a row whose bytes look like a ReadyForQuery
    reply = (m("T", b"\0\0") + row * 3 + m("C", cstr("SELECT 3")) + RFQ) * 3
    relayed = b""
    for chunk in _split(reply, cuts):
        for action in s.server_data(chunk):
            if isinstance(action, SendToClient):
                relayed += action.data
            elif isinstance(action, Release):
                releases += 1
    assert relayed == reply
    assert releases == 3 and not s.active_jobs


def test_a_query_inside_unsynced_extended_messages_ends_its_batch_at_the_sync() -> None:
    # A message before the Query failed: PostgreSQL skips the Query with everything up to the
    # Sync, and only the Sync's ReadyForQuery comes (counting one for the Query held the job
    # until the session ended)
    s = ready_session()
    (submit,) = s.client_data(bind("", "missing") + m("Q", cstr("select 1")) + SYNC)
    s.granted(submit.job)
    error = pg.error_response("26000", 'prepared statement "missing" does not exist')
    assert Release(submit.job) in s.server_data(error + RFQ)
    assert s.active_jobs == []
    # Nothing failed: the Query's own ReadyForQuery comes first, the Sync's ends the batch
    s = ready_session()
    (submit,) = s.client_data(parse("", "select 1") + m("Q", cstr("select 2")) + SYNC)
    s.granted(submit.job)
    query_reply = m("T", b"\0\0") + m("D", b"\0\0") + m("C", cstr("SELECT 1")) + RFQ
    assert not any(isinstance(a, Release) for a in s.server_data(m("1") + query_reply))
    assert Release(submit.job) in s.server_data(RFQ)


def test_a_function_call_is_answered_with_its_own_ready_for_query() -> None:
    s = ready_session()
    call = m("F", struct.pack("!Ihhh", 2026, 0, 0, 0))
    (submit,) = s.client_data(call)
    assert s.granted(submit.job) == [SendToServer(call)]
    assert Release(submit.job) in s.server_data(m("V", struct.pack("!i", 4) + b"\0\0\0\1") + RFQ)


def test_a_long_pipeline_without_a_sync_is_decided_on_and_streamed() -> None:
    """A pipeline that syncs only at its end is admitted once it has sent STREAM_AFTER bytes,
    then streams to the server message by message; its Sync ends it as usual."""
    from proxy.wire.session import STREAM_AFTER

    s = ready_session()
    statement = parse("s1", "select $1::text") + bind("", "s1") + execute()
    sent: list[object] = []
    count = 0
    while not any(isinstance(a, Submit) for a in sent):
        sent.extend(s.client_data(statement))
        count += 1
        assert count * len(statement) <= STREAM_AFTER + len(statement)
    assert s.held_bytes > STREAM_AFTER  # waiting for admission: all of it held so far
    job = next(a for a in sent if isinstance(a, Submit)).job
    granted = s.granted(job)
    assert sum(len(a.data) for a in granted if isinstance(a, SendToServer)) > STREAM_AFTER
    more = s.client_data(statement)  # admitted: straight through
    assert [type(a) for a in more] == [SendToServer] * len(more) and more
    assert s.held_bytes == 0
    s.client_data(SYNC)
    done = s.server_data(m("1") + m("2") + m("C", cstr("SELECT 1")) + RFQ)
    assert any(isinstance(a, Release) and a.job == job for a in done)
