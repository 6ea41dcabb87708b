"""The embedded DuckDB database, locked down before clients reach it.

DuckDB out of the box lets any SQL read and write the host's files (``read_csv('/etc/passwd')``,
``COPY … TO``), attach other database files and download extensions. A PostgreSQL server gives
none of that to an ordinary user, and the embedded server should not either. ``lock`` runs once,
after the server loaded its own data (``--tpch``, ``--database``): it loads the extensions the
operator allowed, names the paths clients may still read and write, then turns DuckDB's external
access off — which DuckDB refuses to turn back on while the database is open — and its
extension auto-install and auto-load with it.

DuckDB's own ``lock_configuration`` would also stop clients from changing settings, but it stops
the server's per-session ones too (the profiler that measures each statement is one), so the
configuration is guarded statement by statement instead: ``check`` lets a client change only
what PostgreSQL lets an ordinary user change — its own session (``search_path``, the profiler,
variables) — and refuses every server-wide DuckDB setting (``threads``, ``memory_limit`` …) and
every PRAGMA that is not a read-only look at the catalog, with SQLSTATE 42501 as PostgreSQL does
for a parameter only a superuser may set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

__all__ = [
    "SESSION_SETTINGS",
    "Lockdown",
    "LockdownError",
    "check",
    "check_catalogs",
    "read_only_pragma",
]


class LockdownError(Exception):
    """A client statement the locked-down server refuses: ``sqlstate`` and the message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


# DuckDB settings a client may change for its own session (their scope is the connection).
# The profiler's output settings are left out: they write files.
SESSION_SETTINGS = frozenset(
    {
        "search_path",
        "schema",
        "enable_profiling",
        "profiling_coverage",
        "profiling_mode",
        "tracked_metrics",
        "enable_progress_bar",
        "enable_progress_bar_print",
        "progress_bar_time",
        "streaming_buffer_size",
        "max_streaming_buffer_size",
        "operator_memory_limit",
    }
)
# PRAGMAs that only read: the catalog, the storage, the version, and the TPC benchmarks' texts.
READ_ONLY_PRAGMAS = frozenset(
    {
        "table_info",
        "show",
        "show_tables",
        "show_tables_expanded",
        "show_databases",
        "database_list",
        "database_size",
        "storage_info",
        "metadata_info",
        "version",
        "platform",
        "user_agent",
        "collations",
        "functions",
        "enable_profiling",
        "disable_profiling",
        "enable_progress_bar",
        "disable_progress_bar",
        "tpch",
        "tpcds",
    }
)
# Time zones the server runs in (it runs in UTC; TimeZone is server-wide in DuckDB).
_UTC = frozenset(
    {"utc", "etc/utc", "gmt", "etc/gmt", "z", "zulu", "universal", "0", "+00", "default"}
)

_NAME = r'(?:"(?:[^"]|"")+"|[\w.]+)'
_SET = re.compile(
    rf"\s*(set|reset)\s+(?:(global|session|local)\s+)?(?:(variable)\s+)?({_NAME})"
    r"(?:\s*(?:=|\bto\b)\s*(.*?))?\s*;?\s*\Z",
    re.I | re.S,
)
_SET_TIME_ZONE = re.compile(r"\s*set\s+(?:session\s+)?time\s+zone\s+(.*?)\s*;?\s*\Z", re.I | re.S)
_USE = re.compile(r"\s*use\s", re.I)
_PRAGMA = re.compile(rf"\s*pragma\s+({_NAME})\s*(=)?", re.I)


def _unquote(name: str) -> str:
    if name.startswith('"') and name.endswith('"'):
        return name[1:-1].replace('""', '"')
    return name.lower()


def _refuse(name: str) -> LockdownError:
    return LockdownError(
        "42501",
        f'permission denied to set parameter "{name}": it is the embedded server\'s own '
        "configuration (set it with `admission serve` options)",
    )


# a statement whose target is in the database of the server's PostgreSQL catalogs
# (``catalog.DATABASE``): its name right where the statement names what it changes
_CATALOG_TARGET = re.compile(
    r"""^\s*(?:
      create\s+(?:or\s+replace\s+)?(?:(?:temp|temporary|persistent)\s+)?
        (?:table|view|macro|function|sequence|schema|type
           |(?:unique\s+)?index\s+(?:if\s+not\s+exists\s+)?\S*\s+on)
        \s+(?:if\s+not\s+exists\s+)?
    | drop\s+\w+\s+(?:if\s+exists\s+)?
    | alter\s+\w+\s+(?:if\s+exists\s+)?
    | insert\s+(?:or\s+\w+\s+)?into\s+
    | update\s+
    | delete\s+from\s+
    | truncate\s+(?:table\s+)?
    | comment\s+on\s+\w+\s+
    | detach\s+(?:database\s+)?(?:if\s+exists\s+)?
    | use\s+
    | copy\s+
    )"?admission_pg\b""",
    re.I | re.X,
)


def check_catalogs(query: str) -> None:
    """Refuse (42501) a statement that would change the server's PostgreSQL catalogs (the
    views and macros in ``admission_pg`` that every session reads) or make them the session's
    default database: clients read them, as an ordinary PostgreSQL user reads pg_catalog."""
    if "admission_pg" in query.lower() and _CATALOG_TARGET.match(query):
        raise LockdownError(
            "42501",
            "permission denied: admission_pg holds the server's PostgreSQL catalogs, which "
            "clients read but do not change",
        )


def read_only_pragma(query: str) -> bool:
    """Whether a PRAGMA only reads the catalog (``table_info``, ``show_tables`` …)."""
    match = _PRAGMA.match(query)
    return match is not None and _unquote(match.group(1)) in READ_ONLY_PRAGMAS


def check(query: str, kind: str) -> bool:
    """Refuse (``LockdownError``) a statement that changes the server's configuration.
    Returns True when the statement is a no-op here (SET TimeZone to UTC, the zone the server
    runs in) and must not be run; False when it may run."""
    if kind == "PRAGMA":
        match = _PRAGMA.match(query)
        name = _unquote(match.group(1)) if match else "?"
        if match is None or name not in READ_ONLY_PRAGMAS:
            raise LockdownError(
                "42501",
                f"permission denied for PRAGMA {name}: the embedded server allows only the "
                "PRAGMAs that read the catalog",
            )
        return False
    if kind != "SET":
        return False
    if _USE.match(query):
        return False
    zone = _SET_TIME_ZONE.match(query)
    if zone is not None:
        return _time_zone(zone.group(1))
    match = _SET.match(query)
    if match is None:
        pragma = _PRAGMA.match(query)  # ``PRAGMA threads = 2`` is a SET too
        raise _refuse(_unquote(pragma.group(1)) if pragma else "?")
    verb, scope, variable, raw_name, value = match.groups()
    if variable:
        return False  # SET VARIABLE: the session's own variables
    name = _unquote(raw_name)
    if name == "timezone":
        return _time_zone(value or "default") if verb.lower() == "set" else True
    if name in SESSION_SETTINGS and (scope or "").lower() != "global":
        return False
    raise _refuse(name)


def _time_zone(value: str) -> bool:
    zone = value.strip().strip("'\"").lower()
    if zone in _UTC:
        return True
    raise LockdownError(
        "0A000",
        f"the embedded server runs in UTC for every session (TimeZone is server-wide in "
        f"DuckDB): cannot set time zone {value.strip()}",
    )


@dataclass(frozen=True)
class Lockdown:
    """What clients of the embedded server may still reach: files under ``file_access``
    (directories or single files) and the ``extensions`` loaded at start."""

    file_access: Sequence[Path] = ()
    extensions: Sequence[str] = ()

    def apply(self, connection: duckdb.DuckDBPyConnection) -> None:
        """Load the allowed extensions, then turn external access off for good. Raises
        ValueError naming what could not be done (an extension that does not install)."""
        for name in self.extensions:
            if not re.fullmatch(r"\w+", name):
                raise ValueError(f"not an extension name: {name!r}")
            try:
                try:
                    connection.execute(f"LOAD {name}")  # built in, or installed already
                except duckdb.Error:
                    connection.execute(f"INSTALL {name}")
                    connection.execute(f"LOAD {name}")
            except duckdb.Error as e:
                first = str(e).split("\n", 1)[0]
                raise ValueError(f"cannot load the DuckDB extension {name}: {first}") from e
        directories = [str(p.resolve()) for p in self.file_access if p.is_dir()]
        files = [str(p.resolve()) for p in self.file_access if not p.is_dir()]
        if directories:
            connection.execute("SET allowed_directories = ?", [directories])
        if files:
            connection.execute("SET allowed_paths = ?", [files])
        for statement in (
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET allow_community_extensions = false",
            "SET enable_external_access = false",
        ):
            connection.execute(statement)
