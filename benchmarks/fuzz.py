"""Protocol fuzzing at volume: a million mutated messages at a front end, and what it cost.

    python -m benchmarks.fuzz [--messages 1000000] [--frontend relay|embedded|both]
        [--seed 0] [--processes 1] [--concurrency 8] [--differential 200] [--mpl 0]

Each front end — the relay in front of a PostgreSQL started here, the embedded DuckDB server —
runs in this process (as the tests run them), and gets ``--messages`` messages of fuzzed real
sessions (``testing.fuzz``: startup, simple and extended queries, COPY both ways, cancels,
Terminate; bit flips, truncations, corrupted and oversized lengths, wrong types, bad
parameters …) from ``--processes`` processes of their own, ``--concurrency`` connections each,
while another client runs ``select 1`` every 10 ms. Then ``--differential`` well-framed cases
go to PostgreSQL and to the front end alike (``testing.fuzz.relay_mismatch``,
``embedded_mismatch``).

Printed per front end: messages sent, connections, cases answered to the end / closed by the
server / unanswered, crashes (internal errors and unanswered cases; on the relay, each case
answered with an internal error is replayed straight to PostgreSQL, and the internal errors
PostgreSQL gives that case itself are its own, relayed, and shown apart), the gate's capacity in use
and queue once idle, differential mismatches, the other client's select 1 p50 and p99 (target
p99 ≤ 50 ms), and this process's RSS before and after. The exit status is 1 when a crash, a
mismatch, capacity left over or a bystander failure is seen.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from admission import Limits
from testing import fuzz
from testing.embeddedharness import Embedded
from testing.pgcluster import Cluster, start_cluster
from testing.proxyharness import ProxyHarness

__all__ = ["main"]

P99_TARGET = 0.050


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Outcome:
    frontend: str
    seconds: float
    stats: fuzz.FuzzStats
    left: dict[str, int]
    mismatches: list[str]
    p50: float
    p99: float
    bystander_failures: list[str]
    select_one: object
    rss_start: int
    rss_end: int

    @property
    def failed(self) -> bool:
        return bool(
            self.stats.crashes
            or self.mismatches
            or any(self.left.values())
            or self.bystander_failures
            or self.select_one != 1
        )


@dataclass
class Target:
    port: int
    user: str
    dbname: str
    books: Callable[[], dict[str, int]]
    errors: list[object]
    forget: Callable[[], None] = lambda: None  # drop what the harness records of each event


@contextmanager
def _front_end(name: str, pg: Cluster, limits: Limits) -> Iterator[Target]:
    if name == "relay":
        relay = ProxyHarness(pg.port, limits=limits)

        def relay_books() -> dict[str, int]:
            state = relay.state()
            return {k: state[k] for k in ("in_service", "threads", "queued")}

        try:
            # the harness keeps every scheduler event for the tests: not the proxy's memory
            yield Target(
                relay.port,
                "postgres",
                "postgres",
                relay_books,
                relay.errors,  # type: ignore[arg-type]
                relay.events.clear,
            )
        finally:
            relay.close()
        return
    embedded = Embedded(limits)

    def embedded_books() -> dict[str, int]:
        s = embedded.scheduler
        books: dict[str, int] = embedded.call(
            lambda: {"in_service": s.in_service, "threads": s.threads_in_use, "queued": s.queued}
        )
        return books

    try:
        yield Target(embedded.port, "app", "app", embedded_books, embedded.errors)  # type: ignore[arg-type]
    finally:
        embedded.close()


def _idle(books: Callable[[], dict[str, int]], timeout: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    left = books()
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        left = books()
    return left


def run(name: str, pg: Cluster, args: argparse.Namespace) -> Outcome:
    limits = Limits(mpl=args.mpl or None)
    with _front_end(name, pg, limits) as target:
        startup = fuzz.startup_packet(target.user, target.dbname)
        rss_start = fuzz.rss_kb()
        bystander = fuzz.Bystander(target.port, target.user, target.dbname)
        bystander.start()
        fuzzing = threading.Event()
        fuzzing.set()

        def forget() -> None:
            while fuzzing.is_set():
                target.forget()
                time.sleep(1.0)

        forgetting = threading.Thread(target=forget, daemon=True)
        forgetting.start()
        started = time.monotonic()
        first = args.seed * 10_000_000
        try:
            stats = fuzz.fuzz_in_subprocess(
                "127.0.0.1",
                target.port,
                range(first, first + 10_000_000),
                startup,
                processes=args.processes,
                concurrency=args.concurrency,
                timeout=args.timeout,
                messages=args.messages,
                progress=5000,
            )
        finally:
            bystander.stop()
            fuzzing.clear()
            forgetting.join()
        target.forget()
        seconds = time.monotonic() - started
        _say(f"{name}: {stats.messages} messages in {seconds:.0f} s; differential replay …")
        select_one = fuzz.select_one(target.port, target.user, target.dbname)
        left = _idle(target.books)
        judge = fuzz.relay_mismatch if name == "relay" else fuzz.embedded_mismatch
        mismatches = fuzz.differential(
            "127.0.0.1",
            pg.port,
            target.port,
            range(first, first + args.differential),
            fuzz.startup_packet("postgres", "postgres"),
            startup,
            judge,
        )
        rss_end = fuzz.rss_kb()
        if name == "relay" and stats.internal:
            # the relay makes no internal error of its own: are these PostgreSQL's?
            stats.internal = stats.internal[:200]
            fuzz.excuse(stats, "127.0.0.1", pg.port, fuzz.startup_packet("postgres", "postgres"))
        if target.errors:
            stats.insane.append(f"errors in the front end's event loop: {target.errors[:3]}")
    return Outcome(
        name,
        seconds,
        stats,
        left,
        mismatches,
        bystander.percentile(50),
        bystander.percentile(99),
        bystander.failures,
        select_one,
        rss_start,
        rss_end,
    )


def table(outcomes: list[Outcome]) -> str:
    rows: list[tuple[str, Callable[[Outcome], str]]] = [
        ("front end", lambda o: o.frontend),
        ("seconds", lambda o: f"{o.seconds:.0f}"),
        ("messages sent", lambda o: f"{o.stats.messages:,}"),
        ("connections", lambda o: f"{o.stats.connections:,}"),
        ("cases", lambda o: f"{o.stats.cases:,}"),
        ("  answered to the end", lambda o: f"{o.stats.ends['answered']:,}"),
        ("  closed by the server", lambda o: f"{o.stats.ends['closed']:,}"),
        ("  unanswered", lambda o: f"{o.stats.ends['timeout']:,}"),
        ("crashes", lambda o: f"{o.stats.crashes}"),
        ("  internal errors PostgreSQL gives itself", lambda o: f"{o.stats.excused}"),
        (
            "capacity left (in service/threads/queued)",
            lambda o: "/".join(map(str, o.left.values())),
        ),
        ("differential mismatches", lambda o: f"{len(o.mismatches)}"),
        ("select 1 p50 (ms)", lambda o: f"{o.p50 * 1e3:.1f}"),
        ("select 1 p99 (ms)", lambda o: f"{o.p99 * 1e3:.1f}"),
        ("bystander failures", lambda o: f"{len(o.bystander_failures)}"),
        ("fresh select 1", lambda o: f"{o.select_one}"),
        ("RSS start (MB)", lambda o: f"{o.rss_start / 1024:.0f}"),
        ("RSS end (MB)", lambda o: f"{o.rss_end / 1024:.0f}"),
    ]
    width = max(len(label) for label, _ in rows)
    lines = []
    for label, cell in rows:
        cells = "".join(f"{cell(o):>16}" for o in outcomes)
        lines.append(f"{label:<{width}}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--frontend", choices=("relay", "embedded", "both"), default="both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1, help="fuzzing processes")
    parser.add_argument("--concurrency", type=int, default=8, help="connections per process")
    parser.add_argument("--differential", type=int, default=200, help="cases replayed")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds per case")
    parser.add_argument("--mpl", type=int, default=0, help="the gate's MPL (0: none)")
    args = parser.parse_args(argv)
    names = ["relay", "embedded"] if args.frontend == "both" else [args.frontend]
    _say("starting PostgreSQL …")
    pg = start_cluster()
    try:
        outcomes = [run(name, pg, args) for name in names]
    finally:
        pg.stop()
    print(table(outcomes))
    for outcome in outcomes:
        for line in [*outcome.stats.insane, *outcome.mismatches[:10]]:
            print(f"{outcome.frontend}: {line}")
        if outcome.stats.timeouts:
            print(f"{outcome.frontend}: unanswered seeds {outcome.stats.timeouts[:20]}")
        if outcome.p99 > P99_TARGET:
            print(f"{outcome.frontend}: select 1 p99 above the {P99_TARGET * 1e3:.0f} ms target")
    failed = [o.frontend for o in outcomes if o.failed]
    print("verdict: " + (f"FAILED on {', '.join(failed)}" if failed else "all invariants held"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
