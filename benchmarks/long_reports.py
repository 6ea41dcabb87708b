"""Long reports holding the MPL: short TPC-H statements arriving while two reports of seconds
hold both slots of an MPL of 2 — the case where a hard cap costs most, and what the latency
policy's short lane and ``--release-after`` do about it.

Writes a trace — Poisson arrivals of TPC-H Q2, Q6, Q11 and Q14 (tens of milliseconds alone) at
``--rate`` statements/s, and every 15 s from 5 s on two reports half a second apart (distinct
orders per supplier and part over all of lineitem, 1–2 s alone at SF 1) — and replays it
through ``admission bench --arrivals trace`` on the embedded DuckDB: every setting of a
repetition gets the same arrivals, settings interleaved. The reports are a statement shape no
model knows: its D_r is a prior until the proxy has measured it, and the short lane counts
such a statement in service as having as long to go as it has run.

``--novel`` makes every short statement a shape of its own (wrapped as ``with novel_N as
(…) select * from novel_N``: the same work, a new fingerprint), as ad hoc queries and
generated SQL are: no short statement is of a class the proxy has measured, so none can take
the short lane (it admits measured classes only) until the shapes beyond ``--max-classes``
share one class.

    python -m benchmarks.long_reports [--rate 10] [--duration 60] [--repetitions 3] \\
        [--policies none,fcfs@2,latency@2+learn+lane=0,latency@2+learn] [--seed 7] [--novel]
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import tempfile
from pathlib import Path

from benchmarks.unseen_mix import bench_on_trace
from workloads.tpch.queries import random_query

__all__ = ["REPORT", "main", "write_trace"]

SHORT = (2, 6, 11, 14)
REPORT = (
    "select l_suppkey, l_partkey, count(distinct l_orderkey), sum(l_extendedprice) "
    "from lineitem group by l_suppkey, l_partkey order by 3 desc limit 5"
)
REPORTS_EVERY, REPORTS_FROM, REPORTS_APART = 15.0, 5.0, 0.5


def write_trace(
    path: Path, rate: float, seconds: float, seed: int, novel: bool = False
) -> tuple[int, int]:
    """The trace's (offset, SQL) rows, in time order; returns (short statements, reports).
    ``novel``: every short statement a statement shape of its own."""
    rng = random.Random(seed)
    rows: list[tuple[float, str]] = []
    offset = 0.0
    while (offset := offset + rng.expovariate(rate)) <= seconds:
        sql = random_query(rng.choice(SHORT), rng)
        if novel:  # (a CTE name of its own: a new fingerprint, the same plan)
            name = f"novel_{len(rows)}"
            sql = f"with {name} as ({sql.strip().rstrip(';')}) select * from {name}"
        rows.append((offset, sql))
    shorts = len(rows)
    at = REPORTS_FROM
    while at <= seconds:
        rows += [(at, REPORT), (at + REPORTS_APART, REPORT)]
        at += REPORTS_EVERY
    rows.sort(key=lambda row: row[0])
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        for when, sql in rows:
            out.writerow([f"{when:.4f}", sql])
    return shorts, len(rows) - shorts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10.0, help="short statements per second")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--policies", default="none,fcfs@2,latency@2+learn+lane=0,latency@2+learn")
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--novel",
        action="store_true",
        help="every short statement a shape of its own (ad hoc SQL: no class measured before)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="admission-reports-") as work:
        trace = Path(work) / "trace.csv"
        shorts, reports = write_trace(trace, args.rate, args.duration, args.seed, args.novel)
        shapes = ", each a shape of its own," if args.novel else ""
        print(
            f"{shorts} short statements{shapes} at {args.rate:g}/s and {reports} reports",
            flush=True,
        )
        return bench_on_trace(trace, ",".join(str(q) for q in SHORT), args)


if __name__ == "__main__":
    sys.exit(main())
