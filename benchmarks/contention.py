"""Transactions that write the same rows, through the embedded server: the contention limit
against no limit and no admission at all.

    python -m benchmarks.contention [--settings none,off,on] [--clients 8] [--seconds 10]
        [--rounds 3] [--tries 1] [--workloads tpcb,update,mixed,select,zipf] [--zipf 1.2]

Per round, in a balanced order (``lab.bench.run_order``), each setting and workload gets a
fresh ``admission serve`` (an in-memory DuckDB; ``pgbench -i -s 1`` first: nothing learned on
one workload carries over to the next) and pgbench runs the workload for ``--seconds`` with
``--clients`` clients (``-j 2``) and ``--tries`` tries per transaction (pgbench retries a
serialization failure, 40001, that many times in all):

* ``tpcb``: pgbench's TPC-B-like script — every transaction updates one of ``--scale`` branch
  rows (at scale 1 the one row: any two in progress at once conflict);
* ``update``: ``simple-update`` — one of 100,000 accounts per transaction, conflicts rare;
* ``mixed``: half TPC-B-like, half a read-only transaction (``BEGIN; SELECT sum(abalance)
  FROM pgbench_accounts; END``), each script's numbers apart: what the limit costs readers;
* ``select``: ``select-only``, no writes (the limit never engages);
* ``zipf``: one account updated and read back per transaction, chosen under a Zipf law of
  exponent ``--zipf`` (pgbench's ``random_zipfian``; at 1.05 about one transaction in twenty
  meets another on its row, at 1.5 one in three): contention between the two above.

Without pgbench on the machine (or with ``--driver python``) ``tpcb`` is run by a client of its
own (psycopg, a thread per client): the same tables (built with ``CREATE TABLE … AS`` of
``range``) and the same five statements per transaction, its parameters drawn as pgbench draws
them; the other workloads need pgbench. ``scripts/demo`` runs it that way.

Settings: ``none`` — no admission control (``--no-learn --no-contention``); ``off`` — ``serve``'s
default without the contention limit (``--no-contention``); ``on`` — ``serve``'s default;
``fcfs@1``, ``fcfs@2`` — FCFS pools of that MPL without the limit (a transaction's statements
pass an MPL at once, so a pool limits autocommit statements only).
``--backend postgres`` runs the same against a PostgreSQL server of its own whose transactions
run at ``--isolation`` (SERIALIZABLE by default: where two write a row, the second fails with
40001 as on DuckDB): ``none`` is ``serve``'s default there (everything admitted), ``on`` the
same with ``--contention``.

Prints each run (transactions/s by pgbench, without the connection time; failed transactions
and retries), then per workload and setting the median over rounds and the ratio of its
throughput to ``none``'s in the same round (median [least, most]).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from benchmarks.coordinator import ADMISSION, _wait
from benchmarks.pooling import pgbench_output, stop
from lab.bench import run_order
from testing.pgcluster import Cluster, free_port, start_cluster

SETTINGS = {
    "none": ["--no-learn", "--no-contention"],
    "off": ["--no-contention"],
    "on": [],
    # FCFS pools (the other baseline): statements in a transaction block pass the MPL at once,
    # so a pool limits autocommit statements only
    "fcfs@1": ["--no-learn", "--no-contention", "--policy", "fcfs", "--mpl", "1"],
    "fcfs@2": ["--no-learn", "--no-contention", "--policy", "fcfs", "--mpl", "2"],
}
READER = "BEGIN;\nSELECT sum(abalance) FROM pgbench_accounts;\nEND;\n"
ZIPF = (
    "\\set aid random_zipfian(1, 100000 * :scale, {s})\n"
    "\\set delta random(-5000, 5000)\n"
    "BEGIN;\n"
    "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n"
    "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n"
    "END;\n"
)
WORKLOADS = ("tpcb", "update", "mixed", "select", "zipf")


def _workload(name: str, scripts: Path, scale: int) -> list[str]:
    """pgbench's arguments for workload ``name`` (its scripts in the directory ``scripts``;
    ``scale``: what a custom script's ``:scale`` is — pgbench reads it from the tables for
    its built-in scripts only)."""
    return {
        "tpcb": ["-b", "tpcb-like"],
        "update": ["-b", "simple-update"],
        "mixed": ["-b", "tpcb-like@1", "-f", f"{scripts / 'reader.sql'}@1"],
        "select": ["-b", "select-only"],
        "zipf": ["-f", str(scripts / "zipf.sql"), "-s", str(scale)],
    }[name]


# in front of PostgreSQL serve admits everything by default (no model): "none" is the default,
# "on" the default with --contention
PG_SETTINGS = {"none": [], "on": ["--contention"]}


def serve(setting: str, backend: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``admission serve`` with ``setting``'s options (in front of ``backend`` if given)."""
    port = free_port()
    where = ["--backend", backend, *PG_SETTINGS[setting]] if backend else SETTINGS[setting]
    proc = subprocess.Popen(
        [
            ADMISSION,
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            *where,
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
    out, _ = pgbench_output(port, args, seconds)
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


TPCB_TABLES = (
    "drop table if exists pgbench_branches",
    "drop table if exists pgbench_tellers",
    "drop table if exists pgbench_accounts",
    "create table pgbench_branches as select i::int as bid, 0::int as bbalance, "
    "''::varchar as filler from generate_series(1, {scale}) t(i)",
    "create table pgbench_tellers as select i::int as tid, "
    "cast(floor((i - 1) / 10.0) as int) + 1 as bid, 0::int as tbalance, ''::varchar as filler "
    "from generate_series(1, 10 * {scale}) t(i)",
    "create table pgbench_accounts as select i::int as aid, "
    "cast(floor((i - 1) / 100000.0) as int) + 1 as bid, 0::int as abalance, "
    "''::varchar as filler from generate_series(1, 100000 * {scale}) t(i)",
    "drop table if exists pgbench_history",
    "create table pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, "
    "filler varchar)",
    "alter table pgbench_branches add primary key (bid)",
    "alter table pgbench_tellers add primary key (tid)",
    "alter table pgbench_accounts add primary key (aid)",
)
TPCB = (
    "update pgbench_accounts set abalance = abalance + %(delta)s where aid = %(aid)s",
    "select abalance from pgbench_accounts where aid = %(aid)s",
    "update pgbench_tellers set tbalance = tbalance + %(delta)s where tid = %(tid)s",
    "update pgbench_branches set bbalance = bbalance + %(delta)s where bid = %(bid)s",
    "insert into pgbench_history (tid, bid, aid, delta, mtime) "
    "values (%(tid)s, %(bid)s, %(aid)s, %(delta)s, current_timestamp)",
)


def python_init(port: int, scale: int) -> None:
    """pgbench's tables at ``scale``, built by this client (no pgbench needed)."""
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in TPCB_TABLES:
            conn.execute(statement.format(scale=scale))


def python_tpcb(
    port: int, clients: int, seconds: float, tries: int, scale: int
) -> dict[str, float]:
    """pgbench's TPC-B-like transactions from ``clients`` threads of this process for
    ``seconds``, a serialization failure (40001) retried up to ``tries`` tries in all: the same
    fields as ``run_pgbench``."""
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    lock = threading.Lock()
    totals = {"done": 0, "failed": 0, "retried": 0, "latency": 0.0}
    connections = [psycopg.connect(dsn) for _ in range(clients)]
    start = time.monotonic()
    deadline = start + seconds

    def client(conn: psycopg.Connection, seed: int) -> None:
        rng = random.Random(seed)
        done = failed = retried = 0
        latency = 0.0
        while time.monotonic() < deadline:
            params = {
                "aid": rng.randint(1, 100_000 * scale),
                "tid": rng.randint(1, 10 * scale),
                "bid": rng.randint(1, scale),
                "delta": rng.randint(-5000, 5000),
            }
            began = time.monotonic()
            for attempt in range(tries):
                try:
                    for statement in TPCB:
                        conn.execute(statement, params)
                    conn.commit()
                except psycopg.errors.SerializationFailure:
                    conn.rollback()
                    if attempt + 1 == tries:
                        failed += 1
                    else:
                        retried += attempt == 0
                    continue
                done += 1
                break
            latency += time.monotonic() - began
        with lock:
            totals["done"] += done
            totals["failed"] += failed
            totals["retried"] += retried
            totals["latency"] += latency

    threads = [
        threading.Thread(target=client, args=(conn, n), daemon=True)
        for n, conn in enumerate(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    for conn in connections:
        conn.close()
    finished = totals["done"] + totals["failed"]
    return {
        "tps": totals["done"] / elapsed,
        "done": float(totals["done"]),
        "failed": float(totals["failed"]),
        "retried": float(totals["retried"]),
        "latency_ms": 1000 * totals["latency"] / finished if finished else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings",
        help="none, off, on, fcfs@1, fcfs@2 (default none, off, on; with --backend postgres "
        "none, on)",
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=", ".join(WORKLOADS))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tries", type=int, default=1, help="pgbench --max-tries")
    parser.add_argument(
        "--zipf",
        type=float,
        default=1.2,
        help="the zipf workload's exponent (pgbench's random_zipfian: 1.001–1000)",
    )
    parser.add_argument(
        "--scale", type=int, default=1, help="pgbench's scale: branch rows (the hot rows)"
    )
    parser.add_argument(
        "--backend",
        choices=("embedded", "postgres"),
        default="embedded",
        help="postgres: a PostgreSQL server of its own whose transactions run at --isolation "
        "(settings none and on only: in front of PostgreSQL serve admits everything unless "
        "told)",
    )
    parser.add_argument(
        "--isolation",
        default="serializable",
        choices=("serializable", "repeatable read", "read committed"),
        help="with --backend postgres: default_transaction_isolation",
    )
    parser.add_argument(
        "--driver",
        choices=("pgbench", "python"),
        default="pgbench" if shutil.which("pgbench") else "python",
        help="what runs the transactions (python: tpcb only; the default without pgbench)",
    )
    args = parser.parse_args(argv)
    chosen = args.settings or ("none,on" if args.backend == "postgres" else "none,off,on")
    settings = [s.strip() for s in chosen.split(",") if s.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    known = PG_SETTINGS if args.backend == "postgres" else SETTINGS
    for s in settings:
        if s not in known:
            parser.error(f"--settings: {s!r} is not one of {', '.join(known)}")
    for w in workloads:
        if w not in WORKLOADS:
            parser.error(f"--workloads: {w!r} is not one of {', '.join(WORKLOADS)}")
    if args.driver == "python" and workloads != ["tpcb"]:
        if args.workloads != ",".join(WORKLOADS):
            parser.error("--driver python runs the tpcb workload only (the others need pgbench)")
        workloads = ["tpcb"]
    if "none" not in settings:
        settings.insert(0, "none")  # (what every ratio is to)
    if not 1.001 <= args.zipf <= 1000:
        parser.error("--zipf must be within 1.001 and 1000 (pgbench's random_zipfian)")
    if min(args.clients, args.seconds, args.rounds, args.tries, args.scale) < 1:
        parser.error("--clients, --seconds, --rounds, --tries and --scale must be at least 1")

    pg = None
    if args.backend == "postgres":
        pg = start_cluster()
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute(
                f"alter database postgres set default_transaction_isolation = '{args.isolation}'"
            )
    try:
        return _run(args, settings, workloads, pg)
    finally:
        if pg is not None:
            pg.stop()


def _run(
    args: argparse.Namespace, settings: list[str], workloads: list[str], pg: Cluster | None
) -> int:
    backend = pg.url if pg is not None else None
    with tempfile.TemporaryDirectory(prefix="admission-contention-") as work:
        scripts = Path(work)
        (scripts / "reader.sql").write_text(READER)
        (scripts / "zipf.sql").write_text(ZIPF.format(s=args.zipf))
        client = (
            f"pgbench -c {args.clients} -j 2"
            if args.driver == "pgbench"
            else f"{args.clients} psycopg clients (pgbench's TPC-B-like transactions)"
        )
        print(
            f"{client}, {args.tries} {'try' if args.tries == 1 else 'tries'} a transaction, "
            f"{args.seconds:g} s, scale {args.scale}, "
            + (f"zipf exponent {args.zipf:g}, " if "zipf" in workloads else "")
            + (
                f"PostgreSQL at {args.isolation}"
                if pg is not None
                else "embedded DuckDB (in memory)"
            )
            + f"; {args.rounds} rounds",
            flush=True,
        )
        rows: dict[tuple[str, str], list[dict[str, float]]] = {}
        for rnd in range(args.rounds):
            for setting in run_order(settings, 0, rnd):
                for workload in workloads:  # (a server of its own: nothing carried over)
                    row = _one_run(args, setting, workload, backend, pg, scripts)
                    rows.setdefault((workload, setting), []).append(row)
                    print(f"round {rnd + 1} {setting:6} {workload:7} {_line(row)}", flush=True)
        print("\nmedian over rounds (throughput vs none in the same round: median [least, most])")
        for workload in workloads:
            for setting in settings:
                runs = rows[(workload, setting)]
                line = f"{workload:7} {setting:6} {_line(_median(runs))}"
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
        if "on" in settings:
            print()
            for workload in workloads:
                print(_verdict(workload, rows[(workload, "none")], rows[(workload, "on")]))
    return 0


def _failed_share(runs: list[dict[str, float]]) -> float:
    done = sum(r["done"] for r in runs)
    failed = sum(r["failed"] for r in runs)
    return failed / (done + failed) if done + failed else float("nan")


def _verdict(workload: str, none: list[dict[str, float]], on: list[dict[str, float]]) -> str:
    """In words: the limit against no admission, paired by round."""
    ratios = [a["tps"] / b["tps"] for a, b in zip(on, none, strict=True) if b["tps"] > 0]
    if not ratios:
        return f"{workload}: no throughput measured without admission"
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    if low > 1.05:
        said = f"{median:.2f}x the commits of no admission control in every round"
    elif high < 0.95:
        said = f"{median:.2f}x the commits of no admission control: fewer in every round"
    else:
        said = (
            f"{median:.2f}x the commits of no admission control: no difference beyond the "
            "rounds' spread"
        )
    return (
        f"{workload}: with the contention limit {said} ({low:.2f}–{high:.2f}); transactions "
        f"failed {_failed_share(none):.1%} without admission, {_failed_share(on):.1%} with the "
        "limit"
    )


def _one_run(
    args: argparse.Namespace,
    setting: str,
    workload: str,
    backend: str | None,
    pg: Cluster | None,
    scripts: Path,
) -> dict[str, float]:
    """A fresh server with ``setting``, pgbench's tables anew, ``workload`` run against it."""
    proc, port = serve(setting, backend)
    try:
        if args.driver == "python":
            python_init(pg.port if pg is not None else port, args.scale)
            return python_tpcb(port, args.clients, args.seconds, args.tries, args.scale)
        dsn = (
            pg.dsn()
            if pg is not None
            else f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        )
        init = subprocess.run(
            ["pgbench", "-i", "-s", str(args.scale), "-q", dsn], capture_output=True, text=True
        )
        if init.returncode != 0:
            raise SystemExit(f"pgbench -i failed: {init.stderr.strip()}")
        extra = [
            *_workload(workload, scripts, args.scale),
            *("-c", str(args.clients), "-j", "2", "--max-tries", str(args.tries)),
        ]
        return run_pgbench(port, extra, args.seconds)
    finally:
        stop(proc)


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
