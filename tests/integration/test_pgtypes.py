"""DuckDB values rendered as PostgreSQL would: each case runs in DuckDB (encoded by
``proxy.backends.pgtypes``) and in the test suite's real PostgreSQL (its own text output, and its
binary send format), and the two must be byte-identical."""

from __future__ import annotations

import subprocess

import duckdb
import psycopg
import pytest

from proxy.backends.embedded import executor
from proxy.backends.pgtypes import encode_binary, encode_text, pg_type
from testing.pgcluster import Cluster

CASES = [
    # (DuckDB expression, PostgreSQL expression, PostgreSQL type name)
    ("true", "true", "bool"),
    ("42::tinyint", "42::int2", "int2"),
    ("-7::integer", "-7::int4", "int4"),
    ("9007199254740993::bigint", "9007199254740993::int8", "int8"),
    ("1234.50::decimal(10,2)", "1234.50::numeric(10,2)", "numeric"),
    ("0.000001::decimal(12,6)", "0.000001::numeric(12,6)", "numeric"),
    (
        "170141183460469231731687303715884105727::hugeint",
        "170141183460469231731687303715884105727::numeric",
        "numeric",
    ),
    # numeric without a precision (the embedded server's DECIMAL(38,9), and its products)
    ("37.774929::decimal(38,9)", "37.774929::numeric", "numeric"),
    ("100::decimal(38,9)", "100::numeric", "numeric"),
    ("-0.5::decimal(38,18)", "-0.5::numeric", "numeric"),
    ("0::decimal(38,9)", "0::numeric", "numeric"),
    (
        "'-12345678901234567890.000000001'::decimal(38,9)",
        "-12345678901234567890.000000001::numeric",
        "numeric",
    ),
    ("3::double", "3::float8", "float8"),
    ("1e15::double", "1e15::float8", "float8"),
    ("1e14::double", "1e14::float8", "float8"),
    ("0.00001::double", "0.00001::float8", "float8"),
    ("-2.5e-7::double", "-2.5e-7::float8", "float8"),
    ("123456789.125::double", "123456789.125::float8", "float8"),
    ("'nan'::double", "'nan'::float8", "float8"),
    ("'-inf'::double", "'-inf'::float8", "float8"),
    ("0.1::float", "0.1::float4", "float4"),
    ("1e6::float", "1e6::float4", "float4"),
    ("123456::float", "123456::float4", "float4"),
    ("1234567::float", "1234567::float4", "float4"),
    ("'héllo, wörld'", "'héllo, wörld'::text", "text"),
    ("date '2024-02-29'", "date '2024-02-29'", "date"),
    ("time '01:02:03.25'", "time '01:02:03.25'", "time"),
    ("timestamp '2020-01-02 03:04:05.5'", "timestamp '2020-01-02 03:04:05.5'", "timestamp"),
    ("timestamp '1999-12-31 23:59:59'", "timestamp '1999-12-31 23:59:59'", "timestamp"),
    ("timestamptz '2020-01-02 03:04:05+02'", "timestamptz '2020-01-02 03:04:05+02'", "timestamptz"),
    ("'1 day 2 hours'::interval", "'1 day 2 hours'::interval", "interval"),
    ("'3 days'::interval", "'3 days'::interval", "interval"),
    ("'-1 day'::interval", "'-1 day'::interval", "interval"),
    ("'-1 hour'::interval", "'-1 hour'::interval", "interval"),
    ("'-1 day -1 hour'::interval", "'-1 day -1 hour'::interval", "interval"),
    ("'00:00:01.5'::interval", "'00:00:01.5'::interval", "interval"),
    ("'\\x01\\xFF'::blob", "'\\x01ff'::bytea", "bytea"),
    (
        "'6f1e8c0e-5b1a-4b3e-9b1e-0e8c5b1a4b3e'::uuid",
        "'6f1e8c0e-5b1a-4b3e-9b1e-0e8c5b1a4b3e'::uuid",
        "uuid",
    ),
    ("[1, 2, NULL]", "array[1, 2, NULL]", "int4[]"),
    ("['a', 'b c', 'x\"y', '', 'NULL']", "array['a', 'b c', 'x\"y', '', 'NULL']", "text[]"),
    ("[1.5::double, 2]", "array[1.5::float8, 2]", "float8[]"),
    ("[date '2020-01-01']", "array[date '2020-01-01']", "date[]"),
]


def _postgres_text(pg: Cluster, expression: str) -> str:
    out = subprocess.run(
        [
            "psql",
            pg.dsn(),
            "-X",
            "-A",
            "-t",
            "-c",
            "set timezone = 'UTC'",
            "-c",
            f"select {expression}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def duck() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("set TimeZone = 'UTC'")
    return con


@pytest.mark.parametrize(
    ("duck_expr", "pg_expr", "type_name"), CASES, ids=[c[0][:40] for c in CASES]
)
def test_text_encoding_matches_postgresql(
    duck: duckdb.DuckDBPyConnection, pg: Cluster, duck_expr: str, pg_expr: str, type_name: str
) -> None:
    cursor = duck.execute(f"select {duck_expr}")
    t = pg_type(cursor.description[0][1])
    assert t.name == type_name
    (value,) = cursor.fetchone()  # type: ignore[misc]
    ours = encode_text(value, t)
    assert ours is not None
    assert ours.decode() == _postgres_text(pg, pg_expr)


# values the row path cannot carry (Python's dates stop at 1 and 9999) and the columnar path
# writes as PostgreSQL does
EDGES = [
    ("'infinity'::date", "'infinity'::date"),
    ("'-infinity'::date", "'-infinity'::date"),
    ("'0044-03-15 (BC)'::date", "'0044-03-15 BC'::date"),
    ("'12345-06-07'::date", "'12345-06-07'::date"),
    ("'infinity'::timestamp", "'infinity'::timestamp"),
    ("'-infinity'::timestamptz", "'-infinity'::timestamptz"),
    ("make_timestamp(-43, 3, 15, 10, 0, 0.5)", "'0044-03-15 10:00:00.5 BC'::timestamp"),
    ("make_timestamp(0, 1, 1, 0, 0, 0)::timestamptz", "'0001-01-01 00:00:00+00 BC'::timestamptz"),
]


@pytest.mark.skipif(not executor.columnar(), reason="the columnar path is not built")
@pytest.mark.parametrize(
    ("duck_expr", "pg_expr"),
    [(d, p) for d, p, _ in CASES] + EDGES,
    ids=[c[0][:40] for c in CASES] + [e[0][:40] for e in EDGES],
)
def test_columnar_text_matches_postgresql(
    duck: duckdb.DuckDBPyConnection, pg: Cluster, duck_expr: str, pg_expr: str
) -> None:
    sql = f"select {duck_expr}"
    result = executor._columnar(duck.cursor(), sql, ())
    if result is None:  # a type the C code does not write: the row path's, tested above
        assert duck_expr not in dict(EDGES)
        return
    assert result.more is None and len(result.rows) == 1
    row = result.rows[0]  # D, length, 1 column, the value's length, the value
    assert row[:1] == b"D" and row[5:7] == b"\x00\x01"
    assert row[11:].decode() == _postgres_text(pg, pg_expr)


@pytest.fixture(scope="module")
def pg_binary(pg: Cluster) -> psycopg.Cursor[object]:
    conn = psycopg.connect(pg.dsn(), autocommit=True)
    conn.execute("set timezone = 'UTC'")
    return conn.cursor(binary=True)


@pytest.mark.parametrize(
    ("duck_expr", "pg_expr", "type_name"), CASES, ids=[c[0][:40] for c in CASES]
)
def test_binary_encoding_matches_postgresql(
    duck: duckdb.DuckDBPyConnection,
    pg_binary: psycopg.Cursor[object],
    duck_expr: str,
    pg_expr: str,
    type_name: str,
) -> None:
    cursor = duck.execute(f"select {duck_expr}")
    t = pg_type(cursor.description[0][1])
    (value,) = cursor.fetchone()  # type: ignore[misc]
    pg_binary.execute(f"select {pg_expr}")
    result = pg_binary.pgresult
    assert result is not None and result.ftype(0) == t.oid
    assert encode_binary(value, t) == result.get_value(0, 0)


def test_binary_numeric_edge_cases(pg_binary: psycopg.Cursor[object]) -> None:
    from decimal import Decimal

    numeric = pg_type("DECIMAL(38,10)")
    for text in ("0", "0.00", "-0.5", "10000", "12345678.0001", "-0.00012", "1e-10", "NaN"):
        pg_binary.execute(f"select '{text}'::numeric")
        result = pg_binary.pgresult
        assert result is not None
        assert encode_binary(Decimal(text), numeric) == result.get_value(0, 0), text


def test_null_and_type_metadata() -> None:
    assert encode_text(None, pg_type("INTEGER")) is None
    numeric = pg_type("DECIMAL(15,2)")
    assert (numeric.oid, numeric.typmod) == (1700, (15 << 16 | 2) + 4)  # as PostgreSQL's atttypmod
    assert pg_type("INTEGER[]").oid == 1007 and pg_type("VARCHAR[]").oid == 1009
    assert pg_type("STRUCT(a INTEGER)").oid == 25  # anything unknown travels as text
