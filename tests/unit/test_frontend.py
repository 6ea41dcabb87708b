"""The front-end core both front ends drive (proxy.wire.frontend), without sockets.

- The startup phase's table: every packet gives its event and leads to its phase.
- The same streams fed whole, byte by byte and cut at random points give the same events.
- Malformed input raises ``ProtocolViolation`` and nothing else.
- Batches: where a message's batch begins and ends, the skip to a failed batch's Sync, jobs.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.classify import QueryClass
from proxy.wire import protocol as pg
from proxy.wire.frontend import (
    PHASE_AFTER,
    Batch,
    CancelRequest,
    EncryptionRequest,
    Event,
    Frame,
    FrontendCore,
    Phase,
    StartupMessage,
)


def m(kind: str, body: bytes = b"") -> bytes:
    return pg.message(kind.encode(), body)


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def untyped(code: int, body: bytes = b"") -> bytes:
    return struct.pack("!II", len(body) + 8, code) + body


def startup(version: int = pg.PROTOCOL_3_0, **params: str) -> bytes:
    body = b"".join(cstr(k) + cstr(v) for k, v in params.items()) + b"\0"
    return untyped(version, body)


SSL = untyped(pg.SSL_REQUEST_CODE)
GSSENC = untyped(pg.GSSENC_REQUEST_CODE)
CANCEL = untyped(pg.CANCEL_REQUEST_CODE, struct.pack("!II", 4242, 99))
STARTUP = startup(user="alice", database="shop")
MESSAGES = (
    m("Q", cstr("select 1"))
    + m("P", cstr("s1") + cstr("select $1::int") + b"\0\0")
    + m("B", cstr("") + cstr("s1") + b"\0\0\0\0\0\0")
    + m("E", cstr("") + b"\0\0\0\0")
    + m("S")
    + m("X")
)
SESSION = GSSENC + SSL + STARTUP + MESSAGES


def core(*, tls: bool = False, max_message: int = 1 << 20) -> FrontendCore[Batch]:
    return FrontendCore(
        Batch, tls_available=tls, max_message=max_message, job_ids=itertools.count(1)
    )


def events(chunks: list[bytes], *, tls: bool = False) -> list[Event]:
    """Feed the chunks one by one, taking every event after each."""
    reader = core(tls=tls)
    out: list[Event] = []
    for chunk in chunks:
        reader.receive_data(chunk)
        while (event := reader.next_event()) is not None:
            out.append(event)
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# -- the startup phase ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("packet", "tls", "event"),
    [
        (SSL, False, EncryptionRequest(b"N")),
        (SSL, True, EncryptionRequest(b"S")),
        (GSSENC, True, EncryptionRequest(b"N")),
        (CANCEL, False, CancelRequest(4242, 99)),
        (STARTUP, False, StartupMessage(STARTUP, {"user": "alice", "database": "shop"})),
    ],
)
def test_each_startup_packet_gives_its_event_and_phase(
    packet: bytes, tls: bool, event: Event
) -> None:
    reader = core(tls=tls)
    reader.receive_data(packet)
    assert reader.next_event() == event
    assert reader.next_event() is None
    assert reader.phase is PHASE_AFTER[type(event)]  # type: ignore[index]


def test_the_transition_table_covers_every_startup_event() -> None:
    assert set(PHASE_AFTER) == {EncryptionRequest, CancelRequest, StartupMessage}
    assert EncryptionRequest(b"S").start_tls and not EncryptionRequest(b"N").start_tls


def test_a_whole_session_reads_as_its_events() -> None:
    # (after 'S' the client waits for the handshake: the rest comes in a later read)
    got = events([GSSENC + SSL, STARTUP + MESSAGES], tls=True)
    assert got[:3] == [
        EncryptionRequest(b"N"),
        EncryptionRequest(b"S"),
        StartupMessage(STARTUP, {"user": "alice", "database": "shop"}),
    ]
    frames = got[3:]
    assert all(isinstance(f, Frame) for f in frames)
    assert "".join(f.name for f in frames if isinstance(f, Frame)) == "QPBESX"
    assert b"".join(f.raw for f in frames if isinstance(f, Frame)) == MESSAGES


@pytest.mark.parametrize("tls", [False, True])
def test_bytes_behind_an_accepted_ssl_request_are_refused(tls: bool) -> None:
    """Whatever follows an SSLRequest answered 'S' before the handshake came in clear; taken
    as the startup it would let a man in the middle inject one (CVE-2021-23214). Declined
    ('N'), the client goes on in clear by its own choice."""
    reader = core(tls=tls)
    reader.receive_data(SSL + STARTUP)
    if tls:
        with pytest.raises(pg.ProtocolViolation, match="unencrypted data after SSL request"):
            reader.next_event()
    else:
        assert reader.next_event() == EncryptionRequest(b"N")
        assert isinstance(reader.next_event(), StartupMessage)


@pytest.mark.parametrize("stream", [SESSION, GSSENC + CANCEL, SSL + STARTUP])
def test_byte_by_byte_gives_the_same_events_as_whole(stream: bytes) -> None:
    assert events([bytes([b]) for b in stream]) == events([stream])


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_random_split_points_give_the_same_events(cuts: list[int]) -> None:
    assert events(split(SESSION, cuts)) == events([SESSION])


def test_a_cancel_request_ends_the_stream() -> None:
    reader = core()
    reader.receive_data(CANCEL + m("Q", cstr("select 1")))
    assert reader.next_event() == CancelRequest(4242, 99)
    assert reader.phase is Phase.CLOSED
    reader.receive_data(b"anything at all")
    assert reader.next_event() is None


def test_startup_parameters_stop_at_the_terminator_and_tolerate_bad_utf8() -> None:
    packet = untyped(pg.PROTOCOL_3_0, cstr("user") + b"al\xffce\0" + b"\0" + cstr("late") + b"x\0")
    reader = core()
    reader.receive_data(packet)
    event = reader.next_event()
    assert isinstance(event, StartupMessage)
    assert event.parameters == {"user": "al\ufffdce"}


@pytest.mark.parametrize(
    ("packet", "why"),
    [
        (untyped(pg.CANCEL_REQUEST_CODE, struct.pack("!I", 1)), "short CancelRequest"),
        (startup(2 << 16, user="alice"), r"unsupported protocol version 2\.0"),
        (untyped(1234 << 16 | 5000), r"unsupported protocol version 1234\.5000"),
        (struct.pack("!I", 4) + b"\0" * 8, "invalid startup packet length 4"),
        (struct.pack("!I", 20_000) + b"\0" * 8, "invalid startup packet length 20000"),
    ],
)
def test_malformed_startup_packets_raise_protocol_violation(packet: bytes, why: str) -> None:
    reader = core()
    with pytest.raises(pg.ProtocolViolation, match=why):
        reader.receive_data(packet)
        reader.next_event()


def test_malformed_messages_raise_protocol_violation() -> None:
    reader = core(max_message=100)
    reader.receive_data(STARTUP)
    assert isinstance(reader.next_event(), StartupMessage)
    with pytest.raises(pg.ProtocolViolation, match="limit 100"):
        reader.receive_data(b"Q" + struct.pack("!I", 1000))


@given(st.binary(max_size=400), st.booleans())
@settings(max_examples=500)
def test_fuzz_raises_only_protocol_violation(data: bytes, started: bool) -> None:
    reader = core(max_message=1 << 16)
    try:
        reader.receive_data((STARTUP if started else b"") + data)
        while reader.next_event() is not None:
            pass
    except pg.ProtocolViolation:
        pass


# -- batches -------------------------------------------------------------------------------

Q, P, B, D, E, S, H, F = (ord(c) for c in "QPBDESHF")


def joined(reader: FrontendCore[Batch], kinds: str) -> list[Batch | None]:
    return [reader.join(ord(k)) for k in kinds]


def test_a_query_is_a_batch_of_its_own() -> None:
    reader = core()
    first, second = joined(reader, "QQ")
    assert first is not None and second is not None and first is not second
    assert first.complete and first.ready and first.syncs == 1 and reader.open is None


def test_extended_messages_are_one_batch_up_to_their_sync() -> None:
    reader = core()
    batches = joined(reader, "PBDES")
    assert len({id(b) for b in batches}) == 1
    batch = batches[0]
    assert batch is not None and batch.complete and batch.syncs == 1
    assert reader.open is None
    assert joined(reader, "P")[0] is not batch  # the next message opens a new one


def test_a_flush_makes_the_batch_ready_but_not_complete() -> None:
    reader = core()
    batch, flushed = joined(reader, "PH")
    assert batch is flushed and batch is not None
    assert batch.ready and not batch.complete and reader.open is batch


def test_a_query_before_the_sync_joins_the_batch_it_interrupts() -> None:
    reader = core()
    batch, query = joined(reader, "PQ")
    assert batch is query and batch is not None and batch.complete


def test_an_execute_after_a_batch_went_through_unadmitted_starts_a_new_one() -> None:
    reader = core()
    batch, _ = joined(reader, "PH")
    assert batch is not None
    batch.forwarded = True  # decided: nothing to execute, it went on with no job
    execute = reader.join(E)
    assert execute is not batch and batch.complete and reader.open is execute
    # one that went through with a job takes the Execute
    assert execute is not None
    execute.forwarded, execute.job = True, 7
    assert reader.join(E) is execute


def test_a_failed_batch_skips_up_to_its_sync() -> None:
    reader = core()
    batch, _ = joined(reader, "PE")
    assert batch is not None
    reader.fail(batch)
    assert reader.discarding and reader.open is None
    assert joined(reader, "BEQHS") == [None] * 5
    assert not reader.discarding
    assert joined(reader, "Q")[0] is not None


def test_a_complete_failed_batch_skips_nothing() -> None:
    reader = core()
    batch = reader.join(Q)
    assert batch is not None
    reader.fail(batch)
    assert not reader.discarding and reader.join(Q) is not None


def test_jobs_draw_ids_classify_and_bypass() -> None:
    classes = {"set x = 1": QueryClass("fp:set", "set", control=True)}
    reader = FrontendCore(
        Batch,
        job_ids=itertools.count(41),
        classify=lambda sql: classes.get(sql, QueryClass("fp:select", "select")),
    )
    plain, control, in_block = Batch(), Batch(), Batch()
    assert reader.new_job(plain, "select 1", b"I")[::2] == (41, False)
    assert reader.new_job(control, "set x = 1", b"I")[::2] == (42, True)
    assert reader.new_job(in_block, "select 1", b"T")[::2] == (43, True)
    assert plain.job == 41 and plain.query_class == QueryClass("fp:select", "select")
