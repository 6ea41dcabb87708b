"""The embedded backend: the proxy answers the PostgreSQL protocol itself, on DuckDB.

Every client gets its own DuckDB cursor (its own transaction state) on one shared database,
in memory by default. Statements pass the same admission gate as with a PostgreSQL backend —
a simple Query, or an extended batch from its first Execute (or Describe of a portal) up to its
Sync — and run in a worker pool, off the event loop, so a long query never stalls other
clients' I/O. A CancelRequest withdraws a queued statement or interrupts a running one.

Results travel in text format with PostgreSQL's type OIDs and text output
(``proxy.backends.pgtypes``), in binary where the client asks for it (asyncpg does); DuckDB errors
carry PostgreSQL SQLSTATEs (``proxy.backends.errors``).

With ``profile`` on, each statement's CPU time and wall time come from DuckDB's profiler, and
``EmbeddedServer.observers`` receive one ``Measurement`` per statement (what training needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import re
import secrets
import struct
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import duckdb
import pglast

from admission.classify import classify_sql
from proxy.backends import compat
from proxy.backends.errors import sqlstate_for
from proxy.backends.pgtypes import ARRAY_ELEMENT, PgType, encode_binary, encode_text, pg_type
from proxy.gate import AdmissionGate
from proxy.server import Listener
from proxy.wire import protocol as pg
from proxy.wire.framing import STARTUP, Frame, FrameScanner

__all__ = ["DuckDBBackend", "EmbeddedServer", "Measurement"]

log = logging.getLogger("admission.duckdb")
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_PARAM = re.compile(r"\$(\d+)")
_LOCAL_HEAD = re.compile(r"\s*(?:show|set|savepoint|release|rollback)\b", re.I)
SERVER_VERSION = "15.0"
TEXT_OID = 25
_DRIVER = "DRIVER:"  # statement kind of a driver's catalog query answered here


class DuckDBBackend:
    """One DuckDB database and the worker threads that run statements on it."""

    def __init__(
        self, database: str = ":memory:", workers: int = 8, *, profile: bool = True
    ) -> None:
        self.database = database
        try:
            self.connection = duckdb.connect(database)
        except duckdb.Error as e:
            raise ValueError(f"cannot open the DuckDB database {database}: {_first_line(e)}") from e
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="duckdb")
        self.version = duckdb.__version__
        self.profile = profile
        self.server_version = f"{SERVER_VERSION} (admission, DuckDB {self.version})"
        self.version_string = f"PostgreSQL {self.server_version}"

    def cursor(self, user: str = "duckdb") -> duckdb.DuckDBPyConnection:
        cursor = self.connection.cursor()
        cursor.execute("SET TimeZone = 'UTC'")
        for macro in compat.session_macros(user):
            cursor.execute(macro)
        if self.profile:
            cursor.execute("PRAGMA enable_profiling = 'no_output'")
        return cursor

    def close(self) -> None:
        """Stop: statements not started are dropped, running ones (interrupted by their
        clients' departure) are waited for, then the database is closed."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(duckdb.Error):
            self.connection.close()


class QueryError(Exception):
    """A statement failed; the client gets an ErrorResponse with ``sqlstate``."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Refused(QueryError):
    """The gate turned the statement away (queue full, timeout, cancel)."""


@dataclass(slots=True)
class Result:
    columns: list[tuple[str, PgType]]
    rows: list[bytes]  # DataRow messages, encoded in the worker thread
    tag: str
    formats: list[int]  # per column: 0 text, 1 binary
    latency: float = 0.0  # DuckDB's own wall time for the statement, seconds
    cpu_time: float | None = None  # summed over DuckDB's threads (profiler), seconds


@dataclass(frozen=True, slots=True)
class Measurement:
    """One statement as DuckDB ran it: the class, the time it took and the CPU it used.
    ``parallelism`` is CPU time over wall time: the mean number of threads busy."""

    class_name: str
    latency: float
    cpu_time: float | None
    job: int | None = None  # the admission job the statement ran under

    @property
    def parallelism(self) -> float | None:
        if self.cpu_time is None or self.latency <= 0:
            return None
        return self.cpu_time / self.latency


@dataclass(slots=True)
class Prepared:
    query: str
    param_types: list[int]
    kind: str


@dataclass(slots=True)
class Portal:
    statement: Prepared
    params: list[object]
    formats: tuple[int, ...] = ()  # result format codes from Bind
    result: Result | None = None
    sent: int = 0


# -- encoding ------------------------------------------------------------------------------


def row_description(columns: Sequence[tuple[str, PgType]], formats: Sequence[int] = ()) -> bytes:
    body = bytearray(_INT16.pack(len(columns)))
    for i, (name, t) in enumerate(columns):
        body += name.encode() + b"\0"
        body += struct.pack("!ihihih", 0, 0, t.oid, t.size, t.typmod, formats[i] if formats else 0)
    return pg.message(b"T", bytes(body))


def column_formats(codes: Sequence[int], count: int) -> list[int]:
    """Bind's result format codes for ``count`` columns: none (all text), one for all, or one
    per column."""
    if not codes:
        return [0] * count
    if len(codes) == 1:
        return [codes[0]] * count
    if len(codes) != count:
        raise QueryError(
            pg.SQLSTATE_PROTOCOL_VIOLATION,
            f"bind message has {len(codes)} result formats but query has {count} columns",
        )
    if any(code not in (0, 1) for code in codes):
        raise QueryError(pg.SQLSTATE_PROTOCOL_VIOLATION, f"unsupported format code in {codes}")
    return list(codes)


def _encoder(t: PgType, binary: int) -> Callable[[Any], bytes]:
    """One column's value → bytes function (NULLs are handled by the caller)."""
    if binary:
        return lambda v: encode_binary(v, t) or b""
    if t.element is None and t.oid in (20, 21, 23):
        return lambda v: b"%d" % v
    if t.element is None and t.oid == TEXT_OID:
        return lambda v: v.encode() if type(v) is str else encode_text(v, t) or b""
    return lambda v: encode_text(v, t) or b""


def data_rows(rows: list[tuple[Any, ...]], types: list[PgType], formats: list[int]) -> list[bytes]:
    """DataRow messages; the per-value work is one call of a per-column encoder."""
    out = []
    count = _INT16.pack(len(types))
    encoders = [_encoder(t, f) for t, f in zip(types, formats, strict=True)]
    pack = _INT32.pack
    null = b"\xff\xff\xff\xff"
    for row in rows:
        parts = [count]
        for value, encode in zip(row, encoders, strict=True):
            if value is None:
                parts.append(null)
            else:
                encoded = encode(value)
                parts.append(pack(len(encoded)))
                parts.append(encoded)
        body = b"".join(parts)
        out.append(b"D" + pack(len(body) + 4) + body)
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
    if oid in ARRAY_ELEMENT:
        element = ARRAY_ELEMENT[oid]
        if binary:
            return _binary_array(raw, element)
        return [
            None if item is None else decode_param(item.encode(), element, False)
            for item in _text_array(raw.decode())
        ]
    if binary:
        decoder = _BINARY_PARAMS.get(oid)
        if decoder is None:
            raise QueryError("0A000", f"binary parameters of type {oid} are not supported")
        return decoder(raw)
    text = raw.decode()
    if oid in (20, 21, 23, 26):
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


def _text_array(text: str) -> list[str | None]:
    """The items of a one-dimensional array literal, ``{1,NULL,"a b"}``."""
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"malformed array literal: {text!r}")
    items: list[str | None] = []
    body, i = text[1:-1], 0
    while i < len(body):
        if body[i] == '"':
            i += 1
            chars = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i])
                i += 1
            items.append("".join(chars))
            i += 1
        else:
            end = body.find(",", i)
            end = len(body) if end < 0 else end
            item = body[i:end].strip()
            if item.startswith("{"):
                raise ValueError("multidimensional array parameters are not supported")
            items.append(None if item.upper() == "NULL" else item)
            i = end
        i += 1  # the comma
    return items


def _binary_array(raw: bytes, element: int) -> list[object]:
    ndim, _, _ = struct.unpack_from("!iii", raw)
    if ndim == 0:
        return []
    if ndim != 1:
        raise ValueError("multidimensional array parameters are not supported")
    (count,) = struct.unpack_from("!i", raw, 12)
    pos, items = 20, []
    for _ in range(count):
        (length,) = struct.unpack_from("!i", raw, pos)
        pos += 4
        items.append(None if length < 0 else decode_param(raw[pos : pos + length], element, True))
        pos += max(length, 0)
    return items


_PG_EPOCH = datetime.datetime(2000, 1, 1)


def _numeric_param(raw: bytes) -> Decimal:
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", raw)
    if sign == 0xC000:
        return Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return Decimal("Infinity" if sign == 0xD000 else "-Infinity")
    digits = struct.unpack_from(f"!{ndigits}h", raw, 8)
    value = sum(Decimal(d) * Decimal(10000) ** (weight - i) for i, d in enumerate(digits))
    value = value.quantize(Decimal(1).scaleb(-dscale)) if digits else Decimal(0).scaleb(-dscale)
    return -value if sign == 0x4000 else value


def _micro(raw: bytes, offset: int = 0) -> datetime.timedelta:
    return datetime.timedelta(microseconds=struct.unpack_from("!q", raw, offset)[0])


def _interval_param(raw: bytes) -> datetime.timedelta:
    _, days, months = struct.unpack("!qii", raw)
    return _micro(raw) + datetime.timedelta(days=days + 30 * months)


_BINARY_PARAMS: dict[int, Callable[[bytes], object]] = {
    16: lambda raw: raw != b"\0",
    17: bytes,
    20: lambda raw: struct.unpack("!q", raw)[0],
    21: lambda raw: struct.unpack("!h", raw)[0],
    23: lambda raw: struct.unpack("!i", raw)[0],
    26: lambda raw: struct.unpack("!I", raw)[0],
    25: lambda raw: raw.decode(),
    700: lambda raw: struct.unpack("!f", raw)[0],
    701: lambda raw: struct.unpack("!d", raw)[0],
    1043: lambda raw: raw.decode(),
    705: lambda raw: raw.decode(),
    0: lambda raw: raw.decode(),
    1700: _numeric_param,
    1082: lambda raw: datetime.date(2000, 1, 1) + datetime.timedelta(struct.unpack("!i", raw)[0]),
    1083: lambda raw: (datetime.datetime.min + _micro(raw)).time(),
    1114: lambda raw: _PG_EPOCH + _micro(raw),
    1184: lambda raw: (_PG_EPOCH + _micro(raw)).replace(tzinfo=datetime.UTC),
    1186: _interval_param,
    2950: lambda raw: uuid.UUID(bytes=raw),
}


_KINDS = {
    "select": "SELECT",
    "with": "SELECT",
    "from": "SELECT",
    "values": "SELECT",
    "table": "SELECT",
    "insert": "INSERT",
    "update": "UPDATE",
    "delete": "DELETE",
}
_FIRST_WORD = re.compile(r"\s*\(*\s*([A-Za-z]+)")


def _single_statement(text: str) -> tuple[str, str] | None:
    """A lone SELECT/INSERT/UPDATE/DELETE and its kind, recognised without DuckDB's parser
    (which costs about a millisecond on a TPC-H query); None when not sure."""
    body = text.rstrip().rstrip(";")
    if ";" in body or "--" in body or "/*" in body:
        return None
    match = _FIRST_WORD.match(body)
    kind = _KINDS.get(match.group(1).lower()) if match else None
    return (body, kind) if kind else None


def _answered(answer: compat.LocalAnswer, format_codes: Sequence[int] = ()) -> Result:
    """A statement answered by the proxy itself, as a Result."""
    types = [t for _, t in answer.columns]
    formats = column_formats(format_codes, len(types))
    return Result(answer.columns, data_rows(answer.rows, types, formats), answer.tag, formats)


# -- execution (worker threads) ------------------------------------------------------------


def execute(
    cursor: duckdb.DuckDBPyConnection,
    query: str,
    params: Sequence[object],
    kind: str,
    format_codes: Sequence[int] = (),
    profile: bool = False,
) -> Result:
    started = time.perf_counter()
    try:
        relation = cursor.execute(query, list(params) if params else None)
        description = relation.description
        rows = relation.fetchall() if description else []
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), _first_line(e)) from None
    latency = time.perf_counter() - started
    cpu_time = None
    if profile:
        latency, cpu_time = _profiled(cursor, latency)
    columns = [(d[0], pg_type(str(d[1]))) for d in description or []]
    is_count = kind in ("INSERT", "UPDATE", "DELETE") and [c[0] for c in columns] == ["Count"]
    tag = command_tag(kind, query, rows, bool(columns) and not is_count)
    if is_count:
        return Result([], [], tag, [], latency, cpu_time)
    formats = column_formats(format_codes, len(columns))
    encoded = data_rows(rows, [t for _, t in columns], formats)
    return Result(columns, encoded, tag, formats, latency, cpu_time)


def _profiled(cursor: duckdb.DuckDBPyConnection, latency: float) -> tuple[float, float | None]:
    """DuckDB's wall time and CPU time (summed over its threads) for the last statement."""
    try:
        info = json.loads(cursor.get_profiling_information(format="json"))
        query = info.get("query", {})
        return float(query.get("total_time", latency)), float(query["cpu_time"])
    except (duckdb.Error, ValueError, KeyError, TypeError):
        return latency, None  # statements the profiler does not cover (SET, BEGIN …)


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
    class_name: str = ""
    failed: bool = False


class EmbeddedConnection(asyncio.Protocol):
    """The server side of protocol v3 for one client, on one DuckDB cursor."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.scanner = FrameScanner(startup=True, max_message=server.max_message)
        self.inbox: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.status = b"I"
        self.settings: dict[str, str] = {}  # PostgreSQL-only parameters SET in this session
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
            with contextlib.suppress(duckdb.Error):  # the database may be closing already
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
        self.cursor = self.server.backend.cursor(params.get("user", "duckdb"))
        self.settings["application_name"] = params.get("application_name", "")
        out = bytearray(pg.message(b"R", _INT32.pack(0)))
        settings = {
            "server_version": self.server.backend.server_version,
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
        except QueryError as e:  # Refused too
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

    @property
    def backend_pid(self) -> int | None:
        """None: no process of its own runs this client's statements (DuckDB's threads are
        this process's; training samples them directly)."""
        return None

    async def _admit(self, sql: str) -> None:
        if self.batch.job is not None:
            return
        job = self.server.gate.new_job()
        query_class = classify_sql(sql)
        self.batch.class_name = query_class.name
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

    async def _run(
        self, query: str, params: Sequence[object], kind: str, formats: Sequence[int] = ()
    ) -> Result:
        if self.status == b"E" and kind != "TRANSACTION":
            raise QueryError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )
        assert self.cursor is not None
        if kind.startswith(_DRIVER):
            return _answered(compat.driver_answer(kind[len(_DRIVER) :], list(params)), formats)
        local = self._local(query) or self._transaction_warning(query, kind)
        if local is not None:
            return local
        loop = asyncio.get_running_loop()
        backend = self.server.backend
        query = compat.rewrite(query, backend.version_string)
        self.running = True
        try:
            result = await loop.run_in_executor(
                backend.pool,
                execute,
                self.cursor,
                query,
                params,
                kind,
                formats,
                backend.profile and bool(self.server.observers),
            )
        finally:
            self.running = False
        self._track_transaction(result.tag)
        if self.server.observers:
            measured = Measurement(
                self.batch.class_name, result.latency, result.cpu_time, self.batch.job
            )
            for observer in self.server.observers:
                observer(measured)
        return result

    def _local(self, sql: str) -> Result | None:
        """A PostgreSQL-only statement answered here (SHOW, SET, SAVEPOINT …), or None."""
        try:
            answer = compat.local_statement(sql, self.settings)
        except compat.Unsupported as e:
            raise QueryError("0A000", str(e)) from None
        return None if answer is None else _answered(answer)

    def _transaction_warning(self, query: str, kind: str) -> Result | None:
        """PostgreSQL warns, where DuckDB fails, on BEGIN inside a transaction block and on
        COMMIT or ROLLBACK outside one."""
        if kind != "TRANSACTION":
            return None
        verb = query.lstrip()[:5].upper()
        if self.status == b"T" and verb in ("BEGIN", "START"):
            message, sqlstate, tag = "there is already a transaction in progress", "25001", "BEGIN"
        elif self.status == b"I" and verb in ("COMMI", "END", "ROLLB", "ABORT"):
            message, sqlstate = "there is no transaction in progress", "25P01"
            tag = "ROLLBACK" if verb in ("ROLLB", "ABORT") else "COMMIT"
        else:
            return None
        self.out += pg.error_response(sqlstate, message, severity="WARNING", kind=b"N")
        return Result([], [], tag, [])

    def _track_transaction(self, tag: str) -> None:
        if tag == "BEGIN":
            self.status = b"T"
        elif tag in ("COMMIT", "ROLLBACK"):
            self.status = b"I"

    # simple protocol

    async def _simple(self, text: str) -> None:
        self.batch = _Batch()
        assert self.cursor is not None
        local = self._local(text)
        if local is not None:
            self._send_result(local)
            self.out += pg.ready_for_query(self.status)
            self._flush()
            return
        statements = self._statements(text)
        if not statements:
            self.out += pg.message(b"I")
        else:
            await self._admit(text)
            for query, kind in statements:
                self._send_result(await self._run(query, (), kind))
        self._finish_batch()
        self.out += pg.ready_for_query(self.status)
        self._flush()

    def _statements(self, text: str) -> list[tuple[str, str]]:
        """The statements of a Query message and their kinds. When DuckDB's parser fails on
        the whole text it is split with PostgreSQL's (pglast) to find the statements answered
        here (``BEGIN; SAVEPOINT x``); a piece DuckDB cannot parse keeps DuckDB's error."""
        assert self.cursor is not None
        single = _single_statement(text)
        if single is not None:
            return [single]
        try:
            return [(st.query, st.type.name) for st in self.cursor.extract_statements(text)]
        except duckdb.Error as e:
            error = QueryError(sqlstate_for(e), _first_line(e))
        try:
            pieces = pglast.split(text)
        except Exception:  # pglast's parse errors: DuckDB's error is the one to report
            raise error from None
        if len(pieces) < 2:
            if pieces and self._local_parse(pieces[0]):
                return [(pieces[0], "LOCAL")]
            if pieces and compat.begin_statement(pieces[0]):
                return [("BEGIN", "TRANSACTION")]
            raise error
        out: list[tuple[str, str]] = []
        for piece in pieces:
            out.extend(self._statements(piece))
        return out

    def _send_result(self, result: Result) -> None:
        if result.columns:
            self.out += row_description(result.columns)
            self.out += b"".join(result.rows)
        self.out += pg.message(b"C", result.tag.encode() + b"\0")

    # extended protocol

    def _parse(self, body: bytes) -> None:
        name, pos = pg.read_cstring(body, 0)
        query, pos = pg.read_cstring(body, pos)
        (count,) = struct.unpack_from("!h", body, pos)
        types = list(struct.unpack_from(f"!{count}i", body, pos + 2)) if count else []
        nparams = max((int(n) for n in _PARAM.findall(query)), default=0)
        types += [0] * (nparams - len(types))
        assert self.cursor is not None
        driver = compat.driver_statement(query)
        if driver is not None:
            kind = _DRIVER + driver  # answered at Execute
            types = [1028] if driver == "typeinfo" else []
        elif _LOCAL_HEAD.match(query) and self._local_parse(query):
            kind = "LOCAL"  # answered at Execute
        else:
            statements = self._statements(query) if query.strip() else []
            if len(statements) > 1:
                raise QueryError(
                    "42601", "cannot insert multiple commands into a prepared statement"
                )
            query, kind = statements[0] if statements else (query, "EMPTY")
        if kind not in ("LOCAL", "EMPTY") and driver is None:
            query = compat.rewrite(query, self.server.backend.version_string)
        if 0 in types:
            inferred = compat.infer_parameter_types(query, len(types), self._catalog())
            types = [
                oid or (pg_type(guess).oid if guess else TEXT_OID)
                for oid, guess in zip(types, inferred, strict=True)
            ]
        self.statements[name] = Prepared(query, types, kind)
        self.out += pg.message(b"1")

    def _catalog(self) -> dict[str, list[tuple[str, str]]]:
        """Every table's columns and their DuckDB types, for parameter type inference."""
        assert self.cursor is not None
        tables: dict[str, list[tuple[str, str]]] = {}
        rows = self.cursor.execute(
            "select lower(table_name), lower(column_name), data_type from duckdb_columns() "
            "order by table_name, column_index"
        ).fetchall()
        for table, column, kind in rows:
            tables.setdefault(table, []).append((column, kind))
        return tables

    def _local_parse(self, query: str) -> bool:
        """Whether ``query`` is answered here; a SET is applied at Execute, not now."""
        try:
            return compat.local_statement(query, dict(self.settings)) is not None
        except compat.Unsupported:
            return True  # fails at Execute, as PostgreSQL fails it there

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
        self.portals[portal] = Portal(statement, params, results)
        self.out += pg.message(b"2")

    async def _describe(self, body: bytes) -> None:
        target, name = body[:1], pg.read_cstring(body, 1)[0]
        if target == b"S":
            statement = self.statements.get(name)
            if statement is None:
                raise QueryError("26000", f'prepared statement "{name}" does not exist')
            oids = statement.param_types
            self.out += pg.message(
                b"t", _INT16.pack(len(oids)) + b"".join(_INT32.pack(o) for o in oids)
            )
            if statement.kind.startswith(_DRIVER):
                columns = compat.driver_answer(statement.kind[len(_DRIVER) :], []).columns
                self.out += row_description(columns)
            elif statement.kind == "LOCAL":
                local = self._local(statement.query)
                columns = local.columns if local is not None else []
                self.out += row_description(columns) if columns else pg.message(b"n")
            elif statement.kind == "SELECT":
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
        if result.columns:
            self.out += row_description(result.columns, result.formats)
        else:
            self.out += pg.message(b"n")

    async def _portal_result(self, portal: Portal) -> Result:
        if portal.result is None:
            statement = portal.statement
            await self._admit(statement.query)
            portal.result = await self._run(
                statement.query, portal.params, statement.kind, portal.formats
            )
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
        self.observers: list[Callable[[Measurement], None]] = []

    def protocol(self) -> EmbeddedConnection:
        return EmbeddedConnection(self)

    def cancel(self, pid: int, secret: int) -> None:
        target = self.by_key.get((pid, secret))
        if target is not None:
            target.cancel()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        for conn in list(self.connections):
            conn._fatal(pg.SQLSTATE_ADMIN_SHUTDOWN, "the proxy is shutting down")
        if tasks:  # each client's loop ends once its connection is lost
            await asyncio.wait(tasks, timeout=10)
        if self._server is not None:
            await self._server.wait_closed()
        self.backend.close()
