"""What work-memory grants do to PostgreSQL's temporary files: a server whose ``work_mem`` is set
for the worst case (small: every connection may run its largest plan at once) spills its
analytical statements' sorts and hash tables to disk; behind the proxy at most MPL statements run
at once, and each can be given its share of a memory budget as its work_mem
(``serve --grant-work-mem``).

Starts a PostgreSQL server of its own (TPC-H at --sf, the database's work_mem set to
--work-mem), trains a model through the proxy (which counts each class's work_mem units from
EXPLAIN), then runs ``admission bench`` with open Poisson arrivals at --load: no admission
("none"), FCFS pools without grants, and the same pools and the latency policy with grants,
interleaved, every policy of a repetition on the same arrivals. Prints, per policy, the
temporary bytes written per run (from pg_stat_database), throughput and mean/p99 response time
with 95 % intervals, and the temp bytes and throughput of each granted run against none's,
paired by repetition.

    python -m benchmarks.pg_spill [--sf 0.1] [--mix 6,9,13,18,21] [--work-mem 256kB]
        [--grant 512MiB] [--load 0.85 | --closed CLIENTS] [--duration 30] [--repetitions 3]
        [--policies none,fcfs@2,fcfs@2+grant,latency@2+grant] [--model FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from admission.model import EtaModel
from testing.pgcluster import start_cluster
from workloads.tpch.data import generate, load_postgres

MIB = 2**20
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def _interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = T95.get(len(values) - 1, 2.0)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def _admission(*args: str) -> str:
    """Run ``admission ARGS`` (its progress on stderr as it goes) and return its stdout."""
    exe = shutil.which("admission") or str(Path(sys.executable).parent / "admission")
    print("$ admission " + " ".join(args), flush=True)
    return subprocess.run([exe, *args], check=True, stdout=subprocess.PIPE, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=0.1)
    parser.add_argument("--mix", default="6,9,13,18,21")
    parser.add_argument("--work-mem", default="256kB", help="the server's work_mem")
    parser.add_argument("--grant", default="512MiB", help="--grant-work-mem of the +grant runs")
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument(
        "--closed", type=int, metavar="CLIENTS", help="a closed loop of CLIENTS, not arrivals"
    )
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--policies", default="none,fcfs@2,fcfs@2+grant,latency@2+grant")
    parser.add_argument("--model", type=Path, help="a model trained on this server's data")
    parser.add_argument("--out", type=Path, help="the bench's JSON result")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    cluster = start_cluster()
    work = Path(tempfile.mkdtemp(prefix="pg-spill-"))
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("create database tpch")
            conn.execute(f"alter database tpch set work_mem = '{args.work_mem}'")
        with psycopg.connect(cluster.dsn(dbname="tpch"), autocommit=True) as conn:
            load_postgres(conn, generate(args.sf), args.sf, progress=print)
            conn.execute("vacuum analyze")
        backend = f"postgresql://postgres@127.0.0.1:{cluster.port}/tpch"
        model = args.model
        if model is None:
            model = work / "model.json"
            _admission(
                "train",
                "--backend",
                backend,
                "--tpch",
                str(args.sf),
                "--classes",
                args.mix,
                "--out",
                str(model),
            )
        found = _admission(
            "bench",
            "--backend",
            backend,
            "--tpch",
            str(args.sf),
            "--mix",
            args.mix,
            "--model",
            str(model),
            *(
                ["--clients", str(args.closed)]
                if args.closed
                else ["--arrivals", "poisson", "--load", str(args.load)]
            ),
            "--duration",
            str(args.duration),
            "--repetitions",
            str(args.repetitions),
            "--policies",
            args.policies,
            "--grant-work-mem",
            args.grant,
            "--seed",
            str(args.seed),
            "--format",
            "json",
        )
        if args.out is not None:
            args.out.write_text(found)
        with psycopg.connect(cluster.dsn(dbname="tpch")) as conn:
            row = conn.execute(
                "select current_setting('max_connections')::int,"
                " pg_size_bytes(current_setting('work_mem'))"
            ).fetchone()
        assert row is not None
        report(json.loads(found), args, EtaModel.load(model), row[0], row[1])
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(
    result: dict[str, Any],
    args: argparse.Namespace,
    model: EtaModel,
    max_connections: int,
    work_mem: int,
) -> None:
    policies: dict[str, Any] = result["policies"]
    units = {c.name: c.work_mem_units for c in model.classes}
    print("\nwork_mem units per class (training, from EXPLAIN):", units)
    counted = [u for u in units.values() if u]
    if counted:
        worst = max_connections * max(counted) * work_mem
        print(
            f"the server's own bound: max_connections {max_connections} × {max(counted):.3g} "
            f"units × work_mem {work_mem // 1024} kB = {worst / MIB:.0f} MiB "
            f"(the grants' budget: {args.grant})"
        )
    print(
        f"\nPostgreSQL, TPC-H SF {args.sf}, work_mem {args.work_mem}, mix {args.mix}, "
        + (
            f"closed loop of {args.closed} clients"
            if args.closed
            else f"Poisson at ρ {result.get('offered_load') or args.load:.2f} "
            f"({result.get('rate') or 0:.2f}/s)"
        )
        + f", {args.repetitions} × {args.duration:.0f} s; "
        f"grants: {args.grant} in total\n"
    )
    print(
        f"{'policy':<20} {'temp MiB/run':>18} {'throughput /s':>16} {'mean R s':>16} "
        f"{'p99 R s':>16} {'errors':>7}"
    )
    for name, p in policies.items():
        reps = p["repetitions"]
        spill = [r["spill_bytes"] / MIB for r in reps if r.get("spill_bytes") is not None]
        x = [r["throughput"] for r in reps]
        mean_r = [r["mean_response"] for r in reps]
        p99 = [r["p99_response"] for r in reps]
        cells = []
        for values in (spill, x, mean_r, p99):
            if values:
                m, h = _interval(values)
                cells.append(f"{m:8.3g} ± {h:<7.2g}")
            else:
                cells.append(f"{'—':>18}")
        errors = sum(r["errors"] for r in reps)
        print(f"{name:<20} {cells[0]:>18} {cells[1]:>16} {cells[2]:>16} {cells[3]:>16} {errors:>7}")
    base = policies.get("none")
    if base is None:
        return
    by_rep = {r["repetition"]: r for r in base["repetitions"]}
    print()
    for name, p in policies.items():
        if "+grant" not in name:
            continue
        ratios, xs = [], []
        for r in p["repetitions"]:
            b = by_rep.get(r["repetition"])
            if b is None or not b.get("spill_bytes") or r.get("spill_bytes") is None:
                continue
            ratios.append(r["spill_bytes"] / b["spill_bytes"])
            xs.append(r["throughput"] / b["throughput"])
        if not ratios:
            continue
        m, h = _interval(ratios)
        xm, xh = _interval(xs)
        verdict = "halved" if m + h <= 0.5 else "not halved"
        print(
            f"{name}: temp bytes {m:.3f} ± {h:.2g} of none's (paired by repetition: {verdict}); "
            f"throughput {xm:.3f} ± {xh:.2g} of none's"
        )


if __name__ == "__main__":
    raise SystemExit(main())
