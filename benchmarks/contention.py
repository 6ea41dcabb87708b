"""Transactions that write the same rows, through the embedded server: the contention limit
against no limit and no admission at all.

    python -m benchmarks.contention [--settings none,off,on] [--clients 8] [--seconds 10]
        [--rounds 3] [--tries 1] [--workloads tpcb,update,mixed,select]

Per round, in a balanced order (``lab.bench.run_order``), each setting gets a fresh ``admission
serve`` (an in-memory DuckDB; ``pgbench -i -s 1`` first) and pgbench runs each workload for
``--seconds`` with ``--clients`` clients (``-j 2``) and ``--tries`` tries per transaction
(pgbench retries a serialization failure, 40001, that many times in all):

* ``tpcb``: pgbench's TPC-B-like script — every transaction updates the one branch row (at
  scale 1), so any two in progress at once conflict;
* ``update``: ``simple-update`` — one of 100,000 accounts per transaction, conflicts rare;
* ``mixed``: half TPC-B-like, half a read-only transaction (``BEGIN; SELECT sum(abalance)
  FROM pgbench_accounts; END``), each script's numbers apart: what the limit costs readers;
* ``select``: ``select-only``, no writes (the limit never engages).

Settings: ``none`` — no admission control (``--no-learn --no-contention``); ``off`` — ``serve``'s
default without the contention limit (``--no-contention``); ``on`` — ``serve``'s default.

Prints each run (transactions/s by pgbench, without the connection time; failed transactions
and retries), then per workload and setting the median over rounds and the ratio of its
throughput to ``none``'s in the same round (median [least, most]).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks.coordinator import ADMISSION, _wait
from benchmarks.pooling import stop
from lab.bench import run_order
from testing.pgcluster import free_port

SETTINGS = {
    "none": ["--no-learn", "--no-contention"],
    "off": ["--no-contention"],
    "on": [],
}
READER = "BEGIN;\nSELECT sum(abalance) FROM pgbench_accounts;\nEND;\n"
WORKLOADS = ("tpcb", "update", "mixed", "select")


def _workload(name: str, reader: Path) -> list[str]:
    return {
        "tpcb": ["-b", "tpcb-like"],
        "update": ["-b", "simple-update"],
        "mixed": ["-b", "tpcb-like@1", "-f", f"{reader}@1"],
        "select": ["-b", "select-only"],
    }[name]


def serve(setting: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            ADMISSION,
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            *SETTINGS[setting],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait(port, proc)
    return proc, port


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text)
    return float(found.group(1)) if found else float("nan")


def run_pgbench(port: int, args: list[str], seconds: float) -> dict[str, float]:
    """One pgbench run: throughput, failed and retried transactions, and per script (when
    there are several) its throughput, failures and mean latency."""
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    result = subprocess.run(
        ["pgbench", *args, "-T", str(int(seconds)), "-n", dsn],
        capture_output=True,
        text=True,
        timeout=seconds * 10 + 120,
    )
    out = result.stdout + result.stderr
    row = {
        "tps": _number(r"tps = ([\d.]+) \(without initial connection time\)", out),
        "done": _number(r"number of transactions actually processed: (\d+)", out),
        "failed": _number(r"number of failed transactions: (\d+)", out),
        "retried": _number(r"number of transactions retried: (\d+)", out),
        "latency_ms": _number(r"latency average = ([\d.]+) ms", out),
    }
    if row["retried"] != row["retried"]:  # (not printed with --max-tries 1)
        row["retried"] = 0.0
    for n, section in enumerate(re.split(r"\nSQL script \d+: ", out)[1:], start=1):
        row[f"s{n}_tps"] = _number(r"tps = ([\d.]+)\)", section)
        row[f"s{n}_failed"] = _number(r"number of failed transactions: (\d+)", section)
        row[f"s{n}_latency_ms"] = _number(r"latency average = ([\d.]+) ms", section)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="none,off,on", help="none, off, on")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=", ".join(WORKLOADS))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tries", type=int, default=1, help="pgbench --max-tries")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for s in settings:
        if s not in SETTINGS:
            parser.error(f"--settings: {s!r} is not one of {', '.join(SETTINGS)}")
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"--workloads: {w!r} is not one of {', '.join(WORKLOADS)}")
    if "none" not in settings:
        settings.insert(0, "none")  # (what every ratio is to)
    if args.clients < 1 or args.seconds < 1 or args.rounds < 1 or args.tries < 1:
        parser.error("--clients, --seconds, --rounds and --tries must be at least 1")

    with tempfile.TemporaryDirectory(prefix="admission-contention-") as work:
        reader = Path(work) / "reader.sql"
        reader.write_text(READER)
        print(
            f"pgbench -c {args.clients} -j 2 --max-tries {args.tries}, {args.seconds:g} s, "
            f"scale 1, embedded DuckDB (in memory); {args.rounds} rounds",
            flush=True,
        )
        rows: dict[tuple[str, str], list[dict[str, float]]] = {}
        for rnd in range(args.rounds):
            for setting in run_order(settings, 0, rnd):
                proc, port = serve(setting)
                try:
                    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
                    init = subprocess.run(
                        ["pgbench", "-i", "-s", "1", "-q", dsn], capture_output=True, text=True
                    )
                    if init.returncode != 0:
                        raise SystemExit(f"pgbench -i failed: {init.stderr.strip()}")
                    for workload in workloads:
                        extra = [
                            *_workload(workload, reader),
                            "-c",
                            str(args.clients),
                            "-j",
                            "2",
                            "--max-tries",
                            str(args.tries),
                        ]
                        row = run_pgbench(port, extra, args.seconds)
                        rows.setdefault((workload, setting), []).append(row)
                        print(f"round {rnd + 1} {setting:4} {workload:7} {_line(row)}", flush=True)
                finally:
                    stop(proc)
        print("\nmedian over rounds (throughput vs none in the same round: median [least, most])")
        for workload in workloads:
            for setting in settings:
                runs = rows[(workload, setting)]
                line = f"{workload:7} {setting:4} {_line(_median(runs))}"
                if setting != "none":
                    ratios = [
                        a["tps"] / b["tps"]
                        for a, b in zip(runs, rows[(workload, "none")], strict=True)
                        if b["tps"] > 0
                    ]
                    if ratios:
                        line += (
                            f"  vs none {statistics.median(ratios):.2f} "
                            f"[{min(ratios):.2f}, {max(ratios):.2f}]"
                        )
                print(line)
    return 0


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _line(row: dict[str, float]) -> str:
    total = row["done"] + row["failed"]
    share = row["failed"] / total if total else float("nan")
    line = (
        f"tps {row['tps']:7.1f}  failed {share:6.1%}  retried {row['retried']:5.0f}  "
        f"latency {row['latency_ms']:7.1f} ms"
    )
    n = 1
    while f"s{n}_tps" in row:
        line += (
            f"  | script {n}: tps {row[f's{n}_tps']:6.1f} latency {row[f's{n}_latency_ms']:6.1f} ms"
        )
        n += 1
    return line


if __name__ == "__main__":
    raise SystemExit(main())
