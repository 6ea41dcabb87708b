"""Admission end to end, and faults: after each, capacity in use returns to 0 and other clients
are unaffected."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest

from admission import ClassProfile, EtaModel, Limits
from testing.pgcluster import Cluster, free_port
from testing.proxyharness import ProxyHarness

MakeProxy = Callable[..., ProxyHarness]


def connect(proxy: ProxyHarness, **kw: object) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1", port=proxy.port, user="postgres", dbname="postgres", autocommit=True, **kw
    )  # type: ignore[arg-type]


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:
            result.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def sleeping(pg: Cluster, marker: str) -> int:
    return int(
        pg.psql(
            "select count(*) from pg_stat_activity where state = 'active' "
            f"and query like '%{marker}%' and pid <> pg_backend_pid()"
        )
        or 0
    )


def still_works(proxy: ProxyHarness) -> None:
    with connect(proxy) as conn:
        assert conn.execute("select 'ok'").fetchone() == ("ok",)


# -- admission -----------------------------------------------------------------------------


def test_mpl_bounds_statements_running_on_the_server(make_proxy: MakeProxy, pg: Cluster) -> None:
    proxy = make_proxy(limits=Limits(mpl=2))
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            while not stop.is_set():
                (n,) = direct.execute(
                    "select count(*) from pg_stat_activity where state = 'active' "
                    "and query like '%mpl_probe%' and pid <> pg_backend_pid()"
                ).fetchone()  # type: ignore[misc]
                peak = max(peak, n)
                time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    classes = ["a", "b"]
    workers = [
        in_thread(
            lambda c=classes[i % 2]: (
                connect(proxy)
                .execute(f"/* admission:class={c} */ select pg_sleep(0.3), 'mpl_probe'")
                .fetchone()
            )
        )
        for i in range(6)
    ]
    for thread, _ in workers:
        thread.join(30)
    stop.set()
    watcher.join()
    assert all(not isinstance(r[0], BaseException) for _, r in workers)
    assert peak == 2, peak
    assert len(proxy.grants()) == 6
    proxy.wait_idle()


def test_grant_order_follows_the_policy(make_proxy: MakeProxy) -> None:
    model = EtaModel(
        classes=(
            ClassProfile(fingerprint="hint:blocker", name="blocker", D=1.0, f=1),
            ClassProfile(fingerprint="hint:long", name="long", D=9.0, f=1),
            ClassProfile(fingerprint="hint:short", name="short", D=0.1, f=1),
        )
    )
    proxy = make_proxy(policy="sept", limits=Limits(mpl=1), model=model)
    blocker = in_thread(
        lambda: (
            connect(proxy).execute("/* admission:class=blocker */ select pg_sleep(0.6)").fetchone()
        )
    )
    wait_for(lambda: proxy.state()["in_service"] == 1)
    order = ["long", "long", "short", "long", "short"]
    threads = []
    for i, name in enumerate(order):
        threads.append(
            in_thread(
                lambda n=name: (
                    connect(proxy).execute(f"/* admission:class={n} */ select 1").fetchone()
                )
            )
        )
        wait_for(lambda k=i: proxy.state()["queued"] == k + 1)
    for thread, _ in [blocker, *threads]:
        thread.join(30)
    assert proxy.grants() == ["blocker", "short", "short", "long", "long", "long"]
    proxy.wait_idle()


def test_transactions_and_session_control_bypass_a_full_queue(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(limits=Limits(mpl=1))
    blocker = in_thread(lambda: connect(proxy).execute("select pg_sleep(1.0)").fetchone())
    wait_for(lambda: proxy.state()["in_service"] == 1)
    start = time.monotonic()
    with psycopg.connect(
        host="127.0.0.1", port=proxy.port, user="postgres", dbname="postgres"
    ) as conn:
        conn.execute("SET application_name = 'bypass'")
        assert conn.execute("SHOW application_name").fetchone() == ("bypass",)
        with conn.transaction():
            assert conn.execute("select 7").fetchone() == (7,)  # inside BEGIN … COMMIT
    assert time.monotonic() - start < 0.8, "a bypass statement waited for the blocker"
    blocker[0].join(10)
    proxy.wait_idle()
    still_works(proxy)


# -- faults --------------------------------------------------------------------------------


def _psql(proxy: ProxyHarness, sql: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["psql", f"{proxy.dsn_base} user=postgres dbname=postgres", "-X", "-c", sql],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_client_killed_while_queued(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(limits=Limits(mpl=1))
    blocker = in_thread(lambda: connect(proxy).execute("select pg_sleep(0.8)").fetchone())
    wait_for(lambda: proxy.state()["in_service"] == 1)
    victim = _psql(proxy, "select 'never runs'")
    wait_for(lambda: proxy.state()["queued"] == 1)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    wait_for(lambda: proxy.state()["queued"] == 0)
    assert proxy.state()["in_service"] == 1  # the blocker is unaffected
    blocker[0].join(10)
    assert (
        blocker[1] == [(None,)]
        or blocker[1][0] == ("",)
        or not isinstance(blocker[1][0], BaseException)
    )
    proxy.wait_idle()
    still_works(proxy)


def test_client_killed_while_running_cancels_the_statement(
    make_proxy: MakeProxy, pg: Cluster
) -> None:
    proxy = make_proxy(limits=Limits(mpl=1))
    victim = _psql(proxy, "select pg_sleep(30), 'killed_client'")
    wait_for(lambda: sleeping(pg, "killed_client") == 1)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    proxy.wait_idle()
    wait_for(lambda: sleeping(pg, "killed_client") == 0)  # the proxy cancelled it on the server
    still_works(proxy)


def test_backend_killed_mid_query(make_proxy: MakeProxy, pg: Cluster) -> None:
    proxy = make_proxy(limits=Limits(mpl=2))
    thread, result = in_thread(
        lambda: connect(proxy).execute("select pg_sleep(30), 'terminated_backend'").fetchone()
    )
    wait_for(lambda: sleeping(pg, "terminated_backend") == 1)
    pg.psql(
        "select pg_terminate_backend(pid) from pg_stat_activity "
        "where query like '%terminated_backend%' and pid <> pg_backend_pid()"
    )
    thread.join(10)
    assert isinstance(result[0], psycopg.OperationalError), result
    proxy.wait_idle()
    still_works(proxy)


def test_cancel_while_queued_answers_57014(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(limits=Limits(mpl=1))
    blocker = in_thread(lambda: connect(proxy).execute("select pg_sleep(0.8)").fetchone())
    wait_for(lambda: proxy.state()["in_service"] == 1)
    conn = connect(proxy)
    thread, result = in_thread(lambda: conn.execute("select 'queued'").fetchone())
    wait_for(lambda: proxy.state()["queued"] == 1)
    conn.cancel_safe()  # the legacy cancel() blocks holding the GIL; the proxy runs in-process
    thread.join(10)
    assert isinstance(result[0], psycopg.errors.QueryCanceled), result
    assert result[0].sqlstate == "57014"
    assert proxy.state()["queued"] == 0 and proxy.state()["in_service"] == 1
    blocker[0].join(10)
    assert conn.execute("select 'usable after cancel'").fetchone() == ("usable after cancel",)
    conn.close()
    proxy.wait_idle()


def test_cancel_while_running_reaches_the_server(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(limits=Limits(mpl=1))
    conn = connect(proxy)
    thread, result = in_thread(lambda: conn.execute("select pg_sleep(30)").fetchone())
    wait_for(lambda: proxy.state()["in_service"] == 1)
    time.sleep(0.2)
    conn.cancel_safe()  # the legacy cancel() blocks holding the GIL; the proxy runs in-process
    thread.join(10)
    assert isinstance(result[0], psycopg.errors.QueryCanceled), result
    assert "user request" in str(result[0])
    assert conn.execute("select 1").fetchone() == (1,)
    conn.close()
    proxy.wait_idle()


def test_queue_timeout(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(limits=Limits(mpl=1, queue_timeout=0.3))
    blocker = in_thread(lambda: connect(proxy).execute("select pg_sleep(1.0)").fetchone())
    wait_for(lambda: proxy.state()["in_service"] == 1)
    with connect(proxy) as conn:
        start = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled, match="queue timeout") as err:
            conn.execute("select 'too late'")
        assert 0.25 < time.monotonic() - start < 0.9
        assert err.value.sqlstate == "57014"
        blocker[0].join(10)
        assert conn.execute("select 'usable'").fetchone() == ("usable",)
    proxy.wait_idle()


def test_queue_full_answers_53300(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(limits=Limits(mpl=1), max_queue=1)
    blocker = in_thread(lambda: connect(proxy).execute("select pg_sleep(0.8)").fetchone())
    wait_for(lambda: proxy.state()["in_service"] == 1)
    queued = in_thread(lambda: connect(proxy).execute("select 'waits'").fetchone())
    wait_for(lambda: proxy.state()["queued"] == 1)
    with connect(proxy) as conn:
        with pytest.raises(psycopg.Error) as err:
            conn.execute("select 'refused'")
        assert err.value.sqlstate == "53300"
        assert "queue limit 1" in str(err.value)
    for thread, _ in (blocker, queued):
        thread.join(10)
    assert queued[1] == [("waits",)]
    proxy.wait_idle()
    still_works(proxy)


def _raw_session(port: int) -> socket.socket:
    """A raw connection that completed startup (trust auth) and read up to ReadyForQuery."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = struct.pack("!I", 196608) + b"user\0postgres\0database\0postgres\0\0"
    sock.sendall(struct.pack("!I", len(body) + 4) + body)
    data = b""
    while b"Z\0\0\0\x05" not in data:
        chunk = sock.recv(65536)
        assert chunk, "server closed during startup"
        data += chunk
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize(
    "payload",
    [
        b"Y\0\0\0\x04",  # unknown message type
        b"Q\0\0\0\x01",  # length below 4
        b"p\0\0\0\x08abcd",  # a password message after authentication
    ],
    ids=["unknown-type", "bad-length", "out-of-place"],
)
def test_malformed_messages_close_only_that_client(proxy: ProxyHarness, payload: bytes) -> None:
    other = connect(proxy)
    sock = _raw_session(proxy.port)
    sock.sendall(payload)
    reply = _read_all(sock)
    sock.close()
    assert reply.startswith(b"E") and b"C08P01" in reply, reply
    assert other.execute("select 'unaffected'").fetchone() == ("unaffected",)
    other.close()
    proxy.wait_idle()


def test_truncated_message_then_disconnect(proxy: ProxyHarness) -> None:
    sock = _raw_session(proxy.port)
    sock.sendall(b"Q\0\0\0\x40select")  # promises 64 bytes, sends 10
    sock.close()
    proxy.wait_idle()
    still_works(proxy)


def test_oversized_message_is_refused(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(max_message=4096)
    with connect(proxy) as conn, pytest.raises(psycopg.OperationalError):
        conn.execute("select '" + "x" * 10_000 + "'")
    proxy.wait_idle()
    still_works(proxy)


def test_garbage_startup_packet(proxy: ProxyHarness) -> None:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(struct.pack("!II", 8, 12345678))  # an unknown protocol version
    reply = _read_all(sock)
    sock.close()
    assert b"C08P01" in reply and b"unsupported protocol version" in reply
    proxy.wait_idle()


def test_100_mb_result_streams_through(proxy: ProxyHarness) -> None:
    with connect(proxy) as conn, conn.cursor() as cur:
        total = 0
        rows = 0
        for (value,) in cur.stream("select repeat('x', 1000) from generate_series(1, 100000)"):
            total += len(value)
            rows += 1
        assert (rows, total) == (100_000, 100_000_000)
    proxy.wait_idle()
    still_works(proxy)


def test_backend_unreachable_gives_a_clear_error(pg: Cluster) -> None:
    harness = ProxyHarness(free_port())
    try:
        with pytest.raises(psycopg.OperationalError, match="cannot connect to the database"):
            psycopg.connect(host="127.0.0.1", port=harness.port, user="postgres", dbname="postgres")
        harness.wait_idle()
    finally:
        harness.close()


def test_cli_serve_end_to_end(pg: Cluster, tmp_path: Path) -> None:
    """The real command: environment variables, SIGTERM shutdown, psql through it."""
    port, admin_port = free_port(), free_port()
    env = {
        **os.environ,
        "ADMISSION_MPL": "2",
        "ADMISSION_POLICY": "min-q",
        "ADMISSION_ADMIN": f"127.0.0.1:{admin_port}",
    }
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("admission")),
            "serve",
            "--backend",
            pg.url,
            "--listen",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: _port_open(port), timeout=20)
        result = subprocess.run(
            [
                "psql",
                f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                "-X",
                "-A",
                "-t",
                "-c",
                "select 6 * 7",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.stdout.strip() == "42", result.stderr
        wait_for(lambda: _port_open(admin_port), timeout=20)
        status = httpx.get(f"http://127.0.0.1:{admin_port}/status").json()
        assert status["policy"] == "min-q" and status["limits"]["mpl"] == 2
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=20)
    assert server.returncode == 0, output
    assert "policy=min-q" in output and "mpl=2" in output


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("queued", [True, False], ids=["queued", "running"])
def test_psql_ctrl_c_cancels(make_proxy: MakeProxy, queued: bool) -> None:
    """psql sends a classic CancelRequest (PQcancel) from its own process on SIGINT."""
    proxy = make_proxy(limits=Limits(mpl=1))
    blocker = None
    if queued:
        blocker = in_thread(lambda: connect(proxy).execute("select pg_sleep(1.5)").fetchone())
        wait_for(lambda: proxy.state()["in_service"] == 1)
    victim = subprocess.Popen(
        [
            "psql",
            f"{proxy.dsn_base} user=postgres dbname=postgres",
            "-X",
            "-c",
            "select pg_sleep(30)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: proxy.state()["queued" if queued else "in_service"] == 1)
    time.sleep(0.2)
    victim.send_signal(signal.SIGINT)
    _, err = victim.communicate(timeout=15)
    assert "canceling statement due to user request" in err
    if blocker is not None:
        blocker[0].join(10)
    proxy.wait_idle()
    still_works(proxy)
