"""The proxy in the test process: its own event loop on a thread, real sockets, a real backend.

Tests talk to it with real clients (psql, psycopg, asyncpg, SQLAlchemy, pgbench) and read the
scheduler's books through ``state()``. An exception that escapes to the proxy's event loop is
recorded and fails the test at teardown.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from admission import EtaModel, Event, Limits, Scheduler
from admission.mpl import MplController
from admission.workloads import WorkloadConfig
from proxy.admin import AdminMetrics, create_app
from proxy.app import AdminServer, pooled_limits
from proxy.autompl import AutoMpl
from proxy.cpu import CpuMeter
from proxy.gate import AdmissionGate
from proxy.learning import LiveModel
from proxy.pool import PoolConfig, Pools
from proxy.server import BackendAddress, ProxyServer
from testing.pgcluster import free_port

T = TypeVar("T")


class ProxyHarness:
    def __init__(
        self,
        backend_port: int,
        *,
        policy: str = "fcfs",
        limits: Limits | None = None,
        model: EtaModel | None = None,
        max_queue: int | None = 10_000,
        max_message: int = 256 * 1024 * 1024,
        tls: ssl.SSLContext | None = None,
        admin: bool = False,
        admin_token: str | None = None,
        model_path: Path | None = None,
        learn: bool = False,
        auto_mpl: MplController | None = None,
        work_mem_grant: int | None = None,
        workloads_path: Path | None = None,
        pool: PoolConfig | None = None,
        max_client_conn: int | None = None,
    ) -> None:
        self.events: list[Event] = []
        self.errors: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda _loop, ctx: self.errors.append(ctx))
        self.scheduler = Scheduler(
            model,
            policy,
            pooled_limits(limits or Limits(), pool),
            listener=self.events.append,
            workloads=WorkloadConfig.load(workloads_path) if workloads_path else None,
        )
        self.metrics = AdminMetrics(self.scheduler)
        self.gate = AdmissionGate(self.scheduler, max_queue=max_queue)
        self.server = ProxyServer(
            self.gate, BackendAddress("127.0.0.1", backend_port), max_message=max_message, tls=tls
        )
        self.server.work_mem_grant = work_mem_grant
        self.server.max_client_conn = max_client_conn
        if pool is not None:
            self.pools = Pools(pool, self.server.backend, self.server.open_backend)
            self.server.pool_transactions(self.pools)
            self.metrics.pools = self.pools
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(lambda: self.server.start("127.0.0.1", 0))
        self.port = self.server.port
        # learning from live statements, refreshed when a test calls learning.refresh
        self.learning = self.call(lambda: LiveModel(self.gate, model_path)) if learn else None
        # --mpl auto, tuned by ``auto_mpl`` (its timer running on the proxy's loop), told the
        # busy share of this host's cores as ``serve`` does in front of a local PostgreSQL
        self.auto_mpl = (
            self.call(lambda: AutoMpl(self.gate, auto_mpl, cpu=CpuMeter.host()))
            if auto_mpl
            else None
        )
        if self.auto_mpl is not None:
            self.call(self.auto_mpl.start)
        self.admin: AdminServer | None = None
        self.admin_url = ""
        if admin:
            port = free_port()
            app = create_app(
                self.gate,
                self.metrics,
                model_path=model_path,
                token=admin_token,
                learning=self.learning,
                auto_mpl=self.auto_mpl,
                workloads_path=workloads_path,
            )
            self.admin = AdminServer(app, "127.0.0.1", port)
            self.call(self.admin.start)
            self.admin_url = f"http://127.0.0.1:{port}"

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the proxy's loop (awaiting it if it returns a coroutine)."""

        async def runner() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        future: Future[Any] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return future.result(timeout=30)

    def state(self) -> dict[str, int]:
        def read() -> dict[str, int]:
            s = self.scheduler
            return {
                "in_service": s.in_service,
                "threads": s.threads_in_use,
                "queued": s.queued,
                "connections": len(self.server.connections),
            }

        result: dict[str, int] = self.call(read)
        return result

    def wait_idle(self, timeout: float = 15.0, connections: int | None = 0) -> dict[str, int]:
        """Wait until nothing is queued or in service (and, by default, no client is left)."""
        deadline = time.monotonic() + timeout
        state = self.state()
        while time.monotonic() < deadline:
            state = self.state()
            busy = state["in_service"] or state["threads"] or state["queued"]
            if not busy and (connections is None or state["connections"] <= connections):
                return state
            time.sleep(0.05)
        raise AssertionError(f"the proxy did not return to idle: {state}")

    def grants(self) -> list[str]:
        return [e.class_name for e in self.events if e.kind == "grant" and e.detail != "bypass"]

    @property
    def dsn_base(self) -> str:
        return f"host=127.0.0.1 port={self.port}"

    def close(self) -> None:
        try:
            if self.auto_mpl is not None:
                self.call(self.auto_mpl.stop)
            if self.admin is not None:
                self.call(self.admin.stop)
            self.call(self.server.close)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        assert not self.errors, f"unhandled errors in the proxy's event loop: {self.errors}"
