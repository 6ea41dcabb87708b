"""Bounded everything: a connection that never finishes its startup is closed after the
startup timeout (both front ends), and a client that sends faster than it reads makes the
embedded server stop reading it instead of buffering without bound."""

from __future__ import annotations

import contextlib
import gc
import socket
import struct
import time
import weakref
from collections.abc import Callable

import pytest

from admission import Limits
from proxy.backends.embedded import Users
from proxy.backends.embedded.server import INBOX_LIMIT
from testing.embeddedharness import Embedded
from testing.proxyharness import ProxyHarness


def startup_packet(user: str = "app", dbname: str = "app") -> bytes:
    body = struct.pack("!i", 196608) + f"user\0{user}\0database\0{dbname}\0\0".encode()
    return struct.pack("!i", len(body) + 4) + body


def read_until_closed(s: socket.socket, limit: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    start = time.monotonic()
    s.settimeout(limit)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data, time.monotonic() - start


@pytest.mark.parametrize("sends", [b"", startup_packet()[:6]], ids=["nothing", "half a startup"])
def test_relay_closes_a_startup_that_stalls(
    make_proxy: Callable[..., ProxyHarness], sends: bytes
) -> None:
    proxy = make_proxy()
    proxy.server.startup_timeout = 0.5
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(sends)
        data, took = read_until_closed(s)
    assert b"08P01" in data and b"did not finish within 0.5 s" in data
    assert 0.4 < took < 5
    assert proxy.call(lambda: len(proxy.server.connections)) == 0


def test_relay_keeps_a_client_that_finished_its_startup(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy()
    proxy.server.startup_timeout = 0.5
    import psycopg

    with psycopg.connect(
        proxy.dsn_base + " user=postgres dbname=postgres", autocommit=True
    ) as conn:
        time.sleep(1.0)
        assert conn.execute("select 1").fetchone() == (1,)


@pytest.mark.parametrize("stage", ["nothing", "startup sent, no password"])
def test_embedded_closes_a_startup_that_stalls(stage: str) -> None:
    e = Embedded(Limits(), users=Users.from_password("pw"))
    e.server.startup_timeout = 0.5
    try:
        with socket.create_connection(("127.0.0.1", e.port)) as s:
            if stage != "nothing":
                s.sendall(startup_packet())
            data, took = read_until_closed(s)
        assert b"08P01" in data and b"did not finish within 0.5 s" in data
        assert 0.4 < took < 5
        with e.connect_as("app", "pw") as conn:  # others still get in, and stay in
            time.sleep(1.0)
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        e.close()


def test_embedded_stops_reading_a_client_that_does_not_read() -> None:
    """Thousands of pipelined queries from a client that reads no reply: the server holds at
    most about INBOX_LIMIT bytes of them (and its replies wait in the socket), then answers
    every one once the client reads."""
    e = Embedded(Limits(mpl=1))
    try:
        # big queries and bigger replies: the kernel's socket buffers (a few MB) fill fast
        query = b"select repeat('y', 5000) /* " + b"x" * 4000 + b" */\0"
        message = b"Q" + struct.pack("!i", len(query) + 4) + query
        count = 8_000  # ~32 MB of queries, ~40 MB of replies
        with socket.create_connection(("127.0.0.1", e.port)) as s:
            s.sendall(startup_packet())
            s.settimeout(10)
            greeting = b""
            while not greeting.endswith(b"Z\0\0\0\x05I"):
                greeting += s.recv(4096)
            s.setblocking(False)
            payload = memoryview(message * count)
            sent, peak, progress = 0, 0, time.monotonic()
            while sent < len(payload) and time.monotonic() - progress < 1.5:
                try:
                    sent += s.send(payload[sent : sent + 65536])
                    progress = time.monotonic()
                except BlockingIOError:
                    time.sleep(0.05)  # the proxy stopped reading us, as it should
                peak = max(peak, e.call(lambda: max(c.inbox_bytes for c in e.server.connections)))
            assert sent < len(payload), "the proxy took everything without being read"
            # what one read from the socket brings is queued before reading pauses
            assert peak <= INBOX_LIMIT + 256 * 1024 + len(message)
            # now read: every query is answered, in order
            s.setblocking(True)
            s.settimeout(30)
            ready = b"Z\0\0\0\x05I"
            tail, answered = b"", 0
            while answered < count:
                if sent < len(payload):
                    s.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        sent += s.send(payload[sent : sent + 65536])
                    s.setblocking(True)
                    s.settimeout(30)
                chunk = tail + s.recv(1 << 20)
                answered += chunk.count(ready)
                tail = chunk[-(len(ready) - 1) :]  # a marker cut in two is counted once
            assert answered == count and sent == len(payload)
    finally:
        e.close()


def test_embedded_streams_a_long_result_whole() -> None:
    """A result longer than a chunk is sent a chunk at a time (what keeps a slow reader's
    memory bounded, ``benchmarks.slow_reader``), and arrives whole, in order, with its tag —
    simple protocol, extended protocol, and a portal read with a row limit (asyncpg's cursor)."""
    import asyncio

    import asyncpg

    from proxy.backends.embedded.executor import CHUNK_ROWS

    n = 2 * CHUNK_ROWS + 7
    e = Embedded(Limits(mpl=2))
    try:
        with e.connect() as conn:
            cur = conn.execute(f"select x, x::text from range({n}) t(x)")
            rows = cur.fetchall()
            assert cur.statusmessage == f"SELECT {n}"
            assert rows[0] == (0, "0") and rows[-1] == (n - 1, str(n - 1)) and len(rows) == n
            cur = conn.execute(f"select x from range({n}) t(x) where x >= %s", (3,))
            assert len(cur.fetchall()) == n - 3 and cur.statusmessage == f"SELECT {n - 3}"

        async def with_asyncpg() -> tuple[int, int]:
            client = await asyncpg.connect(
                host="127.0.0.1", port=e.port, user="app", database="app"
            )
            try:
                fetched = len(await client.fetch(f"select x from range({n}) t(x)"))
                async with client.transaction():
                    cursor = client.cursor(f"select x from range({n}) t(x)", prefetch=5000)
                    counted = [r async for r in cursor]
                return fetched, len(counted)
            finally:
                await client.close()

        assert asyncio.run(with_asyncpg()) == (n, n)
        assert e.call(lambda: e.scheduler.in_service) == 0
    finally:
        e.close()


def test_relay_stops_reading_a_client_whose_statements_wait(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    """A client pipelines 30 MB of statements behind one that waits for admission: the relay
    holds at most about HOLD_LIMIT of them and stops reading the client (it held all 30 MB),
    then forwards every one once they are admitted."""
    import threading

    import psycopg

    from proxy.server import HOLD_LIMIT

    proxy = make_proxy(limits=Limits(mpl=1))
    dsn = proxy.dsn_base + " user=postgres dbname=postgres"
    blocker = threading.Thread(
        target=lambda: psycopg.connect(dsn, autocommit=True).execute("select pg_sleep(3)")
    )
    blocker.start()
    wait = time.monotonic() + 10
    while proxy.state()["in_service"] < 1 and time.monotonic() < wait:
        time.sleep(0.05)
    query = b"select 1 /* " + b"x" * 4000 + b" */\0"
    message = b"Q" + struct.pack("!i", len(query) + 4) + query
    count = 7_500  # ~30 MB
    payload = memoryview(message * count)
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(startup_packet("postgres", "postgres"))
        s.settimeout(10)
        greeting = b""
        while not greeting.endswith(b"Z\0\0\0\x05I"):
            greeting += s.recv(4096)
        s.setblocking(False)
        sent, peak, progress = 0, 0, time.monotonic()
        while sent < len(payload) and time.monotonic() - progress < 1.0:
            try:
                sent += s.send(payload[sent : sent + 65536])
                progress = time.monotonic()
            except BlockingIOError:
                time.sleep(0.05)
            peak = max(
                peak,
                proxy.call(lambda: max(c.session.held_bytes for c in proxy.server.connections)),
            )
        assert sent < len(payload), "the relay took everything while the statements waited"
        assert peak <= HOLD_LIMIT + 256 * 1024 + len(message)
        ready = b"Z\0\0\0\x05I"
        tail, answered = b"", 0
        s.setblocking(True)
        s.settimeout(30)
        while answered < count:
            if sent < len(payload):
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sent += s.send(payload[sent : sent + 65536])
                s.setblocking(True)
                s.settimeout(30)
            chunk = tail + s.recv(1 << 20)
            answered += chunk.count(ready)
            tail = chunk[-(len(ready) - 1) :]
        assert answered == count and sent == len(payload)
    blocker.join(15)
    proxy.wait_idle()


BIG = 3 << 20  # bytes: three times the relay's hold limit and the embedded inbox limit


def _big_statements(conn: object, slow_sql: str) -> None:
    """A statement larger than the limits on held bytes, alone and pipelined behind one that
    runs: the pause for held bytes must not wait for a message that can only complete if it
    is read."""
    import psycopg

    assert isinstance(conn, psycopg.Connection)
    big = "x" * BIG
    assert conn.execute(f"select length('{big}')").fetchone() == (BIG,)
    assert conn.execute("select length(%s)", (big,)).fetchone() == (BIG,)
    with conn.pipeline():
        slow = conn.execute(slow_sql)
        many = [conn.execute("select length(%s)", ("y" * 512,)) for _ in range(8_000)]
        large = conn.execute("select length(%s)", (big,))
    slow.fetchall()
    assert all(c.fetchone() == (512,) for c in many)
    assert large.fetchone() == (BIG,)


def test_relay_reads_a_statement_larger_than_its_hold_limit(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    import psycopg

    proxy = make_proxy(limits=Limits(mpl=1))
    with psycopg.connect(
        proxy.dsn_base + " user=postgres dbname=postgres", autocommit=True, connect_timeout=5
    ) as conn:
        conn.execute("set statement_timeout = '30s'")
        _big_statements(conn, "select pg_sleep(0.3)")
    assert proxy.call(lambda: proxy.server.gate.scheduler.in_service) == 0


def test_embedded_reads_a_statement_larger_than_its_inbox_limit() -> None:
    assert BIG > INBOX_LIMIT
    e = Embedded(Limits(mpl=1))
    try:
        with e.connect() as conn:
            _big_statements(conn, "select count(*) from range(30000000)")
    finally:
        e.close()


def _session_then_close(connect: Callable[[], object]) -> None:
    """A session that runs, fails, prepares and leaves a transaction open, then goes."""
    import psycopg

    conn = connect()
    assert isinstance(conn, psycopg.Connection)
    conn.execute("select 1")
    with contextlib.suppress(psycopg.Error):
        conn.execute("select * from no_such_table")
    conn.execute("select %s::int", (1,), prepare=True)
    conn.execute("begin")
    conn.execute("select 2")
    conn.close()


def _freed(refs: list[weakref.ref[object]], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(r() is None for r in refs)


def test_a_closed_relay_connection_is_freed_without_the_garbage_collector(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    """No reference cycle between a client connection and its server connection: with ten
    thousand clients coming and going, the memory comes back when they go."""
    import psycopg

    proxy = make_proxy(limits=Limits(mpl=2))
    gc.collect()
    gc.disable()
    try:
        refs: list[weakref.ref[object]] = []

        def connect() -> psycopg.Connection:
            conn = psycopg.connect(
                proxy.dsn_base + " user=postgres dbname=postgres", autocommit=True
            )
            conn.execute("select 0")
            refs.extend(
                proxy.call(
                    lambda: [
                        weakref.ref(o) for c in proxy.server.connections for o in (c, c.backend)
                    ]
                )
            )
            return conn

        _session_then_close(connect)
        assert refs and _freed(refs)
    finally:
        gc.enable()


def test_a_closed_embedded_connection_is_freed_without_the_garbage_collector() -> None:
    e = Embedded(Limits(mpl=2))
    gc.collect()
    gc.disable()
    try:
        refs: list[weakref.ref[object]] = []

        def connect() -> object:
            conn = e.connect()
            conn.execute("select 0")
            refs.extend(
                e.call(
                    lambda: [weakref.ref(o) for c in e.server.connections for o in (c, c.session)]
                )
            )
            return conn

        _session_then_close(connect)
        assert refs and _freed(refs)
    finally:
        gc.enable()
        e.close()


def _ready_socket(port: int, user: str, dbname: str) -> socket.socket:
    """A raw connection past its startup (trust authentication), ready for queries."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(startup_packet(user, dbname))
    s.settimeout(10)
    greeting = b""
    while not greeting.endswith(b"Z\0\0\0\x05I"):
        chunk = s.recv(4096)
        assert chunk, f"closed during startup: {greeting!r}"
        greeting += chunk
    return s


def _query_message(length: int) -> bytes:
    """A Query of ``length`` bytes in all: ``select length('xx…')``."""
    head = b"select length('"
    tail = b"')\0"
    fill = length - 5 - len(head) - len(tail)
    body = head + b"x" * fill + tail
    return b"Q" + struct.pack("!i", len(body) + 4) + body


def _total_cap(port: int, user: str, dbname: str, books: Callable[[], tuple[int, int]]) -> None:
    """Over the total, the client sending a large message with nothing in flight is refused
    (53200) and others go on; the total comes back to 0."""
    limit = 1 << 20
    first = _query_message(800_000)
    second = _query_message(2_000_000)
    with _ready_socket(port, user, dbname) as a, _ready_socket(port, user, dbname) as b:
        a.sendall(first[:700_000])
        time.sleep(0.3)
        b.settimeout(10)
        with contextlib.suppress(OSError):  # (the proxy may close before all is sent)
            b.sendall(second[:400_000])
        refused = b""
        with contextlib.suppress(OSError):
            while chunk := b.recv(65536):
                refused += chunk
        assert b"53200" in refused and b"out of memory" in refused
        a.sendall(first[700_000:])
        answer = b""
        while not answer.endswith(b"Z\0\0\0\x05I"):
            chunk = a.recv(65536)
            assert chunk, "the client that stayed under the total was closed"
            answer += chunk
        assert b"799" in answer  # length('xx…'): 800,000 less the message's frame and SQL
        total, refused_count = books()
        assert refused_count == 1 and total == 0 and limit


def test_relay_refuses_a_large_message_over_the_total(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy()
    proxy.call(lambda: setattr(proxy.server.buffers, "limit", 1 << 20))

    def books() -> tuple[int, int]:
        time.sleep(0.2)
        return proxy.call(lambda: (proxy.server.buffers.total, proxy.server.buffers.refused))

    _total_cap(proxy.port, "postgres", "postgres", books)


def test_embedded_refuses_a_large_message_over_the_total() -> None:
    e = Embedded(Limits())
    try:
        e.call(lambda: setattr(e.server.buffers, "limit", 1 << 20))

        def books() -> tuple[int, int]:
            time.sleep(0.2)
            return e.call(lambda: (e.server.buffers.total, e.server.buffers.refused))

        _total_cap(e.port, "app", "app", books)
    finally:
        e.close()


def test_relay_pauses_clients_over_the_total_and_serves_them_all(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    """Clients pipelining statements behind queued ones, together over the total: they are
    paused, not refused, and every statement is answered once the queue moves."""
    import threading

    import psycopg

    proxy = make_proxy(limits=Limits(mpl=1))
    proxy.call(lambda: setattr(proxy.server.buffers, "limit", 1 << 20))
    dsn = proxy.dsn_base + " user=postgres dbname=postgres"
    results: list[object] = []
    peak = [0]

    def pipeline() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn, conn.pipeline():
            cursors = [conn.execute("select length(%s)", ("z" * 500,)) for _ in range(1_500)]
        results.append(all(c.fetchone() == (500,) for c in cursors))

    with psycopg.connect(dsn, autocommit=True) as blocker:
        started = threading.Thread(target=blocker.execute, args=("select pg_sleep(1.5)",))
        started.start()
        time.sleep(0.3)
        clients = [threading.Thread(target=pipeline) for _ in range(3)]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            peak[0] = max(peak[0], proxy.call(lambda: proxy.server.buffers.total))
            time.sleep(0.02)
        for t in clients:
            t.join(60)
        started.join(10)
    assert results == [True, True, True]
    # reading pauses once over: what one read brings can pass the limit, no more
    assert peak[0] <= (1 << 20) + 3 * 256 * 1024
    assert proxy.call(lambda: (proxy.server.buffers.total, proxy.server.buffers.refused)) == (0, 0)


def test_relay_counts_a_single_waiting_statement_against_the_total(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    """A Query that arrives whole in one read and waits for admission (the relay's fast path)
    is held like any batch: the total sees it, and gives it back once it has run."""
    import threading

    import psycopg

    proxy = make_proxy(limits=Limits(mpl=1))
    dsn = proxy.dsn_base + " user=postgres dbname=postgres"
    with psycopg.connect(dsn, autocommit=True) as blocker:
        started = threading.Thread(target=blocker.execute, args=("select pg_sleep(1)",))
        started.start()
        time.sleep(0.3)
        sockets = [_ready_socket(proxy.port, "postgres", "postgres") for _ in range(3)]
        try:
            for s in sockets:
                s.sendall(_query_message(20_000))
            time.sleep(0.3)
            total = proxy.call(lambda: proxy.server.buffers.total)
            assert total >= 3 * 20_000, total  # all three wait, all three counted
            started.join(10)
            for s in sockets:
                answer = b""
                while not answer.endswith(b"Z\0\0\0\x05I"):
                    chunk = s.recv(65536)
                    assert chunk, "closed before its answer"
                    answer += chunk
        finally:
            for s in sockets:
                s.close()
    time.sleep(0.2)
    assert proxy.call(lambda: proxy.server.buffers.total) == 0
