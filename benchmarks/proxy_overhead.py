"""What the proxy adds per query: pgbench -S against PostgreSQL directly, through this proxy
(admission on, MPL 16 ≥ clients), through PgBouncer (session pooling) and through a naive
asyncio byte relay (no parsing at all), at -c 1 and -c 8, simple and prepared protocol.

Targets are measured in interleaved rounds and the median of each is reported (the latency each
proxy adds: the median over rounds of its difference to the direct run of the same round),
because this machine is shared and noisy. Then where the time goes: each proxy process's CPU
per statement (user and system, from /proc, over the same runs), and this proxy's own work per
statement measured hot without sockets.

    python -m benchmarks.proxy_overhead [--seconds 5] [--rounds 3]

Needs PostgreSQL server binaries, pgbench and PgBouncer; when one is missing it installs them
the way scripts/check does (apt-get, as root on Debian/Ubuntu).
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
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testing.pgcluster import Cluster, free_port, start_cluster

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


class Discard:
    """A transport that drops what it is given."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def statement_cycle(mode: str, count: int) -> tuple[Any, list[bytes], bytes]:
    """A client connection as the server runs it (session, classification, admission,
    metrics) between two transports that discard what they get, in its steady state; ``count``
    pgbench -S statements for it (``simple``: each text with its own number, as pgbench sends
    them) and the reply that ends each. Drive it with ``conn.data_received(statement)`` then
    ``conn.from_server(reply)``, on an event loop."""
    import random

    from admission import Limits, Scheduler
    from proxy.admin import AdminMetrics
    from proxy.gate import AdmissionGate
    from proxy.server import BackendAddress, ClientConnection, ProxyServer
    from proxy.wire import protocol as pg

    def m(kind: bytes, body: bytes = b"") -> bytes:
        return pg.message(kind, body)

    body = struct.pack("!I", pg.PROTOCOL_3_0) + b"user\0postgres\0\0"
    startup = struct.pack("!I", len(body) + 4) + body
    rng = random.Random(1)
    if mode == "simple":
        sql = "SELECT abalance FROM pgbench_accounts WHERE aid = {};"
        statements = [
            m(b"Q", sql.format(rng.randint(1, 1_000_000)).encode() + b"\0") for _ in range(count)
        ]
    else:
        statements = [
            m(b"B", b"\0P0_1\0\0\0\0\x01\0\0\0\x06%06d\0\x01\0\x01" % rng.randint(1, 999_999))
            + m(b"E", b"\0\0\0\0\0")
            + m(b"S")
            for _ in range(count)
        ]
    reply = (
        m(b"2") + m(b"D", b"\0\x01\0\0\0\x041234") + m(b"C", b"SELECT 1\0") + pg.ready_for_query()
    )

    class Backend:
        transport = Discard()

    scheduler = Scheduler(None, "min-q", Limits(mpl=16))
    AdminMetrics(scheduler)
    server = ProxyServer(AdmissionGate(scheduler), BackendAddress("127.0.0.1", 5432))
    conn = ClientConnection(server)
    conn.transport = Discard()  # type: ignore[assignment]
    conn.session.client_data(startup)  # → connect the backend: done by hand below
    backend = Backend()
    conn.backend = backend  # type: ignore[assignment]
    conn._server_write = backend.transport.write  # what connecting does
    conn.from_server(pg.ready_for_query())
    parse = m(b"P", b"P0_1\0SELECT abalance FROM pgbench_accounts WHERE aid = $1\0\0\0")
    conn.data_received(parse + m(b"S"))
    conn.from_server(pg.ready_for_query())
    if scheduler.stats.completed != 0 or conn.session.state.value != "ready":
        raise RuntimeError("the measured session is not in its steady state")
    return conn, statements, reply


def on_event_loop(fn: Callable[[], float]) -> float:
    """Run ``fn`` inside a running event loop (uvloop when installed), as the proxy does."""

    async def run() -> float:
        return fn()

    try:
        import uvloop
    except ImportError:
        return asyncio.run(run())
    return uvloop.run(run())


def logic_cost(mode: str = "prepared", cycles: int = 50_000) -> float:
    """µs per query of this proxy's own work, hot, without sockets (see statement_cycle)."""

    def measure() -> float:
        conn, statements, reply = statement_cycle(mode, cycles)
        scheduler = conn.server.gate.scheduler
        start = time.perf_counter()
        for statement in statements:
            conn.data_received(statement)
            conn.from_server(reply)
        elapsed = time.perf_counter() - start
        if scheduler.stats.completed != cycles or scheduler.in_service:
            raise RuntimeError("the measured queries did not all pass the gate")
        return elapsed / cycles * 1e6

    return on_event_loop(measure)


def cpu_seconds(pids: Sequence[int]) -> tuple[float, float]:
    """User and system CPU seconds used so far by these processes."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11]) / tick
        system += int(fields[12]) / tick
    return user, system


def pids_named(name: str, under: int) -> list[int]:
    """Processes whose executable is ``name`` started by process ``under`` or one of its
    children (pgbouncer runs under runuser when we are root; other pgbouncers are not ours)."""

    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != name:
                continue
            pid = int(entry.name)
            while pid > 1 and pid != under:
                pid = parent(pid)
        except OSError:
            continue
        if pid == under:
            found.append(int(entry.name))
    return found


def install_missing() -> None:
    """PostgreSQL, pgbench and PgBouncer, installed by the test command's own step when one is
    missing (apt-get, as root on Debian/Ubuntu; it says what it does, and nothing otherwise)."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "system-packages"
    env = dict(os.environ, SYSTEM_PACKAGES="postgresql pgbouncer")
    subprocess.run(["bash", str(script)], check=False, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=int, default=10)
    args = parser.parse_args()
    install_missing()
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
        owners = {
            "direct": [],
            "admission": [procs[1].pid],
            "pgbouncer": pids_named("pgbouncer", under=bouncer.pid),
            "naive relay": [procs[2].pid],
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
        cpu: dict[tuple[str, int], dict[str, tuple[float, float]]] = {}
        verdicts: list[tuple[str, bool | None]] = []
        for mode in ("simple", "prepared"):
            for clients in (1, 8):
                samples: dict[str, list[tuple[float, float, float, float]]] = {
                    t: [] for t in targets
                }
                for _ in range(args.rounds):
                    for name, port in targets.items():
                        before = cpu_seconds(owners[name])
                        latency, rate = pgbench(port, mode, clients, args.seconds)
                        after = cpu_seconds(owners[name])
                        statements = rate * args.seconds
                        user = (after[0] - before[0]) / statements * 1e6
                        system = (after[1] - before[1]) / statements * 1e6
                        samples[name].append((latency, rate, user, system))
                lat = {t: statistics.median(s[0] for s in v) for t, v in samples.items()}
                tps = {t: statistics.median(s[1] for s in v) for t, v in samples.items()}
                cpu[mode, clients] = {
                    t: (statistics.median(s[2] for s in v), statistics.median(s[3] for s in v))
                    for t, v in samples.items()
                }
                cells = "".join(f"{lat[t]:9.0f} µs {tps[t]:7.0f}/s" for t in targets)
                # added latency per round (the four runs of a round are minutes apart at most),
                # then the median: a slow drift of the machine cancels out
                ours, theirs = (
                    statistics.median(
                        a[0] - d[0] for a, d in zip(samples[name], samples["direct"], strict=True)
                    )
                    for name in ("admission", "pgbouncer")
                )
                share = tps["admission"] / tps["pgbouncer"]
                shown = f"{ours / theirs:>20.2f}×" if theirs > 0 else f"{'n/a':>21}"
                print(f"{mode:9}{clients:>3}  {cells}{shown}{share:>18.0%}", flush=True)
                if clients == 8:
                    verdicts.append((f"{mode} -c 8: {share:.0%} of PgBouncer's tps", share >= 0.7))
                elif theirs > 0:
                    verdict = f"{mode} -c 1: adds {ours / theirs:.2f}× PgBouncer's"
                    verdicts.append((verdict, ours / theirs <= 2))
                else:  # the machine's noise exceeded what PgBouncer adds: no ratio to judge
                    verdicts.append((f"{mode} -c 1: PgBouncer added nothing measurable", None))
        print(
            "\ntarget (at most 2× the latency PgBouncer adds at -c 1, at least 70% of its "
            "throughput at -c 8): "
            + "; ".join(
                f"{text} — {'met' if ok else 'not judged' if ok is None else 'NOT met'}"
                for text, ok in verdicts
            )
        )
        print("\nCPU per statement of each proxy process, µs (user + system, from /proc):")
        proxies = [t for t in targets if owners[t]]
        print(f"{'mode':9}{'-c':>3}  " + "".join(f"{t:>24}" for t in proxies))
        for (mode, clients), row in cpu.items():
            cells = "".join(
                f"{row[t][0]:9.1f} + {row[t][1]:5.1f} = {sum(row[t]):5.1f}" for t in proxies
            )
            print(f"{mode:9}{clients:>3}  {cells}")
        print(
            f"\nthis proxy's own work per prepared query (session, classification, admission, "
            f"metrics; hot, no sockets): {logic_cost():.1f} µs"
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
