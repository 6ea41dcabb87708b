"""Soak: the proxy under a steady TPC-H load for a long time — does it stay up, answer every
statement, hold its memory and give all capacity back when the load stops?

    python -m benchmarks.soak [--minutes 30] [--backend embedded|postgresql] [--tpch 0.01]
        [--users 16] [--think 0] [--mix all] [--mpl 2] [--reconnect 50] [--warmup-minutes 5]
        [--max-growth 10]

A short benchmark catches a slow statement; only a long one catches what accumulates: memory
kept per statement or per connection, capacity not given back on some rare path, a queue that
never quite empties. This one runs ``admission serve`` as its own process — the embedded DuckDB
(``--tpch SF``) or a relay in front of a PostgreSQL started here with TPC-H loaded — with its
admin API on, and drives it with the locust workload (``workloads/tpch/locustfile.py``'s users,
headless, through ``benchmarks/soak_locustfile.py``, which logs every request and renews each
user's connection every ``--reconnect`` queries on average) for ``--minutes``.

Printed every minute: requests finished in that minute, failures (by error), p50 and p99
response time, the proxy's resident memory (VmRSS from /proc, read every second: the minute's
median and peak) and the statements in service and queued (``GET /status``) at the minute's
end. At the end: the errors in all (failed requests, and errors users met outside one, such as
a refused connection), the RSS growth from minute ``--warmup-minutes`` (start-up, caches and
allocator pools settle before) to the last minute under load, and whether statements in
service, the thread budget in use and the queue were back to 0 once the load stopped. The
counts are checked against locust's own and the proxy's (``GET /metrics``). Targets: 0 errors,
RSS growth ≤ ``--max-growth`` % and everything back to 0; the exit status is 1 when one is
missed, and the last line says which.

``tests/integration/test_soak.py`` runs the same harness for a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import psycopg

from testing.pgcluster import Cluster, connect_when_ready, free_port, start_cluster
from workloads.tpch.data import generate, load_postgres

__all__ = ["SoakConfig", "SoakResult", "Window", "main", "run_soak"]

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "benchmarks" / "soak_locustfile.py"
BIN = Path(sys.executable).parent
Backend = Literal["embedded", "postgresql"]
RSS_EVERY = 1.0  # seconds between readings of the proxy's RSS
OUTSIDE = "(user)"  # the locustfile's name for an error raised outside a request
Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, flush=True)


@dataclass(frozen=True)
class SoakConfig:
    """One soak run. ``warmup`` and ``duration`` are seconds; RSS growth is measured from the
    first report at or after ``warmup`` to the last report under load."""

    duration: float
    interval: float = 60.0
    warmup: float = 300.0
    backend: Backend = "embedded"
    scale_factor: float = 0.01
    users: int = 16
    think: float = 0.0
    mix: str = "all"
    mpl: int = 2
    reconnect: int = 50
    max_growth: float = 0.10
    settle: float = 15.0  # seconds the proxy has, once locust exits, to be back to 0


@dataclass
class Window:
    """One report line: the requests that finished between ``start`` and ``end`` seconds after
    locust was started, the proxy's RSS read during that time, its gate at ``end``."""

    start: float
    end: float
    requests: int
    failures: Counter[str]
    p50_ms: float
    p99_ms: float
    rss_kb: int  # median of the readings taken in the window
    rss_peak_kb: int
    in_service: int
    queued: int
    under_load: bool


@dataclass
class SoakResult:
    """What a run measured, and the targets it missed (``misses``, empty when all were met)."""

    windows: list[Window] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    outside: int = 0  # errors users raised outside a request (in ``errors`` too)
    rss_base_kb: int | None = None
    rss_base_at: float | None = None  # seconds into the load
    rss_end_kb: int | None = None
    rss_after_kb: int | None = None
    drained_after: float | None = None  # seconds after locust exited until all was 0
    final_status: dict[str, Any] = field(default_factory=dict)
    proxy_completed: int | None = None
    locust_returncode: int | None = None
    locust_counts: tuple[int, int] | None = None  # locust's own (requests, failures)
    proxy_returncode: int | None = None
    proxy_log: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    @property
    def growth(self) -> float | None:
        if self.rss_base_kb is None or self.rss_end_kb is None:
            return None
        return (self.rss_end_kb - self.rss_base_kb) / self.rss_base_kb


def rss_kb(pid: int) -> int:
    """The process's resident set (VmRSS) in kB, as the kernel reports it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def admin_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


def status(port: int) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(admin_get(port, "/status"))
    return answer


def completed_total(port: int) -> int:
    """Statements the proxy saw finish, summed over classes from ``GET /metrics``."""
    total = 0.0
    for line in admin_get(port, "/metrics").splitlines():
        if line.startswith("admission_completed_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


@dataclass(frozen=True)
class Event:
    """One line of the locustfile's log: a request, or an error a user raised outside one."""

    time: float
    name: str
    ms: float
    error: str

    @property
    def request(self) -> bool:
        return self.name != OUTSIDE


class EventLog:
    """Reads the requests the locustfile appends, as they come; a line is handed out once its
    time is before the boundary asked for, so each lands in the window it finished in."""

    def __init__(self, path: Path) -> None:
        path.touch()
        self._file: IO[str] = path.open(encoding="utf-8")
        self._partial = ""
        self._pending: list[Event] = []

    def take(self, until: float) -> list[Event]:
        """Every event that happened before ``until`` and was not handed out yet."""
        chunk = self._partial + self._file.read()
        lines = chunk.split("\n")
        self._partial = lines.pop()  # "" after a complete line
        for line in lines:
            stamp, name, ms, error = line.split("\t", 3)
            self._pending.append(Event(float(stamp), name, float(ms), error))
        ready = [e for e in self._pending if e.time < until]
        self._pending = [e for e in self._pending if e.time >= until]
        return ready

    def close(self) -> None:
        self._file.close()


@contextlib.contextmanager
def _postgres(config: SoakConfig, say: Say) -> Iterator[Cluster]:
    """A PostgreSQL server of its own with TPC-H in database ``tpch``, as the tests load it."""
    cluster = start_cluster()
    try:
        cluster.psql("create database tpch")
        data = generate(config.scale_factor, progress=say)
        with psycopg.connect(cluster.dsn(dbname="tpch")) as conn:
            load_postgres(conn, data, config.scale_factor, progress=say)
        yield cluster
    finally:
        cluster.stop()


def _start_proxy(
    config: SoakConfig, backend: str | None, log: IO[str]
) -> tuple[subprocess.Popen[str], int, int]:
    """``admission serve`` with its admin API, on free ports; the process, its port and the
    admin port. Its log goes to a file: a pipe nobody reads would stall it on a long run."""
    port, admin_port = free_port(), free_port()
    where = ["--backend", backend] if backend else ["--tpch", f"{config.scale_factor:g}"]
    env = {**os.environ, "ADMISSION_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [
            str(BIN / "admission"),
            "serve",
            *where,
            "--listen",
            f"127.0.0.1:{port}",
            "--admin",
            f"127.0.0.1:{admin_port}",
            "--mpl",
            str(config.mpl),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    return proc, port, admin_port


def _wait_ready(proc: subprocess.Popen[str], port: int, admin_port: int, user: str) -> None:
    """Until the proxy answers a client and its admin API answers too."""
    connect_when_ready(port, proc, timeout=600, user=user, dbname="tpch").close()
    deadline = time.monotonic() + 30
    while True:
        try:
            status(admin_port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _start_locust(
    config: SoakConfig, host: str, workdir: Path, log: IO[str]
) -> subprocess.Popen[str]:
    """Headless locust as ``tests/integration/test_locust.py`` runs it, for the duration."""
    return subprocess.Popen(
        [
            str(BIN / "locust"),
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--host",
            host,
            "-u",
            str(config.users),
            "-r",
            str(max(1, config.users // 2)),
            "-t",
            f"{config.duration:.0f}s",
            "--tpch-mix",
            config.mix,
            "--tpch-sf",
            f"{config.scale_factor:g}",
            "--tpch-think",
            f"{config.think:g}",
            "--soak-events",
            str(workdir / "events.tsv"),
            "--soak-reconnect",
            str(config.reconnect),
            "--json-file",
            str(workdir / "locust"),
            "--stop-timeout",
            "30",
            "--only-summary",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _locust_totals(workdir: Path) -> tuple[int, int] | None:
    """locust's own count of requests and failures, from the statistics it writes as it quits
    (its CSV files are rewritten once a second, so they can miss the last requests)."""
    path = workdir / "locust.json"
    if not path.exists():
        return None
    entries = json.loads(path.read_text())
    return sum(e["num_requests"] for e in entries), sum(e["num_failures"] for e in entries)


def _clock(seconds: float, interval: float) -> str:
    """A report's time: whole minutes when reporting per minute, else m:ss."""
    if interval % 60 == 0 and seconds % 60 == 0:
        return f"{seconds / 60:.0f}"
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _row(window: Window, interval: float) -> str:
    failures = sum(window.failures.values())
    which = "; ".join(f"{n}× {e}" for e, n in window.failures.most_common(3))
    tail = "" if window.under_load else "  (load stopped)"
    return (
        f"{_clock(window.end, interval):>6} {window.requests:9d} {failures:6d} "
        f"{window.p50_ms:8.1f} {window.p99_ms:8.1f} {window.rss_kb / 1024:8.1f} "
        f"{window.rss_peak_kb / 1024:8.1f} "
        f"{window.in_service:10d} {window.queued:7d}{tail}" + (f"   {which}" if which else "")
    )


def _window(
    events: list[Event],
    start: float,
    end: float,
    rss: list[int],
    admin_port: int,
    under_load: bool,
) -> Window:
    times = [e.ms for e in events if e.request and not e.error]
    p50, p99 = np.percentile(times, [50, 99]) if times else (float("nan"), float("nan"))
    state = status(admin_port)
    return Window(
        start=start,
        end=end,
        requests=sum(1 for e in events if e.request),
        failures=Counter(_label(e) for e in events if e.error),
        p50_ms=float(p50),
        p99_ms=float(p99),
        rss_kb=int(np.median(rss)),
        rss_peak_kb=max(rss),
        in_service=int(state["in_service"]),
        queued=int(state["queued"]),
        under_load=under_load,
    )


def _label(event: Event) -> str:
    return event.error if event.request else f"outside a request: {event.error}"


def _drain(admin_port: int, settle: float) -> tuple[float | None, dict[str, Any]]:
    """Seconds until statements in service, threads in use and the queue are all 0 (None if
    not within ``settle``), and the last status read."""
    started = time.monotonic()
    while True:
        state = status(admin_port)
        if state["in_service"] == 0 and state["threads_in_use"] == 0 and state["queued"] == 0:
            return time.monotonic() - started, state
        if time.monotonic() - started > settle:
            return None, state
        time.sleep(0.25)


def _until(
    boundary: float, locust: subprocess.Popen[str], proc: subprocess.Popen[str]
) -> tuple[list[int], bool]:
    """The proxy's RSS every RSS_EVERY seconds until ``boundary`` (and at it), and whether
    locust is still running then. One reading is noisy — result sets and statements in flight
    come and go by tens of MB — so a window is judged by the median of its readings."""
    rss: list[int] = []
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with code {proc.returncode}")
        rss.append(rss_kb(proc.pid))
        left = boundary - time.time()
        if left <= 0:
            return rss, True
        try:
            locust.wait(timeout=min(RSS_EVERY, left))
        except subprocess.TimeoutExpired:
            continue
        rss.append(rss_kb(proc.pid))
        return rss, False


def _measure(
    config: SoakConfig,
    proc: subprocess.Popen[str],
    admin_port: int,
    host: str,
    workdir: Path,
    say: Say,
) -> SoakResult:
    """Run locust against the proxy and report every ``interval``; see the module docstring."""
    result = SoakResult()
    log = EventLog(workdir / "events.tsv")
    say(
        f"{'at':>6} {'requests':>9} {'fail':>6} {'p50 ms':>8} {'p99 ms':>8} {'RSS MB':>8} "
        f"{'peak':>8} {'in service':>10} {'queued':>7}"
    )
    with (workdir / "locust.log").open("w") as locust_log:
        started = time.time()
        locust = _start_locust(config, host, workdir, locust_log)
        try:
            k = 1
            while True:
                boundary = started + k * config.interval
                rss, under_load = _until(boundary, locust, proc)
                if not under_load:
                    boundary = time.time()  # locust is done: a last, shorter window
                events = log.take(boundary)
                window = _window(
                    events,
                    (k - 1) * config.interval,
                    boundary - started,
                    rss,
                    admin_port,
                    under_load,
                )
                result.windows.append(window)
                result.requests += window.requests
                result.errors.update(window.failures)
                result.outside += sum(1 for e in events if not e.request)
                say(_row(window, config.interval))
                if under_load:
                    result.rss_end_kb = window.rss_kb
                    if result.rss_base_kb is None and window.end >= config.warmup - 1e-6:
                        result.rss_base_kb = window.rss_kb
                        result.rss_base_at = window.end
                if not under_load:
                    break
                k += 1
        finally:
            if locust.poll() is None:
                locust.send_signal(signal.SIGINT)
                locust.wait(60)
    result.locust_returncode = locust.returncode
    result.drained_after, result.final_status = _drain(admin_port, config.settle)
    leftover = log.take(float("inf"))  # none, unless written after locust exited
    log.close()
    result.requests += sum(1 for e in leftover if e.request)
    result.outside += sum(1 for e in leftover if not e.request)
    result.errors.update(_label(e) for e in leftover if e.error)
    result.rss_after_kb = rss_kb(proc.pid)
    result.proxy_completed = completed_total(admin_port)
    result.locust_counts = _locust_totals(workdir)
    return result


def _judge(result: SoakResult, config: SoakConfig) -> None:
    """The targets missed, as sentences."""
    errors = sum(result.errors.values())
    if errors:
        result.misses.append(f"{errors} errors (target 0)")
    if result.growth is None:
        result.misses.append(
            f"no RSS growth measured: the run is not longer than the warm-up ({config.warmup:g} s)"
        )
    elif result.growth > config.max_growth:
        result.misses.append(
            f"RSS grew {result.growth:+.1%} after the warm-up (target ≤ {config.max_growth:.0%})"
        )
    if result.drained_after is None:
        s = result.final_status
        result.misses.append(
            f"not back to 0 within {config.settle:g} s of the load stopping: in service "
            f"{s.get('in_service')}, threads {s.get('threads_in_use')}, queued {s.get('queued')}"
        )
    if result.locust_returncode not in (0, 1):  # 1: locust saw failures, counted above
        result.misses.append(f"locust exited with code {result.locust_returncode}")
    if result.locust_counts is None:
        result.misses.append("locust wrote no statistics")
    elif result.locust_counts != (result.requests, errors - result.outside):
        result.misses.append(
            f"locust counted {result.locust_counts[0]} requests and {result.locust_counts[1]} "
            f"failures, the event log {result.requests} and {errors - result.outside}"
        )
    if result.proxy_returncode not in (0, None):
        result.misses.append(f"the proxy exited with code {result.proxy_returncode} at SIGINT")


def _summary(result: SoakResult, config: SoakConfig) -> list[str]:
    errors = sum(result.errors.values())
    lines = [f"requests: {result.requests}; errors: {errors} (target 0)"]
    lines += [f"  {n}× {error}" for error, n in result.errors.most_common(10)]
    if result.rss_base_kb is not None and result.rss_end_kb is not None:
        assert result.growth is not None
        lines.append(
            f"RSS: {result.rss_base_kb / 1024:.1f} MB in the window ending at "
            f"{_clock(result.rss_base_at or 0.0, config.interval)}"
            f"{' min' if config.interval % 60 == 0 else ''} (end of warm-up), "
            f"{result.rss_end_kb / 1024:.1f} MB in the last window under "
            f"load (medians of each window's readings): {result.growth:+.1%} "
            f"(target ≤ {config.max_growth:.0%}); "
            f"{(result.rss_after_kb or 0) / 1024:.1f} MB after the load stopped"
        )
    s = result.final_status
    if result.drained_after is not None:
        lines.append(
            f"after the load stopped: in service 0, threads in use 0, queued 0 "
            f"({result.drained_after:.1f} s after locust exited)"
        )
    else:
        lines.append(
            f"after the load stopped: in service {s.get('in_service')}, threads in use "
            f"{s.get('threads_in_use')}, queued {s.get('queued')} after {config.settle:g} s"
        )
    lines.append(
        f"proxy: {result.proxy_completed} statements completed, refused for a full queue "
        f"{s.get('refused_queue_full')}, timed out {s.get('timed_out')}, cancelled "
        f"{s.get('cancelled')}; locust counted {result.locust_counts}"
    )
    if result.proxy_log:
        lines.append(f"the proxy logged {len(result.proxy_log)} warnings or errors; the last:")
        lines += [f"  {line}" for line in result.proxy_log[-5:]]
    if result.misses:
        lines.append("MISSED: " + "; ".join(result.misses))
    else:
        lines.append("all targets met")
    return lines


def run_soak(config: SoakConfig, say: Say = _say) -> SoakResult:
    """Start the proxy (and PostgreSQL), run the load with reports, stop it all, judge."""
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        backend: str | None = None
        if config.backend == "postgresql":
            cluster = stack.enter_context(_postgres(config, say))
            backend = cluster.url
        proxy_log = stack.enter_context((workdir / "proxy.log").open("w"))
        proc, port, admin_port = _start_proxy(config, backend, proxy_log)
        try:
            user = "postgres" if backend else "soak"
            _wait_ready(proc, port, admin_port, user)
            host = f"postgresql://{user}@127.0.0.1:{port}/tpch"
            where = (
                f"PostgreSQL at {backend}"
                if backend
                else f"embedded DuckDB, TPC-H SF {config.scale_factor:g}"
            )
            say(
                f"soak: {where}; mix {config.mix}, {config.users} users, think "
                f"{config.think:g} s, reconnect every ~{config.reconnect} queries, MPL "
                f"{config.mpl}, {config.duration / 60:g} min; proxy pid {proc.pid}, RSS "
                f"{rss_kb(proc.pid) / 1024:.1f} MB before the load"
            )
            result = _measure(config, proc, admin_port, host, workdir, say)
        except BaseException:
            say("the run failed; the proxy's log ends with:")
            for line in (workdir / "proxy.log").read_text().splitlines()[-20:]:
                say(f"  {line}")
            raise
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        result.proxy_returncode = proc.returncode
        proxy_log.flush()
        result.proxy_log = [
            line
            for line in (workdir / "proxy.log").read_text().splitlines()
            if " WARNING " in line or " ERROR " in line or "Traceback" in line
        ]
        _judge(result, config)
        for line in _summary(result, config):
            say(line)
        return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of load")
    parser.add_argument("--backend", choices=["embedded", "postgresql"], default="embedded")
    parser.add_argument("--tpch", type=float, default=0.01, help="TPC-H scale factor")
    parser.add_argument("--users", type=int, default=16, help="locust users (connections)")
    parser.add_argument("--think", type=float, default=0.0, help="mean think time, s")
    parser.add_argument("--mix", default="all", help="light, medium, heavy, all or Q:W,…")
    parser.add_argument("--mpl", type=int, default=2, help="the proxy's MPL")
    parser.add_argument("--reconnect", type=int, default=50, help="mean queries per connection")
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--max-growth", type=float, default=10.0, help="RSS growth target, %%")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per report line")
    args = parser.parse_args(argv)
    config = SoakConfig(
        duration=args.minutes * 60,
        interval=args.interval,
        warmup=args.warmup_minutes * 60,
        backend=args.backend,
        scale_factor=args.tpch,
        users=args.users,
        think=args.think,
        mix=args.mix,
        mpl=args.mpl,
        reconnect=args.reconnect,
        max_growth=args.max_growth / 100,
    )
    result = run_soak(config)
    sys.exit(1 if result.misses else 0)


if __name__ == "__main__":
    main()
