"""The asyncio shell of the embedded backend: accept clients, read them, admit their batches.

Each client connection reads its bytes through ``FrontendCore`` (proxy.wire.frontend), the core
the relay drives too: the core answers the startup phase (SSLRequest gets 'S' when the server
has a certificate, GSSENCRequest 'N'), recognises a CancelRequest and groups messages into
batches. This module answers the startup message (SCRAM-SHA-256 when the server has users,
``auth``; PostgreSQL's parameter status; a backend key), does TLS when it has a certificate,
queues the messages for one task per client that hands them to its ``DuckDBSession`` one at a
time, and takes a batch's admission from the gate when its first statement is about to run; the
job is released at the batch's end (its Sync, or the end of its Query). An error before the Sync
skips the client's messages up to it, as PostgreSQL does.

A CancelRequest withdraws the target's queued statement or interrupts its running one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import struct
from collections import deque
from collections.abc import Callable

import duckdb

from admission.classify import QueryClass
from proxy.backends.embedded.auth import AuthenticationFailed, Exchange, Users
from proxy.backends.embedded.executor import DuckDBBackend, Measurement, QueryError, Refused
from proxy.backends.embedded.session import DuckDBSession
from proxy.gate import AdmissionGate
from proxy.server import (
    ARRIVING_LIMIT,
    MAX_BUFFERED,
    BufferBudget,
    Listener,
    startup_expired,
)
from proxy.wire import protocol as pg
from proxy.wire.framing import DEFAULT_MAX_MESSAGE
from proxy.wire.frontend import (
    Batch,
    CancelRequest,
    EncryptionRequest,
    Frame,
    FrontendCore,
    StartupMessage,
)

__all__ = ["EmbeddedConnection", "EmbeddedServer"]

log = logging.getLogger("admission.duckdb")
_INT32 = struct.Struct("!i")
# A client's messages buffered before they are handled; beyond it the proxy stops reading the
# client until it catches up (a message larger than this is still taken whole).
INBOX_LIMIT = 1 << 20


class _Inbox:
    """A client's frames not yet handled and the task waiting for them — what an asyncio.Queue
    does, without the four deques (3 kB) it gives every idle client."""

    __slots__ = ("frames", "waiter")

    def __init__(self) -> None:
        self.frames: deque[Frame | None] | None = None  # (only while there are some)
        self.waiter: asyncio.Future[None] | None = None

    def put(self, frame: Frame | None) -> None:
        if self.frames is None:
            self.frames = deque()
        self.frames.append(frame)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Frame | None:
        while not self.frames:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        frame = self.frames.popleft()
        if not self.frames:
            self.frames = None
        return frame


class EmbeddedConnection(asyncio.Protocol):
    """The server side of protocol v3 for one client; its statements run on DuckDB
    connections lent while they need one (``DuckDBSession``)."""

    __slots__ = (
        "__weakref__",
        "_batch",
        "buffer_reported",
        "core",
        "early",
        "encrypted",
        "exchange",
        "inbox",
        "inbox_bytes",
        "key",
        "out",
        "parameters",
        "reading_paused",
        "server",
        "session",
        "startup_timer",
        "task",
        "transport",
        "waiting",
        "write_paused",
        "write_waiter",
    )

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.core = FrontendCore(
            Batch,
            tls_available=server.tls is not None,
            max_message=server.max_message,
            job_ids=server.gate.job_ids,
        )
        self.exchange: Exchange | None = None  # SCRAM under way: the session waits for it
        self.parameters: dict[str, str] = {}  # the startup message's
        self.encrypted = False
        # bytes decrypted before ``start_tls`` returned the TLS transport to answer them on
        self.early: list[bytes] | None = None
        self.inbox = _Inbox()
        self.transport: asyncio.Transport | None = None
        self.out = bytearray()  # replies not yet written
        self.session: DuckDBSession | None = None  # from the startup message on
        self.key = (secrets.randbits(31), secrets.randbits(31))
        self._batch: Batch | None = None  # the batch whose messages run now
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.task: asyncio.Task[None] | None = None
        # back-pressure: the client's messages not yet handled (reading pauses above
        # INBOX_LIMIT bytes), and whether its socket takes more replies now
        self.inbox_bytes = 0
        self.reading_paused = False
        self.buffer_reported = 0  # its bytes in server.buffers
        self.write_paused = False
        self.write_waiter: asyncio.Future[None] | None = None
        self.startup_timer: asyncio.TimerHandle | None = None

    @property
    def batch(self) -> Batch | None:
        return self._batch

    def classify(self, sql: str) -> QueryClass:
        return self.core.classify(sql)

    # transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        self.startup_timer = asyncio.get_running_loop().call_later(
            self.server.startup_timeout, self._startup_expired
        )

    def _startup_expired(self) -> None:
        self.startup_timer = None
        if self.session is None and self.transport is not None:
            log.info("client closed: startup not finished in %g s", self.server.startup_timeout)
            self._write(startup_expired(self.server.startup_timeout))
            self._close()

    def pause_writing(self) -> None:
        self.write_paused = True  # the client reads slower than it is answered: wait for it

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter = self.write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _writable(self) -> None:
        while self.write_paused:
            self.write_waiter = asyncio.get_running_loop().create_future()
            try:
                await self.write_waiter
            finally:
                self.write_waiter = None

    def data_received(self, data: bytes) -> None:
        if self.early is not None:
            self.early.append(data)
            return
        core = self.core
        try:
            core.receive_data(data)
            while (event := core.next_event()) is not None:
                if self.transport is None or self.transport.is_closing():
                    return  # closed by the last event (a refusal, a failed authentication)
                if isinstance(event, Frame):
                    if self.exchange is not None:
                        self._authenticate(event)
                    else:
                        self.inbox.put(event)
                        self.inbox_bytes += len(event.raw)
                elif isinstance(event, StartupMessage):
                    self._startup(event.parameters)
                elif isinstance(event, EncryptionRequest):
                    self._write(event.answer)
                    if event.start_tls:
                        # the client's handshake must not be read as a startup packet: stop
                        # reading now, not when the task runs
                        assert self.transport is not None
                        self.transport.pause_reading()
                        self.early = []
                        asyncio.get_running_loop().create_task(self._start_tls())
                        return
                elif isinstance(event, CancelRequest):
                    self.server.cancel(event.pid, event.secret)
                    self._close()
                    return
        except pg.ProtocolViolation as e:
            self._fatal(pg.SQLSTATE_PROTOCOL_VIOLATION, f"protocol violation: {e}")
            return
        self._check_buffers()

    def _check_buffers(self) -> None:
        """Stop reading a client whose messages not yet handled pass INBOX_LIMIT bytes (it
        sends faster than it is served), read it again below half of it; the same while all
        clients' bytes are over the total (MAX_BUFFERED) — or, when its bytes are only a
        large message still arriving, which pausing would never free, refuse it (53200)."""
        if self.transport is None or self.transport.is_closing():
            return
        budget = self.server.buffers
        inbox, arriving = self.inbox_bytes, len(self.core.buffer)
        budget.report(self, inbox + arriving)
        paused = inbox > INBOX_LIMIT or (self.reading_paused and inbox > INBOX_LIMIT // 2)
        if budget.over and inbox + arriving:
            if inbox:
                paused = True  # handling its messages, or the total falling, reads it again
                budget.pause(self)
            elif arriving > ARRIVING_LIMIT:
                budget.refused += 1
                log.warning(
                    "client refused: the proxy's buffers for all clients are over %d MB",
                    budget.limit >> 20,
                )
                self._fatal(
                    pg.SQLSTATE_OUT_OF_MEMORY,
                    f"out of memory: the proxy's buffers for all clients hold "
                    f"{budget.total / 2**20:.0f} MB (limit {budget.limit / 2**20:.0f} MB); a "
                    f"message of which {arriving} bytes had arrived was refused",
                )
                return
        if paused != self.reading_paused:
            self.reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def buffers_freed(self) -> None:
        self._check_buffers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.startup_timer is not None:
            self.startup_timer.cancel()
        self.resume_writing()  # nothing waits for a socket that is gone
        self.inbox.put(None)
        self.server.buffers.forget(self)
        self.server.connections.discard(self)
        self.server.by_key.pop(self.key, None)
        for job in list(self.waiting):  # a queued statement nobody will read: withdrawn
            self.server.gate.cancel(job, "the client went away")
        if self.session is not None:
            with contextlib.suppress(duckdb.Error):  # the database may be closing already
                self.session.client_gone()

    async def _start_tls(self) -> None:
        assert self.transport is not None and self.server.tls is not None
        try:
            new = await asyncio.get_running_loop().start_tls(
                self.transport, self, self.server.tls, server_side=True
            )
        except (OSError, ssl.SSLError) as e:
            log.info("TLS handshake with a client failed: %s", e)
            self.transport.close()
            return
        assert new is not None
        self.transport = new
        self.encrypted = True
        early, self.early = self.early or [], None
        for data in early:
            self.data_received(data)

    def _startup(self, params: dict[str, str]) -> None:
        """The startup message: refuse a client from another host that did not start TLS
        when the server requires it, then authenticate (SCRAM) or let it in."""
        self.parameters = params
        user = params.get("user", "")
        server = self.server
        if server.require_tls and not self.encrypted and not self._local_peer():
            self._fatal(
                "28000",
                f'connection from another host for user "{user}" refused: no encryption '
                "(this server requires TLS: connect with sslmode=require)",
            )
            return
        if server.users is None:
            self._start(params)
            return
        self.exchange = server.users.exchange(user)
        self._write(self.exchange.start())

    def _local_peer(self) -> bool:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        host = peer[0] if isinstance(peer, tuple) and peer else None
        return host is None or host in ("127.0.0.1", "::1") or str(host).startswith("::ffff:127.")

    def _authenticate(self, frame: Frame) -> None:
        """One SASL message of the client's SCRAM exchange; the session starts after the last."""
        exchange = self.exchange
        assert exchange is not None
        if frame.type == pg.TERMINATE:
            self._close()
            return
        if frame.type != pg.PASSWORD:
            raise pg.ProtocolViolation(
                f"expected a SASL response during authentication, got message {frame.name!r}"
            )
        try:
            answer = exchange.step(frame.body)
        except AuthenticationFailed:
            log.info("password authentication failed for user %r", exchange.user)
            self.exchange = None
            self._fatal("28P01", f'password authentication failed for user "{exchange.user}"')
            return
        if not exchange.done:
            self._write(answer)
            return
        self.exchange = None
        self._start(self.parameters, answer)

    def _start(self, params: dict[str, str], auth: bytes = b"") -> None:
        """The client is in: AuthenticationOk (after ``auth``, the SCRAM exchange's last
        messages, which end with it), the parameters, the key, ReadyForQuery."""
        backend = self.server.backend
        self.session = DuckDBSession(
            self,
            backend,
            params.get("user", "duckdb"),
            self.out,
            self.server.observers,
            self.server.samplers,
            # (PostgreSQL's default database is the user's name)
            database=params.get("database") or params.get("user", "duckdb"),
        )
        self.session.settings["application_name"] = params.get("application_name", "")
        out = bytearray(auth or pg.message(b"R", _INT32.pack(0)))
        settings = {
            "server_version": backend.server_version,
            "server_encoding": "UTF8",
            "client_encoding": "UTF8",
            "DateStyle": "ISO, MDY",
            "TimeZone": "UTC",
            "integer_datetimes": "on",
            "standard_conforming_strings": "on",
            "IntervalStyle": "postgres",
            "application_name": params.get("application_name", ""),
            "is_superuser": "on",
            "session_authorization": params.get("user", ""),
        }
        for name, value in settings.items():
            out += pg.message(b"S", name.encode() + b"\0" + value.encode() + b"\0")
        out += pg.message(b"K", struct.pack("!II", *self.key))
        out += pg.ready_for_query(b"I")
        self._write(bytes(out))
        self.server.by_key[self.key] = self
        if self.startup_timer is not None:
            self.startup_timer.cancel()
            self.startup_timer = None
        self.task = asyncio.get_running_loop().create_task(self._serve())

    # the message loop

    async def _serve(self) -> None:
        try:
            while True:
                frame = await self.inbox.get()
                if frame is None:
                    break
                self.inbox_bytes -= len(frame.raw)
                if self.buffer_reported or self.reading_paused:
                    self._check_buffers()
                if self.write_paused:
                    await self._writable()
                if not await self._handle(frame):
                    break
        except Exception:  # an unexpected failure: close this client only
            log.exception("client session failed")
            self._fatal("XX000", "internal error in the embedded backend")
        finally:
            self._finish_batch()
            await self._end_session()

    async def _end_session(self) -> None:
        """The client is gone: roll back what its transaction left open and close its cursor
        now, not when the garbage collector gets to it (its locks would block others)."""
        session = self.session
        if session is None:
            return
        cursor = session.end()  # back to the backend's idle connections when clean
        if cursor is None:
            self.session = None
            return
        rollback = session.status != b"I"

        def end() -> None:
            session.release()
            with contextlib.suppress(duckdb.Error):
                if rollback:
                    cursor.execute("ROLLBACK")
            with contextlib.suppress(duckdb.Error):
                cursor.close()

        try:
            await self.server.backend.pool.run(end)
        except RuntimeError:  # the pool is shut down: the database is closing anyway
            end()
        self.session = None  # (it points back here: no cycle left for the garbage collector)

    async def _handle(self, frame: Frame) -> bool:
        kind = frame.type
        if kind == pg.TERMINATE:
            self._close()
            return False
        session = self.session
        assert session is not None
        core = self.core
        if kind == pg.QUERY and core.discarding:
            # unlike PostgreSQL, which skips a Query too, this server runs it: the failed
            # batch ends here and the skip with it
            core.discarding = False
            self._finish_batch()
        batch = core.join(kind)
        if batch is not None:
            self._batch = batch
        if kind == pg.SYNC:
            self._finish_batch()
            session.idle()
            self.out += pg.ready_for_query(session.status)
            self._flush()
            return True
        if kind == pg.FLUSH:
            self._flush()
            return True
        if batch is None:
            return True  # after an error, discard up to the Sync
        try:
            if kind == pg.QUERY:
                await session.query(frame.body[:-1].decode("utf-8", "replace"))
            elif kind == pg.PARSE:
                session.parse(frame.body)
            elif kind == pg.BIND:
                session.bind(frame.body)
            elif kind == pg.DESCRIBE:
                await session.describe(frame.body)
            elif kind == pg.EXECUTE:
                await session.execute(frame.body)
            elif kind == pg.CLOSE:
                session.close(frame.body)
            else:
                raise QueryError(
                    "0A000",
                    f"message {frame.name!r} is not supported by the embedded DuckDB backend",
                )
        except QueryError as e:  # Refused too
            self.out += pg.error_response(e.sqlstate, str(e))
            if session.status == b"T":
                session.status = b"E"
            if kind != pg.QUERY:
                core.fail(batch)  # discard up to the Sync
        if kind == pg.QUERY:  # a simple query ends here: no Sync will follow
            self._finish_batch()
            session.idle()
            self.out += pg.ready_for_query(session.status)
            self._flush()
        return True

    # admission

    @property
    def backend_pid(self) -> int | None:
        """None: no process of its own runs this client's statements (DuckDB's threads are
        this process's; training samples them directly)."""
        return None

    async def admit(self, sql: str) -> None:
        """Wait for the gate to admit the running batch (at once if it already was)."""
        batch = self._batch
        assert batch is not None and self.session is not None
        if batch.job is not None:
            return
        job, query_class, bypass = self.core.new_job(batch, sql, self.session.status)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[job] = future
        self.server.gate.submit(job, query_class, bypass, sql, self)
        if not future.done():
            self._flush()  # queued: what is answered so far goes out meanwhile
        try:
            await future
        except Refused:
            batch.job = None
            raise
        finally:
            self.waiting.pop(job, None)

    def admitted(self, job: int) -> None:
        future = self.waiting.get(job)
        if future is not None and not future.done():
            future.set_result(None)
        elif future is None:
            self.server.gate.release(job)

    def refused(self, job: int, sqlstate: str, message: str) -> None:
        future = self.waiting.get(job)
        if future is not None and not future.done():
            future.set_exception(Refused(sqlstate, message))

    def warn(self, job: int, message: str) -> None:
        self.out += pg.error_response("00000", message, severity="NOTICE", kind=b"N")

    def _finish_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None and batch.job is not None:
            self.server.gate.release(batch.job)

    # output

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _flush(self) -> None:
        if self.out:
            self._write(bytes(self.out))
            self.out.clear()

    async def drain(self) -> bool:
        """Write what is pending and wait while the client's socket is full; False when the
        client is gone (a long result stops being fetched then)."""
        self._flush()
        if self.write_paused:
            await self._writable()
        return self.transport is not None and not self.transport.is_closing()

    async def copy_data(self) -> bytes | None:
        """The next CopyData's bytes of a COPY FROM STDIN, None at its CopyDone (the replies
        so far are written first: the CopyInResponse). A CopyFail or another message fails
        the COPY; Flush and Sync are ignored, as PostgreSQL ignores them in copy-in mode."""
        self._flush()
        while True:
            frame = await self.inbox.get()
            if frame is None:  # (the client is gone: the serving loop ends on it too)
                self.inbox.put(None)
                raise QueryError("08006", "the client went away during COPY FROM STDIN")
            self.inbox_bytes -= len(frame.raw)
            if self.buffer_reported or self.reading_paused:
                self._check_buffers()
            kind = frame.type
            if kind == pg.COPY_DATA:
                return frame.body
            if kind == pg.COPY_DONE:
                return None
            if kind == pg.COPY_FAIL:
                why = frame.body.rstrip(b"\0").decode("utf-8", "replace")
                raise QueryError("57014", f"COPY from stdin failed: {why}")
            if kind not in (pg.FLUSH, pg.SYNC):
                raise QueryError(
                    pg.SQLSTATE_PROTOCOL_VIOLATION,
                    f"unexpected message type {frame.name!r} during COPY from stdin",
                )

    def _fatal(self, sqlstate: str, message: str) -> None:
        self._flush()
        self._write(pg.error_response(sqlstate, message, severity="FATAL"))
        self._close()

    def _close(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def cancel(self) -> None:
        """A CancelRequest named this client: withdraw its queued statement, or interrupt the
        running one."""
        for job in list(self.waiting):
            if self.server.gate.cancel(job):
                return
        if self.session is not None:
            self.session.interrupt()

    def shutdown(self, why: str) -> None:
        self._fatal(pg.SQLSTATE_ADMIN_SHUTDOWN, why)


class EmbeddedServer(Listener):
    """Accepts clients and serves them from one ``DuckDBBackend`` through the gate."""

    def __init__(
        self,
        gate: AdmissionGate,
        backend: DuckDBBackend,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        users: Users | None = None,
        tls: ssl.SSLContext | None = None,
        require_tls: bool = False,
        max_buffered: int = MAX_BUFFERED,
    ) -> None:
        self.gate = gate
        self.backend = backend
        self.max_message = max_message
        self.buffers = BufferBudget(max_buffered)
        self.users = users  # None: trust (only for clients of this machine; see ``serve``)
        self.tls = tls
        self.require_tls = require_tls  # clients from other hosts must use TLS
        self.connections: set[EmbeddedConnection] = set()
        self.by_key: dict[tuple[int, int], EmbeddedConnection] = {}
        # sessions read this list; only ``observe`` and what it returns change it
        self.observers: list[Callable[[Measurement], None]] = []
        self.samplers: list[tuple[Callable[[str], bool], Callable[[Measurement], None]]] = []

    def observe(self, observer: Callable[[Measurement], None]) -> Callable[[], None]:
        """Register ``observer`` for one ``Measurement`` per statement run (DuckDB's profiler
        is on while anyone listens); returns what unregisters it."""
        self.observers.append(observer)
        return lambda: self.observers.remove(observer)

    def sample(
        self, wants: Callable[[str], bool], observer: Callable[[Measurement], None]
    ) -> Callable[[], None]:
        """Register ``observer`` for a ``Measurement`` of the statements ``wants`` picks (by
        their class's fingerprint; DuckDB's profiler is on for those alone); returns what
        unregisters it."""
        entry = (wants, observer)
        self.samplers.append(entry)
        return lambda: self.samplers.remove(entry)

    def protocol(self) -> EmbeddedConnection:
        return EmbeddedConnection(self)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        for conn in list(self.connections):
            conn.shutdown("the proxy is shutting down")
        if tasks:  # each client's loop ends once its connection is lost
            await asyncio.wait(tasks, timeout=10)
        if self._server is not None:
            await self._server.wait_closed()
        self.backend.close()
