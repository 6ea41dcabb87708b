"""What learning while serving costs the proxy's throughput, in front of a local PostgreSQL.

    python -m benchmarks.serve_cost [--clients 16] [--seconds 8] [--rounds 5] [--mode extended]

Starts a PostgreSQL of its own (pgbench's tables at scale 1) and, per round in a
balanced order (each setting in each position equally often), ``admission serve`` in
session mode with:

* ``defaults``: what a user gets — D_r learned from every statement and the live profile
  (training's sampler following each statement's backend in /proc, every 0.2 s);
* ``no-profile``: ``--sample-interval 0`` (D_r still learned);
* ``no-learn``: ``--no-learn`` (nothing learned).

Each runs ``pgbench -S -M MODE -c C -j 2`` (one short statement per transaction: what costs
the proxy most per unit of work). Prints each run's throughput, then per setting the median
and its ratio to ``no-learn`` in the same round (median, least, most).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess

from benchmarks.coordinator import serve_proxy
from benchmarks.pooling import pgbench, stop
from lab.bench import run_order
from testing.pgcluster import start_cluster

__all__ = ["main"]

SETTINGS = {
    "defaults": [],
    "no-profile": ["--sample-interval", "0"],
    "no-learn": ["--no-learn"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mode", default="extended", choices=("simple", "extended", "prepared"))
    args = parser.parse_args(argv)
    pg = start_cluster(max_connections=max(100, args.clients + 20))
    direct = f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres"
    subprocess.run(["pgbench", "-i", "-s", "1", "-q", direct], check=True, capture_output=True)
    print(
        f"pgbench -S -M {args.mode} -c {args.clients} -j 2, {args.seconds:g} s, "
        f"{args.rounds} rounds, session mode",
        flush=True,
    )
    tps: dict[str, list[float]] = {name: [] for name in SETTINGS}
    try:
        for rnd in range(args.rounds):
            for name in run_order(list(SETTINGS), 0, rnd):
                proc, port = serve_proxy(pg, ["--log-level", "warning", *SETTINGS[name]])
                try:
                    row = pgbench(
                        port,
                        ["-S", "-M", args.mode, "-c", str(args.clients), "-j", "2"],
                        args.seconds,
                    )
                finally:
                    stop(proc)
                tps[name].append(row["tps"])
                print(
                    f"round {rnd + 1} {name:10} tps {row['tps']:9.0f}  errors {row['errors']:.0f}",
                    flush=True,
                )
    finally:
        pg.stop()
    print("\nmedian over rounds (ratio to no-learn in the same round: median [least, most])")
    for name, values in tps.items():
        ratios = [v / b for v, b in zip(values, tps["no-learn"], strict=True) if b]
        line = f"{name:10} tps {statistics.median(values):9.0f}"
        if name != "no-learn" and ratios:
            line += f"  ×{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
