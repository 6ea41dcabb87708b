"""TPC-H through the proxy on its embedded DuckDB: every query, through psycopg, asyncpg and
SQLAlchemy, returns exactly the rows DuckDB gives when queried in-process; and
``admission serve --tpch`` does the whole set-up from the command line."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import asyncpg
import duckdb
import psycopg
import pytest
import sqlalchemy as sa

from admission import Limits
from testing.embeddedharness import Embedded
from testing.pgcluster import connect_when_ready, free_port
from workloads.tpch import QUERY_NUMBERS, draw_parameters, render_query
from workloads.tpch.data import generate, load_duckdb

SF = 0.01
Rows = list[tuple[object, ...]]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tpch-cache")


@pytest.fixture(scope="module")
def server(data_dir: Path) -> Iterator[Embedded]:
    data = generate(SF, data_dir)
    embedded = Embedded(Limits(mpl=2), lambda con: load_duckdb(con, data, SF), workers=4)
    yield embedded
    embedded.close()


def _queries() -> list[tuple[int, str]]:
    return [
        (q, render_query(q, draw_parameters(q, random.Random(q), SF), "duckdb"))
        for q in QUERY_NUMBERS
    ]


def _same(ours: Rows, direct: Rows) -> bool:
    """Equal row for row, or — where ORDER BY leaves ties — as multisets."""
    return ours == direct or sorted(map(repr, ours)) == sorted(map(repr, direct))


def _direct(server: Embedded, sql: str) -> Rows:
    return server.backend.plain_cursor().execute(sql).fetchall()


def test_all_22_queries_through_psycopg(server: Embedded) -> None:
    with server.connect() as conn:
        for q, sql in _queries():
            direct = _direct(server, sql)
            assert _same(conn.execute(sql).fetchall(), direct), q
            assert _same(conn.cursor(binary=True).execute(sql).fetchall(), direct), q
    assert server.call(lambda: server.scheduler.in_service) == 0


def test_all_22_queries_through_asyncpg(server: Embedded) -> None:
    async def run() -> list[tuple[int, Rows]]:
        conn = await asyncpg.connect(server.url)
        try:
            return [(q, [tuple(r) for r in await conn.fetch(sql)]) for q, sql in _queries()]
        finally:
            await conn.close()

    results = asyncio.run(run())
    for (q, rows), (_, sql) in zip(results, _queries(), strict=True):
        assert _same(rows, _direct(server, sql)), q


def test_all_22_queries_through_sqlalchemy(server: Embedded) -> None:
    engine = sa.create_engine(f"postgresql+psycopg://app@127.0.0.1:{server.port}/app")
    try:
        with engine.connect() as conn:
            for q, sql in _queries():
                rows = [tuple(r) for r in conn.execute(sa.text(sql.replace(":", r"\:"))).all()]
                assert _same(rows, _direct(server, sql)), q
    finally:
        engine.dispose()


def test_admission_serve_tpch_from_the_command_line(data_dir: Path) -> None:
    port = free_port()
    admission = str(Path(sys.executable).with_name("admission"))
    small = ["--mpl", "2", "--memory-limit", "96MiB", "--max-temp-size", "0"]  # a small server
    proc = subprocess.Popen(
        [admission, "serve", "--tpch", str(SF), "--listen", f"127.0.0.1:{port}", *small],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ADMISSION_DATA": str(data_dir.parent / "cli-cache")},
    )
    try:
        with connect_when_ready(port, proc) as conn:
            assert conn.execute("select count(*) from region").fetchone() == (5,)
            (lineitems,) = conn.execute("select count(*) from lineitem").fetchone()  # type: ignore[misc]
            con = duckdb.connect()
            load_duckdb(con, generate(SF, data_dir), SF)
            assert (lineitems,) == con.execute("select count(*) from lineitem").fetchone()
            # more than DuckDB's memory_limit leaves, with nowhere to spill: out of memory
            with pytest.raises(psycopg.errors.OutOfMemory):
                conn.execute(
                    "select i % 3000000 k, count(*) from range(6000000) t(i) group by k order by k"
                ).fetchall()
            assert conn.execute("select count(*) from nation").fetchone() == (25,)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "loading lineitem" in err and "backend=duckdb::memory: TPC-H SF 0.01" in err
    assert "DuckDB spills nothing to disk" in err and "memory budget" in err


def test_admission_serve_opens_a_duckdb_file(tmp_path: Path) -> None:
    path = tmp_path / "shop.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("create table orders (id integer, total decimal(10,2))")
        con.execute("insert into orders values (1, 9.50), (2, 20.00)")
    port = free_port()
    admission = str(Path(sys.executable).with_name("admission"))
    proc = subprocess.Popen(
        [admission, "serve", "--database", str(path), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with connect_when_ready(port, proc) as conn:
            assert conn.execute("select sum(total) from orders").fetchone() == (Decimal("29.50"),)
            conn.execute("insert into orders values (3, 0.50)")
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    with duckdb.connect(str(path)) as con:  # the insert reached the file
        assert con.execute("select count(*) from orders").fetchone() == (3,)


def test_serve_refuses_contradictory_options() -> None:
    admission = str(Path(sys.executable).with_name("admission"))
    out = subprocess.run(
        [admission, "serve", "--backend", "postgresql://127.0.0.1:5432", "--tpch", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "belong to the embedded DuckDB backend" in out.stderr
    out = subprocess.run(
        [admission, "serve", "--database", "/nonexistent/dir/x.duckdb", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "cannot open the DuckDB database" in out.stderr
