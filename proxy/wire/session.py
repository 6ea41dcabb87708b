"""One client connection through the proxy, as a pure state machine (no sockets, no asyncio).

Theory of operation
-------------------
Input: ``client_data(bytes)``, ``server_data(bytes)``, ``granted(job)``, ``rejected(job, error)``
and ``server_lost()``. Output: a list of ``Action`` values the shell carries out — bytes to send
either way, a backend to connect, a job to submit to or release from the admission scheduler,
a cancel to forward, a connection to close.

States: STARTUP (SSL/GSSENC negotiation, cancel requests, the startup packet) → AUTH (messages
relayed untouched both ways until the server's first ReadyForQuery) → READY → CLOSED. The
client's bytes are read by ``FrontendCore`` (proxy.wire.frontend), which the embedded server
drives too: it answers the startup phase's packets and groups messages into batches; this
module adds what relaying them takes.

In READY the client's messages are grouped into *batches*: a simple Query is one batch; an
extended-protocol sequence is one batch up to and including its Sync. A batch containing an
Execute (or a Query) is one admission job whose class comes from its SQL text (for Execute: the
text its portal's statement was parsed from). A batch with no Execute (Parse, Describe, Close)
carries no work and is forwarded without admission. A Flush forces the decision before the
Sync: the batch waits for admission (if it executes) and, once forwarded, the rest of it up to
the Sync streams straight through. An Execute arriving after a batch went through unadmitted
starts a new batch.

Batches are submitted in order, one at a time: batch k+1 waits until batch k is forwarded, so
the server sees exactly the client's byte order. A job is released when the ReadyForQuery of
its last Sync (or Query) arrives, or when either side goes away.

Statements inside a transaction block (the last ReadyForQuery said 'T' or 'E') and session
control statements are submitted with ``bypass``: admitted at once, counted against capacity.

The usual cycle — an idle connection, one read holding exactly one executing batch, admitted
at once, its reply ending in the ReadyForQuery that closes it — has a fast path
(``fast_client``, ``fast_sent``/``fast_wait``, ``fast_server``) that keeps four fields instead of
a batch and makes no actions: the shell calls the gate and writes the bytes itself. Any other event
first turns those fields into the batch the general path would hold, then goes the general
way. ``fast_client`` and ``fast_server`` also exist in C (proxy/wire/_speedups.c, used when
built); a property test holds the general path, these methods and the C functions to the same
bytes and the same scheduler state.

**Messages the server judges.** A Terminate, or a message of a type no client may send now (no
frontend type, a password message after authentication), goes to the server in order — after
every batch before it, held or queued — and, like a Flush, makes the open batch ready (the
client may now wait for the server to close). PostgreSQL answers what came before, then closes
(after a FATAL for a bad type) — or, in the middle of a COPY FROM STDIN, fails the COPY and goes
on — and the client hears exactly what PostgreSQL says, in PostgreSQL's order. A malformed
Parse, Bind, Close or Execute is forwarded too (its names are not noted): PostgreSQL answers it
with an error and goes on. The proxy answers for the server only what it cannot forward: a
stream it cannot frame (a length out of range: FATAL 08P01 at once). When the server closes
after a FATAL of its own, or after the client's Terminate, the client hears nothing more from
the proxy.

When the proxy itself fails a batch (queue timeout, cancel while queued, queue full) the client
gets an ErrorResponse and one ReadyForQuery per Sync/Query of that batch, placed in the reply
stream after the replies to every earlier batch. A batch failed before its Sync arrived makes the
session discard the client's messages up to that Sync, as PostgreSQL itself does after an error.
"""

from __future__ import annotations

import itertools
import re
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from admission.classify import QueryClass, classify_sql
from admission.native import native
from proxy.wire import protocol as pg
from proxy.wire.framing import DEFAULT_MAX_MESSAGE, Frame
from proxy.wire.frontend import (
    Batch,
    CancelRequest,
    EncryptionRequest,
    Event,
    FrontendCore,
    StartupMessage,
)

__all__ = [
    "Action",
    "Close",
    "ConnectServer",
    "ForwardCancel",
    "ProxySession",
    "Release",
    "SendToClient",
    "SendToServer",
    "StartTLS",
    "Submit",
]

_TYPED = struct.Struct("!BI")


class State(Enum):
    STARTUP = "startup"
    AUTH = "auth"
    READY = "ready"
    CLOSED = "closed"


# -- actions -------------------------------------------------------------------------------
# Plain slotted dataclasses, read-only by convention: several are made for every statement, and
# a frozen dataclass takes four times as long to build.


@dataclass(slots=True)
class SendToClient:
    data: bytes


@dataclass(slots=True)
class SendToServer:
    data: bytes


@dataclass(slots=True)
class ConnectServer:
    """Open the backend connection and send it ``startup`` (the client's packet, untouched)."""

    startup: bytes
    parameters: dict[str, str]


@dataclass(slots=True)
class StartTLS:
    """Answer 'S' to an SSLRequest was sent: upgrade the client transport to TLS now."""


@dataclass(slots=True)
class Submit:
    job: int
    query_class: QueryClass
    bypass: bool
    sql: str


# The fast path's submission, a plain tuple (a dataclass costs a Python call to build):
# (job, query_class, bypass, sql), as in ``Submit``.
FastSubmit = tuple[int, QueryClass, bool, str]


@dataclass(slots=True)
class Release:
    job: int


@dataclass(slots=True)
class ForwardCancel:
    """A CancelRequest arrived on this connection: find the session with this key."""

    pid: int
    secret: int


@dataclass(slots=True)
class Close:
    reason: str


Action = (
    SendToClient
    | SendToServer
    | ConnectServer
    | StartTLS
    | Submit
    | Release
    | ForwardCancel
    | Close
)


# -- batches -------------------------------------------------------------------------------


_PARSE_COMPLETE, _BIND_COMPLETE, _CLOSE_COMPLETE = ord("1"), ord("2"), ord("3")
_ROW_DESCRIPTION, _NO_DATA = ord("T"), ord("n")
_COMMAND_COMPLETE, _EMPTY_QUERY, _PORTAL_SUSPENDED = ord("C"), ord("I"), ord("s")
# A batch with an Execute that has held this many bytes without its Sync or a Flush (a
# pipeline that syncs only at its end) is decided on and streamed through, as after a Flush:
# holding it whole would take the client's memory, and stopping reading would wait forever.
STREAM_AFTER = 256 * 1024
_DESCRIBE_STATEMENT = 0x100  # a Describe of a statement: ParameterDescription before its end
# what ends the answer to each extended message (an ErrorResponse ends any of them)
_ANSWER_ENDS: dict[int, frozenset[int]] = {
    pg.PARSE: frozenset((_PARSE_COMPLETE,)),
    pg.BIND: frozenset((_BIND_COMPLETE,)),
    pg.CLOSE: frozenset((_CLOSE_COMPLETE,)),
    pg.DESCRIBE: frozenset((_ROW_DESCRIPTION, _NO_DATA)),
    _DESCRIBE_STATEMENT: frozenset((_ROW_DESCRIPTION, _NO_DATA)),
    pg.EXECUTE: frozenset((_COMMAND_COMPLETE, _EMPTY_QUERY, _PORTAL_SUSPENDED)),
    pg.QUERY: frozenset((pg.READY_FOR_QUERY,)),
    pg.FUNCTION_CALL: frozenset((pg.READY_FOR_QUERY,)),
    pg.SYNC: frozenset((pg.READY_FOR_QUERY,)),
}


class _Span:
    """The server's answers to a mixed batch (see proxy.wire.frontend), message by message,
    to tell the ReadyForQuery of its Sync from those of the Queries inside it: PostgreSQL
    answers each message in turn until an extended one fails, then skips everything up to the
    Sync. Messages with no answer of their own (Flush, COPY data) are not listed."""

    __slots__ = ("pending", "skipping")

    def __init__(self) -> None:
        self.pending: deque[int] = deque()  # the batch's messages not yet answered, in order
        self.skipping = False

    def add(self, raw: bytes) -> None:
        kind = raw[0]
        if kind == pg.DESCRIBE and raw[5:6] == b"S":
            kind = _DESCRIBE_STATEMENT
        if kind in _ANSWER_ENDS:
            self.pending.append(kind)

    def answer(self, reply: int) -> bool:
        """The server's next message (of type ``reply``): whether it is the ReadyForQuery that
        ends the batch."""
        pending = self.pending
        if self.skipping:
            while pending and pending[0] != pg.SYNC:
                pending.popleft()
        if not pending:
            return reply == pg.READY_FOR_QUERY
        kind = pending[0]
        if reply == pg.ERROR_RESPONSE and kind not in (pg.QUERY, pg.FUNCTION_CALL, pg.SYNC):
            pending.popleft()  # an extended message failed: the server skips to the Sync
            self.skipping = True
            return False
        if reply in _ANSWER_ENDS[kind]:
            pending.popleft()
            return kind == pg.SYNC
        return False


class _Batch(Batch):
    """A batch (see proxy.wire.frontend) and what relaying it takes."""

    __slots__ = ("continues", "held", "held_size", "outstanding", "resets", "span", "submitted")

    def __init__(
        self, held: list[bytes] | None = None, ready: bool = False, syncs: int = 0
    ) -> None:
        super().__init__(ready, syncs)
        self.held = [] if held is None else held  # raw messages not yet forwarded
        self.held_size = 0  # bytes of them added by the client's extended messages
        self.submitted = False
        self.outstanding = 0  # ReadyForQuery still expected from the server
        self.span: _Span | None = None  # a mixed batch's answers, when read message by message
        self.resets = False  # it holds a RESET ALL or DISCARD ALL (see ProxySession.granted)
        # it follows extended messages forwarded with no Sync after them (Parse, Describe,
        # Bind, Flush, then this batch's Execute: asyncpg's way): it runs in their implicit
        # transaction, with their unnamed statement and portal
        self.continues = False


@dataclass(slots=True)
class _Synthetic:
    """Reply bytes the proxy made, to go out after the server's replies to earlier batches,
    and ``ready`` ReadyForQuery after them with the server's transaction status as of then
    (what those earlier batches — a BEGIN, a COMMIT, the proxy's abort — left it at)."""

    data: bytes
    ready: int = 0


class _Swallow:
    """The server's reply to a statement of the proxy's own (a work_mem grant), up to and
    including its ReadyForQuery: cut from what the client hears."""

    __slots__ = ()


_SWALLOW = _Swallow()
# a client statement that sets work_mem (SET [SESSION|LOCAL] work_mem, RESET work_mem,
# set_config('work_mem', …)): the client manages it, and the session's grants stop
_WORK_MEM = re.compile(
    rb"(?:\bset\s+(?:session\s+|local\s+)?|\breset\s+)\"?work_mem\b"
    rb"|set_config\s*\(\s*'work_mem'",
    re.IGNORECASE,
)
# … one that resets every setting: the proxy's last grant is gone with it
_RESET_ALL = re.compile(rb"\b(?:reset|discard)\s+all\b", re.IGNORECASE)
# the proxy's own statement, named so that it never replaces a client's unnamed statement (a
# simple Query would: drivers that Parse an unnamed statement in one Sync and Bind it in the
# next, asyncpg without a statement cache, would lose it)
OWN_STATEMENT = b"_admission_grant"
# the proxy's statement that aborts the server's transaction block when the proxy refuses a
# statement inside it (any error does: without PL/pgSQL, DO fails all the same)
_ABORT = (
    b"DO $admission$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = "
    b"'the admission proxy refused a statement of this transaction: it is aborted'; "
    b"END$admission$"
)
# what the server answers to it, cut from what the client hears: ParseComplete, BindComplete,
# CommandComplete, CloseComplete, ReadyForQuery, an ErrorResponse (not a FATAL one). What else
# comes in that stretch — a notification, a parameter status, a notice — is the client's.
_OWN_REPLIES = frozenset(b"123CZE")


class ProxySession:
    """The per-connection protocol state machine (see the module docstring)."""

    def __init__(
        self,
        *,
        tls_available: bool = False,
        max_message: int = DEFAULT_MAX_MESSAGE,
        classify: Callable[[str], QueryClass] = classify_sql,
        job_ids: Iterator[int] | None = None,
    ) -> None:
        self.state = State.STARTUP
        # where job ids come from: the admission gate's (``AdmissionGate.job_ids``), so ids
        # are unique among everything one gate sees; a session alone counts its own
        self.job_ids = job_ids if job_ids is not None else itertools.count(1)
        self.classify = classify
        self.backend_key: tuple[int, int] | None = None
        self.transaction_status = b"I"
        # the client's stream: startup, messages, batches (the fast path reads its buffer)
        self._client = FrontendCore(
            _Batch,
            tls_available=tls_available,
            max_message=max_message,
            job_ids=self.job_ids,
            classify=classify,
            reject_unknown_types=False,  # the server answers them, in order (_server_judges)
            exact_spans=True,
        )
        self._max_message = max_message
        self._server_buf = bytearray()
        self._server_need = 0  # bytes the buffered message needs before anything goes on
        self._statements: dict[bytes, str] = {}  # prepared statement name → SQL
        self._portals: dict[bytes, str] = {}  # portal name → SQL (of its statement)
        self._queue: deque[_Batch] = deque()  # batches not yet (fully) forwarded, in order
        # what each ReadyForQuery closes
        self._replies: deque[_Batch | _Synthetic | _Swallow] = deque()
        self._jobs: dict[int, _Batch] = {}
        self.fast_path = True  # False: every event takes the general path (for comparison)
        self._fast_job: int | None = None  # the fast path's statement (see fast_client)
        self._fast_data = b""  # its messages, until forwarded
        self._fast_sql = ""
        self.fast_sent = False  # the caller forwarded ``_fast_data`` (see fast_client)
        # the server sent a FATAL error, or the client a Terminate: its close says nothing new
        self._server_ends = False
        # the client set work_mem itself: ``granted`` sends no setting of the proxy's
        self.own_work_mem = False
        # watch the client's statements for settings of work_mem (on while grants are: the
        # look costs a few µs a statement)
        self.watch_settings = False
        self._setting: bytes | None = None  # the proxy's last setting on this session
        self.grants_stopped = False  # the session copied (see client_data): no more settings
        # transaction pooling (proxy.pool): every batch is an admission job, for the server
        # connection it needs, not only those that execute
        self.admit_all = False
        # transaction pooling: the key the client is given in place of the server's (its
        # server connection changes; a CancelRequest names the client, the proxy finds it)
        self.key_override: tuple[int, int] | None = None

    # -- queries ---------------------------------------------------------------------------

    @property
    def active_jobs(self) -> list[int]:
        """Jobs submitted and not yet released (for cleanup when a side goes away)."""
        self._leave_fast()
        return list(self._jobs)

    @property
    def statement_running(self) -> bool:
        """Whether a statement was forwarded and its reply is not complete yet."""
        self._leave_fast()
        return any(batch.forwarded for batch in self._jobs.values())

    @property
    def server_idle(self) -> bool:
        """Whether the server owes the session nothing and holds nothing of it: outside a
        transaction block, no reply outstanding, no batch partly forwarded (extended messages
        sent without their Sync). A pooled server connection may then go to another client."""
        if self.transaction_status != b"I" or self._replies:
            return False
        if self._fast_job is not None and self.fast_sent:
            return False
        return not any(batch.forwarded for batch in self._queue)

    @property
    def replies_pending(self) -> bool:
        """Whether the server still owes replies to what was forwarded (cheap: the fast path's
        fields are read, not turned into a batch)."""
        return bool(self._replies) or (self._fast_job is not None and self.fast_sent)

    def job_is_queued(self, job: int) -> bool:
        self._leave_fast()
        batch = self._jobs.get(job)
        return batch is not None and not batch.forwarded

    # -- client → proxy --------------------------------------------------------------------

    def client_data(self, data: bytes) -> list[Action]:
        self._leave_fast()
        actions: list[Action] = []
        client = self._client
        try:
            client.receive_data(data)
            while (event := client.next_event()) is not None:
                self._client_event(event, actions)
                if self.state is State.CLOSED:
                    return actions
        except pg.ProtocolViolation as e:
            actions.extend(self._violation(str(e)))
        return actions

    # -- the fast path (see the module docstring) -------------------------------------------

    def fast_client(self, data: bytes) -> FastSubmit | None:
        """If ``data`` starts the usual cycle, the job to submit, as ``(job, query_class,
        bypass, sql)``; else None (state untouched: call ``client_data``). The caller either
        forwards ``data`` and sets ``fast_sent = True`` (admitted at once, or certain to be:
        the gate's lane) or, when the gate says the job must wait, calls ``fast_wait()`` (the
        job waits, or was answered through ``granted`` or ``rejected``, and the general path
        takes over)."""
        if (
            self._fast_job is not None
            or self.state is not State.READY
            or self._jobs
            or self._queue
            or self._replies
            or self._client.discarding
            or self._client.buffer
            or not self.fast_path
        ):
            return None
        end = len(data)
        pos = 0
        parse_at = bind_at = execute_at = -1  # where the one of each starts
        parse_end = bind_end = execute_end = 0
        unpack = _TYPED.unpack_from
        while True:
            if end - pos < 5:
                return None
            kind, length = unpack(data, pos)
            nxt = pos + 1 + length
            if length < 4 or nxt > end or length > self._max_message:
                return None
            if kind == pg.SYNC or kind == pg.QUERY:
                if nxt != end or (kind == pg.QUERY and pos != 0):
                    return None
                break
            if kind == pg.EXECUTE:
                if execute_at < 0:  # later Executes of the same portal change nothing
                    execute_at, execute_end = pos, nxt
            elif kind == pg.BIND:
                if bind_at >= 0 or execute_at >= 0:
                    return None
                bind_at, bind_end = pos, nxt
            elif kind == pg.PARSE:
                if parse_at >= 0 or bind_at >= 0 or execute_at >= 0:
                    return None
                parse_at, parse_end = pos, nxt
            elif kind != pg.DESCRIBE:
                return None  # Close, Flush, COPY, a function call, Terminate …
            pos = nxt
        if kind == pg.QUERY:
            if data[end - 1] != 0:
                return None
            sql = data[5 : end - 1].decode("utf-8", "replace")
        elif execute_at < 0:
            return None  # nothing to admit (Parse/Describe only)
        else:
            # noting a name twice is harmless if the general path has to do it again; a
            # malformed message goes the general way, forwarded for the server to answer
            if parse_at >= 0 and not self._track_names(pg.PARSE, data, parse_at + 5, parse_end):
                return None
            if bind_at >= 0 and not self._track_names(pg.BIND, data, bind_at + 5, bind_end):
                return None
            portal = _portal(data, execute_at, execute_end)
            if portal is None:
                return None
            sql = self._portal_sql(portal)
        query_class = self.classify(sql)
        job = next(self.job_ids)
        self._fast_job = job
        self._fast_data = data
        self._fast_sql = sql
        self.fast_sent = False
        return job, query_class, query_class.control or self.transaction_status != b"I", sql

    @property
    def in_flight(self) -> bool:
        """Whether a statement of this client waits for admission or runs: its end (or its
        admission) is a state change, after which the caller looks at the client again."""
        return self._fast_job is not None or bool(self._jobs)

    @property
    def held_bytes(self) -> int:
        """The bytes the caller may stop reading the client for (it sends faster than it is
        admitted or served); a state change — an admission, a statement's end — comes
        without reading it, and the caller looks again then.

        While a statement of the client runs: the batches held behind it. Not the message
        still arriving: the running statement may need it (a pipeline streaming to its Sync,
        the data of a COPY), and others may wait for that statement's end. While statements
        only wait for admission: those batches and the message still arriving. 0 while none
        is in flight: the message still arriving must then be read whole for anything to
        happen (it is bounded by the message size cap)."""
        job = self._fast_job
        if job is None and not self._jobs:
            return 0
        held = self._unforwarded()
        running = (job is not None and self.fast_sent) or any(
            batch.forwarded for batch in self._jobs.values()
        )
        return held if running else held + len(self._client.buffer)

    @property
    def buffered_bytes(self) -> int:
        """Client bytes taken and not yet forwarded: batches waiting for admission or behind
        a running statement, and the part of a message still arriving."""
        return self._unforwarded() + len(self._client.buffer)

    @property
    def arriving_bytes(self) -> int:
        """The bytes of the client's message still arriving (an incomplete one)."""
        return len(self._client.buffer)

    def _unforwarded(self) -> int:
        held = 0
        if self._fast_job is not None and not self.fast_sent:
            held += len(self._fast_data)
        for batch in self._queue:
            if not batch.forwarded:
                held += sum(len(raw) for raw in batch.held)
        return held

    def fast_wait(self) -> None:
        """``fast_client``'s job was not admitted at once: the general path takes over."""
        self._leave_fast()

    def fast_granted(self, job: int) -> bytes | None:
        """The gate admitted ``job``, ``fast_client``'s statement, which the caller let wait
        without ``fast_wait`` and nothing has touched since (any other event turns it into a
        queued batch first): the bytes to forward now — the caller writes them, and the reply
        takes the fast path. None: not that case (call ``granted``)."""
        if self._fast_job != job or self.fast_sent:
            return None
        self.fast_sent = True
        return self._fast_data

    def fast_server(self, data: bytes) -> int | None:
        """During the usual cycle: the job the server's ``data`` ends (to release), 0 if the
        reply is not over yet; the caller relays ``data`` untouched either way. None: not
        the usual case (state untouched: call ``server_data``)."""
        job = self._fast_job
        if job is None or not self.fast_sent or self._server_buf:
            return None
        end = len(data)
        pos = 0
        unpack = _TYPED.unpack_from
        while end - pos >= 5:
            kind, length = unpack(data, pos)
            nxt = pos + 1 + length
            if length < 4 or nxt > end or kind == pg.BACKEND_KEY_DATA:
                return None
            if kind == pg.ERROR_RESPONSE:
                return None  # the general path notes whether it is FATAL
            if kind == pg.READY_FOR_QUERY:
                if nxt != end:
                    return None
                self.transaction_status = data[pos + 5 : pos + 6]
                self._fast_job = None
                self._fast_data = b""
                return job
            pos = nxt
        return 0 if pos == end else None

    def _leave_fast(self) -> None:
        """Turn the fast path's fields into the batch the general path would hold now."""
        job = self._fast_job
        if job is None:
            return
        self._fast_job = None
        batch = _Batch([] if self.fast_sent else [self._fast_data], True, 1)
        batch.sql = self._fast_sql
        batch.executes = batch.submitted = True
        batch.job = job
        self._jobs[job] = batch
        if self.fast_sent:
            batch.forwarded = True
            batch.outstanding = 1
            self._replies.append(batch)
        else:
            self._queue.append(batch)
        self._fast_data = b""

    def _violation(self, why: str) -> list[Action]:
        self.state = State.CLOSED
        error = pg.error_response(
            pg.SQLSTATE_PROTOCOL_VIOLATION, f"protocol violation: {why}", severity="FATAL"
        )
        return [SendToClient(error), *self._release_all(), Close(f"protocol violation: {why}")]

    def _client_event(self, event: Event, out: list[Action]) -> None:
        if isinstance(event, Frame):
            if self.state is State.AUTH:
                self._auth_frame(event, out)
            elif self.state is State.READY:
                self._ready_frame(event, out)
        elif isinstance(event, StartupMessage):
            if "user" not in event.parameters:
                raise pg.ProtocolViolation("the startup packet names no user")
            self.state = State.AUTH
            out.append(ConnectServer(event.raw, event.parameters))
        elif isinstance(event, EncryptionRequest):
            out.append(SendToClient(event.answer))
            if event.start_tls:
                out.append(StartTLS())
        elif isinstance(event, CancelRequest):
            self.state = State.CLOSED
            out.extend((ForwardCancel(event.pid, event.secret), Close("cancel request handled")))

    def _auth_frame(self, frame: Frame, out: list[Action]) -> None:
        if frame.type == pg.TERMINATE:
            self.state = State.CLOSED
            out.append(Close("client terminated during authentication"))
        elif frame.type != pg.PASSWORD:
            raise pg.ProtocolViolation(f"unexpected message {frame.name!r} during authentication")
        else:
            out.append(SendToServer(frame.raw))

    def _ready_frame(self, frame: Frame, out: list[Action]) -> None:
        kind = frame.type
        if kind == pg.TERMINATE or kind not in pg.FRONTEND_TYPES or kind == pg.PASSWORD:
            self._server_judges(frame.raw, out)
            if kind == pg.TERMINATE:
                self._server_ends = True
            return
        if kind in (pg.COPY_DATA, pg.COPY_DONE, pg.COPY_FAIL):
            # part of a COPY: it follows its statement, held with it while that one waits
            # (a session that copies gets no more grants: an extended-protocol COPY's Syncs
            # are not each answered, which the reply count does not follow)
            self.grants_stopped = True
            if self._queue and not self._queue[-1].forwarded:
                self._queue[-1].held.append(frame.raw)
            else:
                out.append(SendToServer(frame.raw))
            return
        if kind == pg.FLUSH and self.admit_all and self._client.open is None:
            # (pooled: a Flush outside any batch asks nothing of a server the client may not
            # hold; it goes along, after what is queued before it, and starts no batch)
            if not self._client.discarding:
                if self._queue and not self._queue[-1].forwarded:
                    self._queue[-1].held.append(frame.raw)
                else:
                    out.append(SendToServer(frame.raw))
            return
        batch = self._join(kind)
        if batch is None:  # skipped up to the Sync of a batch the proxy failed
            if kind == pg.SYNC:
                self._reply_synthetic(b"", out, ready=1)
            return
        if kind == pg.PARSE or kind == pg.BIND or kind == pg.CLOSE:
            self._track_names(kind, frame.raw, 5, len(frame.raw))
        if self.watch_settings and (kind == pg.QUERY or kind == pg.PARSE):
            if _WORK_MEM.search(frame.raw):
                self.own_work_mem = True
            elif _RESET_ALL.search(frame.raw):
                if batch.forwarded:
                    self._setting = None
                else:
                    batch.resets = True  # (the proxy's setting is gone once it ran)
        if batch.mixed and batch.span is None and not batch.forwarded:
            # Read its answers message by message. (One that streams already, after a
            # Flush, is not: its Queries' ReadyForQuery are relayed without being counted,
            # so at worst it is released at one of them rather than at its Sync.)
            batch.span = _Span()
            for raw in batch.held:
                batch.span.add(raw)
        if batch.span is not None:
            batch.span.add(frame.raw)
        self._add(batch, frame.raw, out)
        if kind == pg.QUERY:
            if batch.sql is None:
                batch.sql = frame.body[:-1].decode("utf-8", "replace")
            batch.executes = True
        elif (kind == pg.EXECUTE or kind == pg.FUNCTION_CALL) and not batch.executes:
            batch.executes = True
            if batch.sql is None:
                raw = frame.raw
                portal = _portal(raw, 0, len(raw)) if kind == pg.EXECUTE else None
                # a function call, or an Execute the server will refuse (no portal name)
                batch.sql = "fastpath" if portal is None else self._portal_sql(portal)
        elif kind == pg.SYNC and batch.forwarded and batch.span is None:
            batch.outstanding += 1  # (a mixed batch expects its Sync's from its forwarding on)
            self._replies.append(batch)
        if not batch.ready and batch.executes and batch.held_size > STREAM_AFTER:
            batch.ready = True  # a long pipeline without a Sync: decide now, then stream it
        self._pump(out)

    def _server_judges(self, raw: bytes, out: list[Action]) -> None:
        """A Terminate, or a message of a type no client may send now: to the server after
        everything before it (see the module docstring)."""
        queue = self._queue
        if queue and not queue[-1].forwarded:
            tail = queue[-1]
            tail.held.append(raw)
            tail.ready = True  # as after a Flush: the client may wait for the server now
            self._pump(out)
        else:
            out.append(SendToServer(raw))

    def _join(self, kind: int) -> _Batch | None:
        """The batch of a client message (see ``FrontendCore.join``), queued when new."""
        client = self._client
        tail = client.open
        batch = client.join(kind)
        if batch is not None and batch is not tail:
            if tail is not None:  # it went through unadmitted and took no Execute
                self._queue_done(tail)
                batch.continues = True
            self._queue.append(batch)
        return batch

    def _add(self, batch: _Batch, raw: bytes, out: list[Action]) -> None:
        if batch.forwarded:
            out.append(SendToServer(raw))
        else:
            batch.held.append(raw)
            batch.held_size += len(raw)

    def _track_names(self, kind: int, data: bytes, start: int, end: int) -> bool:
        """Note the names a Parse, Bind or Close (whose body is ``data[start:end]``) sets;
        False if it is malformed. A malformed one sets none: the server refuses it (an error,
        not the end of the session) and it changes nothing there either."""
        if kind == pg.CLOSE:
            stop = data.find(0, start + 1, end) if start < end else -1
            if stop < 0:
                return False
            names = self._statements if data[start] == ord("S") else self._portals
            names.pop(data[start + 1 : stop], None)
            return True
        # Parse: statement name, SQL; Bind: portal name, statement name
        first = data.find(0, start, end)
        second = data.find(0, first + 1, end) if first >= 0 else -1
        if second < 0:
            return False
        name = data[start:first]
        if kind == pg.PARSE:
            self._statements[name] = data[first + 1 : second].decode("utf-8", "replace")
        else:
            statement = data[first + 1 : second]
            sql = self._statements.get(statement)
            # A statement the proxy saw no Parse for (SQL PREPARE, or closed): it runs what
            # SQL EXECUTE would, and is admitted as such — never as empty control text.
            self._portals[name] = sql if sql is not None else f"EXECUTE {_quoted(statement)}"
        return True

    def _portal_sql(self, portal: bytes) -> str:
        """The SQL an Execute of ``portal`` runs; a portal the proxy saw no Bind for (a cursor
        from SQL DECLARE) fetches from it, and is admitted as a FETCH."""
        sql = self._portals.get(portal)
        return sql if sql is not None else f"FETCH ALL FROM {_quoted(portal)}"

    # -- admission -------------------------------------------------------------------------

    def _pump(self, out: list[Action]) -> None:
        """Forward or submit batches from the head of the queue, in order."""
        while self._queue:
            batch = self._queue[0]
            if not batch.ready:
                return
            if (batch.executes or self.admit_all) and batch.job is None:
                if self.admit_all and self._replies:
                    # pooled: whether it is inside a transaction (its own connection, no
                    # queue) or not (a connection from the pool's queue) is known once the
                    # server has answered what went before it (a BEGIN among them, say):
                    # queued on a guess, it would wait for the slot its own transaction
                    # holds. ``server_data`` resumes the pump.
                    return
                out.append(self._submit(batch))
                return  # granted() resumes the pump
            if batch.submitted and not batch.forwarded:
                return  # still waiting for its grant
            self._forward(batch, out)
            if not batch.complete:
                return  # streams through until its Sync; later batches wait behind it
            self._queue.popleft()

    def _submit(self, batch: _Batch) -> Submit:
        """Make ``batch`` a job for the scheduler, classified by its SQL."""
        sql = batch.sql or ""
        job, query_class, bypass = self._client.new_job(batch, sql, self.transaction_status)
        batch.submitted = True
        self._jobs[job] = batch
        return Submit(job, query_class, bypass, sql)

    def _forward(self, batch: _Batch, out: list[Action], setting: bytes | None = None) -> None:
        if not batch.forwarded:
            batch.forwarded = True
            if (
                setting is not None
                and setting != self._setting
                and not self._replies
                and self.transaction_status == b"I"
                and not batch.continues
                and not batch.mixed
                and not self.grants_stopped
            ):
                # the proxy's statement goes first, its replies cut from what the client hears
                self._setting = setting
                self._replies.append(_SWALLOW)
                batch.held.insert(0, _own_statement(setting))
            if batch.resets:
                self._setting = None
            if batch.held:
                out.append(SendToServer(b"".join(batch.held)))
                batch.held = []
            # a mixed batch's answers are read from here on, up to its Sync's ReadyForQuery
            expected = batch.syncs or (1 if batch.span is not None else 0)
            batch.outstanding += expected
            self._replies.extend([batch] * expected)
        if batch.complete and batch.outstanding == 0 and batch.job is not None:
            out.append(self._release(batch))

    def _queue_done(self, batch: _Batch) -> None:
        if self._queue and self._queue[0] is batch:
            self._queue.popleft()

    def granted(self, job: int, setting: bytes | None = None) -> list[Action]:
        """The scheduler admitted ``job``: forward its batch (and whatever can follow).

        ``setting``: a statement of the proxy's to run first (``SET work_mem = …``, the
        statement's memory grant), its replies cut from what the client hears; not sent when
        the session already has it (the proxy's last setting, unless a RESET ALL or DISCARD
        ALL came since), nor once the client set work_mem itself (``own_work_mem``). It runs
        as a named statement in a Sync of its own, ahead of the batch, so whatever it does,
        the client's statements, unnamed ones too, are as they were. It is sent only when the
        server owes the session nothing (no reply outstanding, outside a transaction block by
        its last ReadyForQuery): a batch pipelined behind others, one that continues
        extended messages forwarded without a Sync (``continues``: a Sync there would end
        their implicit transaction and portal), a mixed batch, and every batch of a session
        that has copied run with the session's last grant."""
        self._leave_fast()
        out: list[Action] = []
        batch = self._jobs.get(job)
        if batch is None or batch.forwarded or self.state is State.CLOSED:
            if batch is None or self.state is State.CLOSED:
                out.append(Release(job))
            return out
        self._forward(batch, out, None if self.own_work_mem else setting)
        queue = self._queue
        if batch.complete and queue and queue[0] is batch:
            queue.popleft()
        if queue:
            self._pump(out)
        return out

    def rejected(self, job: int, sqlstate: str, text: str) -> list[Action]:
        """The proxy fails a queued job (timeout, cancel, queue full): answer for the server."""
        self._leave_fast()
        out: list[Action] = []
        batch = self._jobs.get(job)
        if batch is None or batch.forwarded:
            return out  # a forwarded job is the server's to answer, and released at its end
        del self._jobs[job]
        if self._queue and self._queue[0] is batch:
            self._queue.popleft()
        error = pg.error_response(sqlstate, text)
        syncs = batch.syncs
        if not batch.complete:
            self._client.fail(batch)  # the rest up to its Sync is dropped; Sync → Z
        status = self.transaction_status
        if self.state is State.READY and status == b"T":
            # an error inside a transaction block aborts it, as PostgreSQL's own would: the
            # server's transaction fails too (its replies cut), so that what the client sends
            # next fails with 25P02 and its COMMIT rolls back — never half a transaction kept.
            # (Pooled, a batch is a job only once what went before it is answered: the status
            # is the server's. In session mode a statement queued behind unanswered ones —
            # pipelined after a BEGIN — is judged by the status before them.)
            self._replies.extend((_SWALLOW, _SWALLOW))  # (two Syncs: see _own_statement)
            out.append(SendToServer(_own_statement(_ABORT, failing=True)))
            self.transaction_status = b"E"  # (until the server says so itself)
        self._reply_synthetic(error, out, ready=syncs)
        self._pump(out)
        return out

    def notice(self, message: str) -> list[Action]:
        """A NOTICE of the proxy's own for the client, after the replies it is still owed
        (never inside one of the server's messages)."""
        out: list[Action] = []
        if self.state is not State.CLOSED:
            notice = pg.error_response("00000", message, severity="NOTICE", kind=b"N")
            self._reply_synthetic(notice, out)
        return out

    def _reply_synthetic(self, data: bytes, out: list[Action], ready: int = 0) -> None:
        if self._replies:
            self._replies.append(_Synthetic(data, ready))
        else:
            out.append(SendToClient(data + pg.ready_for_query(self.transaction_status) * ready))

    def _release(self, batch: _Batch) -> Release:
        job = batch.job
        assert job is not None
        self._jobs.pop(job, None)
        return Release(job)

    def _release_all(self) -> list[Action]:
        out: list[Action] = [Release(job) for job in self._jobs]
        self._jobs.clear()
        return out

    # -- server → proxy --------------------------------------------------------------------

    def server_data(self, data: bytes) -> list[Action]:
        """Forward the server's bytes; note ReadyForQuery, BackendKeyData, the end of auth.

        Complete messages go out as they came (one write, no copy when ``data`` ends on a
        message boundary, the usual case); a message cut by the read waits in a buffer until
        its last byte is here."""
        self._leave_fast()
        if self.state is State.CLOSED:
            return []  # the client is gone or told why: nothing more reaches it
        buf = self._server_buf
        if buf:
            buf += data
            if len(buf) < self._server_need:
                return []
            data = bytes(buf)
            buf.clear()
        out: list[Action] = []
        pieces: list[bytes] | None = None  # only when the proxy inserts or cuts replies
        replies = self._replies
        span = self._head_span()
        swallow = bool(replies) and replies[0] is _SWALLOW  # the proxy's own statement's
        pos = start = 0
        end = len(data)
        need = 5
        unpack = _TYPED.unpack_from
        while end - pos >= 5:
            kind, length = unpack(data, pos)
            if length < 4:
                if pos > start:
                    out.append(SendToClient(data[start:pos]))
                out.extend(self._server_violation(f"server message of length {length}"))
                return out
            nxt = pos + 1 + length
            if nxt > end:
                need = nxt - pos
                break
            if (
                swallow
                and kind in _OWN_REPLIES
                and not (kind == pg.ERROR_RESPONSE and _fatal(data, pos + 5, nxt))
            ):
                if pieces is None:
                    pieces = []
                pieces.append(data[start:pos])  # (a FATAL goes on: the session ends on it)
                start = nxt
                if kind == pg.ERROR_RESPONSE:
                    self._setting = None  # (not set: the next grant tries again)
            if kind == pg.READY_FOR_QUERY:
                self.transaction_status = data[pos + 5 : pos + 6]
                # (inside a mixed batch, only its Sync's ends it)
                if span is None or span.answer(kind):
                    synthetic = self._server_ready(out)
                    span = self._head_span()
                    swallow = bool(replies) and replies[0] is _SWALLOW
                    if synthetic:
                        if pieces is None:
                            pieces = []
                        pieces.append(data[start:nxt])
                        pieces.append(synthetic)
                        start = nxt
            else:
                if span is not None:
                    span.answer(kind)
                if kind == pg.BACKEND_KEY_DATA and length >= 12:
                    self.backend_key = struct.unpack_from("!II", data, pos + 5)
                    if self.key_override is not None:
                        self.backend_key = self.key_override
                        if pieces is None:
                            pieces = []
                        pieces.append(data[start:pos])
                        pieces.append(pg.message(b"K", struct.pack("!II", *self.key_override)))
                        start = nxt
                elif kind == pg.ERROR_RESPONSE and _fatal(data, pos + 5, nxt):
                    self._server_ends = True
            pos = nxt
        if pos < end:
            buf += data[pos:]
            self._server_need = need
        if pieces is not None:
            if pos > start:
                pieces.append(data[start:pos])
            out.insert(0, SendToClient(b"".join(pieces)))
        elif pos > start:
            out.insert(0, SendToClient(data if pos == end else data[:pos]))
        if self.admit_all and self._queue and not self._replies:
            self._pump(out)  # (a batch waiting for the answers before it: see ``_pump``)
        return out

    def _head_span(self) -> _Span | None:
        """The span of the batch the server answers now, if it is read message by message."""
        replies = self._replies
        head = replies[0] if replies else None
        return head.span if isinstance(head, _Batch) else None

    def _server_ready(self, out: list[Action]) -> bytes:
        """A ReadyForQuery: end authentication, or close a batch's reply (releasing its job
        when it was the last). Returns the proxy's own replies that follow it, if any."""
        if self.state is State.AUTH:
            self.state = State.READY
            return b""
        replies = self._replies
        if not replies:
            return b""  # a ReadyForQuery we did not expect: relay it, nothing to release
        batch = replies.popleft()
        if isinstance(batch, _Batch):
            batch.outstanding -= 1
            job = batch.job
            if batch.outstanding == 0 and batch.complete and job is not None:  # noqa: SIM102
                if self._jobs.pop(job, None) is not None:
                    out.append(Release(job))
        if not replies or not isinstance(replies[0], _Synthetic):
            return b""
        synthetic: list[bytes] = []
        while replies and isinstance(replies[0], _Synthetic):
            item = replies.popleft()
            assert isinstance(item, _Synthetic)
            synthetic.append(item.data)
            if item.ready:
                synthetic.append(pg.ready_for_query(self.transaction_status) * item.ready)
        return b"".join(synthetic)

    def _server_violation(self, why: str) -> list[Action]:
        self.state = State.CLOSED
        error = pg.error_response(
            pg.SQLSTATE_CONNECTION_FAILURE, f"the database sent an invalid message ({why})", "FATAL"
        )
        return [SendToClient(error), *self._release_all(), Close(why)]

    def server_lost(self, why: str = "the database closed the connection") -> list[Action]:
        """The backend connection died: tell the client (08006) — unless the server said why
        itself (a FATAL error, relayed) or the client ended the session — and give everything
        back."""
        self._leave_fast()
        if self.state is State.CLOSED:
            return self._release_all()
        self.state = State.CLOSED
        if self._server_ends:
            return [*self._release_all(), Close(why)]
        error = pg.error_response(pg.SQLSTATE_CONNECTION_FAILURE, why, severity="FATAL")
        return [SendToClient(error), *self._release_all(), Close(why)]

    def client_lost(self) -> list[Action]:
        """The client went away: release (or withdraw) every job it had (once: a session
        already closed has nothing left to close)."""
        self._leave_fast()
        if self.state is State.CLOSED:
            return self._release_all()
        self.state = State.CLOSED
        return [*self._release_all(), Close("client disconnected")]


def _own_statement(sql: bytes, *, failing: bool = False) -> bytes:
    """``sql`` (no parameters, no rows) run by the extended protocol as a named statement,
    closed after, in a Sync of its own: Parse, Bind and Execute of the unnamed portal (which
    does not outlive a Sync outside a transaction block), Close, Sync. A ``failing`` one's
    Close is in a second Sync (after an error the server skips to the Sync; a Close it takes
    in an aborted block): two ReadyForQuery."""
    name = OWN_STATEMENT + b"\0"
    close = pg.message(b"C", b"S" + name)
    return b"".join(
        (
            pg.message(b"P", name + sql + b"\0" + b"\0\0"),
            pg.message(b"B", b"\0" + name + b"\0\0" + b"\0\0" + b"\0\0"),
            pg.message(b"E", b"\0" + b"\0\0\0\0"),
            *((pg.message(b"S"), close) if failing else (close,)),
            pg.message(b"S"),
        )
    )


def _quoted(name: bytes) -> str:
    """A statement or portal name as an SQL identifier (for classification only)."""
    text = name.decode("utf-8", "replace").replace('"', '""')
    return f'"{text}"'


def _portal(data: bytes, execute_at: int, end: int) -> bytes | None:
    """The portal an Execute message (``data[execute_at:end]``) names; None if its name is not
    NUL-terminated (the server refuses it)."""
    stop = data.find(0, execute_at + 5, end)
    return None if stop < 0 else data[execute_at + 5 : stop]


_FATAL_SEVERITIES = (b"FATAL", b"PANIC")


def _fatal(data: bytes, start: int, end: int) -> bool:
    """Whether the ErrorResponse whose fields are ``data[start:end]`` ends the session: its
    severity (the untranslated V field, else S) is FATAL or PANIC."""
    severity = b""
    for field in data[start:end].split(b"\0"):
        if field[:1] == b"V":
            return field[1:] in _FATAL_SEVERITIES
        if field[:1] == b"S" and not severity:
            severity = field[1:]
    return severity in _FATAL_SEVERITIES


# -- the fast path in C ----------------------------------------------------------------------
# ``fast_client(session, data)`` and ``fast_server(session, data)``: the methods above, or the
# same in C (proxy/wire/_speedups.c, built by the install when a C compiler is there; set
# ADMISSION_PURE_PYTHON=1 to use the Python methods anyway).

# The C fast path's contract: the attributes it reads and writes, in the order its ``setup``
# takes them (a session's, but ``discarding`` and ``buffer``, its client FrontendCore's, and
# ``control``, a QueryClass's). Renaming one of them means renaming it here; a test holds a
# session to it.
FAST_PATH_FIELDS = (
    "_fast_job",
    "state",
    "_jobs",
    "_queue",
    "_replies",
    "_client",
    "discarding",
    "buffer",
    "fast_path",
    "_max_message",
    "_statements",
    "_portals",
    "classify",
    "control",
    "transaction_status",
    "_fast_data",
    "_fast_sql",
    "fast_sent",
    "_server_buf",
    "job_ids",
)
FastClient = Callable[[ProxySession, bytes], "FastSubmit | None"]
FastServer = Callable[[ProxySession, bytes], "int | None"]


def _fast_functions() -> tuple[FastClient, FastServer, bool]:
    speedups = native("proxy.wire._speedups")
    if speedups is None:
        return ProxySession.fast_client, ProxySession.fast_server, False
    speedups.setup(State.READY, FAST_PATH_FIELDS)
    return speedups.fast_client, speedups.fast_server, True


fast_client, fast_server, SPEEDUPS = _fast_functions()
