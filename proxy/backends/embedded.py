"""The embedded backend: the proxy answers the PostgreSQL protocol itself, on DuckDB.

Every client gets its own DuckDB cursor (its own transaction state) on one shared database,
in memory by default. Statements pass the same admission gate as with a PostgreSQL backend —
a simple Query, or an extended batch from its first Execute (or Describe of a portal) up to its
Sync — and run in a worker pool, off the event loop, so a long query never stalls other
clients' I/O. A CancelRequest withdraws a queued statement or interrupts a running one.

Results travel in text format with PostgreSQL's type OIDs and text output
(``proxy.backends.pgtypes``); DuckDB errors carry PostgreSQL SQLSTATEs
(``proxy.backends.errors``). Binary result formats are refused with 0A000.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import re
import secrets
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb

from admission.classify import classify_sql
from proxy.backends.errors import sqlstate_for
from proxy.backends.pgtypes import PgType, encode_text, pg_type
from proxy.gate import AdmissionGate
from proxy.server import Listener
from proxy.wire import protocol as pg
from proxy.wire.framing import STARTUP, Frame, FrameScanner

__all__ = ["DuckDBBackend", "EmbeddedServer"]

log = logging.getLogger("admission.duckdb")
_jobs = itertools.count(1)
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_PARAM = re.compile(r"\$(\d+)")
SERVER_VERSION = "15.0"


class DuckDBBackend:
    """One DuckDB database and the worker threads that run statements on it."""

    def __init__(self, database: str = ":memory:", workers: int = 8) -> None:
        self.database = database
        self.connection = duckdb.connect(database)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="duckdb")
        self.version = duckdb.__version__

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cursor = self.connection.cursor()
        cursor.execute("SET TimeZone = 'UTC'")
        return cursor

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.connection.close()


class Refused(Exception):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class QueryError(Exception):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(slots=True)
class Result:
    columns: list[tuple[str, PgType]]
    rows: list[bytes]  # DataRow messages, encoded in the worker thread
    tag: str


@dataclass(slots=True)
class Prepared:
    query: str
    param_types: list[int]
    kind: str


@dataclass(slots=True)
class Portal:
    statement: Prepared
    params: list[object]
    result: Result | None = None
    sent: int = 0


# -- encoding ------------------------------------------------------------------------------


def row_description(columns: Sequence[tuple[str, PgType]]) -> bytes:
    body = bytearray(_INT16.pack(len(columns)))
    for name, t in columns:
        body += name.encode() + b"\0"
        body += struct.pack("!ihihih", 0, 0, t.oid, t.size, t.typmod, 0)
    return pg.message(b"T", bytes(body))


def data_rows(rows: list[tuple[Any, ...]], types: list[PgType]) -> list[bytes]:
    out = []
    count = _INT16.pack(len(types))
    for row in rows:
        parts = [count]
        for value, t in zip(row, types, strict=True):
            encoded = encode_text(value, t)
            if encoded is None:
                parts.append(b"\xff\xff\xff\xff")
            else:
                parts.append(_INT32.pack(len(encoded)) + encoded)
        body = b"".join(parts)
        out.append(b"D" + _INT32.pack(len(body) + 4) + body)
    return out


def command_tag(kind: str, query: str, rows: list[tuple[Any, ...]], has_columns: bool) -> str:
    words = query.strip().rstrip(";").split()
    verb = words[0].upper() if words else ""
    count = rows[0][0] if rows and rows[0] and isinstance(rows[0][0], int) else 0
    if kind == "SELECT" or (has_columns and verb in ("SELECT", "WITH", "VALUES", "SHOW", "FROM")):
        return f"SELECT {len(rows)}"
    if kind == "INSERT":
        return f"INSERT 0 {count}"
    if kind in ("UPDATE", "DELETE"):
        return f"{kind} {count}"
    if kind == "TRANSACTION":
        return {"START": "BEGIN", "END": "COMMIT", "ABORT": "ROLLBACK"}.get(verb, verb)
    if verb in ("CREATE", "DROP", "ALTER") and len(words) > 1:
        noun = words[1].upper()
        if noun in ("OR", "TEMP", "TEMPORARY", "UNIQUE") and len(words) > 2:
            noun = words[2].upper() if words[2].upper() != "REPLACE" else words[3].upper()
        return f"{verb} {noun}"
    return verb or "SELECT 0"


def decode_param(raw: bytes | None, oid: int, binary: bool) -> object:
    if raw is None:
        return None
    if binary:
        if oid == 21:
            return struct.unpack("!h", raw)[0]
        if oid == 23:
            return struct.unpack("!i", raw)[0]
        if oid == 20:
            return struct.unpack("!q", raw)[0]
        if oid == 701:
            return struct.unpack("!d", raw)[0]
        if oid == 700:
            return struct.unpack("!f", raw)[0]
        if oid == 16:
            return raw != b"\0"
        if oid in (25, 1043, 0, 705):
            return raw.decode()
        if oid == 17:
            return bytes(raw)
        raise QueryError("0A000", f"binary parameters of type {oid} are not supported")
    text = raw.decode()
    if oid in (20, 21, 23):
        return int(text)
    if oid in (700, 701):
        return float(text)
    if oid == 1700:
        return Decimal(text)
    if oid == 16:
        return text.lower() in ("t", "true", "1", "on", "yes", "y")
    if oid == 1082:
        return datetime.date.fromisoformat(text)
    if oid == 17 and text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return text


# -- execution (worker threads) ------------------------------------------------------------


def execute(
    cursor: duckdb.DuckDBPyConnection, query: str, params: Sequence[object], kind: str
) -> Result:
    try:
        relation = cursor.execute(query, list(params) if params else None)
        description = relation.description
        rows = relation.fetchall() if description else []
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), _first_line(e)) from None
    columns = [(d[0], pg_type(str(d[1]))) for d in description or []]
    is_count = kind in ("INSERT", "UPDATE", "DELETE") and [c[0] for c in columns] == ["Count"]
    tag = command_tag(kind, query, rows, bool(columns) and not is_count)
    if is_count:
        return Result([], [], tag)
    return Result(columns, data_rows(rows, [t for _, t in columns]), tag)


def describe(
    cursor: duckdb.DuckDBPyConnection, query: str, nparams: int
) -> list[tuple[str, PgType]]:
    """The result columns of a SELECT without running it (NULL for every parameter)."""
    body = query.strip().rstrip(";")
    try:
        relation = cursor.execute(f"select * from ({body}) limit 0", [None] * nparams or None)
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), _first_line(e)) from None
    return [(d[0], pg_type(str(d[1]))) for d in relation.description or []]


def _first_line(error: BaseException) -> str:
    return str(error).split("\n", 1)[0]


# -- one client ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Batch:
    job: int | None = None
    failed: bool = False


class EmbeddedConnection(asyncio.Protocol):
    """The server side of protocol v3 for one client, on one DuckDB cursor."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.scanner = FrameScanner(startup=True, max_message=server.max_message)
        self.inbox: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.status = b"I"
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.batch = _Batch()
        self.out = bytearray()
        self.cursor: duckdb.DuckDBPyConnection | None = None
        self.key = (secrets.randbits(31), secrets.randbits(31))
        self.running = False
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.task: asyncio.Task[None] | None = None

    # transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.scanner.feed(data)
            while frames:
                for frame in frames:
                    if frame.type == STARTUP:
                        if not self._startup(frame):
                            return
                    else:
                        self.inbox.put_nowait(frame)
                frames = self.scanner.feed(b"") if self.scanner.buffered else []
        except pg.ProtocolViolation as e:
            self._fatal(pg.SQLSTATE_PROTOCOL_VIOLATION, f"protocol violation: {e}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.inbox.put_nowait(None)
        self.server.connections.discard(self)
        self.server.by_key.pop(self.key, None)
        if self.running and self.cursor is not None:
            self.cursor.interrupt()

    # start-up

    def _startup(self, frame: Frame) -> bool:
        code = pg.int32(frame.body)
        if code in (pg.SSL_REQUEST_CODE, pg.GSSENC_REQUEST_CODE):
            self._write(b"N")
            self.scanner.expect_startup()
            return True
        if code == pg.CANCEL_REQUEST_CODE and len(frame.body) >= 12:
            self.server.cancel(*struct.unpack_from("!II", frame.body, 4))
            self._close()
            return False
        if code >> 16 != 3:
            self._fatal(
                pg.SQLSTATE_PROTOCOL_VIOLATION,
                f"unsupported protocol version {code >> 16}.{code & 0xFFFF}",
            )
            return False
        parts = frame.body[4:].split(b"\0")
        params = {
            parts[i].decode(): parts[i + 1].decode()
            for i in range(0, len(parts) - 1, 2)
            if parts[i]
        }
        self.cursor = self.server.backend.cursor()
        out = bytearray(pg.message(b"R", _INT32.pack(0)))
        settings = {
            "server_version": f"{SERVER_VERSION} (admission, DuckDB {self.server.backend.version})",
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
        return True

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
            self.running = False

    async def _handle(self, frame: Frame) -> bool:
        kind = frame.type
        if kind == pg.TERMINATE:
            self._close()
            return False
        if kind == pg.SYNC:
            self._finish_batch()
            self.out += pg.ready_for_query(self.status)
            self._flush()
            return True
        if kind == pg.FLUSH:
            self._flush()
            return True
        if self.batch.failed and kind != pg.QUERY:
            return True  # after an error, discard up to the Sync
        try:
            if kind == pg.QUERY:
                await self._simple(frame.body[:-1].decode("utf-8", "replace"))
            elif kind == pg.PARSE:
                self._parse(frame.body)
            elif kind == pg.BIND:
                self._bind(frame.body)
            elif kind == pg.DESCRIBE:
                await self._describe(frame.body)
            elif kind == pg.EXECUTE:
                await self._execute(frame.body)
            elif kind == pg.CLOSE:
                target, name = frame.body[:1], pg.read_cstring(frame.body, 1)[0]
                (self.statements if target == b"S" else self.portals).pop(name, None)
                self.out += pg.message(b"3")
            else:
                raise QueryError(
                    "0A000",
                    f"message {frame.name!r} is not supported by the embedded DuckDB backend",
                )
        except (QueryError, Refused) as e:
            self._error(e.sqlstate, str(e))
            if self.status == b"T":
                self.status = b"E"
            if kind == pg.QUERY:  # a simple query ends here: no Sync will follow
                self._finish_batch()
                self.out += pg.ready_for_query(self.status)
                self._flush()
            else:
                self.batch.failed = True  # discard up to the Sync
        return True

    # admission

    async def _admit(self, sql: str) -> None:
        if self.batch.job is not None:
            return
        job = next(_jobs)
        query_class = classify_sql(sql)
        bypass = query_class.control or self.status != b"I"
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[job] = future
        self.batch.job = job
        self._flush()
        self.server.gate.submit(job, query_class, bypass, sql, self)
        try:
            await future
        except Refused:
            self.batch.job = None
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
        if self.batch.job is not None:
            self.server.gate.release(self.batch.job)
        self.batch = _Batch()

    async def _run(self, query: str, params: Sequence[object], kind: str) -> Result:
        if self.status == b"E" and kind != "TRANSACTION":
            raise QueryError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )
        assert self.cursor is not None
        loop = asyncio.get_running_loop()
        self.running = True
        try:
            result = await loop.run_in_executor(
                self.server.backend.pool, execute, self.cursor, query, params, kind
            )
        finally:
            self.running = False
        self._track_transaction(result.tag)
        return result

    def _track_transaction(self, tag: str) -> None:
        if tag == "BEGIN":
            self.status = b"T"
        elif tag in ("COMMIT", "ROLLBACK"):
            self.status = b"I"

    # simple protocol

    async def _simple(self, text: str) -> None:
        self.batch = _Batch()
        assert self.cursor is not None
        try:
            statements = self.cursor.extract_statements(text)
        except duckdb.Error as e:
            raise QueryError(sqlstate_for(e), _first_line(e)) from None
        if not statements:
            self.out += pg.message(b"I")
        else:
            await self._admit(text)
            for statement in statements:
                result = await self._run(statement.query, (), statement.type.name)
                if result.columns:
                    self.out += row_description(result.columns)
                    self.out += b"".join(result.rows)
                self.out += pg.message(b"C", result.tag.encode() + b"\0")
        self._finish_batch()
        self.out += pg.ready_for_query(self.status)
        self._flush()

    # extended protocol

    def _parse(self, body: bytes) -> None:
        name, pos = pg.read_cstring(body, 0)
        query, pos = pg.read_cstring(body, pos)
        (count,) = struct.unpack_from("!h", body, pos)
        types = list(struct.unpack_from(f"!{count}i", body, pos + 2)) if count else []
        nparams = max((int(n) for n in _PARAM.findall(query)), default=0)
        types += [0] * (nparams - len(types))
        assert self.cursor is not None
        try:
            statements = self.cursor.extract_statements(query) if query.strip() else []
        except duckdb.Error as e:
            raise QueryError(sqlstate_for(e), _first_line(e)) from None
        if len(statements) > 1:
            raise QueryError("42601", "cannot insert multiple commands into a prepared statement")
        kind = statements[0].type.name if statements else "EMPTY"
        self.statements[name] = Prepared(query, types, kind)
        self.out += pg.message(b"1")

    def _bind(self, body: bytes) -> None:
        portal, pos = pg.read_cstring(body, 0)
        name, pos = pg.read_cstring(body, pos)
        statement = self.statements.get(name)
        if statement is None:
            raise QueryError("26000", f'prepared statement "{name}" does not exist')
        (nformats,) = struct.unpack_from("!h", body, pos)
        formats = list(struct.unpack_from(f"!{nformats}h", body, pos + 2))
        pos += 2 + 2 * nformats
        (nvalues,) = struct.unpack_from("!h", body, pos)
        pos += 2
        params: list[object] = []
        for i in range(nvalues):
            (length,) = _INT32.unpack_from(body, pos)
            pos += 4
            raw = None if length < 0 else body[pos : pos + length]
            pos += max(length, 0)
            binary = (formats[i] if nformats > 1 else formats[0] if nformats else 0) == 1
            oid = statement.param_types[i] if i < len(statement.param_types) else 0
            try:
                params.append(decode_param(raw, oid, binary))
            except (ValueError, struct.error) as e:
                raise QueryError("22P02", f"invalid value for parameter ${i + 1}: {e}") from None
        (nresults,) = struct.unpack_from("!h", body, pos)
        results = struct.unpack_from(f"!{nresults}h", body, pos + 2)
        if any(results):
            raise QueryError(
                "0A000",
                "binary result format is not supported by the embedded "
                "DuckDB backend; request text results",
            )
        self.portals[portal] = Portal(statement, params)
        self.out += pg.message(b"2")

    async def _describe(self, body: bytes) -> None:
        target, name = body[:1], pg.read_cstring(body, 1)[0]
        if target == b"S":
            statement = self.statements.get(name)
            if statement is None:
                raise QueryError("26000", f'prepared statement "{name}" does not exist')
            oids = [oid or 25 for oid in statement.param_types]
            self.out += pg.message(
                b"t", _INT16.pack(len(oids)) + b"".join(_INT32.pack(o) for o in oids)
            )
            if statement.kind == "SELECT":
                assert self.cursor is not None
                columns = describe(self.cursor, statement.query, len(oids))
                self.out += row_description(columns) if columns else pg.message(b"n")
            else:
                self.out += pg.message(b"n")
            return
        portal = self.portals.get(name)
        if portal is None:
            raise QueryError("34000", f'portal "{name}" does not exist')
        result = await self._portal_result(portal)
        self.out += row_description(result.columns) if result.columns else pg.message(b"n")

    async def _portal_result(self, portal: Portal) -> Result:
        if portal.result is None:
            statement = portal.statement
            await self._admit(statement.query)
            portal.result = await self._run(statement.query, portal.params, statement.kind)
        return portal.result

    async def _execute(self, body: bytes) -> None:
        name, pos = pg.read_cstring(body, 0)
        (limit,) = _INT32.unpack_from(body, pos)
        portal = self.portals.get(name)
        if portal is None:
            raise QueryError("34000", f'portal "{name}" does not exist')
        if portal.statement.kind == "EMPTY":
            self.out += pg.message(b"I")
            return
        result = await self._portal_result(portal)
        rows = result.rows[portal.sent :]
        if limit > 0 and len(rows) > limit:
            self.out += b"".join(rows[:limit])
            portal.sent += limit
            self.out += pg.message(b"s")  # PortalSuspended
            return
        self.out += b"".join(rows)
        portal.sent = len(result.rows)
        self.out += pg.message(b"C", result.tag.encode() + b"\0")

    # output

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _flush(self) -> None:
        if self.out:
            self._write(bytes(self.out))
            self.out.clear()

    def _error(self, sqlstate: str, message: str) -> None:
        self.out += pg.error_response(sqlstate, message)

    def _fatal(self, sqlstate: str, message: str) -> None:
        self._flush()
        self._write(pg.error_response(sqlstate, message, severity="FATAL"))
        self._close()

    def _close(self) -> None:
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def cancel(self) -> None:
        for job in list(self.waiting):
            if self.server.gate.cancel(job):
                return
        if self.running and self.cursor is not None:
            self.cursor.interrupt()


class EmbeddedServer(Listener):
    """Accepts clients and serves them from one ``DuckDBBackend`` through the gate."""

    def __init__(
        self, gate: AdmissionGate, backend: DuckDBBackend, *, max_message: int = 256 * 1024 * 1024
    ) -> None:
        self.gate = gate
        self.backend = backend
        self.max_message = max_message
        self.connections: set[EmbeddedConnection] = set()
        self.by_key: dict[tuple[int, int], EmbeddedConnection] = {}

    def protocol(self) -> EmbeddedConnection:
        return EmbeddedConnection(self)

    def cancel(self, pid: int, secret: int) -> None:
        target = self.by_key.get((pid, secret))
        if target is not None:
            target.cancel()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn._fatal(pg.SQLSTATE_ADMIN_SHUTDOWN, "the proxy is shutting down")
        if self._server is not None:
            await self._server.wait_closed()
