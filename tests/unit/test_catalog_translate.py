"""The embedded server's catalog translation (``proxy.backends.embedded.catalog``): what it
touches and what it leaves, and the translated statements run on a real DuckDB."""

from __future__ import annotations

import random

import duckdb
import pytest

from proxy.backends.embedded import catalog
from workloads.tpch.queries import random_query


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("create table parent (id integer primary key, code varchar unique)")
    con.execute("create table child (id integer primary key, pid integer references parent(id))")
    con.execute("create index child_pid on child(pid)")
    catalog.install(con)
    con.execute(catalog.session_setup("alice"))
    return con


def test_statements_that_read_no_catalog_are_left_alone() -> None:
    for number in (1, 6, 18):
        assert catalog.translate(random_query(number, random.Random(number))) is None
    assert catalog.translate("select pg_sleep(0.1)") is None
    # a user's own call of a function the catalogs redefine (DuckDB's format) stays DuckDB's
    assert catalog.translate("select format('{} and {}', 1, 2), btrim('  x  ')") is None
    # DuckDB's own syntax, which PostgreSQL's parser cannot read, is left to DuckDB
    assert catalog.translate("select * exclude (oid) from pg_class") is None


def test_psql_lookup_of_a_table(con: duckdb.DuckDBPyConnection) -> None:
    sql = catalog.translate(
        "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c "
        "LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname OPERATOR(pg_catalog.~) '^(child)$' COLLATE pg_catalog.default "
        "AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3"
    )
    assert sql is not None
    assert "pg_catalog." not in sql and "COLLATE" not in sql and "OPERATOR" not in sql
    assert f"{catalog.DATABASE}.main.pg_class" in sql
    ((oid, schema, name),) = con.execute(sql).fetchall()
    assert (schema, name) == ("main", "child") and oid > 0


def test_regclass_is_an_oid_to_compare_and_a_name_to_print(
    con: duckdb.DuckDBPyConnection,
) -> None:
    sql = catalog.translate(
        "SELECT c.oid::pg_catalog.regclass, c.relkind FROM pg_catalog.pg_class c "
        "WHERE c.oid = 'main.child'::regclass"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == [("child", "r")]
    assert [d[0] for d in con.execute(sql).description] == ["oid", "relkind"]


def test_keys_and_indexes_as_postgresql_has_them(con: duckdb.DuckDBPyConnection) -> None:
    sql = catalog.translate(
        "SELECT con.conname, con.contype, con.conkey, con.confkey, "
        "pg_catalog.pg_get_constraintdef(con.oid, true) FROM pg_catalog.pg_constraint con "
        "WHERE con.conrelid = 'child'::regclass ORDER BY 1"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == [
        ("child_pid_fkey", "f", [2], [1], "FOREIGN KEY (pid) REFERENCES parent(id)"),
        ("child_pkey", "p", [1], None, "PRIMARY KEY (id)"),
    ]
    sql = catalog.translate(
        "SELECT c.relname, i.indisprimary, i.indisunique, i.indkey, "
        "pg_catalog.pg_get_indexdef(i.indexrelid, 0, true) "
        "FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'child'::regclass ORDER BY 1"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == [
        ("child_pid", False, False, "2", "CREATE INDEX child_pid ON main.child USING btree (pid)"),
        (
            "child_pkey",
            True,
            True,
            "1",  # an int2vector reads as text
            "CREATE UNIQUE INDEX child_pkey ON main.child USING btree (id)",
        ),
    ]


def test_like_escape_and_settings(con: duckdb.DuckDBPyConnection) -> None:
    sql = catalog.translate(
        "SELECT n.nspname FROM pg_catalog.pg_namespace n "
        "WHERE n.nspname NOT LIKE 'pg!_%' ESCAPE '!' AND n.nspname = 'main'"
    )
    assert sql is not None and "like_escape" in sql
    assert con.execute(sql).fetchall() == [("main",)]
    sql = catalog.translate("SELECT current_setting('default_table_access_method'), 1 FROM pg_am")
    assert sql is not None
    assert con.execute(sql).fetchall() == [("heap", 1), ("heap", 1)]


def test_the_session_user_owns_what_it_sees(con: duckdb.DuckDBPyConnection) -> None:
    sql = catalog.translate("SELECT rolname, rolsuper FROM pg_catalog.pg_roles")
    assert sql is not None
    assert con.execute(sql).fetchall() == [("alice", True)]
    # the catalogs' own database is no user's: not among databases, schemas or relations
    for probe in (
        "SELECT datname FROM pg_catalog.pg_database",
        "SELECT nspname FROM pg_catalog.pg_namespace",
        "SELECT relname FROM pg_catalog.pg_class",
    ):
        translated = catalog.translate(probe)
        assert translated is not None
        names = {row[0] for row in con.execute(translated).fetchall()}
        assert catalog.DATABASE not in names and "admission_indexes" not in names
    sql = catalog.translate(
        "SELECT p.proname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
        "ON n.oid = p.pronamespace WHERE n.nspname <> 'pg_catalog'"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == []  # \\df: DuckDB's functions are the system's


def test_functions_see_their_arguments_not_their_own_columns(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # psql passes a bare oid (pg_get_constraintdef(oid, true)) and names its pg_class "c": a
    # macro whose lookup had a column oid, or an alias c, would read its own
    sql = catalog.translate(
        "SELECT conname, pg_catalog.pg_get_constraintdef(oid, true) FROM pg_catalog.pg_constraint "
        "ORDER BY 1"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == [
        ("child_pid_fkey", "FOREIGN KEY (pid) REFERENCES parent(id)"),
        ("child_pkey", "PRIMARY KEY (id)"),
        ("parent_code_key", "UNIQUE (code)"),
        ("parent_pkey", "PRIMARY KEY (id)"),
    ]
    sql = catalog.translate(
        "SELECT c.oid::regclass, c.relname FROM pg_catalog.pg_class c WHERE c.relkind = 'r' "
        "AND c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'main') "
        "ORDER BY 2"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == [("child", "child"), ("parent", "parent")]


@pytest.mark.parametrize(
    ("call", "postgresql"),
    [  # what PostgreSQL 15's format() gives for each
        ("format('%I.%I', 'main', 'Mixed Case')", 'main."Mixed Case"'),
        ("format('%I', 'plain_name')", "plain_name"),
        ("format('%I', 'a\"b')", '"a""b"'),
        ("format('x=%L and %s', 'it''s', NULL)", "x='it''s' and "),
        ("format('%L', NULL)", "NULL"),
        ("format('no arguments')", "no arguments"),
    ],
)
def test_format_quotes_identifiers_and_literals_as_postgresql(
    con: duckdb.DuckDBPyConnection, call: str, postgresql: str
) -> None:
    sql = catalog.translate(f"select pg_catalog.{call}")
    assert sql is not None
    assert con.execute(sql).fetchone() == (postgresql,)


def test_quote_ident_and_current_database(con: duckdb.DuckDBPyConnection) -> None:
    """TypeORM lists views as quote_ident(schemaname) || '.' || quote_ident(viewname);
    current_database() is the client's database (the session's variable), DuckDB's without."""
    sql = catalog.translate(
        "select quote_ident('user'), quote_ident('Mixed'), quote_ident('plain_1'), "
        "quote_ident('a\"b'), quote_ident(relname) from pg_class where relname = 'child'"
    )
    assert sql is not None
    assert con.execute(sql).fetchall() == [('"user"', '"Mixed"', "plain_1", '"a""b"', "child")]
    sql = catalog.translate("select current_database()")
    assert sql is not None
    assert con.execute(sql).fetchall() == [("memory",)]  # (no database set for the session)
    other = con.cursor()
    other.execute(catalog.session_setup("bob", "shop"))
    assert other.execute(sql).fetchall() == [("shop",)]


def test_pg_type_has_postgresql_array_types(con: duckdb.DuckDBPyConnection) -> None:
    """postgres.js reads the array types on connect (typelem of typcategory 'A'); without them
    it sends an array parameter as "1,2"."""
    sql = catalog.translate(
        "select b.oid, b.typarray from pg_catalog.pg_type a "
        "left join pg_catalog.pg_type b on b.oid = a.typelem "
        "where a.typcategory = 'A' group by b.oid, b.typarray order by b.oid"
    )
    assert sql is not None
    pairs = dict(con.execute(sql).fetchall())
    assert pairs[23] == 1007 and pairs[25] == 1009 and pairs[1043] == 1015 and pairs[16] == 1000
    sql = catalog.translate("select typname, typelem from pg_type where oid = 1007")
    assert sql is not None
    assert con.execute(sql).fetchall() == [("_int4", 23)]
