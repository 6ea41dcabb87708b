"""PostgreSQL's catalogs on the embedded DuckDB server, against a real PostgreSQL.

The same schema — TPC-H's eight tables with their primary keys, and a parent/child pair with
a foreign key, a unique constraint over two columns, a check constraint, a plain index and a
view — is made on the embedded server and in a database of the test PostgreSQL. Then the
tools that introspect a database read both, and their answers are compared:

- psql's ``\\dt``, ``\\di``, ``\\dv``, ``\\dn``, ``\\df``, ``\\l``, ``\\du``, ``\\d TABLE`` and
  ``\\d+ TABLE``: the same headers, the same rows by name, the same sections (Indexes, Check
  constraints, Foreign-key constraints, Referenced by) with the same lines in them, the
  schema PostgreSQL's ``public`` on both. What differs by design: DuckDB's strings have no
  length, so ``varchar(10)`` and ``char(25)`` read as ``text``; owners and databases are the
  server's own.
- SQLAlchemy's ``Inspector`` (tables, views, columns, primary keys, foreign keys, unique and
  check constraints, indexes) and ``MetaData.reflect``; pandas' ``read_sql_table``.
- the catalog queries of the PostgreSQL JDBC driver (what Metabase and other JDBC tools call
  DatabaseMetaData) and DBeaver's, captured from their sources.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest
import sqlalchemy as sa

from admission import Limits
from testing.embeddedharness import Embedded
from testing.pgcluster import Cluster
from workloads.tpch.schema import create_statements

SCHEMA = [
    *create_statements(),
    "create table parent (id integer primary key, code varchar(10) unique, "
    "qty integer check (qty > 0), note text)",
    "create table child (cid integer primary key, pid integer references parent(id), "
    "k1 integer, k2 integer, unique (k1, k2))",
    "create index child_pid on child(pid)",
    "create view v_nation as select n_nationkey, n_name from nation",
    "create sequence order_ids",
    "insert into region values (0, 'AFRICA', 'a'), (1, 'AMERICA', null)",
]
REFERENCE_DB = "catalog_ref"


def _schema(con: duckdb.DuckDBPyConnection) -> None:
    for sql in SCHEMA:
        con.execute(sql)


@pytest.fixture(scope="module")
def embedded() -> Iterator[Embedded]:
    server = Embedded(Limits(mpl=2), _schema)
    yield server
    server.close()


@pytest.fixture(scope="module")
def reference(pg: Cluster) -> str:
    pg.psql(f"drop database if exists {REFERENCE_DB}")
    pg.psql(f"create database {REFERENCE_DB}")
    with psycopg.connect(pg.dsn(dbname=REFERENCE_DB), autocommit=True) as conn:
        for sql in SCHEMA:
            conn.execute(sql)
    return pg.dsn(dbname=REFERENCE_DB)


def _psql(dsn: str, command: str) -> str:
    out = subprocess.run(
        ["psql", dsn, "-X", "-P", "pager=off", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and not out.stderr, (command, out.stderr)
    return out.stdout


def _shape(text: str) -> dict[str, object]:
    """What psql printed, without what differs by design: the title, the header, the rows'
    first column (the names), every section's lines, the row count."""
    lines = [line.rstrip() for line in text.splitlines()]
    table = [line for line in lines if "|" in line]
    header = [cell.strip() for cell in table[0].split("|")] if table else []
    names = [row.split("|")[0].strip() for row in table[1:] if row.split("|")[0].strip()]
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line
            sections[current] = []
        elif current and line.startswith("    "):
            sections[current].append(line.strip())
        elif not line.strip():
            current = None
    title = lines[0].strip() if lines else ""
    return {"title": title, "header": header, "names": names, "sections": sections}


@pytest.mark.parametrize(
    "command",
    [
        "\\dt",
        "\\di",
        "\\dv",
        "\\d lineitem",
        "\\d+ nation",
        "\\d child",
        "\\d+ parent",
        "\\d v_nation",
        "\\df",
    ],
)
def test_psql_describes_like_postgresql(embedded: Embedded, reference: str, command: str) -> None:
    ours = _shape(_psql(f"host=127.0.0.1 port={embedded.port} user=app dbname=app", command))
    theirs = _shape(_psql(reference, command))
    assert ours == theirs, command


@pytest.mark.parametrize("command", ["\\dn", "\\l", "\\du"])
def test_psql_lists_schemas_databases_and_roles(
    embedded: Embedded, reference: str, command: str
) -> None:
    # the same columns; the rows are the server's own: schema public (DuckDB's main, empty,
    # is not listed), the DuckDB database, the session's user
    ours = _shape(_psql(f"host=127.0.0.1 port={embedded.port} user=app dbname=app", command))
    theirs = _shape(_psql(reference, command))
    assert ours["title"] == theirs["title"] and ours["header"] == theirs["header"]
    assert ours["names"], ours
    if command == "\\du":
        assert ours["names"] == ["app"]
    if command == "\\dn":
        assert ours["names"] == theirs["names"] == ["public"]


# a table made by a client (through the server's rewrites), with the types tools meet most
TYPED = (
    "create table typed (a text, b numeric, c numeric(6,2), d integer[], e text[], "
    "f boolean, g date, h timestamp, i bigint, j double precision, k bytea, l timestamptz)"
)
TYPES_QUERY = (
    "select a.attname, t.typname, n.nspname, format_type(a.atttypid, a.atttypmod) "
    "from pg_catalog.pg_attribute a join pg_catalog.pg_type t on t.oid = a.atttypid "
    "join pg_catalog.pg_namespace n on n.oid = t.typnamespace "
    "where a.attrelid = 'typed'::regclass and a.attnum > 0 order by a.attnum"
)


def test_a_tables_column_types_read_as_postgresql_s(embedded: Embedded, reference: str) -> None:
    # what JDBC's getColumns and psql's \d read: every column joins pg_type (a list's and a
    # text column's type did not: the column was missing), named as PostgreSQL names it
    ours_dsn = f"host=127.0.0.1 port={embedded.port} user=app dbname=app"
    answers = []
    for dsn in (ours_dsn, reference):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("drop table if exists typed")
            conn.execute(TYPED)
            answers.append(conn.execute(TYPES_QUERY).fetchall())
            conn.execute("drop table typed")  # (after psql's look, below)
    assert answers[0] == answers[1]
    assert len(answers[0]) == 12


def test_every_type_is_in_a_listed_schema(embedded: Embedded, reference: str) -> None:
    # JDBC's getTypeInfo: pg_type joined with pg_namespace (DuckDB's built-in types were in a
    # schema pg_namespace does not list, and the join was empty)
    query = (
        "select t.typname from pg_catalog.pg_type t join pg_catalog.pg_namespace n "
        "on t.typnamespace = n.oid where n.nspname != 'pg_toast' and (t.typrelid = 0 or "
        "(select c.relkind = 'c' from pg_catalog.pg_class c where c.oid = t.typrelid))"
    )
    dsn = f"host=127.0.0.1 port={embedded.port} user=app dbname=app"
    with psycopg.connect(dsn, autocommit=True) as conn:
        ours = {row[0] for row in conn.execute(query)}
    with psycopg.connect(reference, autocommit=True) as conn:
        theirs = {row[0] for row in conn.execute(query)}
    common = {"int4", "int8", "text", "numeric", "bool", "date", "timestamp", "_int4", "_text"}
    assert common <= ours and common <= theirs


# peewee 4.5's PostgresqlDatabase.get_indexes (playhouse's migrations and pwiz read it)
PEEWEE_INDEXES = """
    SELECT
        i.relname, idxs.indexdef, idx.indisunique,
        ARRAY(
            SELECT pg_get_indexdef(idx.indexrelid, k + 1, TRUE)
            FROM generate_subscripts(idx.indkey, 1) AS k
            ORDER BY k)
    FROM pg_catalog.pg_class AS t
    INNER JOIN pg_catalog.pg_namespace AS n ON t.relnamespace = n.oid
    INNER JOIN pg_catalog.pg_index AS idx ON t.oid = idx.indrelid
    INNER JOIN pg_catalog.pg_class AS i ON idx.indexrelid = i.oid
    INNER JOIN pg_catalog.pg_indexes AS idxs ON (
        idxs.tablename = t.relname
        AND idxs.indexname = i.relname
        AND idxs.schemaname = n.nspname)
    WHERE t.relname = %s AND t.relkind = %s
        AND n.nspname = COALESCE(%s, current_schema())
    ORDER BY idx.indisunique DESC, i.relname;"""


def test_index_columns_by_subscript_as_postgresql_s(embedded: Embedded, reference: str) -> None:
    # generate_subscripts in FROM (from 0 over an int2vector), a vector's [0], pg_indexes
    # with the indexes behind primary keys and unique constraints
    answers = []
    for dsn in (f"host=127.0.0.1 port={embedded.port} user=app dbname=app", reference):
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(PEEWEE_INDEXES, ["child", "r", None]).fetchall()
            answers.append([(name, unique, columns) for name, _, unique, columns in rows])
            first = conn.execute(
                "select i.indkey[0], (select array_agg(k) from generate_subscripts(i.indkey, 1) "
                "k) from pg_catalog.pg_index i where i.indexrelid = 'child_pid'::regclass"
            ).fetchone()
            assert first == (2, [0])
    assert answers[0] == answers[1]
    assert answers[0] == [
        ("child_k1_k2_key", True, ["k1", "k2"]),
        ("child_pkey", True, ["cid"]),
        ("child_pid", False, ["pid"]),
    ]


def _url(dsn: str) -> str:
    """A libpq keyword DSN as SQLAlchemy's URL."""
    parts = dict(item.split("=", 1) for item in dsn.split())
    return f"postgresql+psycopg://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


@pytest.mark.parametrize(
    "command",
    [
        "\\db",
        "\\dC",
        "\\dc",
        "\\dd",
        "\\do",
        "\\dy",
        "\\dF",
        "\\dL",
        "\\des",
        "\\deu",
        "\\dl",
        "\\dO",
        "\\dX",
        "\\dT",
        "\\dx",
        "\\dp",
        "\\ds",
        "\\dA",
        "\\dg",
    ],
)
def test_psql_other_lists_run_with_postgresql_s_columns(
    embedded: Embedded, reference: str, command: str
) -> None:
    # the rows are PostgreSQL's own built-in casts, operators, languages…, which DuckDB has
    # none of (or has its own): the command runs and prints the same columns
    ours = _shape(_psql(f"host=127.0.0.1 port={embedded.port} user=app dbname=app", command))
    theirs = _shape(_psql(reference, command))
    assert ours["title"] == theirs["title"] and ours["header"] == theirs["header"], command


def _inspect(url: str) -> dict[str, object]:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        out: dict[str, object] = {
            "tables": sorted(inspector.get_table_names()),
            "views": inspector.get_view_names(),
        }
        for table in ("lineitem", "parent", "child"):
            out[table] = {
                # DuckDB's strings have no length: compared by kind, not by spelling
                "columns": [
                    (c["name"], c["type"].python_type.__name__, c["nullable"])
                    for c in inspector.get_columns(table)
                ],
                "pk": inspector.get_pk_constraint(table),
                "fks": inspector.get_foreign_keys(table),
                "unique": inspector.get_unique_constraints(table),
                "indexes": inspector.get_indexes(table),
                "checks": inspector.get_check_constraints(table),
            }
        metadata = sa.MetaData()
        metadata.reflect(engine, views=True)
        out["reflected"] = sorted(metadata.tables)
        out["reflected_fks"] = sorted(
            (fk.parent.name, fk.column.table.name, fk.column.name)
            for fk in metadata.tables["child"].foreign_keys
        )
        return out
    finally:
        engine.dispose()


def test_sqlalchemy_reflects_what_postgresql_does(embedded: Embedded, reference: str) -> None:
    ours = _inspect(f"postgresql+psycopg://app@127.0.0.1:{embedded.port}/app")
    theirs = _inspect(_url(reference))
    assert ours == theirs


def test_sqlalchemy_reflection_found_the_keys(embedded: Embedded) -> None:
    # (not only the same as PostgreSQL: what the schema holds)
    ours = _inspect(f"postgresql+psycopg://app@127.0.0.1:{embedded.port}/app")
    child = ours["child"]
    assert isinstance(child, dict)
    assert child["pk"]["constrained_columns"] == ["cid"]
    assert [(f["constrained_columns"], f["referred_table"]) for f in child["fks"]] == [
        (["pid"], "parent")
    ]
    assert [u["column_names"] for u in child["unique"]] == [["k1", "k2"]]
    assert {i["name"] for i in child["indexes"]} == {"child_pid", "child_k1_k2_key"}
    assert ours["reflected_fks"] == [("pid", "parent", "id")]


def test_pandas_reads_a_table_as_from_postgresql(embedded: Embedded, reference: str) -> None:
    pandas = pytest.importorskip("pandas")
    ours = pandas.read_sql_table(
        "region", sa.create_engine(f"postgresql+psycopg://app@127.0.0.1:{embedded.port}/app")
    )
    theirs = pandas.read_sql_table(
        "region",
        sa.create_engine(_url(reference)),
    )
    assert list(ours.columns) == list(theirs.columns) == ["r_regionkey", "r_name", "r_comment"]
    assert ours.shape == theirs.shape == (2, 3)
    assert ours["r_regionkey"].tolist() == theirs["r_regionkey"].tolist()
    assert ours["r_comment"].tolist()[0] == "a"


# -- the catalog queries of JDBC tools and DBeaver ----------------------------------------

QUERIES = json.loads((Path(__file__).parent / "data" / "tool_catalog_queries.json").read_text())
# columns that name things: compared between the two servers, value for value
_NAMES = {
    "table_name",
    "column_name",
    "pk_name",
    "fk_name",
    "pktable_name",
    "pkcolumn_name",
    "fkcolumn_name",
    "fktable_name",
    "index_name",
    "name",
    "table-name",
    "relname",
    "attname",
    "conname",
    "tablename",
    "viewname",
    "fk-table-name",
    "fk-column-name",
    "pk-table-name",
    "pk-column-name",
    "nspname",
}


def _run_tool_query(dsn: str, schema: str, query: dict[str, object]) -> tuple[int, list[dict]]:
    """(rows, those rows' naming columns) of one captured query, its placeholders filled in
    for this server, sent as the tool sends it (one Parse with $n, text parameters)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema_oid, table_oid, database = conn.execute(
            "select n.oid, c.oid, current_database() from pg_catalog.pg_class c "
            "join pg_catalog.pg_namespace n on n.oid = c.relnamespace "
            "where c.relname = 'child' and n.nspname = %s",
            [schema],
        ).fetchone()  # type: ignore[misc]
        values = {":schema_oid": schema_oid, ":table_oid": table_oid, ":database_name": database}
        params = [
            str(schema if p == "main" else values.get(p, p)).encode()  # type: ignore[call-overload]
            for p in query["params"]  # type: ignore[attr-defined]
        ]
        result = conn.pgconn.exec_params(str(query["sql"]).encode(), params)
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, (
            query["what"],
            result.error_message.decode(),
        )
        fields = [(result.fname(k) or b"").decode().lower() for k in range(result.nfields)]
        rows = []
        for r in range(result.ntuples):
            row = {}
            for k, name in enumerate(fields):
                value = result.get_value(r, k)
                if name in _NAMES or name == "attnum":
                    row[name] = value.decode() if value is not None else None
            rows.append(row)
        return result.ntuples, rows


@pytest.mark.parametrize("query", QUERIES, ids=[f"{q['tool']}-{i}" for i, q in enumerate(QUERIES)])
def test_tools_catalog_queries_answer_as_postgresql_does(
    embedded: Embedded, reference: str, query: dict[str, object]
) -> None:
    count, rows = _run_tool_query(
        f"host=127.0.0.1 port={embedded.port} user=app dbname=app", "public", query
    )
    theirs_count, theirs = _run_tool_query(reference, "public", query)
    if any("attnum" in row for row in theirs):
        # PostgreSQL's system columns (ctid, xmin, …: attnum < 0) have no DuckDB counterpart
        theirs = [row for row in theirs if int(row["attnum"] or 0) > 0]
        theirs_count = len(theirs)
        for row in (*rows, *theirs):
            row.pop("attnum", None)
    if "database list" in str(query["what"]):
        # PostgreSQL's cluster has databases of its own (postgres, …); DuckDB has one
        assert count == 1 and theirs_count >= 1
        return
    # PostgreSQL's pg_toast has no DuckDB counterpart
    kept = [row for row in theirs if row.get("nspname") != "pg_toast"]
    theirs_count -= len(theirs) - len(kept)
    theirs = kept
    assert count == theirs_count, query["what"]
    assert sorted(map(sorted, (r.items() for r in rows))) == sorted(
        map(sorted, (r.items() for r in theirs))
    ), query["what"]
