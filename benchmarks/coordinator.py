"""What sharing one budget through the coordinator costs: pgbench through one proxy with a
local MPL against pgbench through three proxies sharing the same MPL (``--coordinator``).

Starts a PostgreSQL server of its own (pgbench's tables at scale 1). Each round runs, in a
balanced order (``lab.bench.run_order``: each setting in each position equally often):

* ``one``: one ``admission serve --mpl G`` (no coordinator), pgbench with C clients;
* ``three``: three ``admission serve --mpl G --coordinator …`` processes, three pgbench
  processes at once, C/3 clients each (the same clients in all);
* ``static``: the same three proxies and pgbench processes without a coordinator, the budget
  split once and for all (G = 4: MPL 2, 1 and 1) — what three proxy processes cost on this
  machine by themselves, so that ``three`` against ``static`` is what the coordination costs.

at two budgets: G = 64 (more than the clients: the budget is not saturated — what the
leases add to a statement) and G = 4 (saturated — throughput with the budget shared). Prints
per setting the throughput (statements/s, summed over the pgbench processes) and the median
and 99th percentile of the per-statement latency from pgbench's transaction logs, each the
median over rounds, and per round the ratios of ``three`` to ``one`` (throughput) and the
difference of their median latencies, with their means and 95 % intervals; for ``three``, the
heartbeats per second the three proxies made together.

    python -m benchmarks.coordinator [--seconds 10] [--rounds 3] [--clients 12]
        [--mode simple|prepared] [--budgets 64,4] [--sql "SELECT pg_sleep(0.005)"]

``--sql`` runs that statement instead of pgbench's select-only transaction: with one that the
database takes milliseconds over (``pg_sleep``, a scan), the proxies' own CPU is no longer
what limits the throughput, and at a saturated budget what is left to compare is how fully the
leases keep the global budget in use.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from admission.sim.study import Estimate
from lab.bench import run_order
from testing.pgcluster import Cluster, free_port, start_cluster

ADMISSION = shutil.which("admission") or str(Path(sys.executable).parent / "admission")


def _wait(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a proxy exited: {proc.communicate()[1]!r}")
        try:
            psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres").close()
            return
        except psycopg.OperationalError:
            time.sleep(0.1)
    raise RuntimeError(f"no proxy on port {port}")


def serve_proxy(
    pg: Cluster, args: list[str], port: int | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``admission serve`` in front of ``pg`` with ``args``, listening (on ``port`` or a free
    one) once this returns: (process, port)."""
    port = port or free_port()
    proc = subprocess.Popen(
        [
            ADMISSION,
            "serve",
            "--backend",
            f"postgresql://127.0.0.1:{pg.port}",
            "--listen",
            f"127.0.0.1:{port}",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait(port, proc)
    return proc, port


def _proxies(
    pg: Cluster, n: int, budget: int, coordinated: bool
) -> list[tuple[subprocess.Popen[bytes], int, int]]:
    """``n`` proxies: (process, port, admin port)."""
    out = []
    split = [budget - (n - 1) * (budget // n)] + [budget // n] * (n - 1)
    for i in range(n):
        port, admin = free_port(), free_port()
        coordinator = f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
        extra = ["--coordinator", coordinator] if coordinated else []
        mpl = budget if coordinated or n == 1 else max(1, split[i])
        args = ["--mpl", str(mpl), "--no-learn", "--policy", "fcfs"]
        proc, _ = serve_proxy(pg, [*args, "--admin", f"127.0.0.1:{admin}", *extra], port)
        out.append((proc, port, admin))
    time.sleep(1.0)  # leases taken
    return out


def _heartbeats(proxies: list[tuple[subprocess.Popen[bytes], int, int]]) -> int:
    """Heartbeats the coordinated proxies have made so far (0 without a coordinator)."""
    import httpx

    total = 0
    for _, _, admin in proxies:
        status = httpx.get(f"http://127.0.0.1:{admin}/status", timeout=5).json()
        total += (status.get("coordinator") or {}).get("heartbeats", 0)
    return total


def _stop(proxies: list[tuple[subprocess.Popen[bytes], int, int]]) -> None:
    for proc, _, _ in proxies:
        proc.terminate()
    for proc, _, _ in proxies:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _pgbench(
    ports: list[int], clients: int, seconds: int, mode: str, logs: Path, sql: str | None = None
) -> tuple[float, list[float]]:
    """pgbench -S (or a script of the one statement ``sql``) through each port at once
    (``clients`` in all); statements/s summed and every statement's latency (ms) from the
    transaction logs."""
    workload = ["-S"]
    if sql is not None:
        script = logs / "statement.sql"
        script.write_text(sql.rstrip().rstrip(";") + ";\n")
        workload = ["-f", str(script)]
    procs = []
    for i, port in enumerate(ports):
        prefix = logs / f"p{i}"
        procs.append(
            subprocess.Popen(
                [
                    "pgbench",
                    *workload,
                    "-n",
                    "-M",
                    mode,
                    "-c",
                    str(clients // len(ports)),
                    "-j",
                    "1",
                    "-T",
                    str(seconds),
                    "-l",
                    "--log-prefix",
                    str(prefix),
                    f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=logs,
            )
        )
    latencies: list[float] = []
    count = 0
    for p in procs:
        _out, err = p.communicate(timeout=seconds + 60)
        if p.returncode:
            raise RuntimeError(f"pgbench failed: {err}")
    for log in logs.glob("p[0-9]*"):
        for line in log.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3:
                latencies.append(int(fields[2]) / 1000)
                count += 1
        log.unlink()
    return count / seconds, latencies


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=12, help="a multiple of 3")
    parser.add_argument("--mode", default="simple", choices=("simple", "prepared"))
    parser.add_argument(
        "--budgets", default="64,4", help="global MPLs to run, comma-separated (default 64,4)"
    )
    parser.add_argument(
        "--sql",
        help="the statement each transaction runs instead of pgbench -S's "
        '(e.g. "SELECT pg_sleep(0.005)": the database, not the proxies, sets the pace)',
    )
    args = parser.parse_args(argv)
    if args.clients % 3 or args.clients < 3:
        parser.error("--clients must be a positive multiple of 3")
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        parser.error(f"--budgets wants integers, not {args.budgets!r}")
    if not budgets or min(budgets) < 1:
        parser.error("--budgets wants positive integers")
    if shutil.which("pgbench") is None:
        print("pgbench is not installed", file=sys.stderr)
        return 2
    pg = start_cluster()
    work = Path(tempfile.mkdtemp(prefix="admission-coord-"))
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    try:
        subprocess.run(
            ["pgbench", "-i", "-s", "1", "-q", pg.dsn()], check=True, capture_output=True
        )
        settings = [(name, b) for b in budgets for name in ("one", "static", "three")]
        for r in range(1, args.rounds + 1):
            for name, budget in run_order(settings, 1, r - 1):
                pg.psql("drop table if exists admission_leases, admission_budget")
                proxies = _proxies(pg, 1 if name == "one" else 3, budget, name == "three")
                try:
                    before = _heartbeats(proxies)
                    tps, lat = _pgbench(
                        [port for _, port, _ in proxies],
                        args.clients,
                        args.seconds,
                        args.mode,
                        work,
                        args.sql,
                    )
                    beats = (_heartbeats(proxies) - before) / args.seconds
                finally:
                    _stop(proxies)
                row = (tps, statistics.median(lat), _quantile(lat, 0.99))
                results.setdefault((name, budget), []).append(row)
                print(
                    f"round {r}: {name:6} G={budget:<3} {tps:8.0f} stmt/s  p50 {row[1]:.3f} ms  "
                    f"p99 {row[2]:.3f} ms"
                    + (f"  heartbeats {beats:.1f}/s" if name == "three" else ""),
                    flush=True,
                )
        print()
        what = "-S" if args.sql is None else f"-f ({args.sql})"
        print(
            f"pgbench {what} -M {args.mode}, {args.clients} clients, {args.seconds} s, "
            f"{args.rounds} rounds (medians)"
        )
        print(f"{'setting':22} {'stmt/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for (name, budget), rows in results.items():
            label = {"one": "one proxy", "static": "three, split", "three": "three, coordinator"}[
                name
            ] + f", G={budget}"
            tps, p50, p99 = (statistics.median(r[i] for r in rows) for i in range(3))
            print(f"{label:22} {tps:9.0f} {p50:8.3f} {p99:8.3f}")
        for budget in budgets:
            three = results[("three", budget)]
            for base in ("one", "static"):
                other = results[(base, budget)]
                ratios = [t[0] / o[0] for o, t in zip(other, three, strict=True)]
                added = [t[1] - o[1] for o, t in zip(other, three, strict=True)]
                print(
                    f"G={budget}: coordinator/{base} throughput {Estimate.of(ratios)} "
                    f"(mean ± 95 % interval; per round {', '.join(f'{x:.3f}' for x in ratios)}); "
                    f"p50 added {Estimate.of(added)} ms "
                    f"(per round {', '.join(f'{x:+.3f}' for x in added)})"
                )
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
