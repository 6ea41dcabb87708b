"""TPC-H: data from tpchgen-cli loaded into DuckDB and into a real PostgreSQL; all 22 queries
(each dialect's text, the same substitution parameters) return the same rows on both."""

from __future__ import annotations

import datetime
import math
import os
import random
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest

from admission import classify_sql
from testing.pgcluster import Cluster
from workloads.tpch import QUERY_NUMBERS, draw_parameters, render_query
from workloads.tpch.data import generate, load_duckdb, load_postgres
from workloads.tpch.mixes import MIXES, mix_by_name
from workloads.tpch.schema import TABLES

SF = 0.01


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(SF, tmp_path_factory.mktemp("tpch-cache"))


@pytest.fixture(scope="module")
def duck(data: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    load_duckdb(con, data, SF)
    yield con
    con.close()


@pytest.fixture(scope="module")
def postgres(pg: Cluster, data: Path) -> Iterator[psycopg.Connection]:
    pg.psql("drop database if exists tpch")
    pg.psql("create database tpch")
    with psycopg.connect(pg.dsn(dbname="tpch")) as conn:
        load_postgres(conn, data, SF)
        conn.commit()
        yield conn


def _norm(value: object) -> object:
    if isinstance(value, str):
        return value.rstrip()
    if isinstance(value, Decimal | float):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.date() if value.time() == datetime.time() else value
    return value


def _same(a: list[tuple[object, ...]], b: list[tuple[object, ...]]) -> bool:
    if len(a) != len(b):
        return False
    for row_a, row_b in zip(a, b, strict=True):
        for x, y in zip(row_a, row_b, strict=True):
            x, y = _norm(x), _norm(y)
            if isinstance(x, float) and isinstance(y, float | int):
                if not math.isclose(x, float(y), rel_tol=1e-6, abs_tol=1e-6):
                    return False
            elif x != y:
                return False
    return True


def test_generated_data_has_every_table(data: Path) -> None:
    assert sorted(p.stem for p in data.glob("*.csv")) == sorted(TABLES)
    assert generate(SF, data.parent) == data  # second call reuses the files


def test_loads_are_complete_and_idempotent(
    duck: duckdb.DuckDBPyConnection, postgres: psycopg.Connection, data: Path
) -> None:
    counts = {}
    for table in TABLES:
        (n,) = duck.execute(f"select count(*) from {table}").fetchone()  # type: ignore[misc]
        (m,) = postgres.execute(f"select count(*) from {table}").fetchone()  # type: ignore[misc]
        assert n == m > 0, table
        counts[table] = n
    assert counts["lineitem"] > 50_000 and counts["region"] == 5 and counts["nation"] == 25
    load_duckdb(duck, data, SF)  # already loaded: a no-op
    load_postgres(postgres, data, SF)
    assert duck.execute("select count(*) from region").fetchone() == (5,)


def _fingerprints(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[object, ...]]:
    """Per table: its row count and a sum of its rows' hashes (order-free, every column)."""
    return {
        t: con.execute(f"select count(*), sum(hash(t)) from {t} t").fetchone()  # type: ignore[misc]
        for t in TABLES
    }


def test_duckdb_loads_again_from_its_parquet_copy(
    duck: duckdb.DuckDBPyConnection, data: Path, tmp_path: Path
) -> None:
    """The first load read the CSVs and kept a Parquet copy of each table; a second load reads
    the copies and holds the same rows, value for value. A damaged copy is not trusted: the
    load falls back to the CSV, and keeps a good copy again."""
    copies = {p.name.split(".")[0]: p.name for p in data.glob("*.parquet")}
    assert sorted(copies) == sorted(TABLES) and len(list(data.glob("*.parquet"))) == len(TABLES)
    assert not list(data.glob("*.partial"))
    said: list[str] = []
    again = duckdb.connect()
    load_duckdb(again, data, SF, progress=said.append)
    assert not any("CSV" in line for line in said), said
    assert _fingerprints(again) == _fingerprints(duck)
    again.close()

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for table in TABLES:
        (damaged / f"{table}.csv").write_bytes((data / f"{table}.csv").read_bytes())
        (damaged / copies[table]).write_bytes((data / copies[table]).read_bytes())
    (damaged / copies["orders"]).write_bytes(b"PAR1 not a parquet file")
    said.clear()
    third = duckdb.connect()
    load_duckdb(third, damaged, SF, progress=said.append)
    assert any(f"{copies['orders']} is unreadable" in line for line in said), said
    assert _fingerprints(third) == _fingerprints(duck)
    third.close()
    fourth = duckdb.connect()
    said.clear()
    load_duckdb(fourth, damaged, SF, progress=said.append)
    assert not any("CSV" in line for line in said), said
    assert _fingerprints(fourth) == _fingerprints(duck)
    fourth.close()

    # a CSV newer than its copy (someone replaced it) is read, and the copy made again; copies
    # of another schema and partial copies an hour old go when it is
    stale = [damaged / "region.parquet", damaged / "region.0123abcd.parquet"]
    old_partial = damaged / f"{copies['region']}.1-abc.partial"
    for path in [*stale, old_partial]:
        path.write_bytes(b"left over")
    os.utime(old_partial, (time.time() - 7200, time.time() - 7200))
    now = time.time()
    os.utime(damaged / copies["region"], (now - 100, now - 100))
    os.utime(damaged / "region.csv", (now - 50, now - 50))
    said.clear()
    fifth = duckdb.connect()
    load_duckdb(fifth, damaged, SF, progress=said.append)
    assert [line for line in said if "CSV" in line] == [
        "loading region (from CSV; a Parquet copy is kept for the next load)"
    ], said
    assert _fingerprints(fifth) == _fingerprints(duck)
    fifth.close()
    assert not any(p.exists() for p in [*stale, old_partial])
    assert (damaged / copies["region"]).stat().st_mtime >= now - 50


@pytest.mark.parametrize("query", QUERY_NUMBERS)
def test_query_agrees_between_duckdb_and_postgres(
    query: int, duck: duckdb.DuckDBPyConnection, postgres: psycopg.Connection
) -> None:
    rng = random.Random(1000 + query)
    for _ in range(2):
        params = draw_parameters(query, rng, SF)
        duck_rows = duck.execute(render_query(query, params, "duckdb")).fetchall()
        pg_rows = postgres.execute(render_query(query, params, "postgres")).fetchall()
        same = _same(duck_rows, pg_rows) or _same(
            sorted(duck_rows, key=repr), sorted(pg_rows, key=repr)
        )
        assert same, (query, params, duck_rows[:3], pg_rows[:3])


def test_queries_return_rows_at_this_scale(duck: duckdb.DuckDBPyConnection) -> None:
    """Guard against agreeing on nothing: most queries return rows at SF 0.01."""
    non_empty = 0
    for query in QUERY_NUMBERS:
        params = draw_parameters(query, random.Random(7), SF)
        non_empty += bool(duck.execute(render_query(query, params, "duckdb")).fetchall())
    assert non_empty >= 18


def test_mixes() -> None:
    for name in ("light", "medium", "heavy", "all"):
        mix = mix_by_name(name)
        assert math.isclose(sum(mix.weights.values()), 1.0)
    assert MIXES["light"].weights[16] == pytest.approx(0.3)
    assert MIXES["heavy"].queries == (16, 18, 1, 4, 9, 21)
    with pytest.raises(ValueError, match="unknown mix"):
        mix_by_name("extreme")
    assert (
        len(
            {
                classify_sql(render_query(q, draw_parameters(q, random.Random(q)), "duckdb"))
                for q in MIXES["all"].queries
            }
        )
        == 22
    )
