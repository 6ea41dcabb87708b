"""Which waiting transaction gets the next pooled connection: policies through a transaction
pool, against FCFS (a PgBouncer pool of the same size), on PostgreSQL.

Starts a PostgreSQL server of its own (``max_connections`` 100), writes a trace of Poisson
arrivals — point lookups by primary key beside TPC-H reports (Q1, Q18) — and runs ``admission
bench --arrivals trace --pool-size P`` on it: every policy through the same pool, repetitions
interleaved, the same arrivals for each. ``--tpch-only`` runs a Poisson TPC-H mix at a given
offered load instead (``--mix``, ``--load``). ``--pool-size 0`` runs the baselines without a
pool — every client its own server connection (PostgreSQL then allows 300), ``none`` among
the policies, the others at ``--mpl``. Prints the bench's table.

    python -m benchmarks.pool_order [--pool-size 4] [--lookups 100] [--q1 4] [--q18 0.5]
        [--duration 40] [--repetitions 3] [--policies fcfs,sept,sept+learn,latency+learn]
        [--tpch-only --mix 6:4,14:4,1:1,18:1 --load 0.85]
"""

from __future__ import annotations

import argparse
import csv
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.coordinator import ADMISSION
from testing.pgcluster import start_cluster
from workloads.tpch.queries import draw_parameters, render_query

SCALE = 0.1


def write_trace(
    path: Path, seconds: float, lookups: float, q1: float, q18: float, seed: int
) -> int:
    """Poisson arrivals of each stream merged by time; returns the number of statements."""
    rng = random.Random(seed)
    rows: list[tuple[float, str]] = []

    def stream(rate: float, make: object) -> None:
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            rows.append((round(t, 6), " ".join(make().split())))  # type: ignore[operator]

    orders = int(1_500_000 * SCALE) * 4  # TPC-H order keys are sparse: 1 in 4 exists
    stream(
        lookups,
        lambda: (
            "select o_orderstatus, o_totalprice from orders where o_orderkey = "
            f"{rng.randint(1, orders)}"
        ),
    )
    stream(q1, lambda: render_query(1, draw_parameters(1, rng, SCALE), "postgres"))
    stream(q18, lambda: render_query(18, draw_parameters(18, rng, SCALE), "postgres"))
    rows.sort()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["offset", "sql"])
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool-size", type=int, default=4, help="0: no pool (baselines)")
    parser.add_argument("--mpl", type=int, default=None, help="default: the pool size")
    parser.add_argument("--lookups", type=float, default=100.0, help="point lookups per second")
    parser.add_argument("--q1", type=float, default=4.0, help="TPC-H Q1 per second")
    parser.add_argument("--q18", type=float, default=0.5, help="TPC-H Q18 per second")
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policies", default="fcfs,sept,sept+learn,latency+learn")
    parser.add_argument("--tpch-only", action="store_true")
    parser.add_argument("--mix", default="6:4,14:4,1:1,18:1")
    parser.add_argument("--load", type=float, default=0.85)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="admission-pool-order-"))
    try:
        return _run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path) -> int:
    pooled = args.pool_size > 0
    pg = start_cluster(max_connections=100 if pooled else 300)
    try:
        url = f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
        mpl = args.mpl if args.mpl is not None else (args.pool_size or 4)
        common = [
            *("--backend", url, "--tpch", str(SCALE)),
            *(("--pool-size", str(args.pool_size)) if pooled else ()),
            *("--mpl", str(mpl), "--policies", args.policies),
            *("--repetitions", str(args.repetitions), "--duration", str(args.duration)),
        ]
        if args.tpch_only:
            load = ["--mix", args.mix, "--arrivals", "poisson", "--load", str(args.load)]
        else:
            trace = work / "trace.csv"
            seconds = args.duration + 20
            n = write_trace(trace, seconds, args.lookups, args.q1, args.q18, args.seed)
            print(f"trace: {n} statements in {seconds:g} s ({trace})", flush=True)
            load = ["--mix", "1,18", "--arrivals", "trace", "--trace", str(trace)]
        return subprocess.run([ADMISSION, "bench", *common, *load], check=False).returncode
    finally:
        pg.stop()


if __name__ == "__main__":
    sys.exit(main())
