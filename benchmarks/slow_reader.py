"""A slow reader of a huge result: how much memory does the proxy take for it?

A client asks for 10 million rows and reads them at a limited rate (by default about 16 MB/s,
far slower than the database makes them). The proxy runs as its own process (``admission
serve``); its resident memory is sampled while the rows flow and compared with the same process
idle. Target: at most 64 MB above idle, on both front ends — the relay in front of PostgreSQL
(flow control end to end) and the embedded DuckDB server (results fetched and sent a chunk at a
time, no faster than the client reads).

    python -m benchmarks.slow_reader [--rows 10000000] [--rate-mb 16] [--backend both]
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from testing.pgcluster import free_port, start_cluster

ADMISSION = str(Path(sys.executable).with_name("admission"))
TARGET_MB = 64.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def startup(user: str, dbname: str) -> bytes:
    body = struct.pack("!i", 196608) + f"user\0{user}\0database\0{dbname}\0\0".encode()
    return struct.pack("!i", len(body) + 4) + body


def query(sql: str) -> bytes:
    text = sql.encode() + b"\0"
    return b"Q" + struct.pack("!i", len(text) + 4) + text


def read_messages(s: socket.socket, until: bytes, rate: float | None) -> tuple[int, int]:
    """Read until a message of type ``until``; count DataRows and bytes, at ``rate`` bytes/s."""
    buffer = bytearray()
    rows = total = 0
    started = time.monotonic()
    while True:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("the proxy closed the connection")
        total += len(chunk)
        buffer += chunk
        pos = 0
        while len(buffer) - pos >= 5:
            kind = buffer[pos : pos + 1]
            (length,) = struct.unpack_from("!i", buffer, pos + 1)
            if len(buffer) - pos < 1 + length:
                break
            if kind == b"D":
                rows += 1
            elif kind == b"E":
                raise RuntimeError(bytes(buffer[pos : pos + 1 + length]).decode("utf-8", "replace"))
            elif kind == until:
                return rows, total
            pos += 1 + length
        del buffer[:pos]
        if rate:
            ahead = total / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


def measure(
    name: str, args: list[str], sql: str, user: str, dbname: str, rate: float
) -> dict[str, Any]:
    port = free_port()
    proxy = subprocess.Popen(
        [ADMISSION, "serve", "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *args],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=600)
                break
            except OSError:
                if time.monotonic() > deadline or proxy.poll() is not None:
                    raise RuntimeError(f"{name}: the proxy did not start") from None
                time.sleep(0.2)
        with s:
            s.sendall(startup(user, dbname))
            read_messages(s, b"Z", None)
            s.sendall(query("select 1"))  # warm: the first statement's allocations
            read_messages(s, b"Z", None)
            time.sleep(1.0)
            idle = rss_mb(proxy.pid)
            peak = idle
            done = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_mb(proxy.pid))
                    time.sleep(0.1)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            started = time.monotonic()
            s.sendall(query(sql))
            rows, size = read_messages(s, b"Z", rate)
            took = time.monotonic() - started
            done.set()
            sampler.join()
        return {
            "front end": name,
            "rows": rows,
            "MB read": size / 1e6,
            "seconds": took,
            "idle MB": idle,
            "peak MB": peak,
            "above idle MB": peak - idle,
        }
    finally:
        proxy.terminate()
        proxy.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rate-mb", type=float, default=16.0, help="the reader's MB/s")
    parser.add_argument("--backend", choices=("embedded", "postgresql", "both"), default="both")
    options = parser.parse_args()
    rate = options.rate_mb * 1e6
    results = []
    if options.backend in ("embedded", "both"):
        sql = f"select x, x::text as t from range({options.rows}) r(x)"
        results.append(measure("embedded DuckDB", [], sql, "app", "app", rate))
    if options.backend in ("postgresql", "both"):
        cluster = start_cluster()
        try:
            sql = f"select x, x::text as t from generate_series(1, {options.rows}) x"
            results.append(
                measure(
                    "relay to PostgreSQL",
                    ["--backend", cluster.url],
                    sql,
                    "postgres",
                    "postgres",
                    rate,
                )
            )
        finally:
            cluster.stop()
    print(f"a slow reader of {options.rows:,} rows at {options.rate_mb:g} MB/s")
    header = ("front end", "rows", "MB read", "s", "idle MB", "peak MB", "above")
    print(
        f"{header[0]:<22}{header[1]:>12}{header[2]:>10}{header[3]:>8}"
        + "".join(f"{h:>9}" for h in header[4:])
    )
    failed = False
    for r in results:
        print(
            f"{r['front end']:<22}{r['rows']:>12,}{r['MB read']:>10.0f}{r['seconds']:>8.1f}"
            f"{r['idle MB']:>9.0f}{r['peak MB']:>9.0f}{r['above idle MB']:>9.0f}"
        )
        failed |= r["rows"] != options.rows or r["above idle MB"] > TARGET_MB
    print(
        f"target: every row, at most {TARGET_MB:g} MB above idle: {'MISSED' if failed else 'met'}"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
