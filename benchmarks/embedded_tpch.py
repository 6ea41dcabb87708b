"""What the proxy adds to TPC-H queries on its embedded DuckDB.

Each of the 22 queries runs alone, one at a time, (a) on DuckDB in this process, with and without
the profiler the proxy keeps on for training, and (b) through ``admission serve --tpch SF`` (a
separate process holding its own copy of the data) with psycopg. They are interleaved per query
and round, and the median of each is reported with the time the proxy adds and the ratio.

Each side runs a query twice in a row per round, and both runs are timed: the first right after
the other side ran it (two copies of the data in two processes on the same cores: the side that
runs after the other finds the caches holding the other's copy and its threads asleep — on a
2-core VM that cost either side 1–4 ms on a 10 ms query, measured), the second back to back,
which is what a server busy with its own work sees. Both ratios are printed.
The whole suite's ratio is also taken round by round (round k of every query, summed, through
the proxy over in-process), with a distribution-free 95% interval for its median.

The server learns as it serves (its default): it profiles the first 8 statements of each class
and then one in 32 (at most one a second) for their memory, which costs about a millisecond a
statement. With the default single warm-up run the rounds measure those sampled statements;
``--warmup 8`` measures the statements after them (what a class costs once learned).

    python -m benchmarks.embedded_tpch [--sf 1] [--rounds 7] [--warmup 1]
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

# per query and round: in-process right after the proxy ran it ("plain after"), again at once
# ("plain"), with the profiler on ("profiled"), then through the proxy right after in-process
# ("proxy after") and again at once ("proxy")
KINDS = ("plain after", "plain", "profiled", "proxy after", "proxy")


def _timed(target: duckdb.DuckDBPyConnection | psycopg.Connection, sql: str) -> float:
    started = time.perf_counter()
    target.execute(sql).fetchall()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--rounds", type=int, default=7, help="runs of each query per target")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of each query on both sides first (8: past the server's memory "
        "sample of each class)",
    )
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
    print(
        f"ready in {time.monotonic() - started:.0f} s; {args.warmup} warm-up run(s) and "
        f"{args.rounds} rounds per query\n"
    )

    rows = []
    per_round: list[dict[str, list[float]]] = []
    queries = {
        q: render_query(q, draw_parameters(q, random.Random(q), args.sf), "duckdb")
        for q in QUERY_NUMBERS
    }
    try:
        for _ in range(args.warmup):  # warm both sides: every query, before any is timed
            for sql in queries.values():
                client.execute(sql).fetchall()
                direct.execute(sql).fetchall()
        for q, sql in queries.items():
            times: dict[str, list[float]] = {k: [] for k in KINDS}
            for _ in range(args.rounds):
                direct.execute("PRAGMA disable_profiling")
                times["plain after"].append(_timed(direct, sql))
                times["plain"].append(_timed(direct, sql))
                direct.execute("PRAGMA enable_profiling = 'no_output'")
                times["profiled"].append(_timed(direct, sql))
                times["proxy after"].append(_timed(client, sql))
                times["proxy"].append(_timed(client, sql))
            per_round.append(times)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append((q, med))
            print(
                f"Q{q:<3} in-process {med['plain'] * 1000:7.1f} ms  profiled "
                f"{med['profiled'] * 1000:7.1f}  proxy {med['proxy'] * 1000:7.1f}  added "
                f"{(med['proxy'] - med['plain']) * 1000:+5.1f} ms  ratio "
                f"{med['proxy'] / med['plain']:5.2f}   | after the other: "
                f"{med['plain after'] * 1000:7.1f} / {med['proxy after'] * 1000:7.1f} ms  ratio "
                f"{med['proxy after'] / med['plain after']:5.2f}",
                flush=True,
            )
    finally:
        client.close()
        server.send_signal(signal.SIGINT)
        server.wait(30)

    total = {k: sum(med[k] for _, med in rows) for k in KINDS}
    print()
    print(
        f"sum of medians: in-process {total['plain']:.3f} s, profiled {total['profiled']:.3f} s, "
        f"through the proxy {total['proxy']:.3f} s"
    )
    print(f"profiler / plain, whole suite: {total['profiled'] / total['plain']:.3f}")
    for label, plain, proxy in (
        ("back to back", "plain", "proxy"),
        ("each run after the other side's", "plain after", "proxy after"),
    ):
        ratios = [med[proxy] / med[plain] for _, med in rows]
        worst = max(rows, key=lambda r: r[1][proxy] / r[1][plain])[0]
        suites = [
            sum(t[proxy][k] for t in per_round) / sum(t[plain][k] for t in per_round)
            for k in range(args.rounds)
        ]
        interval = median_interval(suites)
        shown = f" (95% interval {interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
        added = statistics.median(med[proxy] - med[plain] for _, med in rows) * 1000
        print(f"\n{label}:")
        print(f"  proxy / in-process, whole suite: {total[proxy] / total[plain]:.3f}")
        print(
            f"  per query: median {statistics.median(ratios):.3f}, max {max(ratios):.3f} "
            f"(Q{worst}); median added {added:.1f} ms"
        )
        print(
            f"  whole suite round by round: median {statistics.median(suites):.3f}{shown}; "
            + ", ".join(f"{r:.3f}" for r in suites)
        )


if __name__ == "__main__":
    main()
