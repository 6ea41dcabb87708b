"""Statements on DuckDB: the database, its worker threads, and results in PostgreSQL's form.

``DuckDBBackend`` is one database (in memory by default) and the pool of threads statements run
in, off the event loop. ``execute`` runs one statement on a client's cursor in such a thread
and returns a ``Result`` whose rows are already DataRow messages (text, or binary where the
client asked for it), with PostgreSQL's type OIDs and command tag — a SELECT in text format
written in C straight from DuckDB's Arrow batches (the columnar path, below), anything else
from DuckDB's Python tuples (the row path); ``describe`` gives a
SELECT's columns without running it. DuckDB errors become ``QueryError`` with PostgreSQL's
SQLSTATE (``proxy.backends.errors``). With ``profile`` on, DuckDB's profiler gives each
statement's wall time and CPU time (``Measurement``, what training needs).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

import duckdb

from admission.native import native
from admission.units import size_bytes
from proxy.backends.embedded import catalog, compat, lockdown
from proxy.backends.embedded.advisory import AdvisoryLocks
from proxy.backends.embedded.names import name_arrays, postgresql_names
from proxy.backends.embedded.workers import Workers
from proxy.backends.errors import sqlstate_for, sqlstate_for_message
from proxy.backends.pgtypes import (
    NAME,
    PgType,
    encode_binary,
    encode_text,
    pg_type,
    text_encoder,
)
from proxy.contention import ContentionGate
from proxy.planner import PARAM as _PARAM
from proxy.planner import PLANNABLE_HEAD as _PLANNABLE_HEAD
from proxy.wire import protocol as pg

__all__ = [
    "Cursors",
    "DuckDBBackend",
    "Lease",
    "Measurement",
    "QueryError",
    "Refused",
    "Result",
    "answered",
    "column_formats",
    "command_tag",
    "data_rows",
    "describe",
    "execute",
    "first_line",
    "row_description",
]

# Rows fetched from DuckDB and encoded at a time: a result longer than this is sent while it is
# read, as fast as the client takes it, so the proxy never holds more than a chunk of it.
CHUNK_ROWS = 50_000
_STDIO = re.compile(r"\b(?:stdin|stdout)\b", re.I)
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
SERVER_VERSION = "15.0"
TEXT_OID = 25


class DuckDBBackend:
    """One DuckDB database and the worker threads that run statements on it."""

    def __init__(
        self,
        database: str = ":memory:",
        workers: int = 8,
        *,
        profile: bool = True,
        memory_limit: int | None = None,
        max_temp_size: int | None = None,
    ) -> None:
        self.database = database
        try:
            self.connection = duckdb.connect(database)
        except duckdb.Error as e:
            raise ValueError(f"cannot open the DuckDB database {database}: {first_line(e)}") from e
        self.connection.execute("SET TimeZone = 'UTC'")  # server-wide in DuckDB
        if memory_limit is not None:  # (before the lockdown, which keeps clients from it)
            self.connection.execute(f"SET memory_limit = '{int(memory_limit)}B'")
        if max_temp_size is not None:  # what it may spill (0: nothing: it fails with 53200)
            self.connection.execute(f"SET max_temp_directory_size = '{int(max_temp_size)}B'")
        catalog.install(self.connection)  # PostgreSQL's catalogs, for tools that read them
        # PostgreSQL's binary JSON, which ORMs declare JSON columns as (Django, SQLAlchemy's
        # JSONB), is DuckDB's JSON
        self.connection.execute("create type if not exists jsonb as json")
        # PostgreSQL's default schema, where unqualified names go and what the catalogs show
        self.schema = default_schema(self.connection)
        self.search_path = compat.default_search_path(self.schema)
        self.connection.execute(f"set search_path = {catalog.literal(self.search_path)}")
        self.pool = Workers(workers)  # (named duckdb_N: training.proc counts them as DuckDB's)
        # DuckDB connections shared between sessions' transactions; idle ones kept, at most
        self.cursors = Cursors(self, keep=max(8, 2 * workers))
        self._utility: duckdb.DuckDBPyConnection | None = None
        self.version = duckdb.__version__
        self.profile = profile
        self.memory_base = MemoryBase()  # (for sampled statements; see ``execute``)
        self.server_version = f"{SERVER_VERSION} (admission, DuckDB {self.version})"
        self._planner: duckdb.DuckDBPyConnection | None = None  # plan_cost's own cursor
        self.version_string = f"PostgreSQL {self.server_version}"
        self.advisory = AdvisoryLocks()  # (every session's pg_advisory_lock keys)
        # writing transactions in progress, limited while they abort on one another
        # (proxy.contention; None: no limit)
        self.contention: ContentionGate | None = None
        self.connection.execute(  # (compat.VERSION_CALL)
            f"create or replace macro {catalog.S}.version() as "
            f"{catalog.literal(self.version_string)}"
        )

    def memory_for_statements(self) -> int | None:
        """Bytes DuckDB may still use beyond what it holds now: its memory_limit less the
        memory in use (an in-memory database's tables count against the limit), or None when
        DuckDB reports no limit."""
        cursor = self.connection.cursor()
        try:
            setting = cursor.execute("select current_setting('memory_limit')").fetchone()
            used = int(_buffer_memory(cursor) or 0)
        finally:
            cursor.close()
        limit = size_bytes(str(setting[0])) if setting else None
        return None if limit is None else max(0, limit - used)

    def temp_bytes(self) -> int:
        """Bytes in DuckDB's temporary files now: what statements have spilled and hold."""
        cursor = self.connection.cursor()
        try:
            row = cursor.execute("select sum(size) from duckdb_temporary_files()").fetchone()
        finally:
            cursor.close()
        return int(row[0] or 0) if row else 0

    def cursor(self, user: str = "duckdb", database: str = "") -> duckdb.DuckDBPyConnection:
        cursor = self.plain_cursor()
        for macro in compat.session_macros(user):
            cursor.execute(macro)
        cursor.execute(catalog.session_setup(user, database))
        return cursor  # its profiler is off until someone observes (``set_profiling``)

    def plain_cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection to the database that finds names as a session does (its search_path;
        none of a session's macros): DuckDB's ``cursor()`` starts on the schema ``main``."""
        cursor = self.connection.cursor()
        cursor.execute(f"set search_path = {catalog.literal(self.search_path)}")
        return cursor

    @property
    def utility(self) -> duckdb.DuckDBPyConnection:
        """A cursor the event loop's thread uses for what needs no session of its own: splitting
        a Query into statements, the catalog for parameter types, a SELECT's columns (with the
        sessions' macros: a Describe of ``pg_get_userbyid(…)`` needs them)."""
        if self._utility is None:
            self._utility = self.cursor()
        return self._utility

    async def plan_cost(self, sql: str) -> float | None:
        """DuckDB's own cost estimate of one SELECT: the estimated cardinalities of its plan's
        operators, summed (EXPLAIN, nothing run); None for anything else — several statements
        among them (``proxy.planner``)."""
        if not _PLANNABLE_HEAD.match(sql) or _PARAM.search(sql):
            return None
        if self._planner is None:
            self._planner = self.plain_cursor()
        return await self.pool.run(plan_cost, self._planner, sql)

    def lock(self, rules: lockdown.Lockdown) -> None:
        """Close the database to the host (``proxy.backends.embedded.lockdown``): after the
        server loaded its own data, before clients come."""
        try:
            rules.apply(self.connection)
        except duckdb.Error as e:
            raise ValueError(f"cannot lock the DuckDB database down: {first_line(e)}") from e

    def close(self) -> None:
        """Stop: statements not started are dropped, running ones (interrupted by their
        clients' departure) are waited for, then the database is closed."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(duckdb.Error):
            self.connection.close()


def default_schema(connection: duckdb.DuckDBPyConnection) -> str:
    """The schema unqualified names go to: PostgreSQL's ``public``, made in the database if it
    is not there; DuckDB's ``main`` for a database file whose tables are already there and that
    has no ``public`` (its tables stay where they are, and clients find them) or that is
    read-only."""
    schemas = {
        name
        for (name,) in connection.execute(
            "select schema_name from duckdb_schemas() where database_name = current_database()"
        ).fetchall()
    }
    if "public" in schemas:
        return "public"
    held = connection.execute(
        "select (select count(*) from duckdb_tables() where database_name = current_database()) "
        "+ (select count(*) from duckdb_views() where database_name = current_database() "
        "and not internal)"
    ).fetchone()
    if held is not None and held[0]:
        return "main"
    try:
        connection.execute("create schema if not exists public")
    except duckdb.Error:  # (a read-only file)
        return "main"
    return "public"


@dataclass(slots=True, eq=False)
class Lease:
    """A DuckDB connection (a cursor of the database) lent to one session at a time."""

    cursor: duckdb.DuckDBPyConnection
    user: str
    database: str = ""  # the database its sessions connected to (``catalog.session_setup``)
    # DuckDB's profiler is on for this cursor (None: not known — a switch failed)
    profiling: bool | None = False


class Cursors:
    """The DuckDB connections sessions share (a DuckDB connection costs ~26 kB and 1.5 ms to
    open with a session's macros; an idle client costs none).

    A session takes one when a statement of it first needs DuckDB and gives it back at the
    ReadyForQuery that leaves nothing on it — no transaction open, no result half read, no
    state of the session's own in DuckDB (a SET, a variable, a temporary object, a prepared
    statement, random()'s seed: such a session keeps its connection to its end, and the
    connection is closed then, never lent again). Connections are per user and database
    (each carries its user's macros, ``admission_user`` and ``admission_database``); at most
    ``keep`` idle ones are kept, the one idle longest closed for a newcomer. How many are lent
    at once is bounded by what runs and what is inside a transaction, not here: the admission
    gate bounds what runs.

    Used from the event loop's thread only."""

    __slots__ = (
        "backend",
        "closed",
        "idle",
        "keep",
        "lent",
        "oldest",
        "opened",
        "reused",
    )

    def __init__(self, backend: DuckDBBackend, keep: int) -> None:
        self.backend = backend
        self.keep = keep
        self.idle: dict[tuple[str, str], list[Lease]] = {}  # by (user, database), the most
        # recently given back last
        self.oldest: dict[Lease, None] = {}  # every idle one, in the order they were given back
        self.lent = 0
        self.opened = 0
        self.reused = 0
        self.closed = 0

    async def lend(self, user: str, database: str = "") -> Lease:
        """A connection of ``user``'s on ``database``: an idle one, or a new one opened in a
        worker thread."""
        key = (user, database)
        idle = self.idle.get(key)
        if idle:
            lease = idle.pop()
            if not idle:
                del self.idle[key]
            del self.oldest[lease]
            self.reused += 1
        else:
            cursor = await self.backend.pool.run(self.backend.cursor, user, database)
            lease = Lease(cursor, user, database)
            self.opened += 1
        self.lent += 1
        return lease

    def give(self, lease: Lease) -> None:
        """A clean connection back to the idle ones (the one idle longest closed beyond
        ``keep``: a user gone for good does not keep connections from the others)."""
        self.lent -= 1
        if len(self.oldest) >= self.keep:
            stale = next(iter(self.oldest))
            del self.oldest[stale]
            others = self.idle[stale.user, stale.database]
            others.remove(stale)
            if not others:
                del self.idle[stale.user, stale.database]
            self.closed += 1
            with contextlib.suppress(duckdb.Error):
                stale.cursor.close()
        self.idle.setdefault((lease.user, lease.database), []).append(lease)
        self.oldest[lease] = None

    def drop(self) -> None:
        """A connection not to lend again, closed by its session (its state is its own)."""
        self.lent -= 1
        self.closed += 1

    def status(self) -> dict[str, int]:
        return {
            "lent": self.lent,
            "idle": len(self.oldest),
            "keep": self.keep,
            "opened": self.opened,
            "reused": self.reused,
            "closed": self.closed,
        }


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
    # a long result comes in chunks: each call (in a worker thread) gives the next chunk's
    # DataRows, an empty list at the end; ``rows`` is the first chunk, ``tag`` is final then
    more: Callable[[], list[bytes]] | None = None
    # stops a long result early (the rest is not read): gives DuckDB its result back
    close: Callable[[], None] | None = None
    # bytes DuckDB's buffer manager allocated for the statement, and spilled (profiler)
    memory: float | None = None
    spilled: float | None = None

    def abandon(self) -> None:
        """Read no more of it: DuckDB gets the rest back (``close``), and ``more`` is gone —
        its DuckDB connection may serve another session next."""
        if self.more is not None and self.close is not None:
            with contextlib.suppress(Exception):
                self.close()
        self.more = self.close = None


@dataclass(frozen=True, slots=True)
class Measurement:
    """One statement as DuckDB ran it: the class, the time it took and the CPU it used.
    ``parallelism`` is CPU time over wall time: the mean number of threads busy."""

    class_name: str
    latency: float
    cpu_time: float | None
    job: int | None = None  # the admission job the statement ran under
    # bytes DuckDB's buffer manager allocated for the statement (an upper bound of its peak
    # working memory), and bytes it spilled to disk (profiler; None: not measured)
    memory: float | None = None
    spilled: float | None = None
    fingerprint: str = ""  # the statement's class

    @property
    def parallelism(self) -> float | None:
        if self.cpu_time is None or self.latency <= 0:
            return None
        return self.cpu_time / self.latency


# -- encoding ------------------------------------------------------------------------------

_ROWS = native("proxy.backends.embedded._rows")
_INTEGERS = (20, 21, 23)  # int8, int2, int4


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
    if t.element is None and t.oid in _INTEGERS:
        return lambda v: b"%d" % v
    if t.element is None and t.oid == TEXT_OID:
        return lambda v: v.encode() if type(v) is str else encode_text(v, t) or b""
    return text_encoder(t)


def _kind(t: PgType, binary: int) -> int:
    """What the C encoder writes itself: 1 integers, 2 strings (text format); 0 the rest."""
    if binary or t.element is not None:
        return 0
    return 1 if t.oid in _INTEGERS else 2 if t.oid == TEXT_OID else 0


def data_rows(rows: list[tuple[Any, ...]], types: list[PgType], formats: list[int]) -> list[bytes]:
    """DataRow messages; the per-value work is one call of a per-column encoder (in C, with
    integers and strings written there, when ``_rows`` is built: the same bytes)."""
    encoders = [_encoder(t, f) for t, f in zip(types, formats, strict=True)]
    if _ROWS is not None and isinstance(rows, list):
        kinds = tuple(_kind(t, f) for t, f in zip(types, formats, strict=True))
        return _ROWS.encode_rows(rows, kinds, tuple(encoders))  # type: ignore[no-any-return]
    return python_data_rows(rows, encoders)


def python_data_rows(
    rows: list[tuple[Any, ...]], encoders: Sequence[Callable[[Any], bytes]]
) -> list[bytes]:
    """``data_rows`` in Python: the reference the C encoder is held to."""
    out = []
    count = _INT16.pack(len(encoders))
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


# statements whose DuckDB result may be rows (anything else answers with a status column)
_ROW_KINDS = frozenset({"SELECT", "EXPLAIN", "PRAGMA", "CALL", "EXECUTE", "RELATION", "MULTI"})


def _status_only(kind: str, description: Any) -> bool:
    """DuckDB answers a command (BEGIN, COMMIT, CREATE, DROP, SET, COPY …) with one column,
    "Success" or "Count"; PostgreSQL answers it with a command tag alone — no RowDescription,
    which libpq-based drivers hold against it (psycopg2's BEGIN fails on a row description)."""
    return (
        kind not in _ROW_KINDS
        and description is not None
        and len(description) == 1
        and description[0][0] in ("Success", "Count")
    )


def command_tag(kind: str, query: str, rows: list[tuple[Any, ...]], has_columns: bool) -> str:
    # (the sequences compat.serials creates before a CREATE TABLE are not what the client sent)
    words = compat.SEQUENCE_PREFIX.sub("", query.strip(), count=1).rstrip(";").split()
    verb = words[0].upper() if words else ""
    count = rows[0][0] if rows and rows[0] and isinstance(rows[0][0], int) else 0
    if verb == "TRUNCATE":
        return "TRUNCATE TABLE"
    if kind == "SELECT" or (has_columns and verb in ("SELECT", "WITH", "VALUES", "SHOW", "FROM")):
        return f"SELECT {len(rows)}"
    if kind == "INSERT":
        return f"INSERT 0 {count}"
    if kind in ("UPDATE", "DELETE"):
        return f"{kind} {count}"
    if kind == "COPY":
        return f"COPY {count}"
    if kind == "TRANSACTION":
        return {"START": "BEGIN", "END": "COMMIT", "ABORT": "ROLLBACK"}.get(verb, verb)
    if verb in ("CREATE", "DROP", "ALTER") and len(words) > 1:
        noun = words[1].upper()
        if noun in ("OR", "TEMP", "TEMPORARY", "UNIQUE") and len(words) > 2:
            noun = words[2].upper() if words[2].upper() != "REPLACE" else words[3].upper()
        return f"{verb} {noun}"
    return verb or "SELECT 0"


def answered(answer: compat.LocalAnswer, format_codes: Sequence[int] = ()) -> Result:
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
    base: MemoryBase | None = None,
    switch: bool = False,
    text: str = "",
) -> Result:
    """One statement on ``cursor`` (a worker thread). With ``profile`` (DuckDB's profiler on
    for the cursor) the result carries DuckDB's own time, CPU time, memory and spill; the
    memory is measured above what the buffer manager held as the statement began, read now or,
    with ``base``, as read at most a second ago (a sample of live statements: the read costs
    half a millisecond). ``switch``: the profiler is switched to ``profile`` first. A query
    that groups by a primary key and selects the key's table's other columns runs with them
    added to its GROUP BY (see ``compat.group_by_completed``)."""
    owned = _owned_sequences(cursor, query) if kind == "DROP" else []
    if kind == "SET" and (listed := compat.SEARCH_PATH_SET.fullmatch(query)) is not None:
        query = _existing_on_path(cursor, listed.group(1).replace("''", "'"))
    if kind == "INSERT" and compat.SPACED_LITERAL.search(query):
        query = compat.assigned_timestamps(
            query, lambda schema, table: _columns(cursor, schema, table)
        )
    result = _completing_group_by(
        cursor,
        query,
        lambda q: _execute(
            cursor, q, params, kind, format_codes, profile, base, switch, text or query
        ),
    )
    for sequence in owned:  # (a serial's sequence goes with its table, as in PostgreSQL)
        with contextlib.suppress(duckdb.Error):
            cursor.execute(f"drop sequence if exists {sequence}")
    return result


# DROP TABLE: the sequences its serial and identity columns default to, named as
# compat.serials names them (<table>_<column>_seq) — a sequence the user made and named
# otherwise stays
_DROP_TABLE = re.compile(
    rf"(?:^|;)\s*drop\s+table\s+(?:if\s+exists\s+)?(?P<table>{compat.QUALIFIED})",
    re.I,
)
_NEXTVAL = "regexp_extract(column_default, 'nextval\\(''([^'']+)''', 1)"


def _owned_sequences(cursor: duckdb.DuckDBPyConnection, query: str) -> list[str]:
    sequences: list[str] = []
    for found in _DROP_TABLE.finditer(query):
        name = found.group("table").replace('"', "").split(".")[-1].strip().lower()
        try:
            rows = cursor.execute(
                f"select schema_name, {_NEXTVAL} from duckdb_columns() "
                "where lower(table_name) = ? and column_default like 'nextval(%'",
                [name],
            ).fetchall()
        except duckdb.Error:
            continue
        for schema, sequence in rows:
            bare = sequence.split(".")[-1].lower()
            if bare.startswith(f"{name}_") and bare.endswith("_seq"):
                sequences.append(sequence if "." in sequence else f"{schema}.{sequence}")
    return sequences


T = TypeVar("T")
_COMPLETED: dict[str, str] = {}  # queries, and as completed for GROUP BY (at most _KEEP)
_KEEP = 256


def _completing_group_by(
    cursor: duckdb.DuckDBPyConnection, query: str, run: Callable[[str], T]
) -> T:
    """``run(query)``, or of ``query`` completed for its GROUP BY when DuckDB's binder asks for
    a column that depends on a primary key grouped by (once per such column)."""
    original, query = query, _COMPLETED.get(query, query)
    while True:
        try:
            return run(query)
        except QueryError as e:
            asked = compat.GROUP_BY_ERROR.search(str(e)) if e.sqlstate[:2] == "42" else None
            if asked is None:
                raise
            column = asked.group("column").replace('""', '"')
            completed = compat.group_by_completed(query, column, _primary_key(cursor))
            if completed is None:
                raise
            if len(_COMPLETED) >= _KEEP:
                _COMPLETED.clear()
            _COMPLETED[original] = query = completed


def _existing_on_path(cursor: duckdb.DuckDBPyConnection, listed: str) -> str:
    """``SET search_path`` to the schemas of ``listed`` that exist: PostgreSQL skips one that
    does not (a migration tool sets the path before it makes its schema), DuckDB refuses the
    whole SET."""
    try:
        rows = cursor.execute(
            "select schema_name from duckdb_schemas() where database_name = current_database()"
        ).fetchall()
    except duckdb.Error:
        rows = []
    schemas = {name for (name,) in rows}
    kept = [name for name in listed.split(",") if name in schemas or "." in name] or ["main"]
    return "set search_path = " + catalog.literal(",".join(kept))


def _columns(
    cursor: duckdb.DuckDBPyConnection, schema: str | None, table: str
) -> list[tuple[str, str]] | None:
    """A table's columns (name, DuckDB type) in order, found as a statement finds it (the
    search path); None when there is none."""
    name = ".".join('"' + part.replace('"', '""') + '"' for part in (schema, table) if part)
    try:
        description = cursor.execute(f"select * from {name} limit 0").description
    except duckdb.Error:
        return None
    return [(str(d[0]), str(d[1])) for d in description or ()]


def _primary_key(cursor: duckdb.DuckDBPyConnection) -> Callable[[str], list[str]]:
    def key(table: str) -> list[str]:
        rows = cursor.execute(
            "select constraint_column_names from duckdb_constraints() "
            "where constraint_type = 'PRIMARY KEY' and lower(table_name) = ?",
            [table],
        ).fetchall()
        return [str(c) for c in rows[0][0]] if len(rows) == 1 else []

    return key


def _execute(
    cursor: duckdb.DuckDBPyConnection,
    query: str,
    params: Sequence[object],
    kind: str,
    format_codes: Sequence[int],
    profile: bool,
    base: MemoryBase | None,
    switch: bool,
    text: str,
) -> Result:
    if switch:
        try:
            set_profiling(cursor, profile)
        except duckdb.Error as e:  # (interrupted by a CancelRequest, say)
            raise QueryError(sqlstate_for(e), first_line(e)) from None
    if kind == "COPY" and _STDIO.search(query):
        raise QueryError(
            "0A000",
            "COPY FROM STDIN and COPY TO STDOUT are not supported by the embedded DuckDB "
            "server: use INSERT (executemany) to load rows and SELECT to read them",
        )
    try:
        if kind != "SELECT":
            lockdown.check_catalogs(query)
        if (kind == "SET" or kind == "PRAGMA") and lockdown.check(query, kind):
            return Result([], [], "SET", [])
    except lockdown.LockdownError as e:
        raise QueryError(e.sqlstate, str(e)) from None
    held = (base.read(cursor) if base is not None else _buffer_memory(cursor)) if profile else None
    # (profiled for an observer of every statement — training — a long result takes the row
    # path, whose profile is read at its first chunk; the columnar path's only at its end)
    columnar_ok = not profile or base is not None
    if kind == "SELECT" and not any(format_codes) and columnar_ok and columnar_candidate(query):
        result = _columnar(cursor, query, params, text)
        if result is not None:
            if profile and result.more is None:  # (the profile is whole once DuckDB is done)
                result.latency, result.cpu_time, result.memory, result.spilled = _profiled(
                    cursor, result.latency, held
                )
            return result
    started = time.perf_counter()
    try:
        relation = cursor.execute(query, list(params) if params else None)
        description = relation.description
        rows = relation.fetchmany(CHUNK_ROWS) if description else []
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), first_line(e)) from None
    latency = time.perf_counter() - started
    cpu_time = memory = spilled = None
    if profile:
        latency, cpu_time, memory, spilled = _profiled(cursor, latency, held)
    columns = [(d[0], pg_type(str(d[1]))) for d in description or []]
    is_count = kind in ("INSERT", "UPDATE", "DELETE") and [c[0] for c in columns] == ["Count"]
    tag = command_tag(kind, query, rows, bool(columns) and not is_count)
    if is_count or _status_only(kind, description):
        return Result([], [], tag, [], latency, cpu_time, memory=memory, spilled=spilled)
    columns = _postgresql_named(text, columns)
    if any(t.oid == TEXT_ARRAY.oid for _, t in columns):  # (array columns take this path)
        for i in name_arrays(text):
            if i < len(columns) and columns[i][1].oid == TEXT_ARRAY.oid:
                columns[i] = (columns[i][0], NAME_ARRAY)
    formats = column_formats(format_codes, len(columns))
    types = [t for _, t in columns]
    encoded = data_rows(rows, types, formats)
    if len(rows) < CHUNK_ROWS:
        return Result(
            columns, encoded, tag, formats, latency, cpu_time, memory=memory, spilled=spilled
        )

    def more() -> list[bytes]:  # the rest, a chunk at a time, as the client reads it
        try:
            chunk = relation.fetchmany(CHUNK_ROWS)
        except duckdb.Error as e:
            raise QueryError(sqlstate_for(e), first_line(e)) from None
        return data_rows(chunk, types, formats)

    return Result(
        columns, encoded, tag, formats, latency, cpu_time, more, memory=memory, spilled=spilled
    )


# -- the columnar path -------------------------------------------------------------------------
#
# A SELECT whose rows go out in text format is run as a stream of Arrow batches (DuckDB's own
# columnar result, through the Arrow C stream interface: no pyarrow) and its DataRows are
# written from the batches' buffers in C (``_rows.ArrowRows``): no Python object per value. It
# takes the connection's ``_submit(…, "stream")`` — the call behind DuckDB's relation API —
# since the public ``DuckDBPyRelation.__arrow_c_stream__`` binds a statement twice (0.4–1.5 ms a
# TPC-H query). Where either is missing (another DuckDB build, the C module not built), or a
# result column is of a type the C code does not write, the row path runs: the statement is
# then given back unread and run again by ``cursor.execute``, so a statement whose running has
# effects (nextval, setval) never comes this way, and a statement text that needed the row
# path once goes there directly afterwards.

_COLUMNAR = (
    _ROWS is not None
    and hasattr(_ROWS, "ArrowRows")
    and hasattr(duckdb.DuckDBPyConnection, "_submit")
)
_COLUMNAR_TYPES = frozenset(
    {
        "BOOLEAN",
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "HUGEINT",
        "VARCHAR",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMP WITH TIME ZONE",
        "DOUBLE",
        '"NULL"',
    }
)
_COLUMNAR_DECIMAL = re.compile(r"DECIMAL\(\d+,\d+\)")
_ROW_PATH_TEXTS: dict[str, None] = {}  # statement texts that needed the row path (bounded)
_ROW_PATH_KEEP = 1024
_ROW_PATH_LOCK = threading.Lock()


def columnar() -> bool:
    """Whether the columnar path is there (the C module built, DuckDB's stream call present)."""
    return _COLUMNAR


def columnar_candidate(query: str) -> bool:
    if not _COLUMNAR or query in _ROW_PATH_TEXTS:
        return False
    low = query.lower()  # (a substring search: a case-blind regex scan costs ~10 µs a query)
    return "nextval" not in low and "setval" not in low


def _columnar_type(duckdb_type: str) -> bool:
    return duckdb_type in _COLUMNAR_TYPES or _COLUMNAR_DECIMAL.fullmatch(duckdb_type) is not None


def _row_path(query: str) -> None:
    with _ROW_PATH_LOCK:  # (worker threads)
        if len(_ROW_PATH_TEXTS) >= _ROW_PATH_KEEP:
            del _ROW_PATH_TEXTS[next(iter(_ROW_PATH_TEXTS))]
        _ROW_PATH_TEXTS[query] = None


def _columnar(
    cursor: duckdb.DuckDBPyConnection, query: str, params: Sequence[object], text: str = ""
) -> Result | None:
    """A SELECT's first chunk of DataRows (text format) from its Arrow stream; None when the
    row path must run it (see above)."""
    started = time.perf_counter()
    try:
        submitted = cursor._submit(query, list(params) if params else None, "stream", CHUNK_ROWS)
        description = submitted.description
    except duckdb.Error as e:
        raise QueryError(sqlstate_for(e), first_line(e)) from None
    names = [str(d[1]) for d in description or ()]
    if not names or not all(_columnar_type(n) for n in names):
        submitted.close()
        _row_path(query)
        return None
    columns = [(d[0], pg_type(n)) for d, n in zip(description, names, strict=True)]
    columns = _postgresql_named(text or query, columns)
    encoders = tuple(_encoder(t, 0) for _, t in columns)
    try:
        stream = _ROWS.ArrowRows(submitted.arrow_capsule(), encoders)  # type: ignore[union-attr]
    except _ROWS.Unsupported:  # type: ignore[union-attr]
        _row_path(query)
        return None
    except (duckdb.Error, RuntimeError) as e:
        raise QueryError(sqlstate_for_message(str(e)), first_line(e)) from None

    def more() -> list[bytes]:  # the next chunk, [] at the end
        try:
            return stream.fetch(CHUNK_ROWS)  # type: ignore[no-any-return]
        except (duckdb.Error, RuntimeError) as e:
            raise QueryError(sqlstate_for_message(str(e)), first_line(e)) from None

    rows = more()
    latency = time.perf_counter() - started
    formats = [0] * len(columns)
    tag = f"SELECT {len(rows)}"
    if stream.done:
        return Result(columns, rows, tag, formats, latency)
    return Result(columns, rows, tag, formats, latency, None, more, stream.close)


def plan_cost(cursor: duckdb.DuckDBPyConnection, sql: str) -> float | None:
    """``DuckDBBackend.plan_cost`` in the worker thread: DuckDB's parser must find one SELECT,
    and only it is EXPLAINed."""
    try:
        statements = cursor.extract_statements(sql)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            return None
        rows = cursor.execute(f"EXPLAIN (FORMAT JSON) {statements[0].query}").fetchall()
        plan = json.loads(rows[0][1])
    except (duckdb.Error, ValueError, IndexError, TypeError):
        return None
    total = 0.0
    stack = list(plan) if isinstance(plan, list) else [plan]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        extra = node.get("extra_info")
        if isinstance(extra, dict):
            digits = re.sub(r"[^0-9.]", "", str(extra.get("Estimated Cardinality", "")))
            with contextlib.suppress(ValueError):
                total += float(digits)
        stack.extend(node.get("children") or ())
    return total or None


# the profiler's metrics ``_profiled`` reads (DuckDB ≥ 2.0 collects only those: a profiled
# TPC-H query of 7–10 ms took 1.2 ms more than unprofiled with every metric, 0.6–0.8 ms with
# these, measured in-process)
_METRICS = (
    "SET tracked_metrics = ['query.cpu_time', 'query.total_time', 'system.peak_buffer_memory',"
    " 'system.total_memory_allocated', 'system.total_bytes_spilled']"
)


def set_profiling(cursor: duckdb.DuckDBPyConnection, on: bool) -> None:
    """DuckDB's profiler on one cursor, on or off. It costs 0.5–1 ms of a short TPC-H query,
    so it runs only while someone reads it: training's isolation runs, a sample of live
    statements for their memory."""
    if not on:
        cursor.execute("PRAGMA disable_profiling")
        return
    cursor.execute("PRAGMA enable_profiling = 'no_output'")
    with contextlib.suppress(duckdb.Error):  # (DuckDB before 2.0: every metric, as it has)
        cursor.execute(_METRICS)


class MemoryBase:
    """What DuckDB's buffer manager holds, as read at most ``max_age`` seconds ago (by any
    worker thread): the base a sampled statement's memory is measured above. A base read
    before a statement ended reads high, and that statement's M_r low — the live learner keeps
    each class's largest measure, so a low one changes nothing."""

    __slots__ = ("_lock", "_read_at", "_value", "max_age")

    def __init__(self, max_age: float = 1.0) -> None:
        self.max_age = max_age
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._value: float | None = None

    def read(self, cursor: duckdb.DuckDBPyConnection) -> float | None:
        now = time.monotonic()
        with self._lock:
            if now - self._read_at <= self.max_age:
                return self._value
        value = _buffer_memory(cursor)
        with self._lock:
            self._value, self._read_at = value, now
        return value


def _buffer_memory(cursor: duckdb.DuckDBPyConnection) -> float | None:
    """Bytes DuckDB's buffer manager holds now (tables, and statements running)."""
    try:
        # (fetchall: a result left unfinished would refuse the columnar path's ``_submit``)
        rows = cursor.execute("select sum(memory_usage_bytes) from duckdb_memory()").fetchall()
    except duckdb.Error:
        return None
    return float(rows[0][0]) if rows and rows[0][0] is not None else None


def _profiled(
    cursor: duckdb.DuckDBPyConnection, latency: float, base: float | None = None
) -> tuple[float, float | None, float | None, float | None]:
    """DuckDB's wall time, CPU time (summed over its threads), memory and bytes spilled for
    the last statement. Its memory: the buffer manager's peak during the statement less what
    it held when the statement began (``base``: the tables, and any statement beside it),
    bounded by the bytes the statement allocated in all (``total_memory_allocated``, which
    counts memory freed and allocated again: 0.97–2.2× the peak at TPC-H SF 1). Alone, the
    first is exactly the statement's peak; beside others it can also hold some of theirs."""
    try:
        info = json.loads(cursor.get_profiling_information(format="json"))
        query = info.get("query", {})
        latency, cpu = float(query.get("total_time", latency)), float(query["cpu_time"])
    except (duckdb.Error, ValueError, KeyError, TypeError):
        return latency, None, None, None  # statements the profiler does not cover (SET …)
    system = info.get("system") if isinstance(info.get("system"), dict) else {}
    memory, spilled = system.get("total_memory_allocated"), system.get("total_bytes_spilled")
    peak = system.get("peak_buffer_memory")
    if isinstance(memory, int | float) and isinstance(peak, int | float) and base is not None:
        memory = min(memory, max(0.0, peak - base))
    return (
        latency,
        cpu,
        float(memory) if isinstance(memory, int | float) else None,
        float(spilled) if isinstance(spilled, int | float) else None,
    )


# a value of each parameter type whose describing NULL would leave DuckDB to guess a result
# column's type (``1.5 * $1``): DuckDB types the columns by it; LIMIT 0 never evaluates it
_SAMPLES: dict[int, object] = {
    20: 0,
    21: 0,
    23: 0,
    700: 0.0,
    701: 0.0,
    1700: Decimal(0),
    16: False,
    1082: datetime.date(2000, 1, 1),
}


def describe(
    cursor: duckdb.DuckDBPyConnection, query: str, oids: Sequence[int], text: str = ""
) -> list[tuple[str, PgType]]:
    """The result columns of a SELECT without running it: each parameter a sample of its type
    where one is kept above, else NULL."""
    params = [_SAMPLES.get(oid) for oid in oids]

    def run(query: str) -> list[tuple[str, PgType]]:
        body = query.strip().rstrip(";")
        try:
            relation = cursor.execute(f"select * from ({body}) limit 0", params or None)
        except duckdb.Error as e:
            raise QueryError(sqlstate_for(e), first_line(e)) from None
        columns = [(d[0], pg_type(str(d[1]))) for d in relation.description or []]
        return _postgresql_named(text or query, columns)

    return _completing_group_by(cursor, query, run)


# ALTER TABLE on a table with an index: DuckDB refuses almost every change ("Cannot alter
# entry … because there are entries that depend on it": a NOT NULL dropped, a column renamed,
# dropped or retyped), where PostgreSQL carries the indexes along. Migration tools alter
# indexed tables all the time, so the indexes are dropped, the table altered and the indexes
# made again — an index on a dropped column goes, as in PostgreSQL; a renamed column or table
# is renamed in them. Outside a transaction block each step commits (DuckDB checks an ALTER
# against the indexes as they were when its transaction began: a column's type and a dropped
# column need that), and a failed ALTER makes the indexes again; inside one, a failure is
# undone by the client's ROLLBACK, and a type change or a dropped column keeps DuckDB's error
_IDENT = compat.IDENTIFIER
_ALTER_TABLE = re.compile(
    rf"\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?(?P<table>{_IDENT}(?:\s*\.\s*{_IDENT})?)"
    r"\s+(?P<action>.+?)\s*;?\s*$",
    re.I | re.S,
)
_TABLE_NAME = re.compile(rf"(?P<first>{_IDENT})(?:\s*\.\s*(?P<second>{_IDENT}))?")
_RENAME_COLUMN = re.compile(
    rf"rename\s+(?:column\s+)?(?P<old>{_IDENT})\s+to\s+(?P<new>{_IDENT})$", re.I
)
_DROP_CONSTRAINT = re.compile(
    rf"drop\s+constraint\s+(?:if\s+exists\s+)?(?P<name>{_IDENT})(?:\s+(?:cascade|restrict))?$",
    re.I,
)
_RENAME_TABLE = re.compile(rf"rename\s+to\s+(?P<new>{_IDENT})$", re.I)
_DROP_COLUMN = re.compile(rf"drop\s+(?:column\s+)?(?:if\s+exists\s+)?(?P<column>{_IDENT})", re.I)
_ON_TABLE = re.compile(r"(?P<head>\s+ON\s+)(?P<table>.+?)(?P<open>\s*\()", re.I | re.S)


def _bare_name(identifier: str) -> str:
    return identifier[1:-1].replace('""', '"') if identifier.startswith('"') else identifier.lower()


def _mentions(column: str) -> re.Pattern[str]:
    """``column`` as an identifier in an index's SQL, quoted or not."""
    quoted = '"' + column.replace('"', '""') + '"'
    bare = re.escape(column)
    return re.compile(rf'(?<![\w$"]){re.escape(quoted)}|(?<![\w$".]){bare}(?![\w$"])', re.I)


def drops_constraint(sql: str) -> bool:
    """Whether ``sql`` is ALTER TABLE … DROP CONSTRAINT (which DuckDB's parser refuses)."""
    found = _ALTER_TABLE.match(sql)
    return found is not None and _DROP_CONSTRAINT.match(found.group("action")) is not None


def alter_around_indexes(
    cursor: duckdb.DuckDBPyConnection, query: str, in_block: bool
) -> Result | None:
    """An ALTER TABLE run with the table's indexes dropped and made again (see above); None
    when the table has none (the ALTER runs as it is). ``in_block``: the session's transaction
    block is open (a worker thread)."""
    found = _ALTER_TABLE.match(query)
    named = _TABLE_NAME.fullmatch(found.group("table")) if found is not None else None
    if found is None or named is None:
        return None
    table = _bare_name(named.group("second") or named.group("first"))
    schema = _bare_name(named.group("first")) if named.group("second") else None
    try:
        indexes = cursor.execute(
            "select schema_name, index_name, sql from duckdb_indexes() "
            "where lower(table_name) = lower(?) and (? is null or lower(schema_name) = lower(?))"
            " and sql is not null",
            [table, schema, schema],
        ).fetchall()
    except duckdb.Error:
        return None
    action = found.group("action")
    constraint = _DROP_CONSTRAINT.match(action)
    if constraint is not None:  # (a unique constraint added as an index: dropped as one)
        name = _bare_name(constraint.group("name"))
        for index_schema, index, _ in indexes:
            if index.lower() == name.lower():
                try:
                    cursor.execute(
                        f'drop index "{index_schema}"."{index.replace(chr(34), chr(34) * 2)}"'
                    )
                except duckdb.Error as e:
                    raise QueryError(sqlstate_for(e), first_line(e)) from None
                return Result([], [], "ALTER TABLE", [])
        return None  # (a constraint DuckDB has: its own answer, which is that it cannot)
    if not indexes:
        return None
    rename_column = _RENAME_COLUMN.match(action)
    rename_table = _RENAME_TABLE.match(action)
    dropped = _DROP_COLUMN.match(action)
    renamed = (f"{schema}." if schema else "") + (rename_table.group("new") if rename_table else "")

    def on_renamed(on: re.Match[str]) -> str:
        return on.group("head") + renamed + on.group("open")

    remade: list[str] = []
    for _, _, sql in indexes:
        head, _, columns = sql.partition("(")
        if dropped is not None and _mentions(_bare_name(dropped.group("column"))).search(columns):
            continue  # (an index on a dropped column goes with it)
        if rename_column is not None:
            old, new = _bare_name(rename_column.group("old")), rename_column.group("new")
            columns = _mentions(old).sub(new.replace("\\", "\\\\"), columns)
        if rename_table is not None:
            head = _ON_TABLE.sub(on_renamed, head + "(", count=1)[:-1]
        remade.append(head + "(" + columns)
    for index_schema, name, _ in indexes:
        try:
            cursor.execute(f'drop index "{index_schema}"."{name.replace(chr(34), chr(34) * 2)}"')
        except duckdb.Error as e:
            raise QueryError(sqlstate_for(e), first_line(e)) from None
    try:
        cursor.execute(query)
    except duckdb.Error as e:
        if not in_block:  # (inside a block the client's ROLLBACK brings them back)
            for _, _, sql in indexes:
                with contextlib.suppress(duckdb.Error):
                    cursor.execute(sql)
        raise QueryError(sqlstate_for(e), first_line(e)) from None
    for sql in remade:
        try:
            cursor.execute(sql)
        except duckdb.Error as e:
            raise QueryError(
                sqlstate_for(e),
                f"the table was altered, but an index of it was not made again: "
                f"{first_line(e)} ({sql})",
            ) from None
    return Result([], [], "ALTER TABLE", [])


NAME_ARRAY = PgType("name[]", 1003, -1, element=NAME)
TEXT_ARRAY = pg_type("VARCHAR[]")


def _postgresql_named(query: str, columns: list[tuple[str, PgType]]) -> list[tuple[str, PgType]]:
    """The columns named as PostgreSQL names them (``names``: ``count``, not DuckDB's
    ``count_star()``)."""
    names = postgresql_names(query, [name for name, _ in columns])
    return [(name, t) for name, (_, t) in zip(names, columns, strict=True)]


def first_line(error: BaseException) -> str:
    return str(error).split("\n", 1)[0]
