"""A proxy cut off from its coordinator by the kernel: a real network partition.

tests/integration/test_coordinator.py cuts a proxy off with a relay in the test process that
holds bytes; here the proxy runs in a network namespace of its own, wired to the host by two
veth pairs — one (A) for its clients and its backends, one (B) for its coordinator only — and
the partition is the host's end of pair B going down: the kernel then drops the packets of
the coordinator's connections silently (no reset, no answer; a blackhole route keeps the
host's replies from leaving by the default route meanwhile), while clients and backends keep
going over pair A. PostgreSQL (a cluster of the test's own) listens on the host's end of
both pairs.

The proxy's state in /status, and PostgreSQL's count of active statements in
pg_stat_activity (sampled every 10 ms, split by the backends' client address), are the
judges: on its leases for a TTL, then on its fallback budget; the other proxy takes the
units that were its; over-admission while cut off is at most the fallback; back to ``ok``
within seconds of the link coming back up, and to the budget once shares settled.

Needs root and ``ip netns`` (skipped otherwise).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from testing.pgcluster import Cluster, free_port, start_cluster
from tests.integration.test_coordinator import (
    ADMISSION,
    BUDGET,
    TTL,
    Load,
    Proxy,
    Sampler,
    _leased,
    _proxies,
)

FALLBACK = BUDGET // 2  # the default fallback: the budget over the two proxies last seen


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


@dataclass
class Netns:
    """A network namespace and its two veth pairs: ``a`` (clients, backends) and ``b``
    (the coordinator's connections), each a /24 of one /23 of 10.231/16."""

    name: str
    net: str  # the /23 holding both pairs' subnets (the blackhole route, pg_hba)
    host_a: str
    ns_a: str
    host_b: str
    ns_b: str
    link_a: str  # the host's ends
    link_b: str
    subnet_b: str

    def cut(self) -> None:
        _ip("link", "set", self.link_b, "down")

    def heal(self) -> bool:
        """Pair B up again; True when the host's address or route had to be put back."""
        _ip("link", "set", self.link_b, "up")
        repaired = False
        if f"{self.host_b}/24" not in _ip("-4", "addr", "show", "dev", self.link_b):
            _ip("addr", "add", f"{self.host_b}/24", "dev", self.link_b)
            repaired = True
        if self.subnet_b not in _ip("-4", "route", "show", "dev", self.link_b):
            _ip("route", "add", self.subnet_b, "dev", self.link_b, "src", self.host_b)
            repaired = True
        return repaired

    def probe(self, host: str, port: int, timeout: float = 1.0) -> subprocess.Popen[str]:
        """A TCP connect from inside the namespace, in the background; its output is
        ``connected``, ``timeout`` or the error."""
        code = (
            "import socket\n"
            f"s = socket.socket(); s.settimeout({timeout})\n"
            f"try: s.connect(({host!r}, {port})); print('connected')\n"
            "except TimeoutError: print('timeout')\n"
            "except OSError as e: print(repr(e))\n"
        )
        return subprocess.Popen(
            ["ip", "netns", "exec", self.name, sys.executable, "-I", "-S", "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _free_net() -> int:
    """An even third octet k: 10.231.k.0/24 and 10.231.k+1.0/24 unused on this host."""
    used = _ip("-o", "-4", "addr", "show") + _ip("-4", "route", "show", "table", "all")
    start = os.getpid() % 127
    for i in range(127):
        k = 2 * ((start + i) % 127)
        if f"10.231.{k}." not in used and f"10.231.{k + 1}." not in used:
            return k
    pytest.skip("no free /23 in 10.231.0.0/16 for the test's veth pairs")


@contextlib.contextmanager
def _namespace() -> Iterator[Netns]:
    """The namespace and its veth pairs, torn down on the way out whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    k = _free_net()
    tag = str(os.getpid())
    name = f"adm{tag}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"ip netns add failed: {made.stderr.strip()}")
    ns = Netns(
        name=name,
        net=f"10.231.{k}.0/23",
        host_a=f"10.231.{k}.1",
        ns_a=f"10.231.{k}.2",
        host_b=f"10.231.{k + 1}.1",
        ns_b=f"10.231.{k + 1}.2",
        link_a=f"ad{tag}ha",
        link_b=f"ad{tag}hb",
        subnet_b=f"10.231.{k + 1}.0/24",
    )
    blackhole = False
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for link, host, inside, peer in (
            (ns.link_a, ns.host_a, ns.ns_a, f"ad{tag}na"),
            (ns.link_b, ns.host_b, ns.ns_b, f"ad{tag}nb"),
        ):
            _ip("link", "add", link, "type", "veth", "peer", "name", peer, "netns", name)
            _ip("addr", "add", f"{host}/24", "dev", link)
            _ip("link", "set", link, "up")
            _ip("-n", name, "addr", "add", f"{inside}/24", "dev", peer)
            _ip("-n", name, "link", "set", peer, "up")
        # while pair B is down its /24 route is gone from the host: without this, PostgreSQL's
        # retransmissions to the namespace would go out by the default route
        _ip("route", "add", "blackhole", ns.net)
        blackhole = True
        yield ns
    finally:
        # a process left in the namespace would keep it (and its veths) alive
        for pid in _ip("netns", "pids", name, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        if blackhole:
            _ip("route", "del", "blackhole", ns.net, check=False)
        _ip("netns", "del", name, check=False)
        for link in (ns.link_a, ns.link_b):  # gone with the namespace's ends, normally
            if _ip("-o", "link", "show", "dev", link, check=False):
                _ip("link", "del", link, check=False)


@pytest.fixture
def netns() -> Iterator[Netns]:
    with _namespace() as ns:
        yield ns


@pytest.fixture
def cluster(netns: Netns) -> Iterator[Cluster]:
    """A PostgreSQL of the test's own, listening on 127.0.0.1 and the host's end of both pairs
    (the shared cluster listens on 127.0.0.1 only)."""
    pg = start_cluster()
    try:
        with (pg.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {netns.net} trust\n")
        listen = ",".join(["127.0.0.1", netns.host_a, netns.host_b])
        options = (
            f"-p {pg.port} -k {pg.socket_dir} -c listen_addresses={listen} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c max_parallel_workers_per_gather=2"
        )
        pg.restart(options)
        yield pg
    finally:
        pg.stop()


@dataclass
class NsProxy(Proxy):
    """A proxy whose admin API listens beyond loopback (so with a bearer token)."""

    host: str = "127.0.0.1"
    token: str = ""

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = httpx.get(
            f"http://{self.host}:{self.admin}/status",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=5,
            trust_env=False,
        ).json()
        return status


class SplitSampler(Sampler):
    """Sampler's count of active statements, and how many of them came from the namespace
    (the cut-off proxy's backends: client address on pair A)."""

    QUERY = (
        "select count(*), count(*) filter (where client_addr = %s::inet) from pg_stat_activity "
        "where state = 'active' and backend_type = 'client backend' "
        "and pid <> pg_backend_pid() "
        "and application_name not in ('admission-coordinator', 'sampler')"
    )

    def __init__(self, pg: Cluster, ns_addr: str) -> None:
        self.ns_addr = ns_addr
        self.split: list[tuple[float, int]] = []
        super().__init__(pg)

    def _run(self) -> None:
        while not self.stop.is_set():
            row = self.conn.execute(self.QUERY, (self.ns_addr,)).fetchone()
            at = time.monotonic()
            total, inside = (int(row[0]), int(row[1])) if row else (0, 0)
            self.samples.append((at, total))
            self.split.append((at, inside))
            time.sleep(0.01)

    def inside_since(self, t: float) -> list[int]:
        return [n for at, n in self.split if at >= t]


def _start_in(ns: Netns, pg: Cluster, log: Path) -> NsProxy:
    """An ``admission serve`` inside the namespace: clients and backends over pair A, the
    coordinator over pair B; its log in ``log``."""
    port, admin = free_port(), free_port()
    token = secrets.token_hex(16)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *("ip", "netns", "exec", ns.name, ADMISSION, "serve"),
                *("--backend", f"postgresql://{ns.host_a}:{pg.port}"),
                *("--listen", f"{ns.ns_a}:{port}", "--admin", f"{ns.ns_a}:{admin}"),
                *("--admin-token", token, "--insecure"),  # beyond loopback: no TLS here
                *("--mpl", str(BUDGET), "--no-learn", "--policy", "fcfs"),
                *("--coordinator", f"postgresql://postgres@{ns.host_b}:{pg.port}/postgres"),
                *("--lease-ttl", str(TTL)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + 120
    while True:
        try:
            psycopg.connect(
                host=ns.ns_a, port=port, user="postgres", dbname="postgres", connect_timeout=2
            ).close()
            return NsProxy(proc, port, admin, host=ns.ns_a, token=token)
        except psycopg.OperationalError:
            if proc.poll() is not None:
                raise RuntimeError(f"the proxy exited: {log.read_text()[-3000:]}") from None
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"the proxy in {ns.name} never accepted connections") from None
            time.sleep(0.2)


def _stop(proxy: Proxy) -> None:
    if proxy.proc.poll() is None:
        proxy.proc.send_signal(signal.SIGTERM)
    try:
        proxy.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proxy.proc.kill()
        proxy.proc.wait()


def test_a_proxy_partitioned_from_the_coordinator_by_the_kernel_falls_back_then_rejoins(
    netns: Netns, cluster: Cluster, tmp_path: Path
) -> None:
    direct = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    log = tmp_path / "cut-off-proxy.log"
    with _proxies(cluster, 1, direct) as (first,):
        second = _start_in(netns, cluster, log)
        load = Load(hosts={second.port: second.host})
        sampler = SplitSampler(cluster, netns.ns_a)
        report: dict[str, Any] = {}
        try:
            both = [first, second]
            # the coordinator's path is open before the cut
            assert netns.probe(netns.host_b, cluster.port).communicate(timeout=10)[0].strip() == (
                "connected"
            )
            load.start([first.port, second.port], per_proxy=6)
            time.sleep(1.5)  # leases taken, shares settled
            statuses = [p.status()["coordinator"] for p in both]
            assert all(s["state"] == "ok" and s["proxies"] == 2 for s in statuses), statuses
            assert sum(_leased(cluster)) <= BUDGET
            failures = statuses[1]["failures"]

            netns.cut()  # the kernel drops the coordinator's packets from here on
            cut = time.monotonic()
            silent = netns.probe(netns.host_b, cluster.port)  # a SYN into the partition
            open_a = netns.probe(netns.host_a, cluster.port)  # pair A still carries traffic
            states: list[tuple[float, dict[str, Any]]] = []
            while time.monotonic() - cut < TTL + 2.5:
                states.append((time.monotonic() - cut, second.status()["coordinator"]))
                time.sleep(0.1)
            done_then = load.done.get(second.port, 0)
            report["unreachable_after"] = next(
                (round(t, 2) for t, s in states if s["state"] == "unreachable"), None
            )
            report["fallback_after"] = next(
                (round(t, 2) for t, s in states if s["state"] == "fallback"), None
            )
            report["first_failure_after"] = next(
                (round(t, 2) for t, s in states if s["failures"] > failures), None
            )
            report["last_error"] = states[-1][1]["last_error"]
            report["failures"] = states[-1][1]["failures"]
            assert silent.communicate(timeout=10)[0].strip() == "timeout"
            assert open_a.communicate(timeout=10)[0].strip() == "connected"
            early = [s for t, s in states if t < TTL * 0.4]
            late = [s for t, s in states if t > TTL + 1.0]
            assert all(s["state"] in ("ok", "unreachable") for s in early), early
            assert late and all(s["state"] == "fallback" for s in late), (late[-1], report)
            assert late[-1]["local_mpl"] == late[-1]["fallback_mpl"] == FALLBACK
            fell_back = cut + (report["fallback_after"] or TTL)
            # the first proxy saw the second's lease expire and took what was free
            first_status = first.status()["coordinator"]
            assert first_status["state"] == "ok" and first_status["proxies"] == 1, first_status
            assert first_status["held"] == BUDGET, first_status  # its demand is over the budget
            # over-admission while cut off: at most the fallback beyond the budget; the cut-off
            # proxy never beyond its fallback once on it, and still serving its clients
            while_cut = sampler.since(cut)
            report["max_active_cut"] = max(while_cut)
            assert max(while_cut) <= BUDGET + FALLBACK, sorted(while_cut)[-10:]
            inside = sampler.inside_since(fell_back + 0.1)
            report["max_active_cut_off_proxy"] = max(inside)
            assert max(inside) <= FALLBACK, sorted(inside)[-10:]
            time.sleep(0.5)
            assert load.done.get(second.port, 0) > done_then  # its clients are still served

            report["route_repaired"] = netns.heal()
            healed = time.monotonic()
            back = None
            while time.monotonic() - healed < 15:  # measured up to 15 s, asserted below
                if second.status()["coordinator"]["state"] == "ok":
                    back = time.monotonic() - healed
                    break
                time.sleep(0.05)
            report["ok_after_heal"] = None if back is None else round(back, 2)
            assert back is not None and back <= 5.0, (report, log.read_text()[-3000:])
            time.sleep(2.0)  # statements admitted on the fallback finish; shares settle
            settled = time.monotonic()
            time.sleep(2.0)
            after = sampler.since(settled)
            report["max_active_settled"] = max(after)
            assert max(after) <= BUDGET, sorted(after)[-10:]
            assert sum(_leased(cluster)) <= BUDGET, _leased(cluster)
            statuses = [p.status()["coordinator"] for p in both]
            assert all(s["state"] == "ok" and s["proxies"] == 2 for s in statuses), statuses
        finally:
            load.finish()
            sampler.close()
            _stop(second)
            print("partition:", report, "\ncut-off proxy's log:\n", log.read_text()[-2000:])
        assert not load.errors, load.errors[:3]
