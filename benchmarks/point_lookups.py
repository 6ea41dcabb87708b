"""Point lookups through the embedded server: what an MPL costs statements of a millisecond.

    python -m benchmarks.point_lookups [--settings none,2,4,8,auto] [--clients 8]
        [--seconds 15] [--rounds 3] [--scale 1]

Creates pgbench's tables (``pgbench -i -s SCALE``) in a DuckDB file through ``admission serve
--database FILE``; then, per round in a balanced order (``lab.bench.run_order``), starts a
fresh ``admission serve --database FILE`` for each setting and runs ``pgbench -S -M extended -c
C -j 2 -T S`` against it (select-only: one primary-key lookup per transaction, a closed loop).

Settings: ``none`` is ``--mpl 0 --policy fcfs`` (no admission control); ``default`` is
``serve`` given nothing but the database (what a new user gets: latency, learning from
nothing, ``--mpl auto`` from the cores, ``--release-after 1``, the contention limit — which
never engages on reads); a number N is the latency
policy at MPL N learning from nothing (``--model NEW.json --mpl N``, what a model-less default
with an MPL would be); ``auto`` the same with ``--mpl auto`` (its moves, and the default's,
are printed under its row).

Prints each run's throughput (pgbench's, without the connection time), then per setting the
median over rounds and its ratio to ``none``'s in the same round (median and range).

Measured (README "Why no MPL without a model" and "Past a dip, on point lookups"): MPL 2
19–28 % less throughput than none in every pair, MPL 4 10–18 % less, MPL 8 (as many as the
clients) equal; ``auto`` at none's throughput once it has looked past MPL 4 — about 90 s at
first, within 10–20 s since samples of many short statements close sooner (``admission.mpl``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks.coordinator import ADMISSION, _wait
from benchmarks.pooling import pgbench, stop
from lab.bench import run_order
from testing.pgcluster import free_port


def serve(database: Path, setting: str, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``admission serve`` on ``database`` with ``setting``'s options, listening: (process,
    port)."""
    if setting == "none":
        args = ["--mpl", "0", "--policy", "fcfs"]
    elif setting == "default":
        args = []
    else:  # learning from nothing, as a model-less default would (the file is left behind)
        model = work / f"learned-{setting}-{free_port()}.json"
        args = ["--model", str(model), "--mpl", setting]
    # (auto's moves: a line each)
    return serve_database(database, args, "info" if setting in ("auto", "default") else "warning")


def serve_database(
    database: Path, args: list[str], log_level: str = "warning"
) -> tuple[subprocess.Popen[bytes], int]:
    """``admission serve --database DATABASE ARGS`` on a free port, listening: (process, port;
    its standard error piped)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            ADMISSION,
            "serve",
            "--database",
            str(database),
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            log_level,
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait(port, proc)
    return proc, port


def init_pgbench(port: int, scale: int) -> None:
    """``pgbench -i -s SCALE`` through the proxy on ``port`` (SystemExit if it fails)."""
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    init = subprocess.run(
        ["pgbench", "-i", "-s", str(scale), "-q", dsn], capture_output=True, text=True
    )
    if init.returncode != 0:
        raise SystemExit(f"pgbench -i failed: {init.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings", default="none,2,4,8,auto", help="none, default, N (an MPL), auto"
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=int, default=1, help="pgbench's scale factor")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        if s not in ("none", "default", "auto") and not (s.isdigit() and int(s) >= 1):
            parser.error(f"--settings: {s!r} is not none, default, auto or an MPL ≥ 1")
    if "none" not in settings:
        settings.insert(0, "none")  # (what every ratio is to)
    if args.clients < 1 or args.seconds < 1 or args.rounds < 1 or args.scale < 1:
        parser.error("--clients, --seconds, --rounds and --scale must be at least 1")

    work = Path(tempfile.mkdtemp(prefix="admission-lookups-"))
    try:
        return _run(args, settings, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, settings: list[str], work: Path) -> int:
    database = work / "pgbench.duckdb"
    proc, port = serve(database, "none", work)
    try:
        init_pgbench(port, args.scale)
    finally:
        stop(proc)
    print(
        f"pgbench -S -M extended -c {args.clients} -j 2, {args.seconds:g} s, scale "
        f"{args.scale}, embedded DuckDB; {args.rounds} rounds"
    )
    tps: dict[str, list[float]] = {s: [] for s in settings}
    for rnd in range(args.rounds):
        for setting in run_order(settings, 0, rnd):
            proc, port = serve(database, setting, work)
            try:
                row = pgbench(
                    port, ["-S", "-M", "extended", "-c", str(args.clients), "-j", "2"], args.seconds
                )
            finally:
                stop(proc)
            moves = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            tps[setting].append(row["tps"])
            label = setting if setting in ("none", "default") else f"latency, MPL {setting}"
            print(
                f"round {rnd + 1} {label:18} tps {row['tps']:9.0f}  errors {row['errors']:.0f}",
                flush=True,
            )
            for line in moves.splitlines():  # what --mpl auto did, and why
                if "admission.mpl" in line:
                    print("    " + line.split("admission.mpl", 1)[1].strip(), flush=True)
    print("\nmedian over rounds (ratio to none in the same round: median [least, most])")
    for setting in settings:
        line = f"{setting:6} tps {statistics.median(tps[setting]):9.0f}"
        if setting != "none":
            ratios = [a / b for a, b in zip(tps[setting], tps["none"], strict=True) if b > 0]
            if ratios:
                line += (
                    f"  vs none {statistics.median(ratios):.2f} "
                    f"[{min(ratios):.2f}, {max(ratios):.2f}]"
                )
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
