"""The embedded DuckDB backend (work in progress): the proxy answers the protocol itself.

What works and is checked here: psql, psycopg (autocommit, parameters, errors with
SQLSTATEs) and the admission gate in front of DuckDB statements. Not yet: savepoints (psycopg's
nested transaction()), binary results (asyncpg), and the catalog functions psql's \\d needs.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest

from admission import Limits, Scheduler
from proxy.backends.embedded import DuckDBBackend, EmbeddedServer
from proxy.gate import AdmissionGate


class Embedded:
    def __init__(self, limits: Limits) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _l, ctx: self.errors.append(ctx))
        self.backend = DuckDBBackend(workers=4)
        self.backend.connection.execute(
            "create table items (id integer primary key, name varchar, price decimal(10,2), "
            "added date)"
        )
        self.backend.connection.execute(
            "insert into items values (1, 'tea', 3.50, '2024-01-02'), (2, 'cake', null, null)"
        )
        self.scheduler = Scheduler(None, "fcfs", limits)
        self.server = EmbeddedServer(AdmissionGate(self.scheduler), self.backend)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(lambda: self.server.start("127.0.0.1", 0))
        self.port = self.server.port

    def call(self, fn: Any) -> Any:
        async def runner() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        future: Future[Any] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return future.result(timeout=30)

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="app", dbname="app", autocommit=True
        )

    def close(self) -> None:
        self.call(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.backend.close()
        assert not self.errors, self.errors


@pytest.fixture
def embedded() -> Iterator[Embedded]:
    server = Embedded(Limits(mpl=2))
    yield server
    server.close()


def test_psql_through_the_embedded_backend(embedded: Embedded) -> None:
    out = subprocess.run(
        [
            "psql",
            f"host=127.0.0.1 port={embedded.port} user=app dbname=app",
            "-X",
            "-A",
            "-t",
            "-c",
            "select id, name, price from items order by id",
            "-c",
            "select count(*) from nope",
            "-c",
            "select 'after the error'",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.splitlines() == ["1|tea|3.50", "2|cake|", "after the error"]
    assert "Table with name nope does not exist" in out.stderr


def test_psycopg_parameters_types_and_errors(embedded: Embedded) -> None:
    with embedded.connect() as conn:
        assert conn.execute("select name from items where id = %s", (1,)).fetchone() == ("tea",)
        row = conn.execute(
            "select %s::int + 1, %s::text, price, added from items where id = 1", (41, "hi")
        ).fetchone()
        assert row is not None and row[:2] == (42, "hi") and str(row[2]) == "3.50"
        assert str(row[3]) == "2024-01-02"
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1 // 0")
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("select * from nope")
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("selec 1")
        conn.execute("insert into items (id, name) values (%s, %s)", (3, "pie"))
        assert conn.execute("select count(*) from items").fetchone() == (3,)
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0


def test_mpl_holds_inside_duckdb(embedded: Embedded) -> None:
    """Four clients, MPL 2: never more than two statements run in DuckDB at once."""
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, embedded.call(lambda: embedded.scheduler.in_service))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()

    def work() -> None:
        with embedded.connect() as conn:
            conn.execute("select count(*) from range(30000000) t(x) where x % 7 = 0").fetchone()

    workers = [threading.Thread(target=work) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    stop.set()
    watcher.join()
    assert peak == 2
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0
