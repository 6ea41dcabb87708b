"""Thousands of idle clients on one proxy, side by side with PgBouncer.

Starts a PostgreSQL server of its own (``max_connections`` 100) and, one after the other:

* ``pgbouncer``: PgBouncer (when installed), transaction pool mode, pool 20;
* ``relay``: ``admission serve --backend … --pool-mode transaction --pool-size 20``;
* ``embedded``: ``admission serve`` (the embedded DuckDB, no data).

For each, opens N clients from one asyncio process, at most ``--in-flight`` connecting at a
time, each with a bare startup message (user, database) read up to its ReadyForQuery, and keeps
them open. Prints: how many were held, refused (an ErrorResponse) or reset; the time to connect
them all; the server process's resident memory (VmRSS) growth per client held; the median and
99th percentile of ``SELECT 1`` from another client (psycopg) while they are held; and whether
all were still open at the end.

    python -m benchmarks.idle_clients [--clients 10000] [--in-flight 256] [--targets …]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.coordinator import ADMISSION, _wait
from benchmarks.pooling import start_pgbouncer, stop
from testing.pgcluster import free_port, start_cluster


def startup_packet(user: str, database: str) -> bytes:
    body = struct.pack("!I", 196608) + b"user\0" + user.encode() + b"\0database\0"
    body += database.encode() + b"\0\0"
    return struct.pack("!I", len(body) + 4) + body


async def _one(port: int, packet: bytes, timeout: float) -> tuple[str, object]:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError) as e:
        return "refused", repr(e)
    try:
        writer.write(packet)
        while True:
            header = await asyncio.wait_for(reader.readexactly(5), timeout)
            kind, length = header[:1], struct.unpack("!I", header[1:])[0]
            body = await asyncio.wait_for(reader.readexactly(length - 4), timeout)
            if kind == b"Z":
                return "held", (reader, writer)
            if kind == b"E":
                writer.close()
                return "error", body[:120]
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
        writer.close()
        return "reset", repr(e)


async def hold(port: int, n: int, in_flight: int, pid: int, user: str) -> dict[str, Any]:
    packet = startup_packet(user, "postgres")
    gate = asyncio.Semaphore(in_flight)
    rss_before = rss(pid)

    async def one() -> tuple[str, object]:
        async with gate:
            return await _one(port, packet, 60.0)

    started = time.monotonic()
    results = await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.monotonic() - started
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = [
        r[1]  # type: ignore[misc]
        for r in results
        if r[0] == "held"
    ]
    await asyncio.sleep(1.0)
    rss_after = rss(pid)
    counts = {
        k: sum(1 for r in results if r[0] == k) for k in ("held", "error", "reset", "refused")
    }
    examples = [r[1] for r in results if r[0] != "held"][:2]
    latencies = await asyncio.to_thread(select_one, port, user)
    alive = 0
    for reader, writer in held:
        if not reader.at_eof() and not writer.is_closing():
            alive += 1
        writer.close()
    return {
        **counts,
        "seconds": elapsed,
        "rss_per_client": (rss_after - rss_before) / max(1, len(held)),
        "select1_p50_ms": statistics.median(latencies) * 1e3,
        "select1_p99_ms": sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1e3,
        "alive": alive,
        "examples": examples,
    }


def select_one(port: int, user: str) -> list[float]:
    out = []
    with psycopg.connect(
        host="127.0.0.1", port=port, user=user, dbname="postgres", autocommit=True
    ) as conn:
        for _ in range(300):
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            out.append(time.perf_counter() - started)
    return out[50:]


def rss(pid: int) -> int:
    """VmRSS of ``pid`` — or of its child, when it is ``runuser`` starting PgBouncer."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if Path(f"/proc/{pid}/comm").read_text().strip() == "runuser" and children.exists():
        kids = children.read_text().split()
        if kids:
            pid = int(kids[0])
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def start(target: str, pg_port: int, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    if target == "pgbouncer":
        return start_pgbouncer(pg_port, 20, work)
    port = free_port()
    args = [ADMISSION, "serve", "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
    if target == "relay":
        args += [
            "--backend",
            f"postgresql://127.0.0.1:{pg_port}",
            "--pool-mode",
            "transaction",
            "--pool-size",
            "20",
        ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait(port, proc, timeout=120)
    return proc, port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--targets", default="pgbouncer,relay,embedded")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="admission-idle-"))
    pg = start_cluster(max_connections=100)
    print(f"{args.clients} idle clients, {args.in_flight} connecting at a time")
    try:
        for target in args.targets.split(","):
            proc, port = start(target, pg.port, work)
            try:
                user = "postgres"
                row = asyncio.run(hold(port, args.clients, args.in_flight, proc.pid, user))
            finally:
                stop(proc)
            print(
                f"{target:10} held {row['held']}  error {row['error']}  reset {row['reset']}  "
                f"refused {row['refused']}  in {row['seconds']:.1f} s  "
                f"RSS {row['rss_per_client'] / 1024:.1f} kB/client  SELECT 1 p50 "
                f"{row['select1_p50_ms']:.2f} ms p99 {row['select1_p99_ms']:.2f} ms  "
                f"still open {row['alive']}"
                + (f"  e.g. {row['examples']}" if row["examples"] else ""),
                flush=True,
            )
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
