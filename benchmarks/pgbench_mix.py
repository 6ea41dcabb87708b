"""Open load from pgbench on a mix of analytic and point statements: `admission serve` as it
is started, against no admission control and an FCFS pool.

A workload that is not TPC-H, driven by a client the proxy does not ship: pgbench's own
Poisson schedule (``-R``) over two scripts on pgbench's tables (``pgbench -i -s SCALE`` in a
DuckDB file, built through the proxy):

* ``long``: ``SELECT bid, count(DISTINCT md5(aid::varchar || :b)) FROM pgbench_accounts
  GROUP BY bid`` — a scan and hash of every account (~150 ms alone at scale 10 on two cores,
  DuckDB using all of them);
  or, with ``--long tail``, a class with a heavy tail: the same count over the accounts within
  2,000 of a random one (~1.5 ms alone) — but one statement in 20 covers all of them (the
  scan's time), so the class's D_r (a median) is the short ones' (~10 ms on average alone);
* ``short``: pgbench's point lookup of one account (~1 ms alone, most of it the round trip).

``--weights L,S`` is pgbench's script weights (default 1,30: one statement in 31 is long, and
the long ones carry ~85 % of the work). Before the runs each script is timed alone (one
client, 5 s, no admission control) and the load is printed as ρ = rate × Σ p_r D_r, the
issue's definition (D_r: the time alone, with the whole machine). pgbench's latency under
``-R`` counts from each transaction's scheduled start, so a statement that waits for a free
client is charged for it: with enough ``--clients`` the load is open (arrivals do not wait
for completions).

Per round, in a balanced order (``lab.bench.run_order``), each setting gets a fresh ``admission
serve --database FILE`` (nothing learned carries over) and a ``--seconds`` run. Settings:
``none`` (``--mpl 0 --policy fcfs``, no admission control), ``default`` (nothing but the
database: learning from nothing, latency, ``--mpl auto``), ``fcfs@N`` (an FCFS pool of N,
``--no-learn``). Prints every run (mean, p99 and each script's mean, from pgbench's
per-transaction log; and the short script's mean and most in the first 2 s, the cold start
of a server that learns from nothing) and per setting the median over rounds with the ratio
of its mean and p99 to ``none``'s and to the better baseline's (none or the best FCFS pool of
that round) in the same round: median and range, or a 95 % interval for the median from 6
rounds.

    python -m benchmarks.pgbench_mix [--rate 140] [--clients 64] [--seconds 30] [--rounds 3]
        [--settings none,default,fcfs@2] [--weights 1,30] [--scale 10] [--long scan|tail]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from admission.stats import median_interval
from benchmarks.point_lookups import init_pgbench, serve_database
from benchmarks.pooling import pgbench_output, stop
from lab.bench import run_order

LONG = (
    "\\set b random(1, 1000)\n"
    "SELECT bid, count(DISTINCT md5(aid::varchar || :b)) FROM pgbench_accounts GROUP BY bid;\n"
)
# ``--long tail``: a class of mostly short statements with rare long ones — a range query of
# a few thousand accounts, one in 20 of which covers them all (its D_r is the short ones')
TAIL = (
    "\\set a random(1, 100000 * :scale)\n"
    "\\set len case when random(1, 20) = 1 then 1000000 else 2000 end\n"
    "\\set lo :a - :len\n"
    "\\set hi :a + :len\n"
    "\\set b random(1, 1000)\n"
    "SELECT count(DISTINCT md5(aid::varchar || :b)) FROM pgbench_accounts "
    "WHERE aid BETWEEN :lo AND :hi;\n"
)
SHORT = (
    "\\set aid random(1, 100000 * :scale)\n"
    "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n"
)
SCRIPTS = ("long", "short")
COLD = 2.0  # seconds from the first transaction's start counted as the cold start


def settings_args(setting: str) -> list[str]:
    """``admission serve``'s arguments for ``setting`` (SystemExit for an unknown one)."""
    if setting == "none":
        return ["--mpl", "0", "--policy", "fcfs"]
    if setting == "default":
        return []
    if setting.startswith("fcfs@") and setting[5:].isdigit() and int(setting[5:]) > 0:
        return ["--no-learn", "--policy", "fcfs", "--mpl", setting[5:]]
    raise SystemExit(f"unknown setting {setting!r}: none, default or fcfs@N")


class Txn(NamedTuple):
    """One transaction of pgbench's per-transaction log."""

    start: float  # seconds since the epoch: the scheduled start under -R
    script: int  # the script's number (its -f order)
    latency: float  # seconds from the (scheduled) start to the end


def read_logs(directory: Path) -> list[Txn]:
    """pgbench's per-transaction logs (``-l``) in ``directory``. A line is ``client txn time
    script epoch us [lag]``: ``time`` (µs) counts from the scheduled start under ``-R``, and
    ``epoch us`` is when the transaction ended. Failed transactions (``failed``/``skipped``)
    are left out."""
    found = []
    for log in directory.glob("pgbench_log.*"):
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) < 6 or not parts[2].isdigit():
                continue
            latency = int(parts[2]) / 1e6
            end = int(parts[4]) + int(parts[5]) / 1e6
            found.append(Txn(end - latency, int(parts[3]), latency))
    return found


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_run(port: int, scripts: Path, args: argparse.Namespace) -> dict[str, float]:
    logs = Path(tempfile.mkdtemp(prefix="pgbench-log-", dir=scripts))
    long_w, short_w = args.weights
    bench = [
        "-R",
        str(args.rate),
        "-f",
        f"{scripts / 'long.sql'}@{long_w}",
        "-f",
        f"{scripts / 'short.sql'}@{short_w}",
        "-s",
        str(args.scale),
        "-c",
        str(args.clients),
        "-j",
        "2",
        "-M",
        "extended",
        "-l",
        "--log-prefix",
        str(logs / "pgbench_log"),
    ]
    out, code = pgbench_output(port, bench, args.seconds)
    if code != 0:
        raise SystemExit(f"pgbench failed ({code}): {out.strip()[-500:]}")
    txns = read_logs(logs)
    shutil.rmtree(logs, ignore_errors=True)
    every = [t.latency for t in txns]
    row = {
        "rate": len(every) / args.seconds,
        "mean": statistics.fmean(every) if every else float("nan"),
        "p99": quantile(every, 0.99),
        "failed": float(_failed(out)),
    }
    for number, name in enumerate(SCRIPTS):
        xs = [t.latency for t in txns if t.script == number]
        row[name] = statistics.fmean(xs) if xs else float("nan")
    # the cold start: a fresh server learns from nothing, so its first seconds are apart
    began = min((t.start for t in txns), default=0.0)
    first = [t.latency for t in txns if t.script == 1 and t.start - began < COLD]
    row["short_cold"] = statistics.fmean(first) if first else float("nan")
    row["short_cold_max"] = max(first, default=float("nan"))
    return row


def _failed(out: str) -> int:
    for line in out.splitlines():
        if line.startswith("number of failed transactions:"):
            return int(line.split(":")[1].split()[0])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=140.0, help="transactions/s (pgbench -R)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="none,default,fcfs@2")
    parser.add_argument("--weights", default="1,30", help="pgbench weights of long,short")
    parser.add_argument(
        "--long",
        choices=("scan", "tail"),
        default="scan",
        help="the long script: a scan of every account (scan), or a range query of 4,000 "
        "accounts one in 20 of which covers them all (tail: a class with a heavy tail)",
    )
    parser.add_argument("--scale", type=int, default=10, help="pgbench's scale factor")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for setting in settings:
        settings_args(setting)
    try:
        weights = tuple(int(w) for w in args.weights.split(","))
    except ValueError:
        parser.error("--weights is two whole numbers, long,short")
    if len(weights) != 2 or min(weights) < 0 or sum(weights) == 0:
        parser.error("--weights is two whole numbers ≥ 0, long,short, not both 0")
    args.weights = weights
    if args.rate <= 0 or args.clients < 1 or args.seconds < 1 or args.rounds < 1:
        parser.error("--rate must be > 0; --clients, --seconds and --rounds at least 1")
    if shutil.which("pgbench") is None:
        raise SystemExit("pgbench is not on PATH (PostgreSQL's client tools)")
    with tempfile.TemporaryDirectory(prefix="admission-pgbench-mix-") as work:
        return _run(args, settings, Path(work))


def _run(args: argparse.Namespace, settings: list[str], work: Path) -> int:
    database = work / "pgbench.duckdb"
    (work / "long.sql").write_text(LONG if args.long == "scan" else TAIL)
    (work / "short.sql").write_text(SHORT)
    proc, port = serve_database(database, settings_args("none"))
    try:
        init_pgbench(port, args.scale)
        alone = {}
        for name in SCRIPTS:  # each script alone: one client, closed, no admission control
            out, code = pgbench_output(
                port, ["-f", str(work / f"{name}.sql"), "-s", str(args.scale), "-c", "1"], 5
            )
            found = [ln for ln in out.splitlines() if ln.startswith("latency average = ")]
            if code != 0 or not found:
                raise SystemExit(f"pgbench ({name} alone) failed: {out.strip()[-500:]}")
            alone[name] = float(found[0].split("=")[1].split()[0]) / 1e3
    finally:
        stop(proc)
    long_w, short_w = args.weights
    work_per = (long_w * alone["long"] + short_w * alone["short"]) / (long_w + short_w)
    print(
        f"pgbench mix, embedded DuckDB, scale {args.scale}: long ({args.long}) "
        f"{alone['long'] * 1e3:.1f} ms "
        f"alone, short {alone['short'] * 1e3:.2f} ms alone, weights {long_w}:{short_w}; "
        f"-R {args.rate:g}/s = ρ {args.rate * work_per:.2f} (rate × Σ p_r D_r); "
        f"{args.clients} clients, {args.seconds:g} s × {args.rounds} rounds",
        flush=True,
    )
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in settings}
    for rnd in range(args.rounds):
        for setting in run_order(settings, 0, rnd):
            proc, port = serve_database(database, settings_args(setting))
            try:
                row = one_run(port, work, args)
            finally:
                stop(proc)
            runs[setting].append(row)
            print(
                f"round {rnd + 1} {setting:10} {row['rate']:6.1f}/s  mean {row['mean'] * 1e3:8.1f} "
                f"ms  p99 {row['p99'] * 1e3:8.1f} ms  long {row['long'] * 1e3:8.1f} ms  short "
                f"{row['short'] * 1e3:7.2f} ms (first {COLD:g} s {row['short_cold'] * 1e3:.1f}, "
                f"most {row['short_cold_max'] * 1e3:.0f})  failed {row['failed']:.0f}",
                flush=True,
            )
    print("\nmedian over rounds; ratio to none, and to the better baseline, in the same round")
    baselines = [s for s in settings if s == "none" or s.startswith("fcfs@")]
    for setting in settings:
        rows = runs[setting]
        line = (
            f"{setting:10} {statistics.median(r['rate'] for r in rows):6.1f}/s  mean "
            f"{statistics.median(r['mean'] for r in rows) * 1e3:8.1f} ms  p99 "
            f"{statistics.median(r['p99'] for r in rows) * 1e3:8.1f} ms  long "
            f"{statistics.median(r['long'] for r in rows) * 1e3:8.1f} ms  short "
            f"{statistics.median(r['short'] for r in rows) * 1e3:7.2f} ms (first {COLD:g} s "
            f"{statistics.median(r['short_cold'] for r in rows) * 1e3:.1f})"
        )
        if "none" in runs and setting != "none":
            line += _ratios(" vs none", rows, runs["none"])
        if baselines and setting not in baselines:
            best = [
                min((runs[b][i] for b in baselines), key=lambda r: r["mean"])
                for i in range(args.rounds)
            ]
            line += _ratios(" vs better baseline", rows, best)
        print(line)
    return 0


def _ratios(label: str, rows: list[dict[str, float]], base: list[dict[str, float]]) -> str:
    text = label
    for key in ("mean", "p99"):
        ratios = [a[key] / b[key] for a, b in zip(rows, base, strict=True) if b[key] > 0]
        if not ratios:
            continue
        interval = median_interval(ratios)
        lo, hi = interval if interval is not None else (min(ratios), max(ratios))
        text += f"  {key} ×{statistics.median(ratios):.2f} [{lo:.2f}, {hi:.2f}]"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
