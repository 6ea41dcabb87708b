"""The admin API against a running proxy and real clients: status, classes, η, run-time policy
and limit changes, model reload, Prometheus metrics, OpenAPI, and the token."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from admission import ClassProfile, EtaModel, Limits, classify_sql
from testing.proxyharness import ProxyHarness

MakeProxy = Callable[..., ProxyHarness]


def run_queries(proxy: ProxyHarness, *sql: str) -> None:
    with psycopg.connect(
        host="127.0.0.1", port=proxy.port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        for text in sql:
            conn.execute(text).fetchall()


def test_status_classes_and_metrics(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(admin=True, policy="min-q", limits=Limits(mpl=4))
    run_queries(proxy, "select 1", "select 2", "select count(*) from pg_class")
    proxy.wait_idle()
    status = httpx.get(f"{proxy.admin_url}/status").json()
    assert status["policy"] == "min-q" and status["limits"]["mpl"] == 4
    assert status["in_service"] == 0 and status["queued"] == 0
    classes = {c["fingerprint"]: c for c in httpx.get(f"{proxy.admin_url}/classes").json()}
    select_n = classes[classify_sql("select 1").fingerprint]
    assert select_n["counts"]["completed"] == 2 and select_n["mean_response"] > 0
    metrics = httpx.get(f"{proxy.admin_url}/metrics").text
    assert "admission_response_seconds_bucket" in metrics
    assert "admission_queue_wait_seconds_count" in metrics
    assert 'admission_completed_total{query_class="' in metrics
    assert "admission_in_service 0.0" in metrics


def test_policy_and_limits_change_at_run_time(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(admin=True, limits=Limits(mpl=2))
    changed = httpx.put(f"{proxy.admin_url}/policy", json={"policy": "sept"}).json()
    assert changed["policy"] == "sept" and proxy.scheduler.policy.name == "sept"
    bad = httpx.put(f"{proxy.admin_url}/policy", json={"policy": "lifo"})
    assert bad.status_code == 422 and "unknown policy" in bad.json()["detail"]
    limits = httpx.put(f"{proxy.admin_url}/limits", json={"mpl": 0, "queue_timeout": 5}).json()
    assert limits["limits"]["mpl"] is None and limits["limits"]["queue_timeout"] == 5
    assert proxy.scheduler.limits.queue_timeout == 5
    aging = httpx.put(f"{proxy.admin_url}/limits", json={"due_factor": 0}).json()
    assert aging["limits"]["due_factor"] is None and proxy.scheduler.limits.due_factor is None
    aging = httpx.put(f"{proxy.admin_url}/limits", json={"due_factor": 5}).json()
    assert aging["limits"]["due_factor"] == 5 and aging["limits"]["queue_timeout"] == 5
    invalid = httpx.put(f"{proxy.admin_url}/limits", json={"threads": -1})
    assert invalid.status_code == 422
    lifo = httpx.put(f"{proxy.admin_url}/limits", json={"lifo_after": 2}).json()
    assert lifo["limits"]["lifo_after"] == 2
    # no queue timeout under adaptive LIFO: the oldest would wait for ever
    starving = httpx.put(f"{proxy.admin_url}/limits", json={"queue_timeout": None})
    assert starving.status_code == 422 and "queue_timeout" in starving.json()["detail"]
    assert proxy.scheduler.limits.queue_timeout == 5
    off = httpx.put(f"{proxy.admin_url}/limits", json={"lifo_after": 0}).json()
    assert off["limits"]["lifo_after"] is None  # 0 is off, as on the command line
    release = httpx.put(f"{proxy.admin_url}/limits", json={"release_after": 1.5}).json()
    assert release["limits"]["release_after"] == 1.5 and release["released_in_service"] == 0
    assert proxy.scheduler.limits.release_after == 1.5
    release = httpx.put(f"{proxy.admin_url}/limits", json={"release_after": 0}).json()
    assert release["limits"]["release_after"] is None
    lane = httpx.put(f"{proxy.admin_url}/limits", json={"short_lane": 4}).json()
    assert (
        lane["limits"]["short_lane"] == 4
        and lane["short_lane_admitted"] == 0
        and lane["long_runs_beside"] == 0
    )
    assert lane["short_lane_in_force"] == 4
    assert proxy.scheduler.limits.short_lane == 4
    narrow = httpx.put(f"{proxy.admin_url}/limits", json={"short_lane": 0.5})
    assert narrow.status_code == 422 and "short_lane" in narrow.json()["detail"]
    lane = httpx.put(f"{proxy.admin_url}/limits", json={"short_lane": 0}).json()
    assert lane["limits"]["short_lane"] == 0 and lane["short_lane_in_force"] is None
    lane = httpx.put(f"{proxy.admin_url}/limits", json={"short_lane": None}).json()
    assert lane["limits"]["short_lane"] is None  # the policy's own
    assert lane["short_lane_in_force"] == proxy.scheduler.policy.short_lane
    memory = httpx.put(f"{proxy.admin_url}/limits", json={"memory": 2**30}).json()
    assert memory["limits"]["memory"] == 2**30 and proxy.scheduler.limits.memory == 2**30
    assert memory["memory_in_use"] == 0
    metrics = httpx.get(f"{proxy.admin_url}/metrics").text
    gauges = dict(
        line.split(" ", 1) for line in metrics.splitlines() if line.startswith("admission_memory")
    )
    assert float(gauges["admission_memory_budget_bytes"]) == 2**30
    assert float(gauges["admission_memory_in_use_bytes"]) == 0
    none = httpx.put(f"{proxy.admin_url}/limits", json={"memory": 0}).json()
    assert none["limits"]["memory"] is None
    run_queries(proxy, "select 'still works'")


def test_raising_the_mpl_admits_queued_statements(make_proxy: MakeProxy) -> None:
    """Statements queued behind MPL 1 run as soon as the limit is raised (not at the next
    completion): the grants a limit change makes reach their clients."""
    import threading
    import time

    proxy = make_proxy(admin=True, limits=Limits(mpl=1))
    finished: list[float] = []

    def sleeper(seconds: float) -> None:
        run_queries(proxy, f"select pg_sleep({seconds})")
        finished.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=sleeper, args=(s,)) for s in (3, 0.1, 0.1)]
    for t in threads:
        t.start()
        time.sleep(0.3)  # the first holds the only slot, the others queue
    assert proxy.state()["queued"] == 2
    httpx.put(f"{proxy.admin_url}/limits", json={"mpl": 4})
    for t in threads:
        t.join(30)
    quick = sorted(finished)[:2]
    assert all(f - started < 2.5 for f in quick), [f - started for f in finished]
    proxy.wait_idle()


def test_eta_and_model_reload(make_proxy: MakeProxy, tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    first = EtaModel(
        classes=(
            ClassProfile(fingerprint="hint:a", name="a", D=1, f=1, Q=2),
            ClassProfile(
                fingerprint="hint:b",
                name="b",
                D=3,
                f=2,
                Q=5,
                D_low=2.9,
                D_high=3.2,
                D_runs=10,
                f_runs={2: 7, 1: 3},
                converged=False,
                M=48_000_000,
                spill=0,
            ),
        )
    )
    first.save(path)
    proxy = make_proxy(admin=True, model=EtaModel.load(path), model_path=path, policy="min-q")
    shown = {c["name"]: c["profile"] for c in httpx.get(f"{proxy.admin_url}/classes").json()}
    b = shown["b"]  # the interval, the runs behind it and the fork sizes they showed
    assert b["D_low"] <= b["D"] <= b["D_high"] and (b["D_low"], b["D_high"]) == (2.9, 3.2)
    assert b["D_runs"] == 10 and b["f_runs"] == {"2": 7, "1": 3} and b["converged"] is False
    assert sum(b["f_runs"].values()) == b["D_runs"] and str(b["f"]) in b["f_runs"]
    a = shown["a"]  # a profile without them (an older model file): unknown, not made up
    assert a["D_low"] is None and a["D_high"] is None and a["converged"] is None
    assert a["D_runs"] == 0 and a["f_runs"] == {}
    assert (b["M"], b["spill"], a["M"], a["spill"]) == (48_000_000, 0, None, None)
    eta = httpx.get(f"{proxy.admin_url}/eta").json()
    assert eta["classes"] == ["a", "b"] and eta["eta"] == [[-2.0, -2.0], [-5.0, -5.0]]
    assert eta["order"] == [["a"], ["b"]]  # −Q_r: the least backlog first
    assert httpx.get(f"{proxy.admin_url}/eta", params={"policy": "sept"}).json()["bias"] == [-1, -3]
    second = first.model_copy(
        update={
            "classes": (*first.classes, ClassProfile(fingerprint="hint:c", name="c", D=9, f=1, Q=1))
        }
    )
    second.save(path)
    reloaded = httpx.post(f"{proxy.admin_url}/model/reload").json()
    assert reloaded["classes"] == 3
    assert httpx.get(f"{proxy.admin_url}/eta").json()["classes"] == ["a", "b", "c"]
    broken = json.loads(path.read_text())
    broken["classes"][0]["D"] = "slow"
    path.write_text(json.dumps(broken))
    failed = httpx.post(f"{proxy.admin_url}/model/reload")
    assert failed.status_code == 422 and "classes.0.D" in failed.json()["detail"]
    assert len(httpx.get(f"{proxy.admin_url}/eta").json()["classes"]) == 3  # old model kept


def test_token_and_openapi(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(admin=True, admin_token="s3cret")
    assert httpx.get(f"{proxy.admin_url}/status").status_code == 401
    wrong = httpx.get(f"{proxy.admin_url}/status", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    ok = httpx.get(f"{proxy.admin_url}/status", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    paths = httpx.get(f"{proxy.admin_url}/openapi.json").json()["paths"]
    assert {
        "/status",
        "/classes",
        "/eta",
        "/policy",
        "/limits",
        "/model/reload",
        "/metrics",
    } <= set(paths)


def test_reload_without_a_model_file(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(admin=True)
    response = httpx.post(f"{proxy.admin_url}/model/reload")
    assert response.status_code == 409 and "--model" in response.json()["detail"]


def test_cli_refuses_an_unprotected_admin_api_beyond_loopback() -> None:
    from typer.testing import CliRunner

    from cli.app import app

    result = CliRunner().invoke(
        app, ["serve", "--backend", "postgresql://127.0.0.1:1", "--admin", "0.0.0.0:6433"]
    )
    assert result.exit_code == 2
    assert "needs --admin-token" in result.output.replace("\n", " ")


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)


def test_metrics_count_every_statement_once_and_bucket_its_times() -> None:
    """Scheduler-driven: three statements finish with known waits and response times, one is
    cancelled, one still runs and one still waits; the Prometheus text says exactly that."""
    from prometheus_client import generate_latest

    from admission import Scheduler
    from proxy.admin import AdminMetrics

    s = Scheduler(None, "fcfs", Limits(mpl=1))
    metrics = AdminMetrics(s)
    s.submit("blocker", "fp:b", 0.0, name="B")
    for job, (wait, run) in enumerate([(0.0005, 0.002), (0.003, 0.2), (1.0, 400.0)]):
        start = 1000.0 * (job + 1)
        s.submit(job, "fp:a", start - wait, name="A")  # queued behind the blocker
        s.complete("blocker", start)  # job is admitted at `start`
        s.submit("blocker", "fp:b", start, name="B")  # queued behind job
        s.complete(job, start + run)  # the blocker runs again
    s.submit("gone", "fp:a", 5000.0, name="A")
    s.complete("gone", 5001.0)  # left the queue: cancelled
    s.submit("waiting", "fp:a", 5002.0, name="A")
    s.submit("set", "fp:c", 5003.0, name="C", bypass=True)  # admitted past the queue
    s.complete("set", 5003.0005)
    text = generate_latest(metrics.registry).decode()

    def value(line: str) -> float:
        (found,) = [x for x in text.splitlines() if x.startswith(line + " ")]
        return float(found.rsplit(" ", 1)[1])

    wait, response = "admission_queue_wait_seconds", "admission_response_seconds"
    assert value(f'{wait}_bucket{{le="0.001",query_class="A"}}') == 1
    assert value(f'{wait}_bucket{{le="0.005",query_class="A"}}') == 2
    assert value(f'{wait}_bucket{{le="1.0",query_class="A"}}') == 3
    assert value(f'{wait}_sum{{query_class="A"}}') == pytest.approx(1.0035)
    assert value(f'{response}_bucket{{le="0.005",query_class="A"}}') == 1
    assert value(f'{response}_bucket{{le="0.1",query_class="A"}}') == 1
    assert value(f'{response}_bucket{{le="0.25",query_class="A"}}') == 2  # 0.203 s
    assert value(f'{response}_bucket{{le="300.0",query_class="A"}}') == 2
    assert value(f'{response}_bucket{{le="+Inf",query_class="A"}}') == 3
    assert value(f'{response}_sum{{query_class="A"}}') == pytest.approx(401.2055)
    assert value('admission_completed_total{query_class="A"}') == 3
    assert value('admission_cancelled_total{query_class="A"}') == 1
    assert value('admission_admitted_total{query_class="A"}') == 3
    # the blocker: three done, one running now (counted as admitted while it runs)
    assert value('admission_admitted_total{query_class="B"}') == 4
    assert value('admission_completed_total{query_class="B"}') == 3
    # the waits of those done: 0 (admitted on arrival), 0.002 and 0.2 s behind an A statement
    assert value(f'{wait}_bucket{{le="0.001",query_class="B"}}') == 1
    assert value(f'{wait}_bucket{{le="0.005",query_class="B"}}') == 2
    assert value(f'{wait}_bucket{{le="0.1",query_class="B"}}') == 2
    assert value(f'{wait}_bucket{{le="0.25",query_class="B"}}') == 3
    assert value(f'{wait}_bucket{{le="+Inf",query_class="B"}}') == 3
    assert value(f'{wait}_count{{query_class="B"}}') == 3
    assert value(f'{wait}_sum{{query_class="B"}}') == pytest.approx(0.202)
    assert value('admission_bypassed_total{query_class="C"}') == 1
    assert value('admission_completed_total{query_class="C"}') == 1
    assert value(f'{response}_bucket{{le="0.001",query_class="C"}}') == 1
    assert value(f'{wait}_sum{{query_class="C"}}') == 0
    assert value("admission_in_service") == 1 and value("admission_queued") == 1
    assert metrics.tallies()["A"].submitted == 5  # 3 done, 1 cancelled, 1 waiting
    assert [r[1] for r in metrics.recent] == ["B", "A", "B", "A", "B", "A", "C"]


def test_learning_in_status_and_reset(make_proxy: MakeProxy, tmp_path: Path) -> None:
    """What was learned live shows in /status and /classes; /model/reset forgets it, for one
    class (back to what training measured, even once the learned model was saved over the
    file) or for all."""
    import psycopg

    path = tmp_path / "model.json"
    trained = EtaModel(classes=(ClassProfile(fingerprint="hint:a", name="a", D=5, f=1, D_runs=10),))
    trained.save(path)
    proxy = make_proxy(admin=True, model=trained, model_path=path, learn=True)
    learning = proxy.learning
    assert learning is not None
    with psycopg.connect(proxy.dsn_base + " user=postgres dbname=postgres", autocommit=True) as c:
        for _ in range(6):
            c.execute("select pg_sleep(0.01)")
            c.execute("/* admission:class=a */ select 1")
    assert proxy.call(learning.refresh)
    proxy.call(learning.save)  # as serve does every few minutes: the file now holds it
    assert EtaModel.load(path).classes[0].live == 6
    status = httpx.get(f"{proxy.admin_url}/status").json()
    assert status["learning"]["enabled"] and status["learning"]["classes_learned_live"] >= 1
    classes = {c["name"]: c["profile"] for c in httpx.get(f"{proxy.admin_url}/classes").json()}
    (sleep,) = [n for n in classes if n != "a" and classes[n]["live"]]
    assert classes[sleep]["live"] == 6 and 0.005 < classes[sleep]["D"] < 0.5
    assert classes[sleep]["learned_at"].startswith(str(datetime.now(UTC).year))
    assert classes["a"]["live"] == 6 and classes["a"]["D"] < 1  # select 1 is no 5 s
    one = httpx.post(f"{proxy.admin_url}/model/reset", params={"class": sleep})
    assert one.status_code == 200
    classes = {c["name"]: c["profile"] for c in httpx.get(f"{proxy.admin_url}/classes").json()}
    assert classes[sleep]["live"] == 0
    httpx.post(f"{proxy.admin_url}/model/reset", params={"class": "a"})
    classes = {c["name"]: c["profile"] for c in httpx.get(f"{proxy.admin_url}/classes").json()}
    assert classes["a"]["D"] == 5 and classes["a"]["live"] == 0
    assert httpx.post(f"{proxy.admin_url}/model/reset", params={"class": "nope"}).status_code == 404
    everything = httpx.post(f"{proxy.admin_url}/model/reset").json()
    # the file's model again; a class seen live stays known, on the default profile
    assert everything["learning"]["classes_learned_live"] == 0 and everything["classes"] == 2
    classes = {c["name"]: c["profile"] for c in httpx.get(f"{proxy.admin_url}/classes").json()}
    assert classes["a"]["D"] == 5 and classes[sleep]["live"] == 0


def test_reset_without_learning(make_proxy: MakeProxy) -> None:
    proxy = make_proxy(admin=True)
    response = httpx.post(f"{proxy.admin_url}/model/reset")
    assert response.status_code == 409 and "--no-learn" in response.json()["detail"]
