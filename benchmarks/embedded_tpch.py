"""What the proxy adds to TPC-H queries on its embedded DuckDB.

Each of the 22 queries runs alone, one at a time, (a) on DuckDB in this process, with and without
the profiler the proxy keeps on for training, and (b) through ``admission serve --tpch SF`` (a
separate process holding its own copy of the data) with psycopg. The three are interleaved per
query and round, and the median of each is reported with the time the proxy adds and the ratio.
The whole suite's ratio is also taken round by round (round k of every query, summed, through
the proxy over in-process), with a distribution-free 95% interval for its median.

    python -m benchmarks.embedded_tpch [--sf 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psycopg

from admission.stats import median_interval
from testing.pgcluster import connect_when_ready, free_port
from workloads.tpch import QUERY_NUMBERS, draw_parameters, render_query
from workloads.tpch.data import generate, load_duckdb


def _timed(target: duckdb.DuckDBPyConnection | psycopg.Connection, sql: str) -> float:
    started = time.perf_counter()
    target.execute(sql).fetchall()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--rounds", type=int, default=7, help="runs of each query per target")
    args = parser.parse_args(argv)

    print(f"TPC-H SF {args.sf:g}: generating (cached) and loading…", flush=True)
    started = time.monotonic()
    data = generate(args.sf, progress=print)
    port = free_port()
    admission = str(Path(sys.executable).with_name("admission"))
    server = subprocess.Popen(
        [admission, "serve", "--tpch", f"{args.sf:g}", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ADMISSION_LOG_LEVEL": "warning"},
    )
    direct = duckdb.connect()
    load_duckdb(direct, data, args.sf)
    direct.execute("SET TimeZone = 'UTC'")
    try:
        client = connect_when_ready(port, server, timeout=900, user="bench", dbname="tpch")
    except (RuntimeError, TimeoutError) as e:
        raise SystemExit(f"the proxy did not start: {e}") from None
    print(f"ready in {time.monotonic() - started:.0f} s; {args.rounds} rounds per query\n")

    rows = []
    per_round: list[dict[str, list[float]]] = []
    queries = {
        q: render_query(q, draw_parameters(q, random.Random(q), args.sf), "duckdb")
        for q in QUERY_NUMBERS
    }
    try:
        for sql in queries.values():  # warm both sides: every query once, before any is timed
            client.execute(sql).fetchall()
            direct.execute(sql).fetchall()
        for q, sql in queries.items():
            times: dict[str, list[float]] = {"plain": [], "profiled": [], "proxy": []}
            for _ in range(args.rounds):
                direct.execute("PRAGMA disable_profiling")
                times["plain"].append(_timed(direct, sql))
                direct.execute("PRAGMA enable_profiling = 'no_output'")
                times["profiled"].append(_timed(direct, sql))
                times["proxy"].append(_timed(client, sql))
            per_round.append(times)
            plain, profiled, proxy = (statistics.median(times[k]) for k in times)
            rows.append((q, plain, profiled, proxy))
            print(
                f"Q{q:<3} in-process {plain * 1000:8.1f} ms   profiled {profiled * 1000:8.1f} ms"
                f"   proxy {proxy * 1000:8.1f} ms   added {(proxy - plain) * 1000:+7.1f} ms"
                f"   ratio {proxy / plain:5.2f}",
                flush=True,
            )
    finally:
        client.close()
        server.send_signal(signal.SIGINT)
        server.wait(30)

    plain_total = sum(r[1] for r in rows)
    profiled_total = sum(r[2] for r in rows)
    proxy_total = sum(r[3] for r in rows)
    ratios = [r[3] / r[1] for r in rows]
    print()
    print(f"sum of medians: in-process {plain_total:.3f} s, profiled {profiled_total:.3f} s, ")
    print(f"                through the proxy {proxy_total:.3f} s")
    print(f"proxy / in-process, whole suite: {proxy_total / plain_total:.3f}")
    print(f"proxy / in-process per query: median {statistics.median(ratios):.3f}, ")
    print(f"                               max {max(ratios):.3f}")
    print(f"median added per query: {statistics.median(r[3] - r[1] for r in rows) * 1000:.1f} ms")
    print(f"profiler / plain, whole suite: {profiled_total / plain_total:.3f}")
    suites = [
        sum(t["proxy"][k] for t in per_round) / sum(t["plain"][k] for t in per_round)
        for k in range(args.rounds)
    ]
    interval = median_interval(suites)
    shown = f" (95% interval {interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
    print(
        f"whole suite round by round: median {statistics.median(suites):.3f}{shown}; "
        + ", ".join(f"{r:.3f}" for r in suites)
    )


if __name__ == "__main__":
    main()
