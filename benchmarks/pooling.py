"""Transaction pooling side by side with PgBouncer: many clients, few server connections.

Starts a PostgreSQL server of its own (``max_connections`` 100, pgbench's tables at scale 1),
then, per round in a balanced order (each setting in each position equally often), with the
same pgbench command:

* ``pgbouncer``: PgBouncer (when installed) in transaction pool mode, ``default_pool_size`` P;
* ``proxy``: ``admission serve --pool-mode transaction --pool-size P`` (FCFS: exactly a
  PgBouncer pool; ``--no-learn``);
* ``proxy-learn``: the same with the proxy's defaults (learning each class's service time).

Each runs ``pgbench -S -M MODE -c C -j 2 -T S`` (select-only: one statement per transaction)
and, with ``--tpcb``, pgbench's TPC-B-like transactions. Prints per setting and round the
throughput (transactions/s, pgbench's, without the connection time), failed transactions,
the connection time, the most server connections seen in pg_stat_activity (sampled every
20 ms) and the CPU the pooler's process used per transaction, user and system (from
/proc/PID/stat: on a machine whose cores pgbench and PostgreSQL share with the pooler, every
µs of it is taken from them); then per setting the median over rounds and the ratio to
PgBouncer's in the same round (median and range).

PgBouncer before 1.21 does not carry protocol-level prepared statements in transaction mode:
``-M prepared`` fails through it. Use ``--mode extended`` (or simple) for the comparison with
such a PgBouncer; ``--mode prepared`` measures the proxy alone (PgBouncer's row is then its
``extended`` run, labelled so).

    python -m benchmarks.pooling [--clients 500] [--pool-size 20] [--seconds 10]
        [--rounds 3] [--mode extended] [--tpcb]
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from benchmarks.coordinator import _wait, serve_proxy
from benchmarks.proxy_overhead import cpu_seconds, pids_named
from lab.bench import run_order
from testing.pgcluster import Cluster, free_port, start_cluster


def start_pgbouncer(pg_port: int, pool: int, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    port = free_port()
    (work / "users.txt").write_text('"postgres" ""\n')
    ini = work / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={pg_port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {work / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool}\nmax_client_conn = 20000\n"
        "max_db_connections = 0\nlogfile =\npidfile =\nserver_reset_query =\n"
        "listen_backlog = 4096\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    command = [binary, "-q", str(ini)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root: as PostgreSQL's own user
        entry = pwd.getpwnam("postgres")
        for path in (work, work / "users.txt", ini):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        # (with as many files as root may open: runuser's session starts at 1024)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        raise_limit = f'ulimit -n {hard} 2>/dev/null; exec "$0" "$@"'
        command = ["runuser", "-u", "postgres", "--", "sh", "-c", raise_limit, *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait(port, proc)
    return proc, port


def start_proxy(pg: Cluster, pool: int, learn: bool) -> tuple[subprocess.Popen[bytes], int]:
    args = ["--pool-mode", "transaction", "--pool-size", str(pool), "--log-level", "warning"]
    if not learn:
        args += ["--no-learn", "--policy", "fcfs"]
    return serve_proxy(pg, args)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


class Sampler:
    """The most client connections PostgreSQL serves at once (every 20 ms)."""

    def __init__(self, pg: Cluster) -> None:
        self.pg = pg
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(
            host="127.0.0.1",
            port=self.pg.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        ) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid()"
                ).fetchone()
                self.most = max(self.most, row[0] if row else 0)
                time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.most


def pgbench_output(port: int, args: list[str], seconds: float) -> tuple[str, int]:
    """``pgbench ARGS -T SECONDS -n`` through ``port``: what it printed, and its exit code."""
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    result = subprocess.run(
        ["pgbench", *args, "-T", str(int(seconds)), "-n", dsn],
        capture_output=True,
        text=True,
        timeout=seconds * 10 + 120,
    )
    return result.stdout + result.stderr, result.returncode


def pgbench(port: int, args: list[str], seconds: float) -> dict[str, float]:
    out, returncode = pgbench_output(port, args, seconds)
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    failed = re.search(r"number of failed transactions: (\d+)", out)
    connect = re.search(r"initial connection time = ([\d.]+) ms", out)
    errors = len(re.findall(r"(?m)^pgbench: error", out))
    return {
        "tps": float(tps.group(1)) if tps else 0.0,
        "transactions": float(done.group(1)) if done else 0.0,
        "failed": float(failed.group(1)) if failed else float("nan"),
        "connect_ms": float(connect.group(1)) if connect else float("nan"),
        "errors": float(errors + (returncode != 0)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", default="extended", choices=("simple", "extended", "prepared"))
    parser.add_argument("--tpcb", action="store_true", help="also TPC-B-like transactions")
    parser.add_argument("--max-connections", type=int, default=100)
    args = parser.parse_args(argv)

    have_bouncer = shutil.which("pgbouncer") or Path("/usr/sbin/pgbouncer").exists()
    work = Path(tempfile.mkdtemp(prefix="admission-pooling-"))
    pg = start_cluster(max_connections=args.max_connections)
    direct = f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres"
    subprocess.run(["pgbench", "-i", "-s", "1", "-q", direct], check=True, capture_output=True)
    settings = (["pgbouncer"] if have_bouncer else []) + ["proxy", "proxy-learn"]
    workloads = [("select-only", ["-S"])] + ([("tpcb", [])] if args.tpcb else [])
    print(
        f"PostgreSQL max_connections {args.max_connections}; {args.clients} clients, pool "
        f"{args.pool_size}, pgbench -M {args.mode} -j 2, {args.seconds:g} s, "
        f"{args.rounds} rounds{'' if have_bouncer else ' (PgBouncer not installed)'}"
    )
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    try:
        for rnd in range(args.rounds):
            for setting in run_order(settings, 0, rnd):
                if setting == "pgbouncer":
                    proc, port = start_pgbouncer(pg.port, args.pool_size, work)
                else:
                    proc, port = start_proxy(pg, args.pool_size, setting == "proxy-learn")
                try:
                    for name, extra in workloads:
                        mode = args.mode
                        if setting == "pgbouncer" and mode == "prepared":
                            mode = "extended"  # (PgBouncer < 1.21 cannot; see the docstring)
                        pids = (
                            pids_named("pgbouncer", proc.pid)
                            if setting == "pgbouncer"
                            else [proc.pid]
                        )
                        sampler = Sampler(pg)
                        before = cpu_seconds(pids)
                        row = pgbench(
                            port,
                            [*extra, "-M", mode, "-c", str(args.clients), "-j", "2"],
                            args.seconds,
                        )
                        after = cpu_seconds(pids)
                        row["server_connections"] = sampler.stop()
                        n = row["transactions"] or float("nan")
                        row["user_us"] = (after[0] - before[0]) / n * 1e6
                        row["sys_us"] = (after[1] - before[1]) / n * 1e6
                        results.setdefault((setting, name), []).append(row)
                        print(
                            f"round {rnd + 1} {setting:12} {name:11} -M {mode:8} "
                            f"tps {row['tps']:9.0f}  failed {row['failed']:.0f}  "
                            f"errors {row['errors']:.0f}  connect {row['connect_ms']:8.0f} ms  "
                            f"server connections ≤ {row['server_connections']:.0f}  "
                            f"CPU/transaction user {row['user_us']:.1f} µs sys "
                            f"{row['sys_us']:.1f} µs",
                            flush=True,
                        )
                finally:
                    stop(proc)
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\nmedian over rounds (ratio to PgBouncer in the same round: median [least, most])")
    for name, _ in workloads:
        for setting in settings:
            rows = results.get((setting, name), [])
            if not rows:
                continue
            tps = statistics.median(r["tps"] for r in rows)
            line = (
                f"{setting:12} {name:11} tps {tps:9.0f}  failed "
                f"{sum(r['failed'] for r in rows):.0f}  server connections ≤ "
                f"{max(r['server_connections'] for r in rows):.0f}  CPU/transaction user "
                f"{statistics.median(r['user_us'] for r in rows):.1f} µs sys "
                f"{statistics.median(r['sys_us'] for r in rows):.1f} µs"
            )
            base = results.get(("pgbouncer", name))
            if base and setting != "pgbouncer":
                ratios = [r["tps"] / b["tps"] for r, b in zip(rows, base, strict=False) if b["tps"]]
                if ratios:
                    line += (
                        f"  vs PgBouncer {statistics.median(ratios):.2f} "
                        f"[{min(ratios):.2f}, {max(ratios):.2f}]"
                    )
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
