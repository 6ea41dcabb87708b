"""Admission on a mix it was never tuned on: statements that are not TPC-H's 22 queries, on
TPC-H's tables, learned from nothing while they run.

Five statement shapes of very different cost, each with parameters drawn per statement (one
class per shape, its cost varying within the class — the shipping window is 0 to 690 days
long):

==============  ======  =====================================================  ==============
class           share   statement                                              alone (SF 1)
==============  ======  =====================================================  ==============
point           40 %    an order by its key                                    ~0.3 ms
cust_nation     20 %    customers of a nation by market segment                ~1 ms
part_brand      15 %    parts of a size joined with their suppliers, top 20    ~3 ms
ship_window     20 %    revenue per supplier over a shipping window, top 10    ~13 ms (varies)
distinct_parts   5 %    distinct parts and orders of large line items          ~125 ms
==============  ======  =====================================================  ==============

Writes a trace of Poisson arrivals at ``--rate`` statements/s (seeded) and replays it through
``admission bench --arrivals trace`` on the embedded DuckDB: every policy of a repetition gets
the same arrivals, policies interleaved, no model given (``+learn`` policies start from
nothing; the others have only the bench's quick model of TPC-H Q6, which knows none of these
classes). Prints the bench's table and its verdict against the best baseline.

    python -m benchmarks.unseen_mix [--rate 80] [--duration 60] [--repetitions 3] \\
        [--policies none,fcfs@2,fcfs@4,latency@2+learn,latency@4+learn] [--seed 7]
"""

from __future__ import annotations

import argparse
import csv
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.coordinator import ADMISSION

__all__ = ["SHAPES", "bench_on_trace", "main", "write_trace"]


def _point(rng: random.Random) -> str:
    key = rng.randint(1, 6_000_000)
    return f"select o_orderstatus, o_totalprice, o_orderdate from orders where o_orderkey = {key}"


def _cust_nation(rng: random.Random) -> str:
    return (
        "select c_mktsegment, count(*), avg(c_acctbal) from customer "
        f"where c_nationkey = {rng.randint(0, 24)} group by c_mktsegment order by 1"
    )


def _part_brand(rng: random.Random) -> str:
    return (
        "select p_brand, p_type, count(*) from part join partsupp on ps_partkey = p_partkey "
        f"where p_size = {rng.randint(1, 50)} group by p_brand, p_type order by 3 desc limit 20"
    )


def _ship_window(rng: random.Random) -> str:
    start, end = rng.randint(0, 600), rng.randint(0, 600) + 90
    return (
        "select l_suppkey, sum(l_extendedprice * (1 - l_discount)) as rev from lineitem "
        f"where l_shipdate >= date '1995-01-01' + interval '{start} day' "
        f"and l_shipdate < date '1995-01-01' + interval '{end} day' "
        "group by l_suppkey order by rev desc limit 10"
    )


def _distinct_parts(rng: random.Random) -> str:
    return (
        "select count(distinct l_partkey), count(distinct l_orderkey) from lineitem "
        f"where l_quantity > {rng.randint(1, 30)}"
    )


SHAPES: list[tuple[float, Callable[[random.Random], str]]] = [
    (0.40, _point),
    (0.20, _cust_nation),
    (0.15, _part_brand),
    (0.20, _ship_window),
    (0.05, _distinct_parts),
]


def write_trace(path: Path, rate: float, seconds: float, seed: int) -> int:
    """Poisson arrivals of the mix for ``seconds``: (offset, SQL) rows. Returns their number."""
    rng = random.Random(seed)
    offset, rows = 0.0, 0
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        while (offset := offset + rng.expovariate(rate)) <= seconds:
            pick, total = rng.random(), 0.0
            shape = SHAPES[-1][1]
            for share, candidate in SHAPES:
                total += share
                if pick <= total:
                    shape = candidate
                    break
            out.writerow([f"{offset:.4f}", shape(rng)])
            rows += 1
    return rows


def bench_on_trace(trace: Path, mix: str, args: argparse.Namespace) -> int:
    """Replay ``trace`` through ``admission bench --arrivals trace`` (``args``: tpch, duration,
    repetitions, policies); ``mix`` names the TPC-H queries of the bench's quick model."""
    command = [
        ADMISSION,
        "bench",
        "--mix",
        mix,
        "--tpch",
        str(args.tpch),
        "--arrivals",
        "trace",
        "--trace",
        str(trace),
        "--duration",
        str(args.duration),
        "--repetitions",
        str(args.repetitions),
        "--policies",
        args.policies,
    ]
    return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=80.0, help="statements per second")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--policies", default="none,fcfs@2,fcfs@4,latency@2+learn,latency@4+learn")
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="admission-unseen-") as work:
        trace = Path(work) / "trace.csv"
        rows = write_trace(trace, args.rate, args.duration + 10, args.seed)
        print(f"{rows} statements at {args.rate:g}/s over {args.duration + 10:g} s", flush=True)
        return bench_on_trace(trace, "6", args)


if __name__ == "__main__":
    sys.exit(main())
