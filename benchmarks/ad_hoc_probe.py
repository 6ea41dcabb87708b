"""Long ad hoc statements against `admission serve` as it is started: what a psql user sees.

For each setting, starts the real ``admission serve --tpch SF`` with that setting's arguments,
runs as many long statements of a shape it has never seen as the machine has cores (each on a
connection of its own; ~10 s alone on 2 cores), and a second later, on another connection,
short statements of new shapes one after another. Prints how long each short statement took
and how long the long ones ran. A hard MPL the long statements fill keeps the short ones
waiting for as long as they run; no admission control, or a release of the slots of statements
in service (``--release-after``), answers them in milliseconds.

    python -m benchmarks.ad_hoc_probe [--tpch 1] [--rounds 2] \\
        [--setting "none=--no-learn" --setting "default=" --setting "model=--model M" ...]

A setting is ``NAME=ARGUMENTS`` (the arguments split as a shell would). Settings run in turn,
the order rotated each round. Without ``--setting``: no admission control (``--no-learn``),
the default, and the default with the release off (``--release-after 0``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from testing.pgcluster import free_port

__all__ = ["LONG", "SHORT", "main", "probe"]

# ~10 s alone on 2 cores: a shape no model has (a distinct count over a generated range)
LONG = "select count(distinct i * 7 % 200000011) from range(60000000) long_{n}(i)"
# short statements of shapes not seen before, milliseconds alone at SF 1
SHORT = (
    "select 1",
    "select count(*) from nation",
    "select max(o_orderdate) from orders where o_orderkey < 1000",
    "select n_name, count(*) from nation join supplier on s_nationkey = n_nationkey "
    "group by n_name",
)
DEFAULTS = ("none=--no-learn", "default=", "default, release off=--release-after 0")


def _start(tpch: float, args: list[str]) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("admission")),
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--tpch",
        f"{tpch:g}",
        *args,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dsn = f"host=127.0.0.1 port={port} user=app dbname=app"
    deadline = time.monotonic() + 300
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=5).close()
            return proc, dsn
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read() if proc.stdout else ""
                proc.kill()
                raise SystemExit(f"serve {' '.join(args)} did not start:\n{out}") from None
            time.sleep(0.3)


def probe(dsn: str, longs: int, head_start: float = 1.0) -> tuple[list[float], list[float]]:
    """(the short statements' times, the long ones'), in seconds."""
    ran: dict[int, float] = {}
    failed: list[BaseException] = []

    def run_long(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                started = time.monotonic()
                c.execute(LONG.format(n=n)).fetchall()
                ran[n] = time.monotonic() - started
        except BaseException as e:  # (reported below)
            failed.append(e)

    threads = [threading.Thread(target=run_long, args=(n,)) for n in range(longs)]
    for t in threads:
        t.start()
    time.sleep(head_start)
    shorts = []
    with psycopg.connect(dsn, autocommit=True) as c:
        for sql in SHORT:
            started = time.monotonic()
            c.execute(sql).fetchall()
            shorts.append(time.monotonic() - started)
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"a long statement failed: {failed[0]!r}")
    return shorts, [ran[n] for n in sorted(ran)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor to load")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over the settings")
    ap.add_argument(
        "--longs", type=int, default=os.cpu_count() or 1, help="long statements (the cores)"
    )
    ap.add_argument(
        "--setting",
        action="append",
        metavar="NAME=ARGUMENTS",
        help="a name and serve's arguments for it (repeatable)",
    )
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.longs < 1:
        ap.error("--rounds and --longs must be at least 1")
    settings = []
    for spec in a.setting or DEFAULTS:
        name, eq, args = spec.partition("=")
        if not eq or not name.strip():
            ap.error(f"--setting {spec!r}: NAME=ARGUMENTS (the arguments may be empty)")
        settings.append((name.strip(), shlex.split(args)))
    results: dict[str, list[tuple[list[float], list[float]]]] = {n: [] for n, _ in settings}
    for r in range(a.rounds):
        turn = settings[r % len(settings) :] + settings[: r % len(settings)]
        for name, args in turn:
            print(f"round {r + 1}/{a.rounds}: {name} ({' '.join(args) or 'no arguments'})")
            proc, dsn = _start(a.tpch, args)
            try:
                results[name].append(probe(dsn, a.longs))
            finally:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print(
        f"\n{a.longs} long statements of a new shape, then {len(SHORT)} short ones of new "
        f"shapes a second later, one after another (TPC-H SF {a.tpch:g}, {a.rounds} round(s))"
    )
    header = ("setting", "short: each (s)", "short: worst", "long: each (s)")
    rows = []
    for name, _ in settings:
        shorts = [s for sh, _ in results[name] for s in sh]
        longs = [x for _, lg in results[name] for x in lg]
        rows.append(
            (
                name,
                " ".join(f"{s:.3f}" for s in shorts),
                f"{max(shorts):.3f}",
                f"{min(longs):.1f}–{max(longs):.1f} (median {statistics.median(longs):.1f})",
            )
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
