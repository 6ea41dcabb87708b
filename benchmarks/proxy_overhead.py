"""What the proxy adds per query: pgbench -S against PostgreSQL directly, through this proxy
(admission on, MPL 16 ≥ clients), through PgBouncer (session pooling) and through a naive
asyncio byte relay (no parsing at all), at -c 1 and -c 8, simple and prepared protocol.

Targets are measured in interleaved rounds and the median of each is reported, because this
machine is shared and noisy. Then the time is split: a relay's cost (sockets and event loop) and
the cost of this proxy's own work per query (framing, the session state machine, the admission
decision), measured without sockets.

    python -m benchmarks.proxy_overhead [--seconds 5] [--rounds 3]

Needs PostgreSQL server binaries, pgbench and pgbouncer (scripts/check installs them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.pgcluster import Cluster, free_port, start_cluster

RELAY = """
import asyncio, sys
UP = int(sys.argv[1])
class Up(asyncio.Protocol):
    def __init__(self, down): self.down = down
    def connection_made(self, t): self.t = t
    def data_received(self, d): self.down.t.write(d)
    def connection_lost(self, e): self.down.t.close()
class Down(asyncio.Protocol):
    def connection_made(self, t):
        self.t, self.buf, self.up = t, [], None
        asyncio.get_running_loop().create_task(self.connect())
    async def connect(self):
        loop = asyncio.get_running_loop()
        _, self.up = await loop.create_connection(lambda: Up(self), "127.0.0.1", UP)
        for b in self.buf: self.up.t.write(b)
        self.buf = None
    def data_received(self, d):
        if self.buf is not None: self.buf.append(d)
        else: self.up.t.write(d)
    def connection_lost(self, e):
        if self.up: self.up.t.close()
async def main():
    await asyncio.get_running_loop().create_server(Down, "127.0.0.1", int(sys.argv[2]))
    await asyncio.Event().wait()
import uvloop
uvloop.run(main())
"""


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.3).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


def start_pgbouncer(pg: Cluster, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    port = free_port()
    (workdir / "users.txt").write_text('"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={pg.port}\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n"
        f"auth_file = {workdir}/users.txt\npool_mode = session\nmax_client_conn = 200\n"
        f"default_pool_size = 32\nunix_socket_dir =\nlogfile = {workdir}/pgbouncer.log\n"
    )
    cmd = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        entry = pwd.getpwnam("postgres")
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


def pgbench(port: int, mode: str, clients: int, seconds: int) -> tuple[float, float]:
    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    out = subprocess.run(
        [
            "pgbench",
            "-S",
            "-n",
            "-M",
            mode,
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(seconds),
            dsn,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if out.returncode:
        raise RuntimeError(f"pgbench failed on port {port}: {out.stderr}")
    latency = float(re.search(r"latency average = ([\d.]+) ms", out.stdout).group(1))  # type: ignore[union-attr]
    tps = float(re.search(r"tps = ([\d.]+)", out.stdout).group(1))  # type: ignore[union-attr]
    return latency * 1000, tps


def logic_cost(cycles: int = 20_000) -> float:
    """µs per prepared-statement query spent in framing, session and admission, no sockets."""
    from admission import Limits, Scheduler
    from proxy.gate import AdmissionGate
    from proxy.wire import protocol as pg
    from proxy.wire.session import ProxySession, Release, Submit

    def m(kind: bytes, body: bytes = b"") -> bytes:
        return pg.message(kind, body)

    startup = b"\0\0\0\x03\0\0user\0u\0\0"
    client = (
        m(b"B", b"\0P0_1\0\0\0\0\x01\0\0\0\x045432\0\x01\0\x01") + m(b"E", b"\0\0\0\0\0") + m(b"S")
    )
    reply = (
        m(b"2") + m(b"D", b"\0\x01\0\0\0\x041234") + m(b"C", b"SELECT 1\0") + pg.ready_for_query()
    )

    async def run() -> float:
        session = ProxySession()
        session.client_data(len(startup + b"1234").to_bytes(4, "big") + startup)
        session.server_data(pg.ready_for_query())
        session.client_data(
            m(b"P", b"P0_1\0SELECT abalance FROM pgbench_accounts WHERE aid = $1\0\0\0") + m(b"S")
        )
        session.server_data(pg.ready_for_query())
        gate = AdmissionGate(Scheduler(None, "min-q", Limits(mpl=16)))

        class Waiter:
            def admitted(self, job: int) -> None:
                apply(session.granted(job))

            def refused(self, job: int, sqlstate: str, text: str) -> None:
                raise AssertionError(f"rejected: {sqlstate} {text}")

        waiter = Waiter()

        def apply(actions: Sequence[object]) -> None:
            for a in actions:
                if isinstance(a, Submit):
                    gate.submit(a.job, a.query_class, a.bypass, a.sql, waiter)
                elif isinstance(a, Release):
                    gate.release(a.job)

        start = time.perf_counter()
        for _ in range(cycles):
            apply(session.client_data(client))
            apply(session.server_data(reply))
        return (time.perf_counter() - start) / cycles * 1e6

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=int, default=10)
    args = parser.parse_args()
    pg = start_cluster()
    procs: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="admission-bench-"))
    try:
        subprocess.run(
            [
                "pgbench",
                "-i",
                "-q",
                "-s",
                str(args.scale),
                f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres",
            ],
            check=True,
            capture_output=True,
        )
        bouncer, bouncer_port = start_pgbouncer(pg, workdir)
        procs.append(bouncer)
        proxy_port = free_port()
        admission = str(Path(sys.executable).with_name("admission"))
        procs.append(
            subprocess.Popen(
                [
                    admission,
                    "serve",
                    "--backend",
                    pg.url,
                    "--listen",
                    f"127.0.0.1:{proxy_port}",
                    "--mpl",
                    "16",
                    "--policy",
                    "min-q",
                    "--log-level",
                    "warning",
                ]
            )
        )
        relay_port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", RELAY, str(pg.port), str(relay_port)]))
        for port in (proxy_port, relay_port):
            wait_port(port)
        targets = {
            "direct": pg.port,
            "admission": proxy_port,
            "pgbouncer": bouncer_port,
            "naive relay": relay_port,
        }
        print(
            f"pgbench -S, scale {args.scale}, {args.seconds} s per run, median of "
            f"{args.rounds} interleaved rounds; latency in µs"
        )
        print(
            f"{'mode':9}{'-c':>3}  "
            + "".join(f"{t:>22}" for t in targets)
            + f"{'added: ours/bouncer':>22}{'tps: ours/bouncer':>19}"
        )
        for mode in ("simple", "prepared"):
            for clients in (1, 8):
                samples: dict[str, list[tuple[float, float]]] = {t: [] for t in targets}
                for _ in range(args.rounds):
                    for name, port in targets.items():
                        samples[name].append(pgbench(port, mode, clients, args.seconds))
                lat = {t: statistics.median(s[0] for s in v) for t, v in samples.items()}
                tps = {t: statistics.median(s[1] for s in v) for t, v in samples.items()}
                cells = "".join(f"{lat[t]:9.0f} µs {tps[t]:7.0f}/s" for t in targets)
                ours, theirs = lat["admission"] - lat["direct"], lat["pgbouncer"] - lat["direct"]
                ratio = ours / theirs if theirs > 0 else float("inf")
                share = tps["admission"] / tps["pgbouncer"]
                print(f"{mode:9}{clients:>3}  {cells}{ratio:>20.2f}×{share:>18.0%}")
        print(
            f"\nthis proxy's own work per prepared query (framing, session, admission), "
            f"no sockets: {logic_cost():.1f} µs"
        )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
