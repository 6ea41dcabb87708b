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

import functools
import re
from collections.abc import Callable
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
    warning: str | None = None  # a WARNING notice to send with the answer


class Unsupported(Exception):
    """A PostgreSQL statement DuckDB cannot carry out (SQLSTATE 0A000)."""


# DuckDB adds no foreign key to an existing table (ORMs' migrations add them so: Django's, and
# Alembic's for tables that reference each other); the statement succeeds with a warning and
# the key is not enforced, as on a database without foreign keys
_ADD_FOREIGN_KEY = re.compile(
    r'\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?(?:"[^"]+"|[\w$]+)'
    r'(?:\s*\.\s*(?:"[^"]+"|[\w$]+))?\s+add\s+(?:constraint\s+(?:"[^"]+"|[\w$]+)\s+)?'
    r"foreign\s+key\b",
    re.I,
)
FOREIGN_KEY_WARNING = (
    "foreign key not added: DuckDB cannot add a foreign key to an existing table "
    "(declare it in CREATE TABLE to have it enforced)"
)
# DuckDB's foreign keys take no referential action (ON DELETE CASCADE, SET NULL, SET DEFAULT —
# Sequelize's and Rails' defaults): the key is kept and enforced without it, so that deleting
# or changing a referenced row fails (as with NO ACTION) rather than doing what it would
# on PostgreSQL; the statement warns
_FOREIGN_KEY_ACTION = re.compile(
    r"\s+on\s+(?:delete|update)\s+(?:cascade|set\s+(?:null|default)(?:\s*\([^)]*\))?)", re.I
)
FOREIGN_KEY_ACTION_WARNING = (
    "ON DELETE/ON UPDATE CASCADE, SET NULL and SET DEFAULT dropped: DuckDB's foreign keys take "
    "no referential action (deleting or changing a referenced row fails instead)"
)


def without_foreign_key_actions(sql: str) -> str | None:
    """A CREATE TABLE's text without its foreign keys' referential actions; None if it has
    none."""
    if not _FOREIGN_KEY_ACTION.search(sql):
        return None
    return _FOREIGN_KEY_ACTION.sub("", sql)


_SHOW = re.compile(r"\s*show\s+(.+?)\s*;?\s*\Z", re.I | re.S)
_SET = re.compile(
    r"\s*set\s+(?:session\s+|local\s+)?([\w.]+|transaction\s+isolation\s+level)\s*(?:=|\bto\b)?"
    r"\s*(.*?)\s*;?\s*\Z",
    re.I | re.S,
)
_RESET = re.compile(r"\s*reset\s+([\w.]+|transaction\s+isolation\s+level)\s*;?\s*\Z", re.I)
_SESSION_CHARACTERISTICS = re.compile(r"\s*set\s+session\s+characteristics\b", re.I)
# an SQL identifier, quoted or not, and one that may be schema-qualified (the patterns the
# embedded server's statement readers share)
IDENTIFIER = r'(?:"(?:[^"]|"")+"|[A-Za-z_][\w$]*)'
QUALIFIED = rf"{IDENTIFIER}(?:\s*\.\s*{IDENTIFIER})?"
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
    elif head.startswith("reset"):
        match = _RESET.match(sql)
        if match:
            name = " ".join(match.group(1).lower().split())
            if name == "all":  # (the PostgreSQL-only ones; DuckDB's own are kept)
                settings.clear()
                return LocalAnswer("RESET")
            if name in PG_SETTINGS:
                settings.pop(name, None)
                return LocalAnswer("RESET")
    elif head.startswith("savepoint"):
        if _SAVEPOINT.match(sql):
            return LocalAnswer("SAVEPOINT")
    elif head.startswith("release"):
        if _RELEASE.match(sql):
            return LocalAnswer("RELEASE")
    elif head.startswith("alter") and _ADD_FOREIGN_KEY.match(sql):
        return LocalAnswer("ALTER TABLE", warning=FOREIGN_KEY_WARNING)
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
_VERSION = re.compile(r"(?<![\w.])version\s*\(\s*\)", re.I)
# PostgreSQL's version(), as the backend makes it (DuckDB's own names DuckDB): a macro in the
# catalogs' schema (catalog.S), so that its column is named "version" as in PostgreSQL
VERSION_CALL = "admission_pg.main.version()"
_REG_CAST = re.compile(r"::\s*reg(?:type|class|proc|namespace)\b", re.I)  # an oid as itself
# What a statement needs for ``rewrite`` to touch it, tested on its lowercased text: words found
# by substring search, and the few that need a pattern by one regex whose every alternative
# starts with a literal character (so that re skips the positions no alternative starts at). A
# case-blind alternation of all of them took 60–100 µs on a TPC-H query, on every statement.
_MAYBE_WORDS = (
    "pg_catalog",
    "version",
    "serial",
    "identity",
    "index",
    "deferrable",
    "initially",
    "unnest",
    "'{",
    "drop",
    "truncate",
    "search_path",
    "constraint",
    "unlogged",
    "preserve",
    "json",
    "#>",
    "current_",
    "client_database",
    "to_char",
    "cascade",
    "set null",
    "set default",
    "numeric",
    "decimal",
)
_MAYBE = re.compile(
    r"::\s*reg|with\s*\(|for\s+(?:update|no|share|key)\b|select\s+from\b|"
    r" [+-]\d\d(?::?\d\d)?'"
)


def _maybe(sql: str) -> bool:
    """Whether ``rewrite`` may change ``sql`` (False for most statements). Remembered for the
    texts seen last — an application sends the same few again and again — unless long (a bulk
    INSERT's text is not kept)."""
    return _maybe_seen(sql) if len(sql) <= _REMEMBERED else _scan(sql)


_REMEMBERED = 4096  # (characters: at most this × the cache's size held)


def _scan(sql: str) -> bool:
    low = sql.lower()
    return (
        any(word in low for word in _MAYBE_WORDS)
        or _MAYBE.search(low) is not None
        or _duckdb_word(low)
    )


_maybe_seen = functools.lru_cache(maxsize=1024)(_scan)


def rewrite(sql: str, schema: str = "public") -> str:
    """Map PostgreSQL functions DuckDB lacks or names differently to DuckDB SQL, and its DDL
    to DuckDB's (see ``ddl``); ``schema``: the database's default schema (``search_path``)."""
    if not _maybe(sql):  # (the usual case)
        return sql
    sql = ddl(sql)
    if (plain := without_foreign_key_actions(sql)) is not None:
        sql = plain
    if _LOCKING.search(sql):
        sql = _LOCKING.sub("", sql)
    if _SPACED_OFFSET.search(sql):
        sql = _SPACED_OFFSET.sub(
            lambda m: (m.group(1) or m.group(3)) + (m.group(2) or m.group(4)), sql
        )
    if _TO_CHAR.search(sql):
        sql = to_chars(sql)
    if _FROM_FUNCTION.search(sql):
        sql = _FROM_FUNCTION.sub(_from_function, sql)
    if _EMPTY_SELECT.search(sql):
        sql = _EMPTY_SELECT.sub(r"\1 null\2", sql)
    if "json" in sql.lower() or "#>" in sql:
        sql = _JSON_PATH.sub(_json_path, _JSON_FUNCTION.sub(_json_function, sql))
    if "search_path" in sql[:40].lower():
        sql = search_path(sql, schema)
    if _UNNEST.search(sql):
        sql = unnests(sql)
    if "'{" in sql:
        sql = array_literals(sql)
    if "numeric" in (low := sql.lower()) or "decimal" in low:
        sql = unbounded_numerics(sql)
    if _duckdb_word(low):
        sql = duckdb_words_quoted(sql)
    sql = _REG_CAST.sub("", _FUNCTIONS.sub("", sql))
    return _VERSION.sub(VERSION_CALL, sql)


# PostgreSQL's numeric without a precision holds any value exactly; DuckDB's NUMERIC is
# DECIMAL(18,3), which stores 37.774929 as 37.775 without a word. Where a statement names the
# type without one — a column's type in CREATE or ALTER TABLE, a cast — it is DECIMAL(38,9)
# (as pg_lake maps PostgreSQL's unbounded numeric for DuckDB): 29 digits before the point, 9
# after, products of three such values still in range. Its values travel as PostgreSQL's
# unconstrained numeric, without the trailing zeros of the fixed scale (pgtypes: a DECIMAL(38,
# 9·k) is described and written as numeric without a typmod).
UNBOUNDED_NUMERIC = "DECIMAL(38,9)"
_NUMERIC_CAST = re.compile(r"(::\s*)(?:numeric|decimal)\b(?!\s*\()", re.I)
_NUMERIC_CAST_AS = re.compile(r"(\bas\s+)(?:numeric|decimal)\b(?=\s*(?:\[\s*\]\s*)?\))", re.I)
_NUMERIC_COLUMN = re.compile(r"([\w$\"]\s+)(?:numeric|decimal)\b(?!\s*\()", re.I)
_NUMERIC_AFTER_NAME = re.compile(r"^(\s*)(?:numeric|decimal)\b(?!\s*\()", re.I)
_TABLE_DDL = re.compile(
    r"\s*(?:create\s+(?:(?:global\s+|local\s+)?temp(?:orary)?\s+|unlogged\s+)?table"
    r"|alter\s+table)\b",
    re.I,
)
_QUOTED = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")")


def unbounded_numerics(sql: str) -> str:
    """``sql`` with ``numeric`` and ``decimal`` without a precision, where they name a type
    (outside strings and quoted names), as ``UNBOUNDED_NUMERIC``."""
    table_ddl = _TABLE_DDL.match(sql) is not None
    parts = _QUOTED.split(sql)
    for i in range(0, len(parts), 2):  # (the odd ones are quoted)
        part = _NUMERIC_CAST.sub(rf"\g<1>{UNBOUNDED_NUMERIC}", parts[i])
        part = _NUMERIC_CAST_AS.sub(rf"\g<1>{UNBOUNDED_NUMERIC}", part)
        if table_ddl:
            part = _NUMERIC_COLUMN.sub(rf"\g<1>{UNBOUNDED_NUMERIC}", part)
            if i and parts[i - 1].endswith('"'):  # (a quoted column name before it)
                part = _NUMERIC_AFTER_NAME.sub(rf"\g<1>{UNBOUNDED_NUMERIC}", part)
        parts[i] = part
    return "".join(parts)


# words DuckDB's grammar keeps for itself (reserved, or never a column's name) where
# PostgreSQL's takes them as names: a column named "at" or "show" failed DuckDB's parser
_DUCKDB_WORDS = frozenset(
    {
        *("at", "show", "describe", "summarize", "pivot", "unpivot", "pivot_longer"),
        *("pivot_wider", "qualify", "lambda", "anti", "semi", "asof", "positional", "glob"),
        "unpack",
    }
)
# each word, where it ends a word (the regex led by its letters: a scan of a statement without
# it costs next to nothing; the character before is looked at for each match)
_DUCKDB_WORD_ENDS = tuple(
    (word, re.compile(re.escape(word) + r"(?![\w$\"])")) for word in sorted(_DUCKDB_WORDS)
)


def _duckdb_word(low: str) -> bool:
    """Whether the lowercased statement has one of ``_DUCKDB_WORDS`` as a word of its own."""
    for word, ends in _DUCKDB_WORD_ENDS:
        if word in low:
            for found in ends.finditer(low):
                start = found.start()
                if start == 0 or not (low[start - 1].isalnum() or low[start - 1] in '_$"'):
                    return True
    return False


_JOINS = frozenset({"anti", "semi", "asof", "positional"})  # (… JOIN: DuckDB's own joins)


def duckdb_words_quoted(sql: str) -> str:
    """``sql`` with those of ``_DUCKDB_WORDS`` that PostgreSQL reads as names quoted. Only in a
    statement PostgreSQL's parser takes (DuckDB's own SQL — QUALIFY, PIVOT, a lambda, an ASOF
    join, FROM t AT (VERSION => 3) — is none, and stays as it is), and not where the word is
    PostgreSQL's keyword too (AT TIME ZONE, AT LOCAL) or names DuckDB's joins (SEMI JOIN)."""
    from pglast import parse_sql  # (here: statements with such a word are few)
    from pglast.parser import ParseError, scan

    try:
        parse_sql(sql)
        tokens = scan(sql)
    except ParseError:
        return sql
    out: list[str] = []  # (the tokens' offsets count characters)
    last = 0
    for i, token in enumerate(tokens):
        word = sql[token.start : token.end + 1].lower()
        if word not in _DUCKDB_WORDS:
            continue
        following = [t.name for t in tokens[i + 1 : i + 3]]
        if word == "at" and (following == ["TIME", "ZONE"] or following[:1] == ["LOCAL"]):
            continue
        if word in _JOINS and following[:1] == ["JOIN"]:
            continue
        if word == "show" and (i == 0 or tokens[i - 1].name == "ASCII_59"):  # (SHOW x;)
            continue
        out += [sql[last : token.start], f'"{word}"']
        last = token.end + 1
    if not out:
        return sql
    out.append(sql[last:])
    return "".join(out)


# a timestamp with a space before its UTC offset ('2024-01-02 03:04:05.000 +00:00', how
# Sequelize writes every date): PostgreSQL reads it, DuckDB takes "+00:00" for a zone's name
# (a literal is rewritten only where it is compared or cast to a timestamp — a string stored
# in a text column keeps its space; Sequelize binds the values it stores, and the parameter's
# inferred type says when it is a timestamp)
_SPACED_OFFSET = re.compile(
    r"((?:[<>=]|\bbetween|\band|\b(?:timestamp|timestamptz)(?:\s+with\s+time\s+zone)?)\s*'"
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?) ([+-]\d\d(?::?\d\d)?')"
    r"|('\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?) ([+-]\d\d(?::?\d\d)?')"
    r"(?=\s*::\s*timestamp)",
    re.I,
)
_SPACED_VALUE = re.compile(r"^(\s*\d{4}-\d\d-\d\d[ T][\d:.]+) ([+-]\d\d(?::?\d\d)?\s*)$")


def spaced_offset(text: str) -> str:
    """A timestamp's text with no space before its offset (``text`` itself otherwise)."""
    return _SPACED_VALUE.sub(r"\1\2", text) if " +" in text or " -" in text else text


# INSERT … VALUES storing a timestamp with a spaced offset (Sequelize's bulkCreate writes its
# dates inline): which literals go into a timestamp column is known only from the table, so
# the executor asks (``assigned_timestamps``); only such statements pay the parse
SPACED_LITERAL = re.compile(
    r"'\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)? [+-]\d\d(?::?\d\d)?'"
)
_TIME_TYPES = ("TIMESTAMP", "DATE", "TIME")


def assigned_timestamps(
    sql: str, columns_of: Callable[[str | None, str], list[tuple[str, str]] | None]
) -> str:
    """``sql`` with the spaced-offset literals an INSERT … VALUES stores into timestamp, date
    or time columns closed up (``spaced_offset``); the same text stored into another column
    as well keeps its space everywhere. ``columns_of(schema, table)``: the table's columns
    (name, DuckDB type) in order, None when there is no such table."""
    import pglast  # (here: most servers never see such a statement)
    from pglast import ast

    try:
        statements = pglast.parse_sql(sql)
    except Exception:  # (not PostgreSQL's syntax: DuckDB says what it makes of it)
        return sql
    if len(statements) != 1 or not isinstance(insert := statements[0].stmt, ast.InsertStmt):
        return sql
    values = insert.selectStmt
    if not isinstance(values, ast.SelectStmt) or not values.valuesLists:
        return sql
    relation = insert.relation
    if relation is None or not relation.relname:
        return sql
    table = columns_of(relation.schemaname, relation.relname)
    if not table:
        return sql
    types = {name.lower(): kind for name, kind in table}
    names = [c.name for c in insert.cols] if insert.cols else [name for name, _ in table]
    stamped: set[str] = set()
    other: set[str] = set()
    for row in values.valuesLists:
        for name, item in zip(names, row, strict=False):
            if isinstance(item, ast.A_Const) and isinstance(item.val, ast.String):
                text = item.val.sval
                if text and _SPACED_VALUE.match(text):
                    timed = types.get(name.lower(), "").startswith(_TIME_TYPES)
                    (stamped if timed else other).add(text)
    for text in stamped - other:
        sql = sql.replace("'" + text.replace("'", "''") + "'", "'" + spaced_offset(text) + "'")
    return sql


# SELECT * FROM current_schema() (TypeORM): a function in FROM, which DuckDB has as a scalar
_FROM_FUNCTION = re.compile(
    r"(\bfrom\s+)(current_schema|current_database|admission_pg\.main\.client_database)"
    r"\s*\(\s*\)",
    re.I,
)


def _from_function(match: re.Match[str]) -> str:
    name = match.group(2)
    column = "current_database" if name.endswith("client_database") else name
    return f"{match.group(1)}(select {name}() as {column})"


# SELECT FROM t, an empty select list (EXISTS (SELECT FROM …): drizzle-kit): one NULL column
_EMPTY_SELECT = re.compile(r"((?:^|\()\s*select)(\s+from\b)", re.I)
# PostgreSQL's JSON functions by DuckDB's names; #> and #>> paths ('{a,0,b}') as JSONPath
_JSON_FUNCTIONS = {
    "json_agg": "json_group_array",
    "jsonb_agg": "json_group_array",
    "json_build_array": "json_array",
    "jsonb_build_array": "json_array",
    "json_build_object": "json_object",
    "jsonb_build_object": "json_object",
    "to_jsonb": "to_json",
    "json_object_agg": "json_group_object",
    "jsonb_object_agg": "json_group_object",
}
_JSON_FUNCTION = re.compile(r"(?<![\w.$])(" + "|".join(_JSON_FUNCTIONS) + r")(\s*\()", re.I)
_JSON_PATH = re.compile(r"#>(>?)\s*'\{((?:[^'}]|'')*)\}'")


def _json_function(found: re.Match[str]) -> str:
    return _JSON_FUNCTIONS[found.group(1).lower()] + found.group(2)


def _json_path(found: re.Match[str]) -> str:
    path = "$"
    for item in split_list(found.group(2)):
        key = item.strip().strip('"').replace("''", "'")
        if key.isdigit():
            path += f"[{key}]"
        else:
            path += "." + (
                key if re.fullmatch(r"[A-Za-z_]\w*", key) else '"' + key.replace('"', '\\"') + '"'
            )
    return f"->{found.group(1)} '{path.replace(chr(39), chr(39) * 2)}'"


# to_char(timestamp, 'YYYY-MM-DD HH24:MI') with a literal format (reports and dashboards):
# DuckDB's strftime with the same fields; a format with a field strftime has not (Q, number
# formats such as '999.99') is left to DuckDB's error
_TO_CHAR = re.compile(r"(?<![\w.$])to_char\s*\(", re.I)
# (only what strftime writes as PostgreSQL does: 'Month' and 'Day' are blank-padded to 9
# there, upper- and lower-case names cased so; those are left to DuckDB's error, but for
# FMMonth and FMDay). Longest first; FM (no padding) is handled before.
_DATE_FIELDS = [
    ("HH24", "%H"),
    ("HH12", "%I"),
    ("HH", "%I"),
    ("YYYY", "%Y"),
    ("YY", "%y"),
    ("Mon", "%b"),
    ("MM", "%m"),
    ("MI", "%M"),
    ("SS", "%S"),
    ("MS", "%g"),
    ("US", "%f"),
    ("DDD", "%j"),
    ("DD", "%d"),
    ("Dy", "%a"),
    ("IW", "%V"),
    ("AM", "%p"),
    ("PM", "%p"),
    ("TZ", "%Z"),
]
_UNPADDED_NAMES = [("Month", "%B"), ("Day", "%A")]  # (after FM only)
_UNPADDED = {
    "%m": "%-m",
    "%d": "%-d",
    "%H": "%-H",
    "%I": "%-I",
    "%M": "%-M",
    "%S": "%-S",
    "%j": "%-j",
}


def date_format(pattern: str) -> str | None:
    """PostgreSQL's to_char pattern as strftime's, or None when it has a field strftime
    has not (or is a number format)."""
    out, i, unpadded = [], 0, False
    while i < len(pattern):
        if pattern.startswith("FM", i) or pattern.startswith("fm", i):
            unpadded, i = True, i + 2
            continue
        if pattern[i] == '"':  # (quoted text is itself)
            end = pattern.find('"', i + 1)
            end = len(pattern) if end < 0 else end
            out.append(pattern[i + 1 : end].replace("%", "%%"))
            i = end + 1
            continue
        for name, code in (_UNPADDED_NAMES if unpadded else []) + _DATE_FIELDS:
            if pattern.startswith(name, i):
                out.append(_UNPADDED.get(code, code) if unpadded else code)
                i += len(name)
                break
        else:
            c = pattern[i]
            if c.isalpha() or c in "9#0":  # (a field strftime lacks, or a number format)
                return None
            out.append("%%" if c == "%" else c)
            i += 1
        unpadded = False
    return "".join(out)


def to_chars(sql: str) -> str:
    """``sql`` with each to_char of a literal date format as strftime."""
    out, position = [], 0
    for found in _TO_CHAR.finditer(sql):
        if found.start() < position:
            continue
        arguments, end = _arguments(sql, found.end())
        if arguments is None or len(arguments) != 2:
            continue
        literal = arguments[1].strip()
        if not (len(literal) >= 2 and literal[0] == literal[-1] == "'"):
            continue
        converted = date_format(literal[1:-1].replace("''", "'"))
        if converted is None:
            continue
        quoted = "'" + converted.replace("'", "''") + "'"
        out.append(sql[position : found.start()] + f"strftime({arguments[0].strip()}, {quoted})")
        position = end
    return "".join(out) + sql[position:] if out else sql


# SELECT … FOR UPDATE / FOR SHARE [OF t] [NOWAIT | SKIP LOCKED] (Django's select_for_update,
# SQLAlchemy's with_for_update): DuckDB takes no row locks. Its transactions see a snapshot and
# a second writer of a row fails at its write with 40001 (a serialization failure) where
# PostgreSQL would have made it wait, so the clause is dropped: what it protects still cannot
# be lost, it fails instead of waiting (and SKIP LOCKED skips nothing)
_LOCKING = re.compile(
    r"\s+for\s+(?:update|no\s+key\s+update|share|key\s+share)"
    r'(?:\s+of\s+(?:"[^"]+"|[\w$.]+)(?:\s*,\s*(?:"[^"]+"|[\w$.]+))*)?'
    r"(?:\s+nowait|\s+skip\s+locked)?(?=\s*(?:;|$|limit\b|offset\b))",
    re.I,
)

# unnest(a, b, …) in FROM: PostgreSQL zips the arrays into rows (Django's bulk_create sends
# it); DuckDB's unnest takes one list, and its unnests side by side in one SELECT zip them the
# same way (the shorter padded with NULL)
_UNNEST = re.compile(r"(?:\b(?:from|join)|,)\s+unnest\s*\(", re.I)
_ORDINALITY = re.compile(r"\s+with\s+ordinality\b", re.I)


def unnests(sql: str) -> str:
    """``sql`` with each unnest of several arrays in a FROM as a subquery of one unnest per
    array, and one more for WITH ORDINALITY (unchanged where none has several)."""
    out: list[str] = []
    position = 0
    for found in _UNNEST.finditer(sql):
        if found.start() < position:
            continue
        arguments, end = _arguments(sql, found.end())
        if arguments is None or len(arguments) < 2:
            continue
        start = found.start() + found.group(0).lower().index("unnest")
        columns = [f"unnest({a.strip()})" for a in arguments]
        ordinality = _ORDINALITY.match(sql, end)
        if ordinality is not None:  # (the row's number: 1 to the longest array's length)
            longest = "greatest(" + ", ".join(f"len({a.strip()})" for a in arguments) + ")"
            columns.append(f"unnest(range(1, {longest} + 1))")
            end = ordinality.end()
        out.append(sql[position:start] + f"(select {', '.join(columns)})")
        position = end
    return "".join(out) + sql[position:] if out else sql


def _arguments(sql: str, start: int) -> tuple[list[str] | None, int]:
    """The top-level comma-separated arguments of the call whose "(" ends just before
    ``start``, and the position after its ")"; (None, start) if it does not close."""
    depth, quote, begin = 0, "", start
    arguments: list[str] = []
    for i in range(start, len(sql)):
        c = sql[i]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                arguments.append(sql[begin:i])
                return arguments, i + 1
            depth -= 1
        elif c == "," and depth == 0:
            arguments.append(sql[begin:i])
            begin = i + 1
    return None, start


# an array literal as PostgreSQL writes it, cast to an array type ('{1,2}'::int4[], what
# psycopg's client-side binding sends for a list): DuckDB reads lists as [1, 2], so the literal
# becomes a list of its items as strings, which the cast then converts
_ARRAY_LITERAL = re.compile(
    r"(?:(?<![\w$])[Ee]'(?P<escaped>\{(?:[^'\\]|''|\\.)*\})'|'(?P<plain>\{(?:[^']|'')*\})')"
    r"(?=\s*\)?\s*::\s*[\w\" ]+\[\])",
    re.S,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def array_literals(sql: str) -> str:
    """``sql`` with each PostgreSQL array literal that is cast to an array type as a DuckDB
    list of its items (a multidimensional one left as it is)."""

    def listed(found: re.Match[str]) -> str:
        if found.group("escaped") is not None:  # E'…': backslash escapes
            text = re.sub(
                r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), found.group("escaped")
            )
        else:
            text = found.group("plain")
        try:
            items = array_items(text.replace("''", "'"))
        except ValueError:
            return found.group(0)
        quoted = ("NULL" if i is None else "'" + i.replace("'", "''") + "'" for i in items)
        return "[" + ", ".join(quoted) + "]"

    return _ARRAY_LITERAL.sub(listed, sql)


def array_items(text: str) -> list[str | None]:
    """The items of a one-dimensional array literal, ``{1,NULL,"a b"}``."""
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"malformed array literal: {text!r}")
    items: list[str | None] = []
    body, i = text[1:-1], 0
    while i < len(body):
        if body[i] == '"':
            i += 1
            chars = []
            while i < len(body) and body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i : i + 1])
                i += 1
            if i >= len(body):
                raise ValueError(f"malformed array literal: {text!r} (a quote is not closed)")
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


# GROUP BY a table's primary key lets a query select that table's other columns (PostgreSQL
# knows they depend on the key; Django's annotate() groups so); DuckDB wants each in the GROUP
# BY. Its binder error names one such column; the query is completed with it where the key it
# depends on is grouped by, and tried again
GROUP_BY_ERROR = re.compile(r'column "(?P<column>(?:[^"]|"")+)" must appear in the GROUP BY clause')
_GROUP_BY = re.compile(r"\bgroup\s+by\b", re.I)
_CLAUSE_END = re.compile(
    r"(?:having|order|limit|offset|window|qualify|union|except|intersect|fetch|for)\b", re.I
)


def group_by_completed(
    sql: str, column: str, primary_key: Callable[[str], list[str]]
) -> str | None:
    """``sql`` with ``column``, as the query qualifies it, added to each GROUP BY that holds
    the whole primary key of the column's table (``primary_key(table)``: its key columns, []
    for none); None when there is no such GROUP BY."""
    name = re.escape(column.replace('"', '""'))
    references = re.finditer(
        rf"(?P<q>{IDENTIFIER})\s*\.\s*(?:\"" + name + r'"|' + name + r"\b)",
        sql,
        re.I,
    )
    qualified = {_bare(r.group("q")): r.group(0) for r in references}
    out, position = [], 0
    for clause in _GROUP_BY.finditer(sql):
        start, end = clause.end(), _clause_end(sql, clause.end())
        items = {_bare(item) for item in _arguments(sql[start:end] + ")", 0)[0] or []}
        added = [
            reference
            for table, reference in qualified.items()
            if _bare(reference) not in items
            and (key := primary_key(_table_of(sql, table)))
            and all(f"{table}.{k.lower()}" in items for k in key)
        ]
        if added and start >= position:
            out.append(sql[position:end].rstrip() + ", " + ", ".join(added) + " ")
            position = end
    return "".join(out) + sql[position:] if out else None


def _bare(text: str) -> str:
    """An identifier or qualified column as compared here: unquoted, lower case, no spaces."""
    return re.sub(r"\s+", "", text).replace('"', "").lower()


def _clause_end(sql: str, start: int) -> int:
    """Where the list that begins at ``start`` ends: at the next clause's keyword, a ")" that
    closes what it is in, a ";" or the end."""
    depth, quote, i = 0, "", start
    while i < len(sql):
        c = sql[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                return i
            depth -= 1
        elif depth == 0 and (
            c == ";"
            or (
                (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_"))
                and _CLAUSE_END.match(sql, i)
            )
        ):
            return i
        i += 1
    return len(sql)


def _table_of(sql: str, qualifier: str) -> str:
    """The table a qualifier names: an alias's table where the query gives it one (FROM
    "shop_category" T3), else the qualifier itself."""
    alias = re.search(
        rf"(?P<table>{IDENTIFIER})\s+(?:as\s+)?(?:\""
        + re.escape(qualifier)
        + r'"|'
        + re.escape(qualifier)
        + r")(?![\w$\".])",
        sql,
        re.I,
    )
    if alias is not None and alias.group("table").lower() not in ("as", "from", "join", "on"):
        return _bare(alias.group("table"))
    return qualifier


# search_path: what clients set it to (SET search_path = public, TO "$user", public). The
# default schema is PostgreSQL's "public" (``executor.default_schema``); DuckDB's "main" stays
# on the path after the client's schemas (what a database file made elsewhere holds). "$user"
# and the system schemas have no DuckDB schema to name (DuckDB searches its catalog schemas
# itself). On a database whose default schema is "main" (a file whose tables are there),
# "public" names "main". SHOW search_path shows the default as PostgreSQL does.
_SET_SEARCH_PATH = re.compile(
    r"\s*set\s+(?P<scope>session\s+|local\s+)?search_path\s*(?:=|\bto\b)\s*(?P<value>.+?)\s*;?\s*$",
    re.I | re.S,
)
_SHOW_SEARCH_PATH = re.compile(r"\s*show\s+search_path\s*;?\s*$", re.I)
_RESET_SEARCH_PATH = re.compile(r"\s*reset\s+search_path\s*;?\s*$", re.I)
_NOT_DUCKDB_SCHEMAS = {"$user", "pg_catalog", "information_schema", "pg_temp"}


# what ``search_path`` makes of a SET: the executor keeps the schemas on it that exist
SEARCH_PATH_SET = re.compile(r"set search_path = '((?:[^']|'')*)'")


def default_search_path(schema: str) -> str:
    """DuckDB's search_path for a session that set none, ``schema`` being the default one."""
    return "main" if schema == "main" else f"{schema},main"


def search_path(sql: str, schema: str = "public") -> str:
    """``SET``, ``RESET`` and ``SHOW search_path`` in DuckDB's terms (``sql`` itself when it
    is none of them); ``schema``: the database's default schema."""
    default = default_search_path(schema)
    if _SHOW_SEARCH_PATH.match(sql):
        if schema == "main":
            return (
                "select coalesce(nullif(current_setting('search_path'), ''), 'main') as search_path"
            )
        return (
            f"select case current_setting('search_path') when '{default}' then "
            """'"$user", public' else replace(regexp_replace(current_setting('search_path'), """
            "',main$', ''), ',', ', ') end as search_path"
        )
    if _RESET_SEARCH_PATH.match(sql):
        return f"set search_path = '{default}'"
    found = _SET_SEARCH_PATH.match(sql)
    if found is None:
        return sql
    value = found.group("value")
    if value.lower() == "default":
        return f"set search_path = '{default}'"
    schemas: list[str] = []
    for item in split_list(value):
        name = item.strip()
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name
        name = name[1:-1].replace("''", "'") if name.startswith("'") else name.lower()
        if name in _NOT_DUCKDB_SCHEMAS:
            continue
        if name == "public" and schema == "main":
            name = "main"
        if name not in schemas:
            schemas.append(name)
    if "main" not in schemas:
        schemas.append("main")
    listed = ",".join(schemas)
    return f"set search_path = '{listed.replace(chr(39), chr(39) * 2)}'"


def split_list(text: str) -> list[str]:
    """A comma-separated list, commas inside quotes kept."""
    items, quote, start = [], "", 0
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == ",":
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item.strip()]


def ddl(sql: str) -> str:
    """PostgreSQL's DDL as DuckDB takes it: serial and identity columns as sequences,
    constraints checked at once, no storage parameters, a CREATE INDEX without what only
    PostgreSQL's index methods mean, a DROP or TRUNCATE of several objects as one statement
    each (``sql`` itself when it is none of these)."""
    if _CREATE_TABLE.match(sql):
        sql = _DEFERRABLE.sub("", _STORAGE_PARAMETERS.sub("", sql))
        sql = _UNLOGGED.sub(r"\1", _PRESERVE_ROWS.sub("", sql), count=1)
    if _SERIAL_HINT.search(sql):
        sql = serials(sql)
    unique = _ADD_UNIQUE.match(sql)
    if unique is not None:  # (an index DuckDB can drop, and make again around an ALTER)
        sql = (
            f"CREATE UNIQUE INDEX {unique.group('name')} ON {unique.group('table')} "
            f"({unique.group('columns')})"
        )
    several = _SEVERAL_DROPPED.match(sql) or _SEVERAL_TRUNCATED.match(sql)
    if several is not None:  # (one statement per object, as DuckDB drops and truncates)
        names = _arguments(several.group("names") + ")", 0)[0] or []
        head, tail = several.group("head"), several.groupdict().get("tail") or ""
        sql = "; ".join(f"{head}{name.strip()}{tail}" for name in names)
    if _CREATE_INDEX.match(sql):
        sql = index(sql)
    return sql


# ALTER TABLE … ADD CONSTRAINT name UNIQUE (columns) — how Django and knex add a unique
# constraint — is a unique index of that name in DuckDB (what backs a unique constraint in
# PostgreSQL too): a constraint DuckDB can neither drop nor keep through a later ALTER of the
# table, an index it can (DROP CONSTRAINT of that name drops it: executor.alter_around_indexes)
_ADD_UNIQUE = re.compile(
    rf"\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?(?P<table>{QUALIFIED})"
    rf"\s+add\s+constraint\s+(?P<name>{IDENTIFIER})"
    r"\s+unique\s*\((?P<columns>[^()]+)\)\s*;?\s*$",
    re.I,
)
# UNLOGGED (pgbench --unlogged-tables) and a temporary table's ON COMMIT PRESERVE ROWS (what
# DuckDB does anyway): nothing for DuckDB, whose tables are in memory or in its own file
_UNLOGGED = re.compile(r"^(\s*create\s+)unlogged\s+", re.I)
_PRESERVE_ROWS = re.compile(r"\s+on\s+commit\s+preserve\s+rows\b", re.I)
# a table's storage parameters (pgbench's WITH (fillfactor=100)): DuckDB has none
_STORAGE_PARAMETERS = re.compile(
    r"(?<=\))\s*with\s*\(\s*\w+\s*=\s*[\w.]+(?:\s*,\s*\w+\s*=\s*[\w.]+)*\s*\)", re.I
)
# DROP TABLE a, b and TRUNCATE a, b (pgbench -i): DuckDB takes one object at a time; TRUNCATE's
# RESTART/CONTINUE IDENTITY and CASCADE it has not (sequences are not restarted; a table that
# others reference keeps DuckDB's error)
_NAME_LIST = r'(?P<names>(?:"[^"]+"|[\w$.]+)(?:\s*,\s*(?:"[^"]+"|[\w$.]+))+)'
_SEVERAL_DROPPED = re.compile(
    r"\s*(?P<head>drop\s+(?:table|view|sequence|index|type)\s+(?:if\s+exists\s+)?)"
    + _NAME_LIST
    + r"(?P<tail>\s+(?:cascade|restrict))?\s*;?\s*$",
    re.I,
)
_SEVERAL_TRUNCATED = re.compile(
    r"\s*(?P<head>truncate\s+(?:table\s+)?(?:only\s+)?)"
    + _NAME_LIST.replace("+)", "*)")
    + r"(?:\s+(?:restart|continue)\s+identity)?(?:\s+(?:cascade|restrict))?\s*;?\s*$",
    re.I,
)


# CREATE INDEX: DuckDB has one index method (ART) and none of PostgreSQL's index options. What
# only tunes a btree is dropped — USING btree/hash, operator classes (Django's
# varchar_pattern_ops), INCLUDE columns — and a non-unique index's WHERE (the whole table's
# index serves the same queries); a partial UNIQUE index, COLLATE and gin/gist keep DuckDB's
# error, as what they mean cannot be kept
_CREATE_INDEX = re.compile(r"\s*create\s+(?P<unique>unique\s+)?index\b", re.I)
_INDEX_METHOD = re.compile(r"\s+using\s+(?:btree|hash)(?=\s*\()", re.I)
_OPCLASS = re.compile(r"\s+[A-Za-z_]\w*_ops\b(?=\s*(?:[,)]|asc\b|desc\b|nulls\b))", re.I)
_INCLUDE = re.compile(r"\s+include\s*\([^()]*\)", re.I)
_INDEX_WHERE = re.compile(r"\)\s+where\s+.*$", re.I | re.S)


def index(sql: str) -> str:
    """A CREATE INDEX as DuckDB takes it (see above)."""
    statement = _CREATE_INDEX.match(sql)
    if statement is None:
        return sql
    sql = _INCLUDE.sub("", _OPCLASS.sub("", _INDEX_METHOD.sub("", sql)))
    if not statement.group("unique"):
        sql = _INDEX_WHERE.sub(")", sql.rstrip().rstrip(";"))
    return sql


# CREATE TABLE with serial or identity columns (SQLAlchemy's and Django's integer primary keys):
# DuckDB has neither, so each becomes an integer column defaulting to its own sequence, created
# first and named as PostgreSQL names it (<table>_<column>_seq). An identity's START and
# INCREMENT carry over; GENERATED ALWAYS is not enforced (an explicit value is accepted)
_SERIAL_HINT = re.compile(r"serial|identity", re.I)
# a constraint's DEFERRABLE / INITIALLY DEFERRED: DuckDB checks every constraint at once
_DEFERRABLE = re.compile(
    r"\s+(?:(?:not\s+)?deferrable(?:\s+initially\s+(?:deferred|immediate))?|"
    r"initially\s+(?:deferred|immediate))\b",
    re.I,
)
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
_IDENTITY_COLUMN = re.compile(
    r'(?P<lead>[(,]\s*)(?P<column>"[^"]+"|[A-Za-z_][\w$]*)\s+(?P<definition>[^,()]*'
    r"(?:\([^()]*\)[^,()]*)*?)\bgenerated\s+(?:always|by\s+default)\s+as\s+identity\b"
    r"(?:\s*\((?P<options>[^()]*)\))?",
    re.I,
)
_SEQUENCE_OPTION = re.compile(
    r"\b(?P<option>start|increment|minvalue|maxvalue)\s+(?:with\s+|by\s+)?(?P<value>[-+]?\d+)", re.I
)
_SEQUENCE_KEYWORDS = {
    "start": "start with",
    "increment": "increment by",
    "minvalue": "minvalue",
    "maxvalue": "maxvalue",
}
_SERIAL_TYPES = {"smallserial": "SMALLINT", "serial2": "SMALLINT", "serial8": "BIGINT"}
SEQUENCE_PREFIX = re.compile(r"(?:create (?:temp )?sequence if not exists [\w.]+[^;]*; )+")


def serials(sql: str) -> str:
    """``sql`` with each serial column of a CREATE TABLE as an integer defaulting to a sequence
    created just before it (unchanged if it is no CREATE TABLE with one)."""
    table = _CREATE_TABLE.match(sql)
    if table is None:
        return sql
    parts = [p.strip().strip('"') for p in table.group("name").split(".")]
    sequences: list[tuple[str, str]] = []  # (name, options)

    def sequence_of(found: re.Match[str], options: str = "") -> str:
        name = found.group("column").strip('"')
        sequence = ".".join([*parts[:-1], re.sub(r"\W", "_", f"{parts[-1]}_{name}_seq").lower()])
        sequences.append((sequence, options))
        return sequence

    def serial(found: re.Match[str]) -> str:
        kind = found.group("type").lower()
        integer = "BIGINT" if kind == "bigserial" else _SERIAL_TYPES.get(kind, "INTEGER")
        default = f"DEFAULT nextval('{sequence_of(found)}')"
        return f"{found.group('lead')}{found.group('column')} {integer} {default}"

    def identity(found: re.Match[str]) -> str:
        options = "".join(
            f" {_SEQUENCE_KEYWORDS[o.group('option').lower()]} {o.group('value')}"
            for o in _SEQUENCE_OPTION.finditer(found.group("options") or "")
        )
        default = f"DEFAULT nextval('{sequence_of(found, options)}')"
        definition = found.group("definition").rstrip()
        return f"{found.group('lead')}{found.group('column')} {definition} {default}"

    start = table.end() - 1
    body = _IDENTITY_COLUMN.sub(identity, _SERIAL_COLUMN.sub(serial, sql[start:]))
    if not sequences:
        return sql
    temp = "temp " if table.group("temp") else ""
    created = "".join(
        f"create {temp}sequence if not exists {name}{options}; " for name, options in sequences
    )
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
# (arithmetic too: ``abalance + $1``, pgbench's -M extended, takes the column's type)
# (a column as written: quoted parts too, "SqPost"."updatedAt" as Sequelize writes it)
_COLUMN = r'((?:"[^"]+"|[\w]+)(?:\.(?:"[^"]+"|[\w]+))*)'
_COLUMN_THEN_PARAM = re.compile(rf"{_COLUMN}\s*(?:{_OPERATOR}|[-+*/%])\s*\$(\d+)", re.I)
_PARAM_THEN_COLUMN = re.compile(rf"\$(\d+)\s*(?:{_OPERATOR}|[-+*/%])\s*{_COLUMN}", re.I)
_ANY = re.compile(r"([\w.$\"]+)\s*(?:=|<>|!=)\s*(?:any|all)\s*\(\s*\$(\d+)\s*\)", re.I)
_BETWEEN = re.compile(rf"{_COLUMN}\s+between\s+\$(\d+)\s+and\s+\$(\d+)", re.I)
_IN_LIST = re.compile(rf"{_COLUMN}\s+in\s*\(\s*(\$\d+(?:\s*,\s*\$\d+)*)\s*\)", re.I)
_LIMIT = re.compile(r"\b(?:limit|offset)\s+\$(\d+)", re.I)
# a parameter beside a number (``1 + $1``, ``$2 >= 10``): PostgreSQL takes an untyped one to
# be of the other side's type, where DuckDB cannot choose an operator for a string and a number
_NUMERIC_OPERATOR = r"(?:[-+*/%]|=|<>|!=|<=|>=|<|>)"
_NUMBER_THEN_PARAM = re.compile(rf"(?<![\w.$])(\d+)(\.\d+)?\s*{_NUMERIC_OPERATOR}\s*\$(\d+)")
_PARAM_THEN_NUMBER = re.compile(rf"\$(\d+)\s*{_NUMERIC_OPERATOR}\s*(\d+)(\.\d+)?(?![\w.])")
_CAST = re.compile(r"\$(\d+)\s*::\s*([a-z][\w ]*?\w)(?=\s*(?:\)|,|$|\s(?!precision|zone)|;))", re.I)
_ARRAY_CAST = re.compile(r"\$(\d+)\s*\)?\s*::\s*([a-z][\w ]*?\w)\s*\[\]", re.I)
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
        return by_column.get(name.rsplit(".", 1)[-1].strip('"').lower())

    for number, name in _CAST.findall(query):
        put(number, _CAST_NAMES.get(" ".join(name.lower().split())))
    for number, name in _ARRAY_CAST.findall(query):  # (Django's bulk_create: ($1)::varchar[])
        element = _CAST_NAMES.get(" ".join(name.lower().split()))
        put(number, element + "[]" if element else None)
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
    for name, number in _ANY.findall(query):  # (id = ANY($1): node-postgres, postgres.js)
        element = column(name) if not name.startswith("$") else None
        put(number, (element or "VARCHAR") + "[]")
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
    "json": "JSON",
    "jsonb": "JSON",
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
