"""The server side of protocol v3 as every front end reads it: a client's bytes in, events out.

Theory of operation
-------------------
Two front ends answer PostgreSQL clients: ``ProxySession`` (proxy.wire.session) relays them to
a real PostgreSQL, the embedded server (proxy.backends.embedded) answers them itself on DuckDB.
Both read a client the same way, and ``FrontendCore`` is that reading, with no sockets, no
asyncio and no clock: the front end hands it bytes and gets events back, like h11's
``Connection`` or asyncpg's ``CoreProtocol``.

**Startup.** ``receive_data(bytes)`` buffers the client's bytes; ``next_event()`` returns the
next event, or None when more bytes are needed. A connection opens with untyped packets
(phase STARTUP), read one at a time because the answer to each decides how the next is read:

  ==================  ====================================  ===========
  packet              event                                 next phase
  ==================  ====================================  ===========
  SSLRequest          ``EncryptionRequest(b"S" or b"N")``   STARTUP
  GSSENCRequest       ``EncryptionRequest(b"N")``           STARTUP
  CancelRequest       ``CancelRequest(pid, secret)``        CLOSED
  StartupMessage 3.x  ``StartupMessage(raw, parameters)``   MESSAGES
  ==================  ====================================  ===========

(``PHASE_AFTER`` is this table.) An SSLRequest is answered 'S' when the front end can do TLS
(the front end writes the answer and starts TLS), 'N' otherwise; GSSAPI encryption is always
declined; bytes that came after an SSLRequest answered 'S' and before the handshake are a
protocol violation (they were never encrypted). A CancelRequest comes on a connection of its
own and nothing else follows it. In MESSAGES every typed message is an event of its own, a
``Frame`` (type and raw bytes, to forward untouched or to answer). Malformed input — a length
out of range, a short CancelRequest, a protocol version other than 3, a message type no client
sends (PostgreSQL ends the session for one too) — raises ``ProtocolViolation`` and nothing
else; the front end answers FATAL 08P01 and closes. A relay may take messages of any type
instead (``reject_unknown_types=False``) and leave them to its server, which answers them
after everything before them. Feeding a
stream whole, byte by byte or cut anywhere gives the same events.

**Batches.** Admission works on *batches*: a simple Query is one; extended-protocol messages up
to and including their Sync are one. A front end calls ``join(kind)`` for each message when it
acts on it and gets the batch the message belongs to (``Batch``, or the front end's subclass of
it): the open batch, or a new one after a boundary. A Query or a Sync completes the open batch
(a Query that arrives before a Sync joins the batch it interrupts); a Flush makes it *ready*
(the client now waits for answers, so an admission decision cannot wait for the Sync). A batch
that went on without admission (``forwarded`` with no job: it had nothing to execute when it
was decided) takes no Execute, FunctionCall or Query: one starts a new batch instead.

A batch that executes becomes one admission job: ``new_job`` draws its id from the gate's
counter, classifies it by its SQL, and says whether it bypasses the queue (a session-control
statement, or anything inside a transaction block). A batch the front end fails before its
Sync (an error, the gate's refusal) makes ``join`` skip the client's messages up to that Sync,
as PostgreSQL does after an error: ``join`` returns None for them, and for the Sync itself,
which the front end answers with ReadyForQuery.

A relay counts the server's ReadyForQuery messages, so it needs batches exactly as PostgreSQL
answers them (``exact_spans=True``): a FunctionCall, like a Query, is answered with a
ReadyForQuery of its own and ends its batch; one that interrupts extended messages not yet
synced joins their batch without ending it — PostgreSQL runs it (with its ReadyForQuery) unless
an earlier message of the batch failed, in which case it skips it with everything up to the
Sync, and only the Sync's ReadyForQuery surely comes. Such a batch is ``mixed``; it is ready
at once (the client waits for the Query's answer).

What differs between the front ends stays with them: the relay holds a batch's messages until
its admission and forwards them; the embedded server runs them one by one and takes admission
at the first that executes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from admission.classify import QueryClass, classify_sql
from proxy.wire import protocol as pg
from proxy.wire.framing import DEFAULT_MAX_MESSAGE, STARTUP, Frame, FrameScanner

__all__ = [
    "PHASE_AFTER",
    "Batch",
    "CancelRequest",
    "EncryptionRequest",
    "Event",
    "Frame",
    "FrontendCore",
    "Phase",
    "StartupMessage",
]

_KEY = struct.Struct("!II")


class Phase(Enum):
    STARTUP = "startup"  # untyped packets: negotiation, cancel, the startup message
    MESSAGES = "messages"  # typed messages
    CLOSED = "closed"  # a CancelRequest was the whole connection


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncryptionRequest:
    """An SSLRequest or a GSSENCRequest: write ``answer`` to the client; after b"S" start TLS,
    after b"N" the client goes on in clear. Another startup-phase packet follows either way."""

    answer: bytes

    @property
    def start_tls(self) -> bool:
        return self.answer == b"S"


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Cancel the statement of the session that was given this backend key."""

    pid: int
    secret: int


@dataclass(frozen=True, slots=True)
class StartupMessage:
    """The client's startup packet: ``raw`` as it came (a relay forwards it untouched) and its
    parameters (user, database, application_name …)."""

    raw: bytes
    parameters: dict[str, str]


Event = EncryptionRequest | CancelRequest | StartupMessage | Frame

# The startup phase's transitions: the phase each startup-phase event leads to.
PHASE_AFTER: dict[type[EncryptionRequest | CancelRequest | StartupMessage], Phase] = {
    EncryptionRequest: Phase.STARTUP,
    CancelRequest: Phase.CLOSED,
    StartupMessage: Phase.MESSAGES,
}


# -- batches ---------------------------------------------------------------------------------


class Batch:
    """Client messages that form one unit of admission (see the module docstring). The front
    end sets ``sql`` and ``executes`` when it sees what the batch executes; ``join`` keeps the
    boundaries (``ready``, ``complete``, ``syncs``), ``new_job`` the job."""

    __slots__ = (
        "complete",
        "executes",
        "forwarded",
        "job",
        "mixed",
        "query_class",
        "ready",
        "sql",
        "syncs",
    )

    def __init__(self, ready: bool = False, syncs: int = 0) -> None:
        self.sql: str | None = None  # what decides the class: the first executed statement
        self.executes = False
        self.ready = ready  # Sync, Query or Flush seen: the admission decision can be made
        self.complete = ready and syncs > 0  # its last Sync (or the Query) seen
        self.syncs = syncs  # Sync/Query messages in the batch
        self.forwarded = False  # its messages went on (to the database)
        self.mixed = False  # a Query or FunctionCall inside its extended messages (exact_spans)
        self.job: int | None = None
        self.query_class: QueryClass | None = None


B = TypeVar("B", bound=Batch)


class FrontendCore(Generic[B]):
    """One client's byte stream as a front end reads it (see the module docstring)."""

    __slots__ = (
        "_batch",
        "_frames",
        "_reject_unknown",
        "_scanner",
        "_taken",
        "buffer",
        "classify",
        "discarding",
        "exact_spans",
        "job_ids",
        "open",
        "phase",
        "tls_available",
    )

    def __init__(
        self,
        batch: Callable[[], B],
        *,
        tls_available: bool = False,
        max_message: int = DEFAULT_MAX_MESSAGE,
        job_ids: Iterator[int],
        classify: Callable[[str], QueryClass] = classify_sql,
        reject_unknown_types: bool = True,
        exact_spans: bool = False,
    ) -> None:
        self.phase = Phase.STARTUP
        self._reject_unknown = reject_unknown_types
        self.exact_spans = exact_spans
        self.tls_available = tls_available
        self._scanner = FrameScanner(startup=True, max_message=max_message)
        self.buffer = self._scanner.buffer  # bytes of an incomplete message (read-only outside)
        # scanned frames, those before ``_taken`` returned (a list: an idle client's costs 56
        # bytes where a deque's costs 760)
        self._frames: list[Frame] = []
        self._taken = 0
        self._batch = batch
        self.job_ids = job_ids  # the admission gate's (``AdmissionGate.job_ids``)
        self.classify = classify
        self.open: B | None = None  # the batch still receiving messages
        self.discarding = False  # skipping the client's messages up to a Sync

    # -- the byte stream -------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Take the client's bytes (a CancelRequest's connection reads nothing more)."""
        if self.phase is not Phase.CLOSED:
            self._frames += self._scanner.feed(data)

    def next_event(self) -> Event | None:
        """The next event, or None until more bytes come."""
        frames = self._frames
        if self._taken == len(frames):
            if frames:
                frames.clear()
                self._taken = 0
            if self.phase is Phase.CLOSED or not self.buffer:
                return None
            # a startup-phase packet stops the scanner until its answer says what comes next
            frames += self._scanner.feed(b"")
            if not frames:
                return None
        frame = frames[self._taken]
        self._taken += 1
        if frame.type != STARTUP:
            if self._reject_unknown and frame.type not in pg.FRONTEND_TYPES:
                raise pg.ProtocolViolation(f"invalid frontend message type {frame.type}")
            return frame
        event = self._startup(frame.raw, frame.body)
        early = len(frames) > self._taken or self.buffer
        if isinstance(event, EncryptionRequest) and event.start_tls and early:
            # Bytes sent after an SSLRequest but before the handshake were never encrypted:
            # taking them as the startup would let a man in the middle inject one
            # (PostgreSQL refuses them too, since CVE-2021-23214).
            raise pg.ProtocolViolation("received unencrypted data after SSL request")
        self.phase = PHASE_AFTER[type(event)]
        if self.phase is Phase.STARTUP:
            self._scanner.expect_startup()
        return event

    def _startup(
        self, raw: bytes, body: bytes
    ) -> EncryptionRequest | CancelRequest | StartupMessage:
        code = pg.int32(body)
        if code == pg.SSL_REQUEST_CODE:
            return EncryptionRequest(b"S" if self.tls_available else b"N")
        if code == pg.GSSENC_REQUEST_CODE:
            return EncryptionRequest(b"N")
        if code == pg.CANCEL_REQUEST_CODE:
            if len(body) < 12:
                raise pg.ProtocolViolation("short CancelRequest")
            pid, secret = _KEY.unpack_from(body, 4)
            return CancelRequest(pid, secret)
        if code >> 16 == 3:
            return StartupMessage(raw, _startup_parameters(body[4:]))
        raise pg.ProtocolViolation(
            f"unsupported protocol version {code >> 16}.{code & 0xFFFF} (this proxy speaks 3.x)"
        )

    # -- batches ---------------------------------------------------------------------------

    def join(self, kind: int) -> B | None:
        """The batch the client's message of type ``kind`` belongs to; None while skipping to
        the Sync of a failed batch (that Sync included)."""
        if self.discarding:
            if kind == pg.SYNC:
                self.discarding = False
            return None
        batch = self.open
        fresh = batch is None
        if batch is None:
            batch = self.open = self._batch()
        elif (
            (kind == pg.EXECUTE or kind == pg.FUNCTION_CALL or kind == pg.QUERY)
            and batch.forwarded
            and batch.job is None
        ):
            batch.complete = True  # went through unadmitted: what executes starts anew
            batch = self.open = self._batch()
            fresh = True
        if kind == pg.SYNC or kind == pg.QUERY or (kind == pg.FUNCTION_CALL and self.exact_spans):
            if self.exact_spans and kind != pg.SYNC and not fresh:
                batch.mixed = batch.ready = True  # joins the extended messages before it
                return batch
            batch.syncs += 1
            batch.ready = batch.complete = True
            self.open = None
        elif kind == pg.FLUSH:
            batch.ready = True
        return batch

    def fail(self, batch: B) -> None:
        """The front end failed ``batch``: if its Sync is still to come, skip to it."""
        if not batch.complete:
            self.discarding = True
            if self.open is batch:
                self.open = None

    def new_job(
        self, batch: B, sql: str, transaction_status: bytes
    ) -> tuple[int, QueryClass, bool]:
        """Make ``batch`` an admission job: its id, its class (from ``sql``) and whether it
        bypasses the queue (session control, or inside a transaction block: queueing a
        transaction's statements would hold its locks behind other clients' work)."""
        job = batch.job = next(self.job_ids)
        query_class = batch.query_class = self.classify(sql)
        return job, query_class, query_class.control or transaction_status != b"I"


def _startup_parameters(body: bytes) -> dict[str, str]:
    parts = body.split(b"\0")
    params: dict[str, str] = {}
    for i in range(0, len(parts) - 1, 2):
        if not parts[i]:
            break
        params[parts[i].decode("utf-8", "replace")] = parts[i + 1].decode("utf-8", "replace")
    return params
