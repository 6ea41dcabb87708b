"""One client's session on DuckDB: what its Query, Parse, Bind, Describe and Execute say.

``DuckDBSession`` holds a client's transaction status as PostgreSQL reports it, the PostgreSQL
parameters it SET, its prepared statements and portals, and — only while it needs one — a
DuckDB connection lent by the backend (``Cursors``): from the first statement that runs on
DuckDB to the ReadyForQuery that leaves nothing on it (no transaction, no half-read result, no
DuckDB state of its own: a session that SETs a DuckDB option, creates a temporary object,
PREPAREs or runs a PRAGMA keeps its connection to its end). An idle client holds none. It
writes the replies to each message into the connection's output buffer. It knows
nothing of sockets or of batches: the connection (``proxy.backends.embedded.server``) hands it
messages one at a time and gives it admission when a statement is about to run (``admit``).

Statements PostgreSQL clients send that DuckDB does not understand are answered here or
rewritten (``compat``); a multi-statement Query is split first with DuckDB's parser, then with
PostgreSQL's where DuckDB's fails.

A message is read field by field as PostgreSQL reads it (``_Fields``): a malformed one — a
string without its NUL, a count with fewer fields than it says, bytes left over, a Describe or
Close of neither a statement nor a portal, format codes other than text and binary — is
answered as PostgreSQL answers it, with an error (08P01, or 22023 for a format code) after
which the session goes on, never by ending the connection.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import re
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import duckdb
import pglast

from admission.classify import QueryClass
from admission.contention import CONFLICT_STATES, WRITE_KINDS
from proxy.backends.embedded import catalog, compat, copy, lockdown
from proxy.backends.embedded.advisory import AdvisoryCall, advisory_call
from proxy.backends.embedded.executor import (
    CHUNK_ROWS,
    TEXT_OID,
    DuckDBBackend,
    Lease,
    Measurement,
    QueryError,
    Result,
    alter_around_indexes,
    answered,
    describe,
    drops_constraint,
    execute,
    first_line,
    row_description,
)
from proxy.backends.embedded.params import decode_param
from proxy.backends.errors import sqlstate_for
from proxy.backends.pgtypes import BOOL, PgType, pg_type, text_encoder
from proxy.contention import ContentionGate, ContentionWaitCancelled, ContentionWaitTimedOut
from proxy.wire import protocol as pg
from proxy.wire.frontend import Batch

__all__ = ["Admission", "DuckDBSession", "Portal", "Prepared"]

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_UINT16 = struct.Struct("!H")
_UINT32 = struct.Struct("!I")
MAX_PARAMETERS = 65535  # PostgreSQL's limit: a statement's $n beyond it do not exist
_PARAM = re.compile(r"\$(\d+)")
_LOCAL_HEAD = re.compile(r"\s*(?:show|set|savepoint|release|rollback)\b", re.I)
_DRIVER = "DRIVER:"  # statement kind of a driver's catalog query answered here


_ENDS_TRANSACTION = re.compile(r"\s*(?:commit|end|rollback|abort)\b", re.I)
# statements that leave state of the session's own on its DuckDB connection (it keeps it then;
# see ``_pins``)
_PINS = frozenset({"VARIABLE_SET", "PREPARE", "EXECUTE", "LOAD", "MULTI"})
_MAY_PIN = frozenset({"CREATE", "CREATE_FUNC", "ALTER", "DROP"})
_TEMP = re.compile(r"\btemp(?:orary)?\b", re.I)
_SETSEED = re.compile(r"\bsetseed\s*\(", re.I)  # random()'s seed is the connection's
_CHECKPOINT = re.compile(r"\s*call\s+(?:force_)?checkpoint\s*\(", re.I)


def _pins(query: str, kind: str) -> bool:
    """Whether ``query``, run, left state of the session's own on its DuckDB connection: a
    setting, a variable, a temporary object, a prepared statement, random()'s seed."""
    if kind in _PINS:
        return True
    if kind == "SET":  # (but not one the server answers as a no-op: SET TimeZone to UTC)
        try:
            return not lockdown.check(query, kind)
        except lockdown.LockdownError:
            return False
    if kind == "PRAGMA":
        return not lockdown.read_only_pragma(query)
    if kind == "CALL":
        return _CHECKPOINT.match(query) is None
    if kind in _MAY_PIN:
        return _TEMP.search(query) is not None
    return kind == "SELECT" and "setseed" in query.lower() and _SETSEED.search(query) is not None


_NO_TRANSACTION = "no transaction is active"


def _end_transaction(cursor: duckdb.DuckDBPyConnection) -> None:
    """Roll back whatever transaction DuckDB holds for this session, if any. A statement
    that fails where the client has no transaction open must leave none open: a BEGIN
    interrupted by a CancelRequest can have started DuckDB's transaction and then aborted it,
    and every statement after it would fail until a ROLLBACK the client has no reason to send
    (and that this session, seeing no transaction, would answer itself)."""
    with contextlib.suppress(duckdb.Error):  # none was open: the usual case
        cursor.execute("rollback")


def _protocol_violation(text: str) -> QueryError:
    return QueryError(pg.SQLSTATE_PROTOCOL_VIOLATION, text)


class _Fields:
    """A message body read field by field, as PostgreSQL's ``pq_getmsg*`` read it: a field
    that is not there is the error PostgreSQL answers (08P01), not an exception of ours."""

    __slots__ = ("body", "pos")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.pos = 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.body):
            raise _protocol_violation("insufficient data left in message")
        data = self.body[self.pos : self.pos + size]
        self.pos += size
        return data

    def string(self) -> str:
        end = self.body.find(0, self.pos)
        if end < 0:
            raise _protocol_violation("invalid string in message")
        text = self.body[self.pos : end].decode("utf-8", "replace")
        self.pos = end + 1
        return text

    def byte(self) -> bytes:
        if self.pos >= len(self.body):
            raise _protocol_violation("no data left in message")
        return self._take(1)

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def count(self) -> int:
        """A number of fields to follow (unsigned, as PostgreSQL reads it)."""
        value: int = _UINT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def oid(self) -> int:
        value: int = _UINT32.unpack(self._take(4))[0]
        return value

    def value(self) -> bytes | None:
        """A parameter value: its length, then its bytes (length -1: NULL)."""
        length = self.int32()
        return None if length == -1 else self._take(length)

    def end(self) -> None:
        if self.pos != len(self.body):
            raise _protocol_violation("invalid message format")


def _target(fields: _Fields, message: str) -> bytes:
    """A Describe's or Close's target: S (statement) or P (portal)."""
    target = fields.byte()
    if target not in (b"S", b"P"):
        raise _protocol_violation(f"invalid {message} message subtype {target[0]}")
    return target


def _format_codes(fields: _Fields) -> tuple[int, ...]:
    codes = tuple(fields.int16() for _ in range(fields.count()))
    for code in codes:
        if code not in (0, 1):
            raise QueryError("22023", f"unsupported format code: {code}")
    return codes


class Admission(Protocol):
    """What a session asks of its connection: admission for the batch it is running."""

    @property
    def batch(self) -> Batch | None: ...

    async def admit(self, sql: str) -> None: ...

    def classify(self, sql: str) -> QueryClass:
        """The statement shape of ``sql``, as admission classifies it."""
        ...

    async def drain(self) -> bool:
        """Write the replies so far, and wait while the client is slower to read them;
        False when the client is gone."""

    async def copy_data(self) -> bytes | None:
        """The next CopyData of a COPY FROM STDIN (None at its CopyDone)."""


@dataclass(slots=True)
class Prepared:
    query: str
    param_types: list[int]
    kind: str
    text: str = ""  # the client's statement, before the rewrites (result columns named by it)


@dataclass(slots=True)
class Portal:
    statement: Prepared
    params: list[object]
    formats: tuple[int, ...] = ()  # result format codes from Bind
    result: Result | None = None
    sent: int = 0
    cursor: bool = False  # a SQL cursor (DECLARE): FETCH, MOVE and CLOSE name it
    held: bool = False  # WITH HOLD: outlives its transaction, its rows read whole at DECLARE
    declared: str = ""  # (the DECLARE statement, for pg_cursors)


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


INTERRUPT_AGAIN = 0.05  # seconds before a statement still running is interrupted again
_SESSION_HEAD = re.compile(r"\s*(declare|fetch|move|close|deallocate|discard)\s", re.I)
_DISCARD = re.compile(r"\s*discard\s+(?P<what>all|plans|sequences|temp|temporary)\s*;?\s*$", re.I)
_IDENTIFIER = compat.IDENTIFIER
_NAME = rf"(?P<name>{_IDENTIFIER})"
_NAME_OR_ALL = rf"(?P<name>all|{_IDENTIFIER})"
_DEALLOCATE = re.compile(r"\s*deallocate\s+(?:prepare\s+)?" + _NAME_OR_ALL + r"\s*;?\s*$", re.I)
_DECLARE = re.compile(
    r"\s*declare\s+" + _NAME + r"\s+(?P<options>(?:[a-z]+\s+)*?)cursor\s+"
    r"(?P<hold>(?:with|without)\s+hold\s+)?for\s+(?P<query>.+?)\s*;?\s*$",
    re.I | re.S,
)
_FETCH = re.compile(
    r"\s*(?P<verb>fetch|move)\s+(?P<direction>(?:next|all|forward(?:\s+(?:all|\d+))?|\d+)\s+)?"
    r"(?:(?:from|in)\s+)?" + _NAME + r"\s*;?\s*$",
    re.I,
)
_PG_CURSORS = re.compile(r"(?:\bpg_catalog\s*\.\s*)?\bpg_cursors\b", re.I)
# an alias follows (FROM pg_cursors c, … AS c): not a keyword, a comma, ")" or the end
_ALIAS_NEXT = re.compile(
    r"\s+(?!(?:where|join|left|right|inner|full|cross|natural|on|using|group|order|limit|"
    r"offset|union|except|intersect|having|window|qualify|returning)\b)(?:as\s+)?[A-Za-z_\"]",
    re.I,
)
_CLOSE = re.compile(r"\s*close\s+" + _NAME_OR_ALL + r"\s*;?\s*$", re.I)


def _cursor_name(text: str) -> str:
    """A cursor's name as PostgreSQL keeps it: quoted as written, else in lower case."""
    if text.startswith('"'):
        return text[1:-1].replace('""', '"')
    return text.lower()


def _fetch_count(direction: str | None) -> int:
    """How many rows a FETCH or MOVE direction asks for (forward only)."""
    words = (direction or "").lower().split()
    if not words or words == ["next"] or words == ["forward"]:
        return 1
    if words[-1] == "all":
        return sys.maxsize
    return int(words[-1])


def _split(text: str) -> list[str]:
    try:
        return list(pglast.split(text))
    except Exception:  # pglast's parse errors: the caller's own error path reports it
        return []


VOID = PgType("void", 2278, 4)  # (what pg_advisory_lock returns)
COPY_BATCH = 50_000  # rows of a COPY FROM STDIN inserted at once
# parameter types inferred for a statement's text (and the types its Parse gave): a client that
# parses the same text again (pgbench -M extended, psycopg) reads no catalog; forgotten when
# any session changes the schema (``_schema_changed``)
_INFERRED: dict[tuple[str, tuple[int, ...]], list[int]] = {}
_KEEP_INFERRED = 1024
_SCHEMA_KINDS = frozenset({"CREATE", "ALTER", "DROP", "ATTACH", "DETACH"})


def _copy_width(cursor: duckdb.DuckDBPyConnection, table: str, columns: str | None) -> int:
    """How many columns a COPY FROM STDIN fills: its table's, or its column list's
    (a worker thread; QueryError if the table or a column is not there)."""
    try:
        relation = cursor.execute(f"select {columns or '*'} from {table} limit 0")
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), first_line(e)) from None
    return len(relation.description or [])


def _copy_insert(
    cursor: duckdb.DuckDBPyConnection, target: str, width: int, rows: list[list[str | None]]
) -> int:
    """Rows of text fields into ``target``, DuckDB casting each to its column's type (a
    worker thread); how many went in."""
    import numpy as np

    for row in rows:
        if len(row) < width:
            raise QueryError("22P04", f"missing data for column {len(row) + 1} of {width}")
        if len(row) > width:
            raise QueryError("22P04", "extra data after last expected column")
    data = {f"c{i}": np.array([row[i] for row in rows], dtype=object) for i in range(width)}
    name = "admission_copy_rows"
    try:
        cursor.register(name, data)
        cursor.execute(f"insert into {target} select * from {name}")
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), first_line(e)) from None
    finally:
        with contextlib.suppress(duckdb.Error):
            cursor.unregister(name)
    return len(rows)


def _copy_query(
    cursor: duckdb.DuckDBPyConnection, query: str
) -> tuple[list[str], Callable[[], list[list[bytes | None]]]]:
    """The column names of a COPY TO STDOUT's query and a function that reads its next rows
    as PostgreSQL's text output (a worker thread)."""
    try:
        relation = cursor.execute(query)
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), first_line(e)) from None
    description = relation.description or []
    encoders = [text_encoder(pg_type(str(d[1]))) for d in description]

    def fetch() -> list[list[bytes | None]]:
        try:
            chunk = relation.fetchmany(CHUNK_ROWS)
        except duckdb.Error as e:
            raise QueryError(sqlstate_for(e), first_line(e)) from None
        return [
            [None if v is None else encode(v) for v, encode in zip(row, encoders, strict=True)]
            for row in chunk
        ]

    return [str(d[0]) for d in description], fetch


def _check_catalogs(query: str) -> None:
    """``lockdown.check_catalogs`` on what the client sent (the catalog translation turns a
    name in admission_pg into another)."""
    try:
        lockdown.check_catalogs(query)
    except lockdown.LockdownError as e:
        raise QueryError(e.sqlstate, str(e)) from None


class DuckDBSession:
    """One client's statements, on a DuckDB connection lent while it needs one (see the module
    docstring)."""

    __slots__ = (
        "__weakref__",  # (tests see a session freed without the garbage collector)
        "backend",
        "connection",
        "database",
        "gone",
        "lease",
        "lock_wait",
        "observers",
        "open",
        "out",
        "pinned",
        "portals",
        "running",
        "samplers",
        "schema_changed",
        "settings",
        "started",
        "statements",
        "status",
        "tx_aborted",
        "tx_nesting",
        "tx_starter",
        "user",
        "xact_locks",
    )

    def __init__(
        self,
        connection: Admission,
        backend: DuckDBBackend,
        user: str,
        out: bytearray,
        observers: list[Callable[[Measurement], None]],
        samplers: Sequence[tuple[Callable[[str], bool], Callable[[Measurement], None]]] = (),
        database: str = "",
    ) -> None:
        self.connection = connection
        self.backend = backend
        self.user = user
        self.database = database  # the one it connected to (what current_database() says)
        self.lease: Lease | None = None  # the DuckDB connection lent to it now
        self.pinned = False  # it keeps its connection to its end (state of its own there)
        self.out = out  # replies not yet written (the connection's buffer)
        self.observers = observers  # the server's: one Measurement per statement run
        # the server's too: (wants, observer) — a Measurement of the statements of a class
        # (its fingerprint) that ``wants`` picks, the profiler on for those only
        self.samplers = samplers
        self.status = b"I"  # transaction status, as ReadyForQuery reports it
        self.schema_changed = False  # DDL in the open transaction block (see _INFERRED)
        self.lock_wait = False  # waiting for an advisory lock (a cancel ends the wait)
        self.xact_locks: list[tuple[tuple[int, ...], bool]] = []  # (key, shared) to its end
        self.settings: dict[str, str] = {}  # PostgreSQL-only parameters SET in this session
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.running = False  # a statement is running in a worker thread
        self.started = 0  # statements started on DuckDB so far
        self.gone = False  # the client's connection is lost
        self.open: Result | None = None  # a long result not yet read to its end
        # the open transaction, for the contention limit (admission.contention): the shape of
        # its first statement, and whether a statement of it failed on a conflict
        self.tx_starter: str | None = None
        self.tx_aborted = False
        self.tx_nesting = 0  # _admit calls not yet followed by _contended

    def interrupt(self) -> None:
        """Stop the statement running now, if any (it fails with 57014). DuckDB loses an
        interrupt that lands before its execution has begun (3 in 40 right after the call
        starts, measured), so while that same statement still runs it is interrupted again,
        every INTERRUPT_AGAIN seconds — never the next statement."""
        if self.lock_wait:
            self.lock_wait = False  # (its wait sees it and fails with 57014)
        contention = self.backend.contention
        if contention is not None:
            contention.cancel(self)  # (waiting for a place: fails with 57014)
        if self.running and self.lease is not None:
            self.lease.cursor.interrupt()
            with contextlib.suppress(RuntimeError):  # (no loop: nobody to try again)
                asyncio.get_running_loop().call_later(
                    INTERRUPT_AGAIN, self._interrupt_again, self.started, 1
                )

    def client_gone(self) -> None:
        """The client's connection is lost: what runs is stopped (``interrupt``), and a
        statement between its admission and DuckDB is not started at all."""
        self.gone = True
        self.interrupt()

    def _interrupt_again(self, started: int, tries: int) -> None:
        if not self.running or self.started != started or self.lease is None:
            return  # it stopped (or another statement runs now)
        with contextlib.suppress(duckdb.Error):
            self.lease.cursor.interrupt()
        if tries < 200:
            asyncio.get_running_loop().call_later(
                INTERRUPT_AGAIN, self._interrupt_again, started, tries + 1
            )

    @property
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """The connection for what the event loop's thread asks DuckDB itself (parsing, the
        catalog, a SELECT's columns): the session's own while it holds one (its transaction
        sees what it wrote), else the backend's."""
        return self.lease.cursor if self.lease is not None else self.backend.utility

    async def _lend(self) -> Lease:
        """The session's DuckDB connection, lent now if it holds none."""
        if self.lease is None:
            self.lease = await self.backend.cursors.lend(self.user, self.database)
        return self.lease

    def idle(self) -> None:
        """ReadyForQuery outside a transaction: its portals end (PostgreSQL's rule: an implicit
        transaction ends at its Sync; none outlives the DuckDB connection its rows come from),
        and the connection goes back if nothing of the session's is left on it."""
        if self.status != b"I" or self.running:
            return
        for key, shared in self.xact_locks:  # (its transaction has ended)
            self.backend.advisory.give(self, key, shared)
        self.xact_locks.clear()
        for portal in self.portals.values():
            if portal.result is not None and not portal.held:
                portal.result.abandon()
        self.portals = {name: p for name, p in self.portals.items() if p.held}
        lease = self.lease
        if lease is not None and not self.pinned and self.open is None:
            self.lease = None
            self.backend.cursors.give(lease)

    def end(self) -> duckdb.DuckDBPyConnection | None:
        """The session ends: its connection goes back when clean; else the connection to close
        (in a worker thread, after ``release`` and a rollback), no longer counted as lent."""
        self.idle()
        self.backend.advisory.give_all(self)
        if self.backend.contention is not None:
            self.backend.contention.forget(self)
        lease, self.lease = self.lease, None
        if lease is None:
            return None
        self.backend.cursors.drop()
        return lease.cursor

    def _settle_now(self) -> None:
        """Read the rest of a long result still open on the cursor and keep it whole (a portal
        suspended at a row limit, a Describe before its Execute): the cursor is about to run
        something else, and a statement's rows are never lost to another's."""
        result, self.open = self.open, None
        if result is None or result.more is None:
            return
        try:
            while chunk := result.more():
                result.rows += chunk
        finally:
            # (failed part way too: nothing more is read from it — the connection may go back
            # to the backend's idle set, and a later read would take another session's rows)
            result.abandon()
        result.tag = f"SELECT {len(result.rows)}"

    async def _settle(self) -> None:
        if self.open is not None:
            await self.backend.pool.run(self._settle_now)

    def release(self) -> None:
        """The session ends: a result still open gives DuckDB its resources back, unread."""
        result, self.open = self.open, None
        if result is not None:
            result.abandon()

    def close(self, body: bytes) -> None:
        """A Close message: forget a prepared statement or a portal."""
        fields = _Fields(body)
        target = _target(fields, "CLOSE")
        name = fields.string()
        fields.end()
        (self.statements if target == b"S" else self.portals).pop(name, None)
        self.out += pg.message(b"3")

    async def _run(
        self,
        query: str,
        params: Sequence[object],
        kind: str,
        formats: Sequence[int] = (),
        text: str = "",
    ) -> Result:
        """One statement: answered here, or run on DuckDB in a worker thread. ``text``: the
        client's own statement when ``query`` was rewritten at its Parse (it names the
        result's columns)."""
        text = text or query
        if self.status == b"E" and kind != "TRANSACTION":
            raise QueryError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )
        if kind == "CURSOR":
            return await self._cursor_statement(query, params, formats)
        if kind == "COPY" and copy.STDIO.match(query):
            return await self._copy(query)
        if kind == "DEALLOCATE":
            return self._deallocate(query)
        if kind == "DISCARD":
            return await self._discard(query)
        if kind.startswith(_DRIVER):
            return answered(compat.driver_answer(kind[len(_DRIVER) :], list(params)), formats)
        local = self._local(query) or self._transaction_warning(query, kind)
        if local is not None:
            return local
        if kind == "CREATE" and compat.without_foreign_key_actions(query) is not None:
            self.out += pg.error_response(  # (``rewrite`` drops them)
                "01000", compat.FOREIGN_KEY_ACTION_WARNING, severity="WARNING", kind=b"N"
            )
        if kind in _SCHEMA_KINDS:
            _INFERRED.clear()
            self.schema_changed = self.status != b"I"
        elif kind == "TRANSACTION" and self.schema_changed:  # (a ROLLBACK undoes it)
            _INFERRED.clear()
            self.schema_changed = False
        backend = self.backend
        _check_catalogs(query)
        query = self._with_cursors(query)
        query = compat.rewrite(catalog.translate(query) or query, self.backend.schema)
        await self._settle()
        if kind == "ALTER":  # (an indexed table: its indexes carried along, see the function)
            altered = await self._alter_around_indexes(query)
            if altered is not None:
                return altered
        batch = self.connection.batch
        query_class = batch.query_class if batch is not None else None
        fingerprint = query_class.fingerprint if query_class is not None else ""
        listening = list(self.observers)
        for wants, observer in self.samplers:
            if wants(fingerprint):
                listening.append(observer)
        lease = await self._lend()
        cursor = lease.cursor
        if kind == "TRANSACTION":  # (the profiler left as it is: a PRAGMA in a transaction
            profile = switch = False  # that failed fails, and the ROLLBACK with it)
        else:
            profile = backend.profile and bool(listening)
            switch = profile != lease.profiling  # (switched in the statement's own thread hop)
            lease.profiling = profile
        if self.gone:  # (lost while this statement waited for its admission or connection)
            raise QueryError("57014", "canceling statement: the client went away")
        self.running = True
        self.started += 1  # (names this statement for a repeated interrupt)
        try:
            result = await backend.pool.run(
                execute,
                cursor,
                query,
                params,
                kind,
                formats,
                profile,
                # only live samples (no observer of every statement) take the cached base
                None if self.observers else backend.memory_base,
                switch,
                text,
            )
        except asyncio.CancelledError:
            self.pinned = True  # a worker thread may still use the connection: never lent again
            raise
        except QueryError as e:
            self.running = False  # (a CancelRequest must not interrupt the clean-up)
            if switch:
                lease.profiling = None  # (whether the switch took is not known: again next time)
            ends = kind == "TRANSACTION" and _ENDS_TRANSACTION.match(query) is not None
            if self.status == b"I" or ends:
                await backend.pool.run(_end_transaction, cursor)
                had = self.status
                self.status = b"I"  # a failed COMMIT ends the transaction, as in PostgreSQL
                if had != b"I" and _NO_TRANSACTION in str(e):
                    # DuckDB had already ended it (an interrupted COMMIT, say): the client's
                    # ROLLBACK or COMMIT finds nothing left to end, and succeeds
                    return Result([], [], "ROLLBACK", [])
            raise
        finally:
            self.running = False
        if result.more is not None:
            self.open = result
        if not self.pinned and _pins(query, kind):
            self.pinned = True
        self._track_transaction(result.tag)
        if listening:
            measured = Measurement(
                query_class.name if query_class is not None else "",
                result.latency,
                result.cpu_time,
                batch.job if batch is not None else None,
                result.memory,
                result.spilled,
                fingerprint,
            )
            for observer in listening:
                observer(measured)
        return result

    def _local(self, sql: str) -> Result | None:
        """A PostgreSQL-only statement answered here (SHOW, SET, SAVEPOINT …), or None."""
        try:
            answer = compat.local_statement(sql, self.settings)
        except compat.Unsupported as e:
            raise QueryError("0A000", str(e)) from None
        if answer is None:
            return None
        if answer.warning is not None:
            self.out += pg.error_response("01000", answer.warning, severity="WARNING", kind=b"N")
        return answered(answer)

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

    async def _cursor_statement(
        self, query: str, params: Sequence[object], formats: Sequence[int]
    ) -> Result:
        """DECLARE, FETCH, MOVE and CLOSE of a SQL cursor (what psycopg's and psycopg2's named
        cursors send). A cursor is a portal of the session named as the cursor, as in
        PostgreSQL — a Describe of that portal (psycopg's) reads its columns; its query runs at
        its first Describe or FETCH, and a FETCH takes the next rows, streamed from DuckDB as
        they are asked for. It lives until its transaction ends — a WITH HOLD one until it is
        closed (psycopg's named cursors outside a transaction, Django's ``iterator()``): its
        rows are read whole at DECLARE and kept in the proxy's memory, as PostgreSQL keeps them
        at commit. BINARY and backward movement are refused (0A000)."""
        declare = _DECLARE.match(query)
        if declare is not None:
            name = _cursor_name(declare.group("name"))
            options = declare.group("options").lower().split()
            hold = (declare.group("hold") or "").lower().startswith("with ")
            if "binary" in options:
                raise QueryError(
                    "0A000", "BINARY cursors are not supported by the embedded DuckDB server"
                )
            if self.status == b"I" and not hold:
                raise QueryError("25P01", "DECLARE CURSOR can only be used in transaction blocks")
            if name in self.portals:
                raise QueryError("42P03", f'cursor "{name}" already exists')
            statements = self._statements(declare.group("query"))
            if len(statements) != 1 or statements[0][1] != "SELECT":
                raise QueryError("42601", "a cursor's query must be one SELECT or VALUES")
            inner, kind = statements[0]
            cursor = Portal(Prepared(inner, [], kind), list(params), cursor=True, declared=query)
            if hold:
                result = await self._portal_result(cursor)
                while (more := result.more) is not None:
                    chunk = await self.backend.pool.run(more)
                    if not chunk:
                        self._abandon(result)
                        break
                    result.rows += chunk
                cursor.held = True
            self.portals[name] = cursor
            return Result([], [], "DECLARE CURSOR", [])
        close = _CLOSE.match(query)
        if close is not None:
            target = close.group("name")
            names = (
                [n for n, p in self.portals.items() if p.cursor]
                if target.lower() == "all"
                else [_cursor_name(target)]
            )
            for name in names:
                portal = self.portals.pop(name, None)
                if portal is None:
                    raise QueryError("34000", f'cursor "{name}" does not exist')
                if portal.result is not None:
                    self._abandon(portal.result)
            return Result(
                [], [], "CLOSE CURSOR ALL" if target.lower() == "all" else "CLOSE CURSOR", []
            )
        fetch = _FETCH.match(query)
        if fetch is None:
            raise QueryError("0A000", "this form of a cursor statement is not supported")
        name = _cursor_name(fetch.group("name"))
        portal = self.portals.get(name)
        if portal is None or not portal.cursor:
            raise QueryError("34000", f'cursor "{name}" does not exist')
        count = _fetch_count(fetch.group("direction"))
        if portal.result is None:
            portal.formats = tuple(formats)
            result = await self._portal_result(portal)
        else:
            result = portal.result
            if tuple(formats) != portal.formats and any(formats):
                raise QueryError(
                    "0A000", "a cursor's rows are fetched in the format of its first FETCH"
                )
        while result.more is not None and len(result.rows) - portal.sent < count:
            more = result.more
            chunk = await self.backend.pool.run(more)
            if not chunk:
                self._abandon(result)
                break
            result.rows += chunk
        rows = result.rows[portal.sent : portal.sent + count]
        result.rows = result.rows[portal.sent + len(rows) :]  # (what is fetched is not kept)
        portal.sent = 0
        if fetch.group("verb").lower() == "move":
            return Result([], [], f"MOVE {len(rows)}", [])
        return Result(result.columns, rows, f"FETCH {len(rows)}", result.formats)

    def _with_cursors(self, query: str) -> str:
        """``query`` with PostgreSQL's ``pg_cursors`` as this session's SQL cursors (psycopg
        looks a named cursor up there before it closes it)."""
        if "pg_cursors" not in query.lower() or not _PG_CURSORS.search(query):
            return query
        rows = [
            f"({catalog.literal(name)}, {catalog.literal(p.declared)}, {str(p.held).lower()}, "
            "false, false, now())"
            for name, p in self.portals.items()
            if p.cursor
        ]
        values = ", ".join(rows) or (
            "(null::varchar, null::varchar, null::boolean, null::boolean, null::boolean, "
            "null::timestamptz)"
        )
        view = (
            f"(select * from (values {values}) as c(name, statement, is_holdable, is_binary, "
            f"is_scrollable, creation_time){'' if rows else ' where false'})"
        )

        def replaced(found: re.Match[str]) -> str:
            aliased = _ALIAS_NEXT.match(query, found.end())
            return view if aliased else view + " as pg_cursors"

        return _PG_CURSORS.sub(replaced, query)

    async def _advisory(
        self, call: AdvisoryCall, params: Sequence[object], formats: Sequence[int] = ()
    ) -> Result:
        """An advisory-lock call, answered here (see ``advisory``)."""
        if self.status == b"E":
            raise QueryError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )
        locks = self.backend.advisory
        function = call.function
        if function == "pg_advisory_unlock_all":
            locks.give_all(self)
            self.xact_locks.clear()
            value: object = ""
        else:
            try:
                key = call.key(params)
            except ValueError as e:
                raise QueryError("22023", str(e)) from None
            shared = function.endswith("_shared")
            if "unlock" in function:
                value = locks.give(self, key, shared)
                if not value:
                    kind = "ShareLock" if shared else "ExclusiveLock"
                    self.out += pg.error_response(
                        "01000",
                        f"you don't own a lock of type {kind}",
                        severity="WARNING",
                        kind=b"N",
                    )
            elif "try_" in function:
                value = locks.try_take(self, key, shared)
            else:
                self.lock_wait = True
                try:
                    await locks.take(self, key, shared, lambda: not self.lock_wait or self.gone)
                except TimeoutError:
                    raise QueryError("57014", "canceling statement due to user request") from None
                finally:
                    self.lock_wait = False
                value = ""
            if "xact" in function and value is not False:
                self.xact_locks.append((key, shared))
        column = (call.column, BOOL if call.returns_bool else VOID)
        return answered(compat.LocalAnswer("SELECT 1", [column], [(value,)]), formats)

    async def _alter_around_indexes(self, query: str) -> Result | None:
        lease = await self._lend()
        self.running = True
        self.started += 1
        try:
            return await self.backend.pool.run(
                alter_around_indexes, lease.cursor, query, self.status != b"I"
            )
        finally:
            self.running = False

    async def _copy(self, query: str) -> Result:
        """COPY … FROM STDIN or TO STDOUT: the data moved between the client and DuckDB here,
        in PostgreSQL's text or CSV format (see ``copy``). Rows read from the client go in at
        most COPY_BATCH at a time, all in one transaction, as PostgreSQL's COPY is one
        statement; rows written out are sent a chunk at a time as the client reads them."""
        try:
            statement = copy.copy_statement(query)
        except copy.CopyError as e:
            raise QueryError(e.sqlstate, str(e)) from None
        lease = await self._lend()
        pool = self.backend.pool
        if statement.direction == "out":
            return await self._copy_out(statement, lease.cursor)
        assert statement.table is not None
        target = statement.table + (f" ({statement.columns})" if statement.columns else "")
        width = await pool.run(_copy_width, lease.cursor, statement.table, statement.columns)
        self.out += pg.message(b"G", struct.pack("!bh", 0, width) + b"\0\0" * width)
        own = self.status == b"I"  # (outside a transaction block: one of its own)
        failed: QueryError | None = None
        rows: list[list[str | None]] = []
        count = 0
        pending, first = "", True
        decoder = codecs.getincrementaldecoder("utf-8")()
        csv_text: list[str] = []
        if own:
            await pool.run(lease.cursor.execute, "BEGIN")
        self.running = True  # (in service until it ends: a cancel or a lost client stops it)
        self.started += 1
        try:
            while (data := await self.connection.copy_data()) is not None:
                if failed is not None:
                    continue  # (the rest is read and dropped, up to the client's CopyDone)
                try:
                    text = decoder.decode(data)
                except UnicodeDecodeError:
                    failed = QueryError("22021", "invalid byte sequence for encoding UTF8")
                    continue
                if statement.options.format == "csv":  # (quoted fields may span lines)
                    csv_text.append(text)
                    continue
                lines, pending = copy.split_lines(pending, text)
                rows.extend(copy.read_rows(lines, statement.options, first))
                first = False
                if len(rows) >= COPY_BATCH:
                    try:
                        count += await pool.run(_copy_insert, lease.cursor, target, width, rows)
                    except QueryError as e:
                        failed = e
                    rows = []
            if failed is not None:
                raise failed
            tail = pending + decoder.decode(b"", final=True)
            if csv_text or statement.options.format == "csv":
                whole = copy.csv_lines("".join(csv_text) + tail)
                rows = list(copy.read_rows(whole, statement.options, True))
            elif tail:
                rows.extend(copy.read_rows([tail], statement.options, first))
            if rows:
                count += await pool.run(_copy_insert, lease.cursor, target, width, rows)
            if own:
                await pool.run(lease.cursor.execute, "COMMIT")
        except (copy.CopyError, QueryError, duckdb.Error) as e:
            self.running = False  # (a CancelRequest must not interrupt the clean-up)
            if own:
                await pool.run(_end_transaction, lease.cursor)
            if isinstance(e, QueryError):
                raise
            sqlstate = e.sqlstate if isinstance(e, copy.CopyError) else sqlstate_for(e)
            raise QueryError(sqlstate, first_line(e)) from None
        finally:
            self.running = False
        return Result([], [], f"COPY {count}", [])

    async def _copy_out(
        self, statement: copy.CopyStatement, cursor: duckdb.DuckDBPyConnection
    ) -> Result:
        pool = self.backend.pool
        if statement.query is not None:
            query = statement.query
        else:
            columns = statement.columns or "*"
            query = f"select {columns} from {statement.table}"
        _check_catalogs(query)
        query = compat.rewrite(catalog.translate(query) or query, self.backend.schema)
        names, fetch = await pool.run(_copy_query, cursor, query)
        options = statement.options
        self.out += pg.message(b"H", struct.pack("!bh", 0, len(names)) + b"\0\0" * len(names))
        if options.header:
            self.out += pg.message(
                b"d", copy.write_lines([[n.encode() for n in names]], options)[0]
            )
        count = 0
        while rows := await pool.run(fetch):
            count += len(rows)
            # (one CopyData per row, as PostgreSQL sends them: psycopg reads a row from each)
            self.out += b"".join(pg.message(b"d", line) for line in copy.write_lines(rows, options))
            if not await self.connection.drain():
                break
        self.out += pg.message(b"c")
        return Result([], [], f"COPY {count}", [])

    def _abandon(self, result: Result) -> None:
        """A result read no further: DuckDB gets its resources back, and it is not open."""
        if self.open is result:
            self.open = None
        result.abandon()

    def _deallocate(self, query: str) -> Result:
        """``DEALLOCATE [PREPARE] name | ALL``: the session's prepared statements, those of the
        protocol's Parse included, as in PostgreSQL (psycopg sends it after DDL)."""
        found = _DEALLOCATE.match(query)
        if found is None:
            raise QueryError("42601", "syntax error in DEALLOCATE")
        target = found.group("name")
        if target.lower() == "all":
            self.statements.clear()
            return Result([], [], "DEALLOCATE ALL", [])
        name = _cursor_name(target)
        if self.statements.pop(name, None) is None:
            raise QueryError("26000", f'prepared statement "{name}" does not exist')
        return Result([], [], "DEALLOCATE", [])

    async def _discard(self, query: str) -> Result:
        """``DISCARD ALL`` (what PgBouncer and other poolers send when a server connection
        changes hands), ``PLANS``, ``SEQUENCES``, ``TEMP``. DISCARD ALL forgets the session's
        prepared statements, portals, cursors and settings, and a session that left state of
        its own on its DuckDB connection (a temporary table, a variable, a DuckDB setting)
        gives that connection up, closed: the next statement starts on a clean one."""
        found = _DISCARD.match(query)
        if found is None:
            raise QueryError("42601", "syntax error in DISCARD")
        what = found.group("what").upper()
        if what == "ALL":
            if self.status != b"I":
                raise QueryError("25001", "DISCARD ALL cannot run inside a transaction block")
            self.statements.clear()
            for portal in self.portals.values():
                if portal.result is not None:
                    portal.result.abandon()
            self.portals.clear()
            self.settings.clear()
            self.release()
            lease = self.lease
            if lease is not None and self.pinned:
                self.lease, self.pinned = None, False
                self.backend.cursors.drop()
                with contextlib.suppress(duckdb.Error):
                    await self.backend.pool.run(lease.cursor.close)
        elif what == "PLANS":
            self.statements.clear()
        elif what in ("TEMP", "TEMPORARY") and self.pinned:
            raise QueryError(
                "0A000",
                "DISCARD TEMP is not supported by the embedded DuckDB server: DISCARD ALL "
                "starts the session over, its temporary objects gone",
            )
        return Result([], [], f"DISCARD {'TEMP' if what == 'TEMPORARY' else what}", [])

    def _track_transaction(self, tag: str) -> None:
        if tag == "BEGIN":
            self.status = b"T"
        elif tag in ("COMMIT", "ROLLBACK"):
            self.status = b"I"

    # simple protocol

    async def query(self, text: str) -> None:
        """A Query message's replies, up to (not including) its ReadyForQuery."""
        local = self._local(text)
        if local is not None:
            await self._send_result(local)
            return
        call = advisory_call(text)
        if call is not None:  # (no admission: a wait must not hold the capacity)
            await self._send_result(await self._advisory(call, ()))
            return
        statements = self._statements(text)
        if not statements:
            self.out += pg.message(b"I")
            return
        await self._admit(text, [kind for _, kind in statements])
        try:
            for query, kind in statements:
                await self._send_result(await self._run(query, (), kind))
        except BaseException as e:
            self._contended(e)
            raise
        self._contended(None)

    async def _admit(self, sql: str, kinds: Sequence[str]) -> None:
        """Admission for the running batch; before it, where the contention limit applies
        (``backend.contention``), a place for a writing transaction (admission.contention):
        an autocommit statement that writes; in a transaction block its first statement if
        it writes or if transactions that began with the same shape wrote, else its first
        statement that writes (and that shape is noted). Waiting for a place holds nothing
        (no MPL slot), and a holder counts as running only once admitted. ``_contended`` must
        follow once the statements ran (or failed); a statement run inside another (a
        cursor's query at its DECLARE or first FETCH) goes under the outer one's place."""
        gate = self.backend.contention
        if gate is None:
            await self.connection.admit(sql)
            return
        self.tx_nesting += 1
        try:
            if self.tx_nesting == 1:
                await self._take_place(gate, sql, kinds)
            await self.connection.admit(sql)
        except BaseException as e:
            self._contended(e)
            raise
        if self.tx_nesting == 1 and gate.holds(self):
            gate.touch(self, running=True)

    async def _take_place(self, gate: ContentionGate, sql: str, kinds: Sequence[str]) -> None:
        if gate.holds(self):
            return
        writes = not WRITE_KINDS.isdisjoint(kinds)
        if self.status != b"I":
            starter = self.tx_starter
            if starter is None:  # the transaction's first statement
                starter = self.tx_starter = self.connection.classify(sql).fingerprint
                if not writes and not gate.control.starts_writer(starter):
                    return
            elif writes:  # it read first: its kind is held back at its first statement
                gate.control.learn_starter(starter)
            else:
                return
        elif not writes:
            return
        if self.gone:
            raise QueryError("57014", "canceling statement: the client went away")
        # a later Execute of a batch already admitted holds the batch's MPL slot till its
        # Sync: waiting there could hold up a holder queued for that slot (it takes a place
        # at once, beyond the limit, instead)
        batch = self.connection.batch
        try:
            await gate.acquire(self, at_once=batch is not None and batch.job is not None)
        except ContentionWaitCancelled:
            raise QueryError("57014", "canceling statement due to user request") from None
        except ContentionWaitTimedOut as e:
            raise QueryError("57014", str(e)) from None

    def _contended(self, error: BaseException | None) -> None:
        """After a batch's statements (see ``_admit``): a holder's statement ended, or its
        transaction — on a conflict (40001, 40P01) or not."""
        gate = self.backend.contention
        if gate is None:
            return
        self.tx_nesting -= 1
        if isinstance(error, QueryError) and error.sqlstate in CONFLICT_STATES:
            self.tx_aborted = True
        if self.tx_nesting:
            return  # (a statement inside another: the outer one ends the place's turn)
        over = self.status == b"I"
        gate.statement_ended(self, over, self.tx_aborted)
        if over:
            self.tx_starter = None
            self.tx_aborted = False

    def _rewritten_kind(self, statement: str) -> str | None:
        """The kind of one statement that DuckDB's parser refuses (an identity column, an
        index's operator class, a DROP of several tables, a search_path list) but takes once
        rewritten as it runs; None if not that."""
        rewritten = compat.rewrite(statement, self.backend.schema)
        if rewritten == statement:
            return None
        try:
            kinds = {st.type.name for st in self.cursor.extract_statements(rewritten)}
        except duckdb.Error:
            return None
        return kinds.pop() if len(kinds) == 1 else None

    def _statements(self, text: str) -> list[tuple[str, str]]:
        """The statements of a Query message and their kinds. When DuckDB's parser fails on
        the whole text it is split with PostgreSQL's (pglast) to find the statements answered
        here (``BEGIN; SAVEPOINT x``); a piece DuckDB cannot parse keeps DuckDB's error."""
        single = _single_statement(text)
        if single is not None:
            return [single]
        if copy.STDIO.match(text) and len(lone := _split(text)) == 1:
            return [(lone[0], "COPY")]  # (moved by the session, not by DuckDB's COPY)
        head = _SESSION_HEAD.match(text)
        if head is not None and len(lone := _split(text)) == 1:
            # (answered here: DuckDB has no SQL cursors, and its DEALLOCATE is its own)
            word = head.group(1).lower()
            return [(lone[0], word.upper() if word in ("deallocate", "discard") else "CURSOR")]
        try:
            return [(st.query, st.type.name) for st in self.cursor.extract_statements(text)]
        except duckdb.Error as e:
            error = QueryError(sqlstate_for(e), first_line(e))
        try:
            pieces = pglast.split(text)
        except Exception:  # pglast's parse errors: DuckDB's error is the one to report
            raise error from None
        if len(pieces) < 2:
            if pieces and self._local_parse(pieces[0]):
                return [(pieces[0], "LOCAL")]
            if pieces and compat.begin_statement(pieces[0]):
                return [("BEGIN", "TRANSACTION")]
            if pieces and (kind := self._rewritten_kind(pieces[0])) is not None:
                return [(pieces[0], kind)]
            if pieces and drops_constraint(pieces[0]):  # (a unique one may be an index here)
                return [(pieces[0], "ALTER")]
            raise error
        out: list[tuple[str, str]] = []
        for piece in pieces:
            out.extend(self._statements(piece))
        return out

    async def _send_result(self, result: Result) -> None:
        if result.columns:
            self.out += row_description(result.columns)
            self.out += b"".join(result.rows)
        if result.more is not None:
            await self._stream(result)
        self.out += pg.message(b"C", result.tag.encode() + b"\0")

    async def _stream(self, result: Result, portal: Portal | None = None) -> None:
        """The rest of a long result, chunk by chunk, each written before the next is fetched
        and only as fast as the client reads (``drain``): the proxy holds one chunk of it."""
        more = result.more
        assert more is not None
        count = len(result.rows)
        self.running = True  # a CancelRequest interrupts the fetching too
        try:
            while True:
                if not await self.connection.drain():
                    break  # nobody reads the rest: stop fetching it
                try:
                    chunk = await self.backend.pool.run(more)
                except asyncio.CancelledError:
                    self.pinned = True  # (as in ``_run``)
                    raise
                if not chunk:
                    break
                self.out += b"".join(chunk)
                count += len(chunk)
        finally:
            self.running = False
            result.abandon()  # (stopped early: the rest is not read)
            if self.open is result:
                self.open = None
        result.rows = []  # sent: nothing of it stays
        result.tag = f"SELECT {count}"
        if portal is not None:
            portal.sent = 0

    # extended protocol

    def parse(self, body: bytes) -> None:
        fields = _Fields(body)
        name = fields.string()
        query = fields.string()
        types = [fields.oid() for _ in range(fields.count())]
        fields.end()
        nparams = max((int(n) for n in _PARAM.findall(query)), default=0)
        if nparams > MAX_PARAMETERS:
            raise QueryError("42P02", f"there is no parameter ${nparams}")
        types += [0] * (nparams - len(types))
        driver = compat.driver_statement(query)
        if driver is not None:
            kind = _DRIVER + driver  # answered at Execute
            types = [1028] if driver == "typeinfo" else []
        elif advisory_call(query) is not None:
            kind = "ADVISORY"  # answered at Execute, its keys bigint
            types = [oid or 20 for oid in types]
        elif _LOCAL_HEAD.match(query) and self._local_parse(query):
            kind = "LOCAL"  # answered at Execute
        else:
            statements = self._statements(query) if query.strip() else []
            if len(statements) > 1:
                raise QueryError(
                    "42601", "cannot insert multiple commands into a prepared statement"
                )
            query, kind = statements[0] if statements else (query, "EMPTY")
        text = query
        if kind not in ("LOCAL", "EMPTY", "ADVISORY") and driver is None:
            _check_catalogs(query)
            query = self._with_cursors(query)
            query = compat.rewrite(catalog.translate(query) or query, self.backend.schema)
        if 0 in types:
            key = (query, tuple(types))
            known = _INFERRED.get(key)
            if known is None:  # (read from the catalog: a millisecond, on the event loop)
                inferred = compat.infer_parameter_types(query, len(types), self._catalog())
                known = [
                    oid or (pg_type(guess).oid if guess else TEXT_OID)
                    for oid, guess in zip(types, inferred, strict=True)
                ]
                if len(_INFERRED) >= _KEEP_INFERRED:
                    _INFERRED.clear()
                _INFERRED[key] = known
            types = list(known)
        self.statements[name] = Prepared(query, types, kind, text)
        self.out += pg.message(b"1")

    def _catalog(self) -> dict[str, list[tuple[str, str]]]:
        """Every table's columns and their DuckDB types, for parameter type inference."""
        tables: dict[str, list[tuple[str, str]]] = {}
        self._settle_now()  # (rare: a Parse while a long result is open)
        rows = self.cursor.execute(
            "select lower(table_name), lower(column_name), data_type from duckdb_columns() "
            f"where database_name <> '{catalog.DATABASE}' order by table_name, column_index"
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

    def bind(self, body: bytes) -> None:
        fields = _Fields(body)
        portal = fields.string()
        name = fields.string()
        statement = self.statements.get(name)
        if statement is None:
            raise QueryError("26000", f'prepared statement "{name}" does not exist')
        formats = [fields.int16() for _ in range(fields.count())]
        raws = [fields.value() for _ in range(fields.count())]
        results = _format_codes(fields)
        fields.end()
        if len(formats) > 1 and len(formats) != len(raws):
            raise _protocol_violation(
                f"bind message has {len(formats)} parameter formats but {len(raws)} parameters"
            )
        params: list[object] = []
        for i, raw in enumerate(raws):
            code = formats[i] if len(formats) > 1 else formats[0] if formats else 0
            if raw is not None and code not in (0, 1):
                raise QueryError("22023", f"unsupported format code: {code}")
            oid = statement.param_types[i] if i < len(statement.param_types) else 0
            try:
                params.append(decode_param(raw, oid, code == 1))
            except (ValueError, ArithmeticError, struct.error) as e:
                # PostgreSQL's own SQLSTATEs: bad binary data, bad text
                sqlstate = "22P03" if code == 1 else "22P02"
                raise QueryError(sqlstate, f"invalid value for parameter ${i + 1}: {e}") from None
        self.portals[portal] = Portal(statement, params, results)
        self.out += pg.message(b"2")

    async def describe(self, body: bytes) -> None:
        fields = _Fields(body)
        target = _target(fields, "DESCRIBE")
        name = fields.string()
        fields.end()
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
            elif statement.kind == "ADVISORY":
                call = advisory_call(statement.query)
                assert call is not None
                self.out += row_description([(call.column, BOOL if call.returns_bool else VOID)])
            elif statement.kind == "SELECT" or (
                returning := compat.returning_select(statement.query, statement.kind)
            ):
                await self._settle()
                if statement.kind == "SELECT":
                    columns = describe(self.cursor, statement.query, oids, statement.text)
                else:  # (a RETURNING list with no parameters of its own)
                    columns = describe(self.cursor, returning or "", [])
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
        if portal.result is None and portal.statement.kind == "ADVISORY":
            call = advisory_call(portal.statement.query)
            assert call is not None  # (it was one at its Parse)
            portal.result = await self._advisory(call, portal.params, portal.formats)
        if portal.result is None:
            statement = portal.statement
            await self._admit(statement.query, (statement.kind,))
            try:
                portal.result = await self._run(
                    statement.query, portal.params, statement.kind, portal.formats, statement.text
                )
            except BaseException as e:
                self._contended(e)
                raise
            self._contended(None)
        return portal.result

    async def execute(self, body: bytes) -> None:
        fields = _Fields(body)
        name = fields.string()
        limit = fields.int32()
        fields.end()
        portal = self.portals.get(name)
        if portal is None:
            raise QueryError("34000", f'portal "{name}" does not exist')
        if portal.statement.kind == "EMPTY":
            self.out += pg.message(b"I")
            return
        result = await self._portal_result(portal)
        if result.more is not None and limit <= 0:  # all of it, streamed
            self.out += b"".join(result.rows)
            await self._stream(result, portal)
            self.out += pg.message(b"C", result.tag.encode() + b"\0")
            return
        if result.more is not None:  # a row limit: kept whole, as before, to count it
            self.open = result
            await self._settle()
        rows = result.rows[portal.sent :]
        if limit > 0 and len(rows) > limit:
            self.out += b"".join(rows[:limit])
            portal.sent += limit
            self.out += pg.message(b"s")  # PortalSuspended
            return
        self.out += b"".join(rows)
        portal.sent = len(result.rows)
        self.out += pg.message(b"C", result.tag.encode() + b"\0")
