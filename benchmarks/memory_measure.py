"""How well training's memory measure matches what a statement takes, each statement run alone.

DuckDB (in this process, TPC-H at --sf): training's measure — the profiler's buffer-manager
peak during the statement less what it held before — against the same peak watched from outside
(another cursor polling ``duckdb_memory()`` as fast as it answers) and against the bytes the
statement allocated in all (``total_memory_allocated``, the earlier measure).

PostgreSQL (``--postgres``: a server started here, TPC-H at --pg-sf, work_mem 256 MB and no
parallel workers so that nothing spills): training's measure — the sum of what EXPLAIN
(ANALYZE, BUFFERS) reports of the operators — against the growth of the backend's anonymous
memory (/proc RssAnon, polled every ~1 ms) while the statement runs on a fresh connection (a
reused backend keeps its earlier statements' heap, and grows little or not at all).

    python -m benchmarks.memory_measure [--sf 1] [--queries 18,9,13,21] [--runs 3]
                                        [--postgres] [--pg-sf 0.1]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
import psycopg

from proxy.backends.embedded.executor import set_profiling
from testing.pgcluster import start_cluster
from training.pgmemory import explain_memory
from workloads.tpch.data import generate, load_duckdb, load_postgres
from workloads.tpch.queries import random_query

MIB = 2**20


def _watch(read: Callable[[], float], run: Callable[[], object], pause: float = 0.0) -> float:
    """The most ``read()`` gave above its value before, while ``run()`` ran (read every
    ``pause`` seconds, or as fast as it answers)."""
    base = read()
    peak = [base]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], read())
            if pause:
                time.sleep(pause)

    watcher = threading.Thread(target=poll)
    watcher.start()
    try:
        run()
    finally:
        done.set()
        watcher.join()
    return peak[0] - base


def duckdb_rows(sf: float, queries: list[int], runs: int) -> None:
    con = duckdb.connect()
    load_duckdb(con, generate(sf), sf)
    monitor, cursor = con.cursor(), con.cursor()
    set_profiling(cursor, True)

    def held() -> float:
        row = monitor.execute("select sum(memory_usage_bytes) from duckdb_memory()").fetchone()
        return float(row[0]) if row else 0.0

    print(f"DuckDB, TPC-H SF {sf:g} (MiB): training's measure | watched | allocated in all")
    for q in queries:
        for rep in range(runs):
            sql = random_query(q, random.Random(rep), "duckdb", sf)
            base = held()
            watched = _watch(held, functools.partial(_fetch, cursor, sql))
            system = json.loads(cursor.get_profiling_information(format="json"))["system"]
            peak = float(system["peak_buffer_memory"]) - base
            total = float(system["total_memory_allocated"])
            print(
                f"  Q{q:<2} run {rep + 1}: {peak / MIB:8.1f} | {watched / MIB:8.1f} "
                f"({peak / max(watched, 1):.2f}×) | {total / MIB:8.1f} "
                f"({total / max(watched, 1):.2f}×)"
            )
    con.close()


def _fetch(conn: Any, sql: str) -> object:
    return conn.execute(sql).fetchall()


def _anon(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return float(line.split()[1]) * 1024
    return 0.0


def postgres_rows(sf: float, queries: list[int], runs: int) -> None:
    cluster = start_cluster()
    try:
        with psycopg.connect(cluster.dsn(dbname="postgres"), autocommit=True) as conn:
            conn.execute("create database memory")
            conn.execute("alter database memory set work_mem = '256MB'")
            conn.execute("alter database memory set max_parallel_workers_per_gather = 0")
        dsn = cluster.dsn(dbname="memory")
        with psycopg.connect(dsn) as conn:
            load_postgres(conn, generate(sf), sf)
        print(f"PostgreSQL, TPC-H SF {sf:g} (MiB): EXPLAIN's sum | fresh backend's growth")
        for q in queries:
            for rep in range(runs):
                sql = random_query(q, random.Random(rep), "postgres", sf)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    explained = explain_memory(conn, sql).memory
                with psycopg.connect(dsn, autocommit=True) as conn:
                    pid = conn.info.backend_pid
                    conn.execute("select 1")
                    grew = _watch(
                        functools.partial(_anon, pid),
                        functools.partial(_fetch, conn, sql),
                        pause=0.001,
                    )
                print(
                    f"  Q{q:<2} run {rep + 1}: {explained / MIB:8.2f} | {grew / MIB:8.2f} "
                    f"({explained / max(grew, 1):.2f}×)"
                )
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--queries", default="18,9,13,21")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--pg-sf", type=float, default=0.1)
    args = parser.parse_args()
    queries = [int(q) for q in args.queries.split(",")]
    duckdb_rows(args.sf, queries, args.runs)
    if args.postgres:
        postgres_rows(args.pg_sf, queries, args.runs)


if __name__ == "__main__":
    main()
