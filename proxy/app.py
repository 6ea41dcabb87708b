"""Assemble and run the proxy from a configuration (what ``admission serve`` does)."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from admission.model import EtaModel
from admission.scheduler import Limits, Scheduler
from proxy.gate import AdmissionGate
from proxy.server import BackendAddress, ProxyServer

log = logging.getLogger("admission.proxy")


@dataclass(frozen=True)
class ProxyConfig:
    backend: BackendAddress
    listen_host: str = "127.0.0.1"
    listen_port: int = 6432
    policy: str = "fcfs"
    model: EtaModel | None = None
    model_path: Path | None = None
    limits: Limits = field(default_factory=Limits)
    max_queue: int | None = 10_000
    max_message: int = 256 * 1024 * 1024
    tls_cert: Path | None = None
    tls_key: Path | None = None


def build(config: ProxyConfig) -> ProxyServer:
    scheduler = Scheduler(config.model, config.policy, config.limits)
    gate = AdmissionGate(scheduler, max_queue=config.max_queue)
    tls = None
    if config.tls_cert is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(config.tls_cert, config.tls_key)
    return ProxyServer(gate, config.backend, max_message=config.max_message, tls=tls)


async def serve(config: ProxyConfig, ready: asyncio.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM; then refuse new clients and close the open ones."""
    server = build(config)
    await server.start(config.listen_host, config.listen_port)
    log.info(
        "listening host=%s port=%s backend=%s policy=%s mpl=%s threads=%s classes=%s",
        config.listen_host,
        server.port,
        config.backend,
        config.policy,
        config.limits.mpl,
        config.limits.threads,
        len(config.model.classes) if config.model else 0,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down")
    await server.close()


def run(config: ProxyConfig) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
