"""Shared fixtures: one real PostgreSQL cluster per test session, proxies in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testing.pgcluster import Cluster, start_cluster
from testing.proxyharness import ProxyHarness


@pytest.fixture(scope="session")
def pg() -> Iterator[Cluster]:
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def make_proxy(pg: Cluster) -> Iterator[Callable[..., ProxyHarness]]:
    started: list[ProxyHarness] = []

    def make(**kwargs: Any) -> ProxyHarness:
        harness = ProxyHarness(pg.port, **kwargs)
        started.append(harness)
        return harness

    yield make
    for harness in started:
        harness.close()


@pytest.fixture
def proxy(make_proxy: Callable[..., ProxyHarness]) -> ProxyHarness:
    return make_proxy()
