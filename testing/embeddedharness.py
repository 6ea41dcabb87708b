"""The embedded DuckDB server in the test process: its own event loop on a thread, real
sockets, a real DuckDB database, the scheduler's books readable through ``call``."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import duckdb
import psycopg

from admission import Limits, Scheduler
from proxy.backends.embedded import DuckDBBackend, EmbeddedServer, Lockdown, Users
from proxy.gate import AdmissionGate


class Embedded:
    def __init__(
        self,
        limits: Limits,
        setup: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
        workers: int = 4,
        policy: str = "fcfs",
        lockdown: Lockdown | None = Lockdown(),  # noqa: B008 (frozen, no state)
        users: Users | None = None,
        tls: ssl.SSLContext | None = None,
        require_tls: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _l, ctx: self.errors.append(ctx))
        self.backend = DuckDBBackend(workers=workers)
        if setup is not None:
            setup(self.backend.connection)
        if lockdown is not None:  # as `admission serve` runs it
            self.backend.lock(lockdown)
        self.scheduler = Scheduler(None, policy, limits)
        self.server = EmbeddedServer(
            AdmissionGate(self.scheduler),
            self.backend,
            users=users,
            tls=tls,
            require_tls=require_tls,
        )
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(lambda: self.server.start(host, 0))
        self.port = self.server.port

    def call(self, fn: Any) -> Any:
        async def runner() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        future: Future[Any] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return future.result(timeout=30)

    @property
    def url(self) -> str:
        return f"postgresql://app@127.0.0.1:{self.port}/app"

    def connect(self, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="app", dbname="app", autocommit=autocommit
        )

    def connect_as(self, user: str, password: str) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            dbname="app",
            password=password,
            autocommit=True,
        )

    def close(self) -> None:
        self.call(self.server.close)  # closes the backend too
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        assert not self.errors, self.errors
