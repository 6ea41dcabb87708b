"""The asyncio shell of the embedded backend: accept clients, read them, admit their batches.

Each client connection reads its bytes through ``FrontendCore`` (proxy.wire.frontend), the core
the relay drives too: the core answers the startup phase (SSLRequest and GSSENCRequest get
'N': no TLS here), recognises a CancelRequest and groups messages into batches. This module
answers the startup message (trust authentication, PostgreSQL's parameter status, a backend
key), queues the messages for one task per client that hands them to its ``DuckDBSession`` one
at a time, and takes a batch's admission from the gate when its first statement is about to
run; the job is released at the batch's end (its Sync, or the end of its Query). An error
before the Sync skips the client's messages up to it, as PostgreSQL does.

A CancelRequest withdraws the target's queued statement or interrupts its running one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
from collections.abc import Callable

import duckdb

from proxy.backends.embedded.executor import DuckDBBackend, Measurement, QueryError, Refused
from proxy.backends.embedded.session import DuckDBSession
from proxy.gate import AdmissionGate
from proxy.server import Listener
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


class EmbeddedConnection(asyncio.Protocol):
    """The server side of protocol v3 for one client, on one DuckDB cursor."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.core = FrontendCore(Batch, max_message=server.max_message, job_ids=server.gate.job_ids)
        self.inbox: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.out = bytearray()  # replies not yet written
        self.session: DuckDBSession | None = None  # from the startup message on
        self.key = (secrets.randbits(31), secrets.randbits(31))
        self._batch: Batch | None = None  # the batch whose messages run now
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.task: asyncio.Task[None] | None = None

    @property
    def batch(self) -> Batch | None:
        return self._batch

    # transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        core = self.core
        try:
            core.receive_data(data)
            while (event := core.next_event()) is not None:
                if isinstance(event, Frame):
                    self.inbox.put_nowait(event)
                elif isinstance(event, StartupMessage):
                    self._start(event.parameters)
                elif isinstance(event, EncryptionRequest):
                    self._write(event.answer)  # 'N': no TLS here, the client goes on in clear
                elif isinstance(event, CancelRequest):
                    self.server.cancel(event.pid, event.secret)
                    self._close()
                    return
        except pg.ProtocolViolation as e:
            self._fatal(pg.SQLSTATE_PROTOCOL_VIOLATION, f"protocol violation: {e}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.inbox.put_nowait(None)
        self.server.connections.discard(self)
        self.server.by_key.pop(self.key, None)
        if self.session is not None:
            with contextlib.suppress(duckdb.Error):  # the database may be closing already
                self.session.interrupt()

    def _start(self, params: dict[str, str]) -> None:
        """Trust authentication: AuthenticationOk, the parameters, the key, ReadyForQuery."""
        backend = self.server.backend
        self.session = DuckDBSession(
            self,
            backend,
            backend.cursor(params.get("user", "duckdb")),
            self.out,
            self.server.observers,
        )
        self.session.settings["application_name"] = params.get("application_name", "")
        out = bytearray(pg.message(b"R", _INT32.pack(0)))
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
        self.task = asyncio.get_running_loop().create_task(self._serve())

    # the message loop

    async def _serve(self) -> None:
        try:
            while True:
                frame = await self.inbox.get()
                if frame is None:
                    break
                if not await self._handle(frame):
                    break
        except Exception:  # an unexpected failure: close this client only
            log.exception("client session failed")
            self._fatal("XX000", "internal error in the embedded backend")
        finally:
            self._finish_batch()

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
        self._flush()
        self.server.gate.submit(job, query_class, bypass, sql, self)
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
        self, gate: AdmissionGate, backend: DuckDBBackend, *, max_message: int = DEFAULT_MAX_MESSAGE
    ) -> None:
        self.gate = gate
        self.backend = backend
        self.max_message = max_message
        self.connections: set[EmbeddedConnection] = set()
        self.by_key: dict[tuple[int, int], EmbeddedConnection] = {}
        # sessions read this list; only ``observe`` and what it returns change it
        self.observers: list[Callable[[Measurement], None]] = []

    def observe(self, observer: Callable[[Measurement], None]) -> Callable[[], None]:
        """Register ``observer`` for one ``Measurement`` per statement run (DuckDB's profiler
        is on while anyone listens); returns what unregisters it."""
        self.observers.append(observer)
        return lambda: self.observers.remove(observer)

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
