"""Assemble and run the proxy from a configuration (what ``admission serve`` does).

The proxy knows no workload: data to load into the embedded DuckDB database comes as the
configuration's ``prepare`` callback (the command line and the lab give one that loads TPC-H).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from admission.contention import ContentionConfig
from admission.model import EtaModel
from admission.mpl import MplController
from admission.scheduler import MAX_CLASSES, Limits, Scheduler
from admission.workloads import WorkloadConfig
from proxy.admin import AdminMetrics
from proxy.autompl import AutoMpl
from proxy.contention import ContentionGate
from proxy.cpu import CpuMeter
from proxy.gate import AdmissionGate
from proxy.learning import LiveModel, Planner
from proxy.planner import PostgresPlanner
from proxy.pool import PoolConfig, Pools
from proxy.server import MAX_BUFFERED, BackendAddress, Listener, ProxyServer, Tuner

if TYPE_CHECKING:
    import duckdb

    from proxy.backends.embedded import EmbeddedServer

Progress = Callable[[str], None]
# Fills the embedded backend's DuckDB connection before the proxy accepts clients.
Prepare = Callable[["duckdb.DuckDBPyConnection", Progress], None]


def _quiet(_message: str) -> None:
    pass


MEMORY_SHARE = 0.8  # of what DuckDB's memory_limit leaves: the embedded memory budget's default

log = logging.getLogger("admission.proxy")


@dataclass(frozen=True)
class ProxyConfig:
    backend: BackendAddress | None  # None: the embedded DuckDB backend
    listen_host: str = "127.0.0.1"
    listen_port: int = 6432
    policy: str = "fcfs"
    model: EtaModel | None = None
    model_path: Path | None = None
    learn: bool = False  # keep the model current from live statements (proxy.learning)
    limits: Limits = field(default_factory=Limits)
    auto_mpl: bool = False  # tune the MPL while serving, from limits.mpl (proxy.autompl)
    explain_dsn: str | None = None  # PostgreSQL: where the live model may EXPLAIN (priors)
    # more that keeps the proxy tuned while it serves, built on the front end once it exists
    # (the command line adds training's live profile sampler this way: training.live)
    extend: Callable[[Listener], Tuner | None] | None = None
    max_queue: int | None = 10_000
    memory_limit: int | None = None  # the embedded DuckDB's memory_limit, bytes (None: DuckDB's)
    # the embedded DuckDB's max_temp_directory_size, bytes: what it may spill (0: nothing, a
    # statement that outgrows memory_limit fails; None: DuckDB's, 90% of the disk's free space)
    max_temp_size: int | None = None
    # the embedded DuckDB's memory budget from what its memory_limit leaves once the data is
    # loaded (MEMORY_SHARE of it), in place of limits.memory
    memory_auto: bool = False
    # PostgreSQL: work memory granted to the admitted statements, bytes in total (each its
    # share as its work_mem: admission.grants); None: no grants
    work_mem_grant: int | None = None
    # several proxies, one budget: where the leases on the global MPL (limits.mpl) are kept
    # (a PostgreSQL connection string; None: the MPL is this proxy's alone)
    coordinator: str | None = None
    lease_ttl: float = 2.0  # seconds a lease lives without a heartbeat
    coordinator_fallback: int | None = None  # the MPL once cut off for a TTL (None: share)
    max_classes: int | None = MAX_CLASSES  # statement shapes learned live, at most
    # tenants, priorities and background work (admission.workloads); None: one tenant
    workloads: WorkloadConfig | None = None
    workloads_path: Path | None = None  # the file it came from (POST /workloads/reload)
    max_message: int = 256 * 1024 * 1024
    max_buffered: int = MAX_BUFFERED  # all clients' bytes buffered in the proxy, at most
    tls_cert: Path | None = None
    tls_key: Path | None = None
    admin_host: str | None = None  # the admin API listens here when set
    admin_port: int = 6433
    admin_token: str | None = None
    database: str = ":memory:"  # the embedded backend's DuckDB database
    prepare: Prepare | None = None  # loads data into it before clients are accepted
    dataset: str | None = None  # what ``prepare`` loads, for the log ("TPC-H SF 1")
    workers: int = 8  # the embedded backend's worker threads (statements running at once)
    file_access: tuple[Path, ...] = ()  # what clients of the embedded database may still read
    extensions: tuple[str, ...] = ()  # DuckDB extensions loaded before it is locked down
    users_file: Path | None = None  # embedded: who may connect (else ADMISSION_PASSWORD)
    insecure: bool = False  # allow listening beyond loopback without authentication and TLS
    startup_timeout: float = 60.0  # seconds from connecting to ready for queries
    # PostgreSQL: transaction pooling (proxy.pool); None: session mode, a server connection
    # per client
    pool: PoolConfig | None = None
    max_client_conn: int | None = None  # clients at once, at most (53300 beyond)
    # the embedded DuckDB: limit writing transactions while they abort on one another
    # (admission.contention; None: no limit)
    contention: ContentionConfig | None = None


LOOPBACK = ("127.0.0.1", "::1", "localhost")
MPL_HIGH = 64  # --mpl auto in front of PostgreSQL: the highest MPL it tries


def check_exposure(config: ProxyConfig, users: object | None) -> None:
    """Listening beyond this machine needs TLS, and (embedded) authentication, unless the
    operator says ``insecure``: the embedded server would otherwise give its data to anyone
    who can reach the port, and any client's statements would cross the network in clear."""
    if config.listen_host in LOOPBACK or config.insecure:
        return
    missing = []
    if config.backend is None and users is None:
        missing.append("authentication (--users FILE or ADMISSION_PASSWORD)")
    if config.tls_cert is None:
        missing.append("TLS (--tls-cert and --tls-key)")
    if missing:
        raise ValueError(
            f"listening on {config.listen_host} (beyond this machine) needs "
            + " and ".join(missing)
            + "; --insecure listens without them"
        )


def tls_context(config: ProxyConfig) -> ssl.SSLContext | None:
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load the TLS certificate {config.tls_cert}: {e}") from None
    return context


def pooled_limits(limits: Limits, pool: PoolConfig | None) -> Limits:
    """In transaction pool mode the MPL is at most the pool size: a statement admitted finds
    a server connection (proxy.pool)."""
    if pool is None:
        return limits
    mpl = pool.size if not limits.mpl else min(limits.mpl, pool.size)
    return dataclasses.replace(limits, mpl=mpl)


def build(config: ProxyConfig, progress: Progress = _quiet) -> tuple[Listener, AdminMetrics]:
    """The front end, and the metrics its scheduler feeds (for the admin API).
    With the embedded backend this opens the DuckDB database and runs ``config.prepare``."""
    if config.pool is not None and config.backend is None:
        raise ValueError(
            "--pool-mode transaction pools PostgreSQL's connections (--backend); the embedded "
            "DuckDB has none to pool"
        )
    if config.pool is not None:
        config = dataclasses.replace(config, limits=pooled_limits(config.limits, config.pool))
    scheduler = Scheduler(
        config.model,
        config.policy,
        config.limits,
        max_classes=config.max_classes,
        workloads=config.workloads,
    )
    metrics = AdminMetrics(scheduler)
    gate = AdmissionGate(scheduler, max_queue=config.max_queue)

    def queue_timeout() -> float | None:  # (bounds a wait for a contention place too)
        return scheduler.limits.queue_timeout

    listener: Listener
    planner: Planner | None = None  # what a class not yet measured may cost (for a prior)
    if config.backend is None:
        embedded = embedded_server(config, gate, progress)
        listener, planner = embedded, embedded.backend.plan_cost
        metrics.cursors = embedded.backend.cursors
        if config.contention is not None:
            embedded.backend.contention = ContentionGate(config.contention, timeout=queue_timeout)
            gate.contention = metrics.contention = embedded.backend.contention
    else:
        if config.explain_dsn is not None:
            planner = PostgresPlanner(config.explain_dsn).plan_cost
        check_exposure(config, None)
        tls = tls_context(config)
        listener = ProxyServer(
            gate,
            config.backend,
            max_message=config.max_message,
            tls=tls,
            max_buffered=config.max_buffered,
        )
        listener.max_client_conn = config.max_client_conn
        if config.contention is not None:
            if config.pool is not None:
                raise ValueError(
                    "the contention limit is not supported with transaction pooling (a "
                    "transaction holds its server connection, and the pool is its limit)"
                )
            listener.contention = ContentionGate(config.contention, timeout=queue_timeout)
            gate.contention = metrics.contention = listener.contention
        if config.pool is not None:
            pools = Pools(config.pool, config.backend, listener.open_backend)
            listener.pool_transactions(pools)
            metrics.pools = pools
            progress(
                f"transaction pooling: {config.pool.size} server connections per (database, "
                f"user), MPL {config.limits.mpl}"
            )
        if config.work_mem_grant is not None:
            listener.work_mem_grant = config.work_mem_grant
            progress(
                f"work_mem grants: {config.work_mem_grant / 2**20:.0f} MiB shared by the "
                "statements admitted (each its share as its work_mem)"
            )
    listener.startup_timeout = config.startup_timeout
    if config.learn:
        learning = listener.learning = LiveModel(gate, config.model_path, planner=planner)
        if config.backend is None:  # DuckDB's profiler measures a sample's memory
            embedded.sample(learning.memory_wanted, learning.memory_measured)
    if config.auto_mpl:
        start = config.limits.mpl or os.cpu_count() or 1
        # embedded: more statements in service than worker threads would only queue there
        high = config.workers if config.backend is None else MPL_HIGH
        if config.pool is not None:  # never beyond the server connections there are
            high = config.pool.size
        # the busy share of the database's cores, where this host can tell it
        if config.backend is None:
            cpu: CpuMeter | None = CpuMeter.process()
        else:
            cpu = CpuMeter.host() if _on_this_host(config.backend) else None
        if cpu is None:
            progress("--mpl auto: the database's CPU is not measured from here")
        controller = MplController(start, high=max(high, start))
        listener.auto_mpl = AutoMpl(gate, controller, cpu=cpu)
    if config.coordinator is not None:
        from proxy.coordinator import Coordinator

        if config.auto_mpl or config.limits.mpl is None:
            raise ValueError(
                "--coordinator shares a global MPL among proxies: give it as a number (--mpl N)"
            )
        shared = {"mpl": config.limits.mpl}
        if config.limits.threads is not None:
            shared["threads"] = config.limits.threads
        if config.limits.memory is not None:
            shared["memory"] = config.limits.memory
        coordinator = Coordinator(
            gate,
            config.coordinator,
            shared,
            ttl=config.lease_ttl,
            fallback=config.coordinator_fallback,
        )
        listener.extras = (*listener.extras, coordinator)
        metrics.coordinator = coordinator
        progress(
            "shared through the coordinator (leases of "
            f"{config.lease_ttl:g} s): global "
            + ", ".join(f"{r} {units}" for r, units in shared.items())
        )
    if config.workloads is not None:
        cfg = config.workloads
        progress(
            f"workload classes from {cfg.source or 'the config'}: "
            + ", ".join(
                f"{w['name']} ({w['priority']}, weight {w['weight']:g})" for w in cfg.describe()
            )
        )
        if cfg.renice is not None and config.backend is None:
            progress(
                "renice: the embedded DuckDB runs in this process, with no backend process to "
                "renice per statement: ignored"
            )
        # (always: a reload may set a pressure bound the first file had not)
        from proxy.tenants import CpuPressure

        listener.extras = (*listener.extras, CpuPressure(gate))
    if config.extend is not None:
        extra = config.extend(listener)
        if extra is not None:
            listener.extras = (*listener.extras, extra)
    return listener, metrics


def embedded_server(config: ProxyConfig, gate: AdmissionGate, progress: Progress) -> EmbeddedServer:
    from proxy.backends.embedded import DuckDBBackend, EmbeddedServer, Lockdown, Users

    users = Users.configured(config.users_file)
    check_exposure(config, users)
    tls = tls_context(config)
    backend = DuckDBBackend(
        config.database,
        workers=config.workers,
        memory_limit=config.memory_limit,
        max_temp_size=config.max_temp_size,
    )
    try:
        if config.prepare is not None:
            config.prepare(backend.connection, progress)
        backend.lock(Lockdown(config.file_access, config.extensions))
        if config.max_temp_size == 0:
            progress(
                "DuckDB spills nothing to disk (--max-temp-size 0): a statement that outgrows "
                "its memory_limit fails with out of memory (53200)"
            )
        elif config.max_temp_size is not None:
            progress(f"DuckDB spills at most {config.max_temp_size / 2**20:.0f} MiB to disk")
        if config.memory_auto:
            free = backend.memory_for_statements()
            if free:
                budget = max(1, int(free * MEMORY_SHARE))
                gate.scheduler.limits = dataclasses.replace(gate.scheduler.limits, memory=budget)
                progress(
                    f"memory budget {budget / 2**20:.0f} MiB ({MEMORY_SHARE:.0%} of the "
                    f"{free / 2**20:.0f} MiB DuckDB's memory_limit leaves beside the data)"
                )
    except BaseException:
        backend.close()
        raise
    gate.cursors = backend.cursors
    return EmbeddedServer(
        gate,
        backend,
        max_message=config.max_message,
        max_buffered=config.max_buffered,
        users=users,
        tls=tls,
        require_tls=tls is not None and config.listen_host not in LOOPBACK and not config.insecure,
    )


def _on_this_host(backend: BackendAddress) -> bool:
    """A Unix socket or a loopback address: the database's cores are this host's."""
    return backend.is_unix or backend.host in ("localhost", "127.0.0.1", "::1")


def describe_backend(config: ProxyConfig) -> str:
    if config.backend is not None:
        return f"postgresql://{config.backend}"
    dataset = f" {config.dataset}" if config.dataset is not None else ""
    return f"duckdb:{config.database}{dataset}"


async def serve(
    config: ProxyConfig, ready: asyncio.Event | None = None, progress: Progress = _quiet
) -> None:
    """Run until SIGINT/SIGTERM; then refuse new clients and close the open ones."""
    server, metrics = build(config, progress)
    await server.start(config.listen_host, config.listen_port)
    for tuner in server.tuners():
        tuner.start()
    admin = None
    if config.admin_host is not None:
        admin = await start_admin(server.gate, metrics, config, server.learning, server.auto_mpl)
    log.info(
        "listening host=%s port=%s backend=%s policy=%s mpl=%s short_lane=%s "
        "release_after=%s threads=%s memory=%s classes=%s",
        config.listen_host,
        server.port,
        describe_backend(config),
        config.policy,
        f"auto (from {config.limits.mpl})" if config.auto_mpl else config.limits.mpl,
        server.gate.scheduler.short_lane,
        config.limits.release_after,
        config.limits.threads,
        f"{memory / 2**20:.0f}MiB" if (memory := server.gate.scheduler.limits.memory) else None,
        len(config.model.classes) if config.model else 0,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Everything built so far (modules, the model, the app) lives as long as the process: keep
    # it out of the garbage collector's way, so that collections triggered by the short-lived
    # objects of each statement do not walk it again and again.
    gc.collect()
    gc.freeze()
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down")
    if admin is not None:
        await admin.stop()
    # a tuner that must see the statements still in service (the coordinator: it keeps their
    # units leased while the database stops them) is done before the clients go
    early = [t for t in server.tuners() if getattr(t, "stop_before_close", False)]
    for tuner in early:
        tuner.stop()
        closing = getattr(tuner, "aclose", None)
        if closing is not None:
            await closing()
    await server.close()
    for tuner in reversed(server.tuners()):
        if tuner in early:
            continue
        tuner.stop()
        closing = getattr(tuner, "aclose", None)  # one with work to finish on the loop
        if closing is not None:
            await closing()


class AdminServer:
    """uvicorn inside the proxy's event loop, leaving signal handling to the proxy."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        class Embedded(uvicorn.Server):
            def install_signal_handlers(self) -> None:  # older uvicorn
                pass

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # newer uvicorn
                yield

        self.server = Embedded(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()  # raises what stopped it (the port is taken, say)
                raise RuntimeError("the admin API stopped during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


async def start_admin(
    gate: AdmissionGate,
    metrics: AdminMetrics,
    config: ProxyConfig,
    learning: LiveModel | None = None,
    auto_mpl: AutoMpl | None = None,
) -> AdminServer:
    from proxy.admin import create_app

    host = config.admin_host or "127.0.0.1"
    if host not in LOOPBACK and not config.admin_token:
        raise ValueError(
            f"the admin API on {host} needs a token (--admin-token): it can change "
            "the policy and the limits"
        )
    app = create_app(
        gate,
        metrics,
        model_path=config.model_path,
        token=config.admin_token,
        learning=learning,
        auto_mpl=auto_mpl,
        workloads_path=config.workloads_path,
    )
    admin = AdminServer(app, host, config.admin_port)
    await admin.start()
    log.info("admin API listening host=%s port=%s", host, config.admin_port)
    return admin


def run(config: ProxyConfig, progress: Progress = _quiet) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config, progress=progress))
    else:
        uvloop.run(serve(config, progress=progress))


class BackgroundProxy:
    """The proxy on an event loop of its own, in a thread of this process: for training and
    benchmarks, which drive it and read its scheduler while clients connect over TCP."""

    def __init__(self, config: ProxyConfig, progress: Progress = _quiet) -> None:
        import threading

        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.server, self.metrics = build(config, progress)
        self.gate = self.server.gate
        self.thread = threading.Thread(target=self.loop.run_forever, name="proxy", daemon=True)
        self.thread.start()
        self.call(lambda: self.server.start(config.listen_host, config.listen_port))
        for tuner in self.server.tuners():
            self.call(tuner.start)
        self.port = self.server.port
        self.host = config.listen_host

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the proxy's loop, awaiting it if it returns a coroutine."""

        async def runner() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(runner(), self.loop).result(timeout=60)

    def conninfo(self, user: str = "admission", dbname: str = "admission") -> str:
        return f"host={self.host} port={self.port} user={user} dbname={dbname}"

    def close(self) -> None:
        try:
            for tuner in reversed(self.server.tuners()):
                self.call(tuner.stop)
            self.call(self.server.close)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
