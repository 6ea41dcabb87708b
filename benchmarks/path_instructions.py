"""Instructions this proxy executes per pgbench -S statement, counted by callgrind.

Time on this shared machine moves by tens of percent from run to run; an instruction count
does not move at all, so it is how a change to the per-statement path is judged before the
pgbench runs of ``benchmarks.proxy_overhead`` confirm it. The workload is the connection
object as the server runs it, without sockets (``proxy_overhead.statement_cycle``): the
session with its fast path, classification, the gate, the scheduler and the metrics. Each
figure is (instructions of a run of N statements − those of a run of none) / N, so start-up,
imports and building the statements cancel out.

    python -m benchmarks.path_instructions [--statements 20000]

Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys


def run_statements(mode: str, count: int, built: int) -> None:
    """Build ``built`` statements, drive the first ``count`` through the connection."""
    from benchmarks.proxy_overhead import on_event_loop, statement_cycle

    def drive() -> float:
        conn, statements, reply = statement_cycle(mode, built)
        for statement in statements[:count]:
            conn.data_received(statement)
            conn.from_server(reply)
        scheduler = conn.server.gate.scheduler
        if scheduler.stats.completed != count or scheduler.in_service:
            raise RuntimeError("the statements did not all pass the gate")
        return 0.0

    on_event_loop(drive)


def instructions(mode: str, count: int, built: int) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.path_instructions",
        "--run",
        mode,
        str(count),
        str(built),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=20_000, help="statements counted")
    parser.add_argument("--run", nargs=3, help=argparse.SUPPRESS)  # the process measured
    args = parser.parse_args()
    if args.run:
        mode, count, built = args.run
        run_statements(mode, int(count), int(built))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed to count instructions: apt-get install valgrind")
    n = args.statements
    if n < 1:
        raise SystemExit("--statements must be at least 1")
    print("instructions per pgbench -S statement through the connection (callgrind, no sockets)")
    for mode in ("simple", "prepared"):
        per = (instructions(mode, n, n) - instructions(mode, 0, n)) / n
        print(f"{mode:9} {per:10,.0f}", flush=True)


if __name__ == "__main__":
    main()
