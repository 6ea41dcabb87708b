"""The database an experiment measures: the proxy, in this process, in front of the embedded
DuckDB or a PostgreSQL server, with TPC-H loaded.

Training and the bench both drive such a target (clients over TCP through the proxy, the
scheduler read and steered in between), so there is one builder for both; ``admission serve
--tpch`` loads the embedded database with the same ``tpch_prepare``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from admission.model import EtaModel
from admission.scheduler import Limits
from admission.workloads import WorkloadConfig
from proxy.app import BackgroundProxy, Prepare, Progress, ProxyConfig
from proxy.pool import PoolConfig, backend_password
from proxy.server import parse_backend, url_identity
from workloads.tpch.data import generate, load_duckdb, load_postgres

__all__ = ["Target", "open_target", "tpch_prepare"]


def _quiet(_message: str) -> None:
    pass


def tpch_prepare(scale_factor: float) -> Prepare:
    """Generate TPC-H at ``scale_factor`` (cached) and load it into the embedded DuckDB."""

    def prepare(connection: object, progress: Progress) -> None:
        data = generate(scale_factor, progress=progress)
        load_duckdb(connection, data, scale_factor, progress=progress)

    return prepare


@dataclass
class Target:
    """A running proxy in front of the database, and how clients reach it through it."""

    proxy: BackgroundProxy
    conninfo: str

    def close(self) -> None:
        self.proxy.close()


def open_target(
    backend: str,
    scale_factor: float,
    *,
    model: EtaModel | None = None,
    limits: Limits | None = None,
    progress: Progress = _quiet,
    learn: bool = False,
    auto_mpl: bool = False,
    memory_limit: int | None = None,
    max_temp_size: int | None = None,
    memory_auto: bool = False,
    workloads: WorkloadConfig | None = None,
    policy: str = "fcfs",
    pool_size: int | None = None,
) -> Target:
    """``backend``: "duckdb" (embedded, in memory) or postgresql://HOST:PORT/DB, into which
    TPC-H is loaded first (loading is idempotent). ``learn``: the proxy keeps its model current
    from live statements (``proxy.learning``; off: the model stays as given). ``pool_size``:
    PostgreSQL only, transaction pooling with that many server connections (``proxy.pool``)."""
    if backend == "duckdb":
        if pool_size is not None:
            raise ValueError("the embedded DuckDB has no server connections to pool")
        config = ProxyConfig(
            backend=None,
            listen_port=0,
            prepare=tpch_prepare(scale_factor),
            dataset=f"TPC-H SF {scale_factor:g}",
            model=model,
            limits=limits or Limits(),
            learn=learn,
            auto_mpl=auto_mpl,
            memory_limit=memory_limit,
            max_temp_size=max_temp_size,
            memory_auto=memory_auto,
            workloads=workloads,
            policy=policy,
        )
        proxy = BackgroundProxy(config, progress)
        return Target(proxy, proxy.conninfo())
    address = parse_backend(backend)
    data = generate(scale_factor, progress=progress)
    with psycopg.connect(backend) as conn:
        load_postgres(conn, data, scale_factor, progress=progress)
    config = ProxyConfig(
        backend=address,
        listen_port=0,
        model=model,
        limits=limits or Limits(),
        learn=learn,
        auto_mpl=auto_mpl,
        workloads=workloads,
        policy=policy,
        pool=None
        if pool_size is None
        else PoolConfig(size=pool_size, password=backend_password(backend)),
    )
    proxy = BackgroundProxy(config, progress)
    user, dbname = url_identity(backend)
    return Target(proxy, proxy.conninfo(user=user, dbname=dbname))
