"""The embedded server's default schema (``executor.default_schema``): PostgreSQL's public,
unless a database file already keeps its tables in DuckDB's main."""

from __future__ import annotations

from pathlib import Path

import duckdb

from proxy.backends.embedded import compat
from proxy.backends.embedded.executor import DuckDBBackend


def test_a_new_database_gets_public_first_on_every_connection() -> None:
    backend = DuckDBBackend(workers=1)
    try:
        assert backend.schema == "public"
        cursor = backend.cursor("app")
        cursor.execute("create table t (a int)")
        assert cursor.execute("select current_schema()").fetchone() == ("public",)
        assert backend.plain_cursor().execute(
            "select schema_name from duckdb_tables() where table_name = 't'"
        ).fetchone() == ("public",)
        assert backend.plain_cursor().execute("select count(*) from t").fetchone() == (0,)
    finally:
        backend.close()


def test_a_file_whose_tables_are_in_main_keeps_main(tmp_path: Path) -> None:
    path = str(tmp_path / "made_elsewhere.duckdb")
    with duckdb.connect(path) as made:
        made.execute("create table old (a int)")
        made.execute("insert into old values (1)")
    backend = DuckDBBackend(path, workers=1)
    try:
        assert backend.schema == "main"
        cursor = backend.cursor("app")
        assert cursor.execute("select * from old").fetchall() == [(1,)]
        # a client's SET search_path = public names main there
        cursor.execute(compat.search_path("set search_path = public", backend.schema))
        assert cursor.execute("select * from old").fetchall() == [(1,)]
        schemas = {
            s for (s,) in cursor.execute("select schema_name from duckdb_schemas()").fetchall()
        }
        assert "public" not in schemas  # (nothing written into the user's file)
    finally:
        backend.close()


def test_an_empty_file_gets_public(tmp_path: Path) -> None:
    backend = DuckDBBackend(str(tmp_path / "new.duckdb"), workers=1)
    try:
        assert backend.schema == "public"
    finally:
        backend.close()


def test_search_path_statements_in_duckdb_terms() -> None:
    sp = compat.search_path
    assert sp('set search_path to "$user", public') == "set search_path = 'public,main'"
    assert sp("SET search_path = side, public") == "set search_path = 'side,public,main'"
    assert sp("set search_path to default") == "set search_path = 'public,main'"
    assert sp("reset search_path") == "set search_path = 'public,main'"
    assert sp("set search_path = public", "main") == "set search_path = 'main'"
    assert sp("select 1") == "select 1"
    assert "current_setting('search_path')" in sp("show search_path")
