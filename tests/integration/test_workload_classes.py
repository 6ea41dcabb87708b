"""Workload classes through the proxy with real PostgreSQL and real clients: tenants chosen by
application_name and by comment tag, weighted shares, background work held back while the
foreground runs, the admin API's view and reload, and a bad file refused."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest

from admission import Limits
from testing.proxyharness import ProxyHarness

MakeProxy = Callable[..., ProxyHarness]

CONFIG = """
[scheduler]
hold = 0.005

[[workload]]
name = "gold"
weight = 2
match = { application_name = "gold-*" }

[[workload]]
name = "silver"
weight = 1
match = { application_name = "silver-*" }

[[workload]]
name = "maint"
priority = "background"
match = { application_name = "maint" }
"""


def _connect(proxy: ProxyHarness, app: str) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=proxy.port,
        user="postgres",
        dbname="postgres",
        autocommit=True,
        application_name=app,
    )


def _loop(proxy: ProxyHarness, app: str, sql: str, until: float, done: Counter[str]) -> None:
    with _connect(proxy, app) as conn:
        while time.monotonic() < until:
            conn.execute(sql).fetchall()
            done[app.split("-")[0]] += 1


def test_two_tenants_share_the_server_by_weight(make_proxy: MakeProxy, tmp_path: Path) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(CONFIG)
    proxy = make_proxy(admin=True, limits=Limits(mpl=1), workloads_path=path)
    done: Counter[str] = Counter()
    until = time.monotonic() + 4.0
    threads = [
        threading.Thread(
            target=_loop, args=(proxy, f"{t}-{i}", "select pg_sleep(0.01)", until, done)
        )
        for t in ("gold", "silver")
        for i in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    proxy.wait_idle()
    ratio = done["gold"] / done["silver"]
    assert 1.6 <= ratio <= 2.5, (done, ratio)  # 2:1 by weight, both saturating
    status = httpx.get(f"{proxy.admin_url}/status").json()
    rows = {r["tenant"]: r for r in status["tenants"]["tenants"]}
    assert set(rows) >= {"gold", "silver"}
    share = rows["gold"]["service_share"]
    assert 0.58 <= share <= 0.75, rows  # of the statement-seconds served
    assert rows["gold"]["weight_share"] == 2 / 3 or "default" in rows
    metrics = httpx.get(f"{proxy.admin_url}/metrics").text
    assert 'admission_tenant_service_seconds_total{priority="interactive",tenant="gold"}' in metrics


def test_background_waits_for_the_foreground_and_a_tag_chooses_the_tenant(
    make_proxy: MakeProxy, tmp_path: Path
) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(CONFIG)
    proxy = make_proxy(admin=True, limits=Limits(mpl=4), workloads_path=path)
    started: dict[str, float] = {}

    def foreground() -> None:
        with _connect(proxy, "gold-1") as conn:
            conn.execute("select pg_sleep(0.6)")

    fg = threading.Thread(target=foreground)
    fg.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    with _connect(proxy, "maint") as conn:
        conn.execute("select 1").fetchall()  # background: waits for the foreground to end
        started["maint"] = time.monotonic() - t0
        # a tag moves a statement to a tenant (and may only lower its priority)
        conn.execute("/* admission: tenant=silver */ select 2").fetchall()
    fg.join()
    assert started["maint"] >= 0.3, started  # the foreground had ~0.4 s to go
    proxy.wait_idle()
    rows = {r["tenant"]: r for r in proxy.scheduler.tenant_stats()}
    assert rows["maint"]["completed"] >= 1 and rows["silver"]["completed"] == 1


def test_the_workload_file_reloads_and_a_bad_one_is_refused(
    make_proxy: MakeProxy, tmp_path: Path
) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(CONFIG)
    proxy = make_proxy(admin=True, limits=Limits(mpl=2), workloads_path=path)
    with _connect(proxy, "silver-1") as conn:
        conn.execute("select 1").fetchall()
    path.write_text(CONFIG.replace("weight = 1", "weight = 3"))
    reloaded = httpx.post(f"{proxy.admin_url}/workloads/reload").json()
    assert {w["name"]: w["weight"] for w in reloaded["workloads"]}["silver"] == 3
    assert {r["tenant"]: r["weight"] for r in proxy.scheduler.tenant_stats()}["silver"] == 3
    path.write_text("[[workload]]\nname = 'x'\nweight = -1\n")
    bad = httpx.post(f"{proxy.admin_url}/workloads/reload")
    assert bad.status_code == 422 and "weight must be positive" in bad.json()["detail"]
    assert proxy.scheduler.workloads is not None
    assert "silver" in proxy.scheduler.workloads.names  # the old config still serves
    with _connect(proxy, "silver-1") as conn:
        assert conn.execute("select 3").fetchone() == (3,)
    view = httpx.get(f"{proxy.admin_url}/workloads").json()
    assert view["file"] == str(path) and view["status"]["tenants"]


def test_reload_without_a_file_is_409(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(admin=True)
    answer = httpx.post(f"{proxy.admin_url}/workloads/reload")
    assert answer.status_code == 409
    assert httpx.get(f"{proxy.admin_url}/status").json()["tenants"] is None


def test_background_starts_on_a_timer_after_a_long_busy_period(
    make_proxy: MakeProxy, tmp_path: Path
) -> None:
    """After a long foreground busy period background waits ``idle_wait`` into the idle
    period — a deadline no client event brings: the gate's timer must (it did not, once)."""
    path = tmp_path / "workloads.toml"
    path.write_text(CONFIG + "\n[background]\nidle_wait = 0.3\n")
    proxy = make_proxy(admin=True, limits=Limits(mpl=1), workloads_path=path)

    def foreground(i: int) -> None:
        with _connect(proxy, f"gold-{i}") as conn:
            conn.execute("select pg_sleep(0.05)")

    busy = [threading.Thread(target=foreground, args=(i,)) for i in range(5)]
    done: list[float] = []

    def background() -> None:
        with _connect(proxy, "maint") as conn:
            conn.execute("select 1").fetchall()  # queued while the foreground is busy
            done.append(time.monotonic())

    for th in busy:
        th.start()
    time.sleep(0.05)
    bg = threading.Thread(target=background)
    bg.start()
    for th in busy:
        th.join()
    idle_at = time.monotonic()  # (a little after the foreground's last release)
    bg.join(timeout=10)
    assert done, "the background statement was never admitted"
    assert 0.15 <= done[0] - idle_at <= 3.0, done[0] - idle_at
    idle = proxy.scheduler.idle
    assert idle is not None and idle.conservative and list(idle.lengths) == [5]


def test_the_embedded_backend_assigns_tenants_by_user_and_application_name() -> None:
    from admission.workloads import WorkloadConfig
    from testing.embeddedharness import Embedded

    embedded = Embedded(Limits(mpl=2))
    try:
        config = WorkloadConfig.from_dict(
            {
                "workload": [
                    {"name": "gold", "weight": 2, "match": {"application_name": "gold-*"}},
                    {"name": "apps", "priority": "batch", "match": {"user": "app"}},
                ]
            }
        )
        embedded.call(lambda: embedded.server.gate.set_workloads(config))
        with psycopg.connect(embedded.url, autocommit=True, application_name="gold-1") as conn:
            assert conn.execute("select 41 + 1").fetchone() == (42,)
        with embedded.connect() as conn:  # user app, no application_name: apps (batch)
            conn.execute("select 1").fetchall()
            conn.execute("/* admission: tenant=gold */ select 2").fetchall()
        rows = {r["tenant"]: r for r in embedded.call(embedded.scheduler.tenant_stats)}
        assert rows["gold"]["completed"] >= 2 and rows["gold"]["priority"] == "interactive"
        assert rows["apps"]["completed"] >= 1 and rows["apps"]["priority"] == "batch"
        assert embedded.errors == []
    finally:
        embedded.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="renicing PostgreSQL's processes needs root here")
def test_batch_statements_run_in_reniced_backends(make_proxy: MakeProxy, tmp_path: Path) -> None:
    path = tmp_path / "workloads.toml"
    path.write_text(
        CONFIG.replace("hold = 0.005", "hold = 0.005\nrenice = 10")
        + '\n[[workload]]\nname = "etl"\npriority = "batch"\nmatch = { application_name = "etl" }\n'
    )
    proxy = make_proxy(limits=Limits(mpl=2), workloads_path=path)
    with _connect(proxy, "etl") as conn:
        (pid,) = conn.execute("select pg_backend_pid()").fetchone()  # type: ignore[misc]
        assert os.getpriority(os.PRIO_PROCESS, pid) == 10
    with _connect(proxy, "gold-1") as conn:
        (pid,) = conn.execute("select pg_backend_pid()").fetchone()  # type: ignore[misc]
        assert os.getpriority(os.PRIO_PROCESS, pid) == 0
        conn.execute("/* admission: priority=batch */ select 1").fetchall()
        assert os.getpriority(os.PRIO_PROCESS, pid) == 10
        conn.execute("select 2").fetchall()  # interactive again: back to 0 before it runs
        assert os.getpriority(os.PRIO_PROCESS, pid) == 0
