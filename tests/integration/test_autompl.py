"""``--mpl auto`` on a real proxy in front of a real PostgreSQL: the MPL follows what the
database does, and the admin API shows it and steers it.

Statements that sleep in PostgreSQL (``pg_sleep``) cost the machine nothing, so the more run at
once the more complete: the controller must climb to the highest MPL it may use. The
controller is made quick for the test (windows of 0.25 s); the logic is the one
``admission serve --mpl auto`` runs (``tests/unit/test_mpl_controller.py`` checks its choices).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import psycopg

from admission import Limits
from admission.mpl import MplController
from testing.proxyharness import ProxyHarness

SLEEP = "select pg_sleep(0.02)"


@contextmanager
def closed_load(proxy: ProxyHarness, clients: int, sql: str = SLEEP) -> Iterator[list[int]]:
    """``clients`` connections running ``sql`` back to back until the block ends; yields the
    list of statements each completed (read it after the block)."""
    done = [0] * clients
    errors: list[BaseException] = []
    stop = threading.Event()

    def client(i: int) -> None:
        try:
            dsn = f"{proxy.dsn_base} user=postgres dbname=postgres"
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    conn.execute(sql)
                    done[i] += 1
        except BaseException as e:  # reported below, not lost in a thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        yield done
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors


@contextmanager
def open_load(proxy: ProxyHarness, rate: float, sql: str = SLEEP) -> Iterator[list[int]]:
    """Statements arriving as a Poisson stream of ``rate`` a second, whatever completes
    (each on one of 32 connections, none waiting for another's result), until the block ends;
    yields [statements completed]."""
    done = [0]
    errors: list[BaseException] = []
    stop = threading.Event()
    local = threading.local()
    connections: list[psycopg.Connection] = []

    def one() -> None:
        try:
            conn = getattr(local, "conn", None)
            if conn is None:
                dsn = f"{proxy.dsn_base} user=postgres dbname=postgres"
                conn = local.conn = psycopg.connect(dsn, autocommit=True)
                connections.append(conn)
            conn.execute(sql)
            done[0] += 1
        except BaseException as e:  # reported below, not lost in a thread
            errors.append(e)

    pool = ThreadPoolExecutor(32)

    def arrivals() -> None:
        rng = random.Random(7)
        while not stop.wait(rng.expovariate(rate)):
            pool.submit(one)

    generator = threading.Thread(target=arrivals, daemon=True)
    generator.start()
    try:
        yield done
    finally:
        stop.set()
        generator.join(10)
        pool.shutdown(wait=True)
        for conn in connections:
            conn.close()
    assert not errors, errors


def quick(start: int, high: int) -> MplController:
    # (the demand window scaled with the sample window: an MPL not measured is tried only
    # once a demand window has passed)
    return MplController(start, high=high, window=0.25, samples=4, min_samples=2, demand_window=5.0)


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_the_mpl_climbs_while_more_in_service_completes_more(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(limits=Limits(mpl=2), auto_mpl=quick(2, 6))
    auto = proxy.auto_mpl
    assert auto is not None

    def measured() -> dict[int, float]:
        return proxy.call(lambda: {e.mpl: e.mean for e in auto.controller.estimates()})

    # statements of 50 ms: at MPL 6, 120 a second — the proxy and its ten clients share this
    # process, and at 20 ms (300 a second at MPL 6) a loaded machine's CPU, not the MPL, capped
    # the throughput (measured 48, 99, 147, 176 a second at MPL 1–4: a step up paid too little
    # to be taken)
    with closed_load(proxy, 10, "select pg_sleep(0.05)") as done:
        # (a step is taken only when the samples show it pays: noisy samples take longer)
        reached = wait_for(lambda: proxy.call(lambda: proxy.scheduler.limits.mpl) == 6, 120)
        assert reached, measured()
        assert wait_for(lambda: 6 in measured(), 10)
    assert sum(done) > 0
    by_mpl = measured()
    # what it measured is what pg_sleep(0.05) gives: about 20 statements a second per slot
    assert by_mpl[6] > 1.5 * by_mpl.get(2, by_mpl[6] / 3)
    assert proxy.wait_idle()["in_service"] == 0


def test_the_admin_api_shows_and_steers_the_tuning(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(limits=Limits(mpl=2), auto_mpl=quick(2, 6), admin=True)
    with closed_load(proxy, 8), httpx.Client(base_url=proxy.admin_url) as admin:
        assert wait_for(lambda: admin.get("/status").json()["mpl_auto"]["changes"] > 0, 30)
        status = admin.get("/status").json()
        auto = status["mpl_auto"]
        assert auto["enabled"] and auto["mpl"] == status["limits"]["mpl"]
        assert auto["bounds"] == [1, 6] and auto["reason"]
        assert all(level["samples"] >= 1 for level in auto["throughput_by_mpl"])
        # 8 clients back to back at an MPL of at most 6: statements wait at nearly any
        # instant (all but a client's round trip of a millisecond or so in 50 ms)
        assert all(level["saturated_share"] > 0.5 for level in auto["throughput_by_mpl"])
        # and how busy this host's cores were meanwhile (PostgreSQL runs here)
        assert all(0 <= level["cpu_busy_share"] <= 1 for level in auto["throughput_by_mpl"])
        assert auto["demand_work_per_second"] > 0  # what arrives, in D_r per second
        # and the number in the system stays at the 8 clients: it reads as a closed loop once
        # the clients' start (0 → 8 in the system) has left the moving average (5 s here)
        assert wait_for(
            lambda: admin.get("/status").json()["mpl_auto"]["arrivals"] == "closed loop", 15
        )
        metrics = admin.get("/metrics").text
        assert f"admission_mpl {float(status['limits']['mpl'])}" in metrics
        # a number set by hand stops the tuning and stays
        status = admin.put("/limits", json={"mpl": 3}).json()
        assert status["limits"]["mpl"] == 3 and not status["mpl_auto"]["enabled"]
        time.sleep(1.5)
        assert admin.get("/status").json()["limits"]["mpl"] == 3
        # "auto" starts it again, from where it is
        status = admin.put("/limits", json={"mpl": "auto"}).json()
        assert status["mpl_auto"]["enabled"] and status["mpl_auto"]["changes"] == 0
        assert wait_for(lambda: admin.get("/status").json()["mpl_auto"]["changes"] > 0, 30)
        assert admin.put("/limits", json={"mpl": "many"}).status_code == 422


def test_auto_needs_a_proxy_started_with_it(make_proxy: Callable[..., ProxyHarness]) -> None:
    proxy = make_proxy(limits=Limits(mpl=2), admin=True)
    with httpx.Client(base_url=proxy.admin_url) as admin:
        response = admin.put("/limits", json={"mpl": "auto"})
        assert response.status_code == 409 and "--mpl auto" in response.json()["detail"]
        assert admin.get("/status").json()["mpl_auto"] is None
        assert admin.get("/status").json()["limits"]["mpl"] == 2


def test_an_open_stream_reads_as_open(make_proxy: Callable[..., ProxyHarness]) -> None:
    # 40 statements of 20 ms a second at MPL 2: the number in the system varies as a Poisson
    # count's at least (the closed loop of the test above keeps it at its 8 clients)
    proxy = make_proxy(limits=Limits(mpl=2), auto_mpl=quick(2, 2), admin=True)
    with open_load(proxy, 40.0) as done, httpx.Client(base_url=proxy.admin_url) as admin:
        time.sleep(8)  # more than the quick controller's demand window of 5 s
        auto = admin.get("/status").json()["mpl_auto"]
        assert auto["arrivals"] == "open", auto
        assert auto["demand_work_per_second"] > 0
    assert done[0] > 100
    assert proxy.wait_idle()["in_service"] == 0
