"""What PostgreSQL clients send that DuckDB does not understand, answered the PostgreSQL way.

Drivers and tools run a few statements of their own on connect: SQLAlchemy asks for
``pg_catalog.version()`` and ``SHOW standard_conforming_strings``, psql's ``\\dt`` calls
``pg_catalog.pg_get_userbyid``, psycopg's nested ``transaction()`` opens a SAVEPOINT, JDBC and
others ``SET`` PostgreSQL parameters DuckDB has never heard of. This module answers those
statements locally (``local_statement``) or rewrites them into DuckDB SQL (``rewrite``).

DuckDB has no savepoints: SAVEPOINT and RELEASE succeed (a transaction that never rolls back to
its savepoint behaves exactly as in PostgreSQL), and ROLLBACK TO SAVEPOINT fails with 0A000,
leaving the transaction failed, so nothing half-undone can be committed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from proxy.backends.pgtypes import ARRAY_ELEMENT, BUILTIN, CHAR, INT4, NAME, OID, TEXT, PgType

__all__ = ["LocalAnswer", "Unsupported", "local_statement", "rewrite", "session_macros"]

# Parameters a PostgreSQL client may SHOW or SET that DuckDB lacks; SET stores them per session.
PG_SETTINGS: dict[str, str] = {
    "standard_conforming_strings": "on",
    "transaction isolation level": "repeatable read",  # DuckDB's snapshot isolation
    "transaction_isolation": "repeatable read",
    "default_transaction_isolation": "repeatable read",
    "client_encoding": "UTF8",
    "server_encoding": "UTF8",
    "datestyle": "ISO, MDY",
    "intervalstyle": "postgres",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "application_name": "",
    "client_min_messages": "notice",
    "statement_timeout": "0",
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "integer_datetimes": "on",
    "max_identifier_length": "63",
    "default_transaction_read_only": "off",
    "transaction_read_only": "off",
    "synchronous_commit": "on",
    "jit": "off",
    "default_table_access_method": "heap",
    "max_index_keys": "32",
    "server_version_num": "150000",
}


@dataclass(slots=True)
class LocalAnswer:
    tag: str
    columns: list[tuple[str, PgType]] = field(default_factory=list)
    rows: list[tuple[object, ...]] = field(default_factory=list)


class Unsupported(Exception):
    """A PostgreSQL statement DuckDB cannot carry out (SQLSTATE 0A000)."""


_SHOW = re.compile(r"\s*show\s+(.+?)\s*;?\s*\Z", re.I | re.S)
_SET = re.compile(
    r"\s*set\s+(?:session\s+|local\s+)?([\w.]+|transaction\s+isolation\s+level)\s*(?:=|\bto\b)?"
    r"\s*(.*?)\s*;?\s*\Z",
    re.I | re.S,
)
_SESSION_CHARACTERISTICS = re.compile(r"\s*set\s+session\s+characteristics\b", re.I)
_NAME = r'(?:\w+|"(?:[^"]|"")+")'
_SAVEPOINT = re.compile(rf"\s*savepoint\s+{_NAME}\s*;?\s*\Z", re.I)
_RELEASE = re.compile(rf"\s*release\s+(?:savepoint\s+)?{_NAME}\s*;?\s*\Z", re.I)
_ROLLBACK_TO = re.compile(r"\s*rollback\s+(?:work\s+|transaction\s+)?to\s", re.I)
_BEGIN_MODES = re.compile(
    r"\s*(begin|start\s+transaction)\b(?:\s+(?:transaction|work)\b)?(.*)", re.I | re.S
)


def local_statement(sql: str, settings: dict[str, str]) -> LocalAnswer | None:
    """Answer ``sql`` here if it is one of the PostgreSQL-only statements; None otherwise.
    ``settings`` holds this session's values, changed by SET."""
    head = sql.lstrip()[:12].lower()
    if head.startswith("show"):
        match = _SHOW.match(sql)
        if match:
            name = " ".join(match.group(1).lower().split())
            if name in PG_SETTINGS or name in settings:
                value = settings.get(name, PG_SETTINGS.get(name, ""))
                column = name.split()[-1] if name.startswith("transaction ") else name
                return LocalAnswer("SHOW", [(column, TEXT)], [(value,)])
    elif head.startswith("set"):
        if _SESSION_CHARACTERISTICS.match(sql):
            return LocalAnswer("SET")
        match = _SET.match(sql)
        if match:
            name = " ".join(match.group(1).lower().split())
            if name in PG_SETTINGS:
                settings[name] = match.group(2).strip("'\"")
                return LocalAnswer("SET")
    elif head.startswith("savepoint"):
        if _SAVEPOINT.match(sql):
            return LocalAnswer("SAVEPOINT")
    elif head.startswith("release"):
        if _RELEASE.match(sql):
            return LocalAnswer("RELEASE")
    elif head.startswith("rollback") and _ROLLBACK_TO.match(sql):
        raise Unsupported(
            "DuckDB has no savepoints: ROLLBACK TO SAVEPOINT is not supported; "
            "roll back the whole transaction"
        )
    return None


def begin_statement(sql: str) -> str | None:
    """``BEGIN ISOLATION LEVEL …`` / ``START TRANSACTION READ WRITE`` as DuckDB's plain
    BEGIN (its one isolation level is snapshot isolation); None if ``sql`` is no BEGIN with
    modes."""
    match = _BEGIN_MODES.match(sql)
    if match and match.group(2).strip(" ;"):
        return "BEGIN"
    return None


_FUNCTIONS = re.compile(
    r"\bpg_catalog\s*\.\s*(?=(?:pg_get_userbyid|version|current_setting|pg_encoding_to_char|to_regtype)\s*\()",
    re.I,
)
_VERSION = re.compile(r"\bversion\s*\(\s*\)", re.I)
_REG_CAST = re.compile(r"::\s*reg(?:type|class|proc|namespace)\b", re.I)  # an oid as itself
_MAYBE = re.compile(r"pg_catalog|version|::\s*reg|serial", re.I)


def rewrite(sql: str, server_version: str) -> str:
    """Map PostgreSQL functions DuckDB lacks or names differently to DuckDB SQL, and serial
    columns to sequences."""
    if not _MAYBE.search(sql):  # (one scan of every statement's text: the usual case)
        return sql
    if _SERIAL_HINT.search(sql):
        sql = serials(sql)
    sql = _REG_CAST.sub("", _FUNCTIONS.sub("", sql))
    literal = "'" + server_version.replace("'", "''") + "'"
    return _VERSION.sub(literal, sql)


# CREATE TABLE with serial columns (SQLAlchemy's and Django's integer primary keys): DuckDB has
# no serial types, so each becomes an integer column defaulting to its own sequence, created
# first and named as PostgreSQL names it (<table>_<column>_seq)
_SERIAL_HINT = re.compile(r"serial", re.I)
_CREATE_TABLE = re.compile(
    r"\s*create\s+(?P<temp>(?:(?:global|local)\s+)?temp(?:orary)?\s+)?(?:unlogged\s+)?table\s+"
    r'(?:if\s+not\s+exists\s+)?(?P<name>(?:"[^"]+"|[\w$]+)(?:\s*\.\s*(?:"[^"]+"|[\w$]+))?)\s*\(',
    re.I,
)
_SERIAL_COLUMN = re.compile(
    r'(?P<lead>[(,]\s*)(?P<column>"[^"]+"|[A-Za-z_][\w$]*)\s+'
    r"(?P<type>smallserial|bigserial|serial[248]?)\b",
    re.I,
)
_SERIAL_TYPES = {"smallserial": "SMALLINT", "serial2": "SMALLINT", "serial8": "BIGINT"}
SEQUENCE_PREFIX = re.compile(r"(?:create (?:temp )?sequence if not exists [\w.]+; )+")


def serials(sql: str) -> str:
    """``sql`` with each serial column of a CREATE TABLE as an integer defaulting to a sequence
    created just before it (unchanged if it is no CREATE TABLE with one)."""
    table = _CREATE_TABLE.match(sql)
    if table is None:
        return sql
    parts = [p.strip().strip('"') for p in table.group("name").split(".")]
    sequences: list[str] = []

    def column(found: re.Match[str]) -> str:
        name = found.group("column").strip('"')
        sequence = ".".join([*parts[:-1], re.sub(r"\W", "_", f"{parts[-1]}_{name}_seq").lower()])
        sequences.append(sequence)
        kind = found.group("type").lower()
        integer = "BIGINT" if kind == "bigserial" else _SERIAL_TYPES.get(kind, "INTEGER")
        return (
            f"{found.group('lead')}{found.group('column')} {integer} DEFAULT nextval('{sequence}')"
        )

    start = table.end() - 1
    body = _SERIAL_COLUMN.sub(column, sql[start:])
    if not sequences:
        return sql
    temp = "temp " if table.group("temp") else ""
    created = "".join(f"create {temp}sequence if not exists {q}; " for q in sequences)
    return created + sql[:start] + body


# INSERT/UPDATE/DELETE … RETURNING: a Describe of the statement must tell its columns (asyncpg
# and pg8000 read rows by it), and DuckDB describes only what it may run; the same columns are
# those of a SELECT of the RETURNING list from the target table
_DML_TARGET = re.compile(
    r'\s*(?:insert\s+into|update|delete\s+from)\s+(?P<table>(?:"[^"]+"|[\w$]+)'
    r'(?:\s*\.\s*(?:"[^"]+"|[\w$]+))?)(?:\s+(?:as\s+)?(?P<alias>(?!set\b|values\b|where\b|'
    r"select\b|default\b|using\b|returning\b|on\b)[A-Za-z_]\w*))?",
    re.I,
)
_RETURNING = re.compile(r"\breturning\b", re.I)


def returning_select(sql: str, kind: str) -> str | None:
    """A SELECT with the columns of a DML statement's RETURNING list, or None when it has none
    (or one that names a parameter)."""
    if kind not in ("INSERT", "UPDATE", "DELETE"):
        return None
    target = _DML_TARGET.match(sql)
    ends = list(_RETURNING.finditer(sql))
    if target is None or not ends:
        return None
    listed = sql[ends[-1].end() :].strip().rstrip(";")
    if "$" in listed:
        return None  # (a parameter in the list: numbered as in the whole statement)
    alias = target.group("alias")
    source = target.group("table") + (f" as {alias}" if alias else "")
    return f"select {listed} from {source}"


def session_macros(user: str) -> list[str]:
    """Temporary macros for PostgreSQL functions that psql's describe commands and psycopg's
    type discovery call."""
    quoted = "'" + user.replace("'", "''") + "'"
    return [
        f"create or replace temp macro pg_get_userbyid(id) as {quoted}",
        "create or replace temp macro pg_encoding_to_char(id) as 'UTF8'",
        "create or replace temp macro to_regtype(name) as "
        "(select oid from pg_catalog.pg_type where typname = name limit 1)",
    ]


# -- parameter types -------------------------------------------------------------------------
# PostgreSQL tells a client the type of each $n (ParameterDescription) and drivers such as asyncpg
# encode arguments by it. DuckDB resolves parameter types only when values arrive, so they are
# inferred here from the columns they are compared with or inserted into; anything else is text,
# which DuckDB casts to whatever the statement needs.

_OPERATOR = r"(?:=|<>|!=|<=|>=|<|>|\blike\b|\bilike\b)"
_COLUMN_THEN_PARAM = re.compile(rf"([\w.]+)\s*{_OPERATOR}\s*\$(\d+)", re.I)
_PARAM_THEN_COLUMN = re.compile(rf"\$(\d+)\s*{_OPERATOR}\s*([\w.]+)", re.I)
_BETWEEN = re.compile(r"([\w.]+)\s+between\s+\$(\d+)\s+and\s+\$(\d+)", re.I)
_IN_LIST = re.compile(r"([\w.]+)\s+in\s*\(\s*(\$\d+(?:\s*,\s*\$\d+)*)\s*\)", re.I)
_LIMIT = re.compile(r"\b(?:limit|offset)\s+\$(\d+)", re.I)
# a parameter beside a number (``1 + $1``, ``$2 >= 10``): PostgreSQL takes an untyped one to
# be of the other side's type, where DuckDB cannot choose an operator for a string and a number
_NUMERIC_OPERATOR = r"(?:[-+*/%]|=|<>|!=|<=|>=|<|>)"
_NUMBER_THEN_PARAM = re.compile(rf"(?<![\w.$])(\d+)(\.\d+)?\s*{_NUMERIC_OPERATOR}\s*\$(\d+)")
_PARAM_THEN_NUMBER = re.compile(rf"\$(\d+)\s*{_NUMERIC_OPERATOR}\s*(\d+)(\.\d+)?(?![\w.])")
_CAST = re.compile(r"\$(\d+)\s*::\s*([a-z][\w ]*?\w)(?=\s*(?:\)|,|$|\s(?!precision|zone)|;))", re.I)
_INSERT = re.compile(
    r"\s*insert\s+into\s+([\w.\"]+)\s*(?:\(([^)]*)\))?\s*values\s*\(([^)]*)\)", re.I | re.S
)


def infer_parameter_types(
    query: str, count: int, columns: dict[str, list[tuple[str, str]]]
) -> list[str | None]:
    """A DuckDB type name (or None) for each of ``count`` parameters. ``columns`` maps each
    table name to its (column, DuckDB type) list, in order."""
    types: list[str | None] = [None] * count
    by_column: dict[str, str | None] = {}
    for table_columns in columns.values():
        for name, kind in table_columns:
            known = by_column.get(name, kind)
            by_column[name] = kind if known == kind else None  # ambiguous: leave it out

    def put(number: str, kind: str | None) -> None:
        i = int(number) - 1
        if 0 <= i < count and kind is not None and types[i] is None:
            types[i] = kind

    def column(name: str) -> str | None:
        return by_column.get(name.rsplit(".", 1)[-1].lower())

    for number, name in _CAST.findall(query):
        put(number, _CAST_NAMES.get(" ".join(name.lower().split())))
    insert = _INSERT.match(query)
    if insert:
        table = insert.group(1).replace('"', "").rsplit(".", 1)[-1].lower()
        target = columns.get(table, [])
        names = (
            [n.strip().strip('"').lower() for n in insert.group(2).split(",")]
            if insert.group(2)
            else [n for n, _ in target]
        )
        kinds = dict(target)
        for name, value in zip(names, insert.group(3).split(","), strict=False):
            value = value.strip()
            if value.startswith("$") and value[1:].isdigit():
                put(value[1:], kinds.get(name))
    for name, number in _COLUMN_THEN_PARAM.findall(query):
        put(number, column(name))
    for number, name in _PARAM_THEN_COLUMN.findall(query):
        put(number, column(name))
    for name, low, high in _BETWEEN.findall(query):
        put(low, column(name))
        put(high, column(name))
    for name, members in _IN_LIST.findall(query):
        for member in members.split(","):
            put(member.strip()[1:], column(name))
    for number in _LIMIT.findall(query):
        put(number, "BIGINT")
    for _, fraction, number in _NUMBER_THEN_PARAM.findall(query):
        put(number, "DECIMAL(18,3)" if fraction else "INTEGER")
    for number, _, fraction in _PARAM_THEN_NUMBER.findall(query):
        put(number, "DECIMAL(18,3)" if fraction else "INTEGER")
    return types


_CAST_NAMES = {
    "int": "INTEGER",
    "int4": "INTEGER",
    "integer": "INTEGER",
    "int2": "SMALLINT",
    "smallint": "SMALLINT",
    "int8": "BIGINT",
    "bigint": "BIGINT",
    "text": "VARCHAR",
    "varchar": "VARCHAR",
    "numeric": "DECIMAL(18,3)",
    "decimal": "DECIMAL(18,3)",
    "float8": "DOUBLE",
    "double precision": "DOUBLE",
    "float4": "FLOAT",
    "real": "FLOAT",
    "bool": "BOOLEAN",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "time": "TIME",
    "timestamp": "TIMESTAMP",
    "timestamptz": "TIMESTAMP WITH TIME ZONE",
    "interval": "INTERVAL",
    "bytea": "BLOB",
    "uuid": "UUID",
}


# -- asyncpg's type introspection ------------------------------------------------------------
# asyncpg has no built-in codecs for arrays: it looks their element types up in pg_type with a
# recursive query DuckDB's pg_catalog cannot run, after switching JIT off. Both are answered
# here for the built-in types.

_OID_ARRAY = PgType("oid[]", 1028, -1, element=OID)
_TEXT_ARRAY = PgType("text[]", 1009, -1, element=TEXT)
TYPEINFO_COLUMNS: list[tuple[str, PgType]] = [
    ("oid", OID),
    ("ns", NAME),
    ("name", NAME),
    ("kind", CHAR),
    ("basetype", OID),
    ("elemtype", OID),
    ("elemdelim", CHAR),
    ("range_subtype", OID),
    ("attrtypoids", _OID_ARRAY),
    ("attrnames", _TEXT_ARRAY),
    ("depth", INT4),
    ("basetype_name", TEXT),
    ("elemtype_name", TEXT),
    ("range_subtype_name", TEXT),
]


def driver_statement(sql: str) -> str | None:
    """``"typeinfo"`` or ``"jit"`` for asyncpg's introspection statements, else None."""
    if "typeinfo_tree" in sql and "pg_type" in sql:
        return "typeinfo"
    if "set_config('jit'" in sql:
        return "jit"
    return None


def driver_answer(which: str, params: list[object]) -> LocalAnswer:
    if which == "jit":
        return LocalAnswer("SELECT 1", [("cur", TEXT), ("new", TEXT)], [("off", "off")])
    wanted = [int(oid) for oid in (params[0] if params and params[0] else [])]  # type: ignore[attr-defined]
    rows: list[tuple[object, ...]] = []
    for oid in wanted:
        element = ARRAY_ELEMENT.get(oid)
        if element is not None and element in BUILTIN:
            name = BUILTIN[element].name
            rows.append(_type_row(element, name, depth=1))
            rows.append(_type_row(oid, "_" + name, element=element, element_name=name))
        elif oid in BUILTIN:
            rows.append(_type_row(oid, BUILTIN[oid].name))
    return LocalAnswer(f"SELECT {len(rows)}", TYPEINFO_COLUMNS, rows)


def _type_row(
    oid: int, name: str, *, element: int = 0, element_name: str | None = None, depth: int = 0
) -> tuple[object, ...]:
    """One row of asyncpg's typeinfo query for a built-in base type (or array of one)."""
    delimiter = "," if element else None
    return (
        oid,
        "pg_catalog",
        name,
        "b",
        None,
        element,
        delimiter,
        None,
        None,
        None,
        depth,
        None,
        element_name,
        None,
    )
