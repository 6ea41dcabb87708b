"""Training: the estimator's bookkeeping by hand, then ``admission train`` for real on the
embedded DuckDB and on the suite's PostgreSQL (parallel plans on), checked against the OS's CPU
count and Little's law, loaded by the proxy and the simulator, and interrupted with Ctrl-C."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from admission import EtaModel, Scheduler
from admission.classify import classify_sql
from admission.scheduler import DUE_FACTOR
from lab.train import train
from testing.pgcluster import Cluster, connect_when_ready, free_port, interruptible
from training.estimate import (
    Completed,
    Estimator,
    attribute,
    fork_quantile,
    phases_of,
    pooled_phases,
)
from training.pgmemory import explain_memory
from training.train import TrainConfig, TrainResult
from workloads.tpch import draw_parameters, render_query

ADMISSION = str(Path(sys.executable).with_name("admission"))
CLASSES = (1, 4, 9, 16, 18, 21)
SF = 0.05


# -- the estimator, by hand ----------------------------------------------------------------


def test_estimator_by_hand() -> None:
    est = Estimator(cores=2, fork={"a": 2, "b": 1})
    est.admit("j1", "a", 0.0)  # nothing in flight: A^a_a = own fork 2
    est.sample(0.0, {"j1": 2})
    est.admit("j2", "b", 1.0)  # sees a: 2 tasks; own b: 1
    est.sample(1.0, {"j1": 2, "j2": 1})
    est.sample(2.0, {"j1": 1, "j2": 1})
    est.complete("j1", 3.0, cpu=2.5)
    est.sample(3.0, {"j2": 1})
    est.complete("j2", 4.0, cpu=1.5)
    est.sample(4.0, {})
    got = est.estimates()
    ea, eb = got["a"], got["b"]
    # a's tasks: 2 on [0,1), 2 on [1,2), 1 on [2,3) → 5 task-seconds over 4 s
    assert ea.Q == pytest.approx(5 / 4)
    # b's: 1 on [1,2), [2,3), [3,4) → 3 task-seconds
    assert eb.Q == pytest.approx(3 / 4)
    assert ea.U == pytest.approx(2.5 / (4 * 2)) and eb.U == pytest.approx(1.5 / 8)
    assert ea.thread_seconds == pytest.approx(5) and eb.thread_seconds == pytest.approx(3)
    # Little: Q_r = X_r · E[thread-seconds]
    for one in (ea, eb):
        assert one.Q == pytest.approx(one.throughput * one.thread_seconds)
    a = est.a_matrix(["a", "b"])  # A[r][c]
    assert a == [[2.0, 2.0], [0.0, 1.0]]
    assert ea.A == pytest.approx((2 + 2) / 2) and eb.A == pytest.approx(1 / 2)
    assert ea.response == pytest.approx(3.0) and eb.count == 1


def test_attribution_and_phases() -> None:
    assert attribute(3, {"x": 2.0, "y": 1.0}) == {"x": 2.0, "y": 1.0}
    assert attribute(2, {"x": 0.0, "y": 0.0}) == {"x": 1.0, "y": 1.0}
    series = [(0.0, 1), (0.1, 3), (0.2, 3), (0.3, 1), (0.4, 3), (0.5, 3), (0.6, 1)]
    # the lone 1 at 0.3 is shorter than both neighbours: merged into the 3-thread phase
    assert phases_of(series, 0.7) == [
        (1, pytest.approx(0.1)),
        (3, pytest.approx(0.5)),
        (1, pytest.approx(0.1)),
    ]
    runs = [
        Completed(
            i, "a", 0.0, 1.0, 0, None, tuple((t / 10, 2 if 2 <= t < 8 else 1) for t in range(10))
        )
        for i in range(3)
    ]
    assert pooled_phases(runs) == [
        (1, pytest.approx(0.2)),
        (2, pytest.approx(0.6)),
        (1, pytest.approx(0.2)),
    ]


# -- real training -------------------------------------------------------------------------


def _check_isolation(model: EtaModel, least: int) -> None:
    """D_r's interval, the runs behind it and the fork sizes they showed, for real."""
    runs = {c.D_runs for c in model.classes}
    assert len(runs) == 1, runs  # round-robin: every class ran as often
    assert runs.pop() >= least
    for c in model.classes:
        assert c.converged is not None, c
        assert sum(c.f_runs.values()) == c.D_runs  # the /proc samples' fork size per run
        # f_r from the database's own report where it gave one (DuckDB: every run's profile)
        assert c.f == fork_quantile(c.f_engine or c.f_runs), c
        if model.backend == "duckdb":
            assert sum(c.f_engine.values()) == c.D_runs and c.f_source == "DuckDB's profiler"
            assert max(c.f_engine) <= model.cores
        else:
            assert c.f_source == "PostgreSQL's workers launched" and c.f_engine, c
        if c.D_runs >= 6:  # from 6 runs on there is a distribution-free 95 % interval
            assert c.D_low is not None and c.D_high is not None, c
            assert c.D_low <= c.D <= c.D_high, c
            # converged means within ±5 %, and only then
            assert c.converged == (c.D_low >= 0.95 * c.D and c.D_high <= 1.05 * c.D), c
        else:
            assert c.D_low is None and c.D_high is None and c.converged is False, c
    unconverged = [c.name for c in model.classes if not c.converged]
    assert "round-robin runs per class" in model.notes
    assert ("not within ±5%" in model.notes) == bool(unconverged), model.notes
    assert all(name in model.notes for name in unconverged)
    assert model.speed is not None and model.speed.before > 0 and model.speed.after > 0
    assert ("speed changed" in model.notes) == (abs(model.speed.change) > 0.10)


def _check_q_intervals(model: EtaModel) -> None:
    """Q_r's batch-means interval: for every class or (a run too short for 4 batches) none,
    and around Q_r."""
    have = {c.Q_low is not None and c.Q_high is not None for c in model.classes}
    assert len(have) == 1, model.classes
    for c in model.classes:
        if c.Q_low is not None and c.Q_high is not None:
            assert 0 <= c.Q_low <= c.Q <= c.Q_high, c
            assert c.Q_high - c.Q_low < 2 * c.Q + 1, c  # an interval, not a shrug


def _check(result: TrainResult, classes: tuple[int, ...], least: int = 3) -> EtaModel:
    model = result.model
    assert [c.name for c in model.classes] == [f"Q{q}" for q in classes]
    for c in model.classes:
        assert c.D > 0 and c.f >= 1 and c.phases and c.count > 0, c
        assert c.U > 0 and c.Q > 0 and c.A > 0, c
        assert c.phases[0].threads == c.f
        assert sum(p.duration for p in c.phases) == pytest.approx(c.D, rel=1e-6)
    _check_isolation(model, least)
    _check_q_intervals(model)
    assert len(model.A_matrix) == len(classes)
    assert set(model.eta) == {"fcfs", "sept", "min-q", "min-a", "max-u", "max-p", "latency"}
    checks = result.checks
    assert 0 < checks.u_sum <= 1.0
    # U_r matches the CPU time the OS reports for the database over the run, within 10 %
    assert checks.cpu_error < 0.10, (checks.model_cpu, checks.os_cpu)
    # Q_r matches Little's law within 10 %
    for name, (q, little) in checks.little.items():
        assert q == pytest.approx(little, rel=0.10), name
    assert checks.sampler_cpu < 0.10
    return model


def _uses_the_model(model: EtaModel, path: Path) -> None:
    model.save(path)
    loaded = EtaModel.load(path)
    assert loaded.fingerprints == model.fingerprints
    scheduler = Scheduler(loaded, "min-a")  # what the proxy builds
    assert scheduler.submit("j", loaded.classes[0].fingerprint, 0.0) != []
    sim = subprocess.run(
        [
            ADMISSION,
            "simulate",
            "--model",
            str(path),
            "--policies",
            "fcfs,min-a",
            "--replications",
            "1",
            "--completions",
            "400",
            "--warmup",
            "40",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert sim.returncode == 0, sim.stderr
    summary = json.loads(sim.stdout)
    assert set(summary["policies"]) == {"fcfs", "min-a"}


def test_train_on_duckdb(tmp_path: Path) -> None:
    config = TrainConfig(
        backend="duckdb",
        tpch=SF,
        classes=CLASSES,
        isolation_reps=3,
        isolation_seconds=4,
        concurrency=4,
        duration=6,
        interval=0.02,
    )
    result = train(config)
    model = _check(result, CLASSES)
    assert model.backend == "duckdb" and "profiler" in model.notes
    assert all(c.Q_low is not None for c in model.classes)  # 6 s: batches enough
    threads = max(p.threads for c in model.classes for p in c.phases)
    assert 2 <= threads <= (os.cpu_count() or 2) + 2  # DuckDB's threads, one per core
    # memory: the buffer manager's peak during each statement beyond what it held before —
    # a statement building hash tables takes some; nothing near the database's whole size
    memory = {c.name: c.M for c in model.classes}
    assert all(m is not None for m in memory.values()), memory
    assert max(m or 0 for m in memory.values()) > 64 * 1024, memory
    assert all((m or 0) < 2**30 for m in memory.values()), memory
    assert all(c.spill == 0 for c in model.classes)  # nothing spills at this size
    # … and what a statement of it shows run alone, outside training and the proxy: within
    # 20 % (Q18: its hash table holds every order whatever the parameters)
    q18 = next(c for c in model.classes if c.name == "Q18")
    alone = _duckdb_peak_alone(q18.sample_sql)
    assert q18.M == pytest.approx(alone, rel=0.2), (q18.M, alone)
    assert EtaModel.load(_saved(model, tmp_path)).classes[0].M == model.classes[0].M
    _uses_the_model(model, tmp_path / "duck.json")


def _duckdb_peak_alone(sql: str) -> float:
    """What DuckDB's profiler reports of ``sql`` run alone, straight on a fresh database with
    the same data (no proxy, no training): its buffer manager's peak during the statement less
    what it held before, the largest of five runs. (That this peak is the statement's own, as
    another cursor polling ``duckdb_memory()`` sees it: ``benchmarks/memory_measure.py``.)"""
    import duckdb

    from proxy.backends.embedded.executor import set_profiling
    from workloads.tpch.data import generate, load_duckdb

    con = duckdb.connect()
    try:
        load_duckdb(con, generate(SF), SF)
        cursor = con.cursor()
        set_profiling(cursor, True)
        cursor.execute(sql).fetchall()  # once to warm up
        peaks = []
        for _ in range(5):
            row = cursor.execute("select sum(memory_usage_bytes) from duckdb_memory()").fetchone()
            base = float(row[0]) if row else 0.0
            cursor.execute(sql).fetchall()
            info = json.loads(cursor.get_profiling_information(format="json"))
            peaks.append(float(info["system"]["peak_buffer_memory"]) - base)
        return max(peaks)
    finally:
        con.close()


def _saved(model: EtaModel, tmp_path: Path) -> Path:
    path = tmp_path / "saved.json"
    model.save(path)
    return path


def _parallel_classes(conninfo: str) -> set[int]:
    found = set()
    with psycopg.connect(conninfo) as conn:
        for q in CLASSES:
            sql = render_query(q, draw_parameters(q, random.Random(q), SF))
            plan = "\n".join(r[0] for r in conn.execute("explain " + sql).fetchall())
            if re.search(r"Workers Planned: [1-9]", plan):
                found.add(q)
    return found


def test_train_on_postgresql_with_parallel_workers(pg: Cluster, tmp_path: Path) -> None:
    pg.psql("drop database if exists tpch_train")
    pg.psql("create database tpch_train")
    for setting in (
        "max_parallel_workers_per_gather = 2",
        "parallel_setup_cost = 0",
        "parallel_tuple_cost = 0",
        "min_parallel_table_scan_size = 0",
    ):
        pg.psql(f"alter database tpch_train set {setting}")
    url = f"postgresql://postgres@127.0.0.1:{pg.port}/tpch_train"
    config = TrainConfig(
        backend=url,
        tpch=SF,
        classes=CLASSES,
        isolation_reps=3,
        isolation_seconds=4,
        concurrency=4,
        duration=8,
        interval=0.02,
    )
    result = train(config)
    model = _check(result, CLASSES)
    parallel = _parallel_classes(url)
    assert parallel, "the planner chose no parallel plan; the test proves nothing"
    by_name = {c.name: c for c in model.classes}
    for q in parallel:
        fork = max(p.threads for p in by_name[f"Q{q}"].phases)
        assert fork > 1, (q, by_name[f"Q{q}"].phases)
    assert any(by_name[f"Q{q}"].f > 1 for q in parallel)
    for name, c in by_name.items():  # the leader and at most 2 workers per Gather
        assert 1 <= min(c.f_engine) and max(c.f_engine) <= 3, (name, c.f_engine)
    # memory: what PostgreSQL reports of each class's operators (and workers); Q18 (its hash
    # aggregate holds every order whatever the parameters) run alone again reports within 20 %
    assert all(c.M is not None and c.spill is not None for c in model.classes)
    assert max(c.M or 0 for c in model.classes) > 256 * 1024, [(c.name, c.M) for c in model.classes]
    q18 = by_name["Q18"]
    with psycopg.connect(url, autocommit=True) as conn:
        alone = max(explain_memory(conn, q18.sample_sql)[0] for _ in range(3))
    assert q18.M == pytest.approx(alone, rel=0.2), (q18.M, alone)
    assert (
        model.classes[0].fingerprint
        == classify_sql(render_query(1, draw_parameters(1, random.Random(0), SF))).fingerprint
    )
    _uses_the_model(model, tmp_path / "pg.json")


def test_train_against_a_server_without_proc_access(
    pg: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server on another machine: tasks from pg_stat_activity, CPU estimated, and said so."""
    import training.train as trainer

    monkeypatch.setattr(trainer._Probes, "_local_postmaster", lambda self: None)
    pg.psql("drop database if exists tpch_remote")
    pg.psql("create database tpch_remote")
    url = f"postgresql://postgres@127.0.0.1:{pg.port}/tpch_remote"
    config = TrainConfig(
        backend=url,
        tpch=SF,
        classes=(1, 6),
        isolation_reps=2,
        isolation_seconds=2,
        concurrency=3,
        duration=4,
        interval=0.02,
    )
    result = train(config)
    model = result.model
    assert "pg_stat_activity" in model.notes and "estimated" in model.notes
    assert all(c.U > 0 and c.Q > 0 and c.count > 0 for c in model.classes)
    _check_isolation(model, 2)
    assert 0 < result.checks.u_sum <= 1.0 and result.checks.os_cpu is None
    assert all(c.M is not None for c in model.classes)  # EXPLAIN needs no /proc


# -- the command line ------------------------------------------------------------------------


def _train_cli(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        interruptible(
            [
                ADMISSION,
                "train",
                "--tpch",
                str(SF),
                "--classes",
                "1,6,14",
                "--isolation-reps",
                "2",
                "--isolation-seconds",
                "2",
                "--concurrency",
                "3",
                "--interval",
                "0.02",
                "--out",
                str(out),
                *extra,
            ]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_train_cli_writes_model_table_and_heat_map(tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    proc = _train_cli(out, "--duration", "3")
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    assert "Q14" in stdout and "Σ U_r" in stdout and "sampler:" in stdout
    model = EtaModel.load(out)
    assert model.classes[1].name == "Q6"
    _check_isolation(model, 2)
    _check_q_intervals(model)
    if model.classes[0].Q_low is not None:
        assert "MIN-Q admits" in stdout and "LATENCY admits" in stdout
    q6 = model.classes[1]  # D_r as "estimate [low, high] (runs)"
    assert q6.D_low is not None and q6.D_high is not None, q6  # ≥ 6 runs of a quick class
    assert re.search(
        rf"Q6 │ +{q6.D:.4g} \[{q6.D_low:.4g}, {q6.D_high:.4g}\] \({q6.D_runs}\)", stdout
    )
    assert "machine speed" in stdout and "Q6:" in stderr and "runs by fork size" in stderr
    order = next(line for line in stdout.splitlines() if "SEPT admits" in line)
    assert all(name in order for name in ("Q1", "Q6", "Q14")) and "(≈: tied)" in order
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    check = subprocess.run([ADMISSION, "model", "check", str(out)], capture_output=True, text=True)
    assert check.returncode == 0 and "3 classes" in check.stdout
    _serve_with(out)


def _serve_with(model: Path) -> None:
    """The live proxy loads the trained model and admits by it: with no --policy and no --mpl,
    by the recommended policy at the MPL the model's cores give."""
    port, admin = free_port(), free_port()
    proc = subprocess.Popen(
        [
            ADMISSION,
            "serve",
            "--tpch",
            str(SF),
            "--listen",
            f"127.0.0.1:{port}",
            "--model",
            str(model),
            "--admin",
            f"127.0.0.1:{admin}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with connect_when_ready(port, proc) as conn:
            sql = render_query(6, draw_parameters(6, random.Random(1), SF), "duckdb")
            conn.execute(sql).fetchall()
        classes = {c["name"]: c for c in httpx.get(f"http://127.0.0.1:{admin}/classes").json()}
        assert {"Q1", "Q6", "Q14"} <= set(classes)
        assert classes["Q6"]["counts"]["completed"] == 1  # classified as the trained class
        q6 = classes["Q6"]["profile"]
        assert q6["D_low"] <= q6["D"] <= q6["D_high"] and q6["D_runs"] >= 2
        assert "Q_low" in q6 and "Q_high" in q6
        assert sum(q6["f_runs"].values()) == q6["D_runs"] and isinstance(q6["converged"], bool)
        status = httpx.get(f"http://127.0.0.1:{admin}/status").json()
        assert status["policy"] == "latency"
        cores = json.loads(model.read_text())["cores"]
        assert status["limits"]["mpl"] == cores and status["limits"]["due_factor"] == DUE_FACTOR
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_ctrl_c_or_sigterm_keeps_a_usable_partial_model_or_none(tmp_path: Path) -> None:
    """Stopped in the concurrent run (here by SIGTERM, as a service manager stops it) it
    writes what was measured; stopped before (Ctrl-C) it writes nothing."""
    out = tmp_path / "partial.json"
    proc = _train_cli(out, "--duration", "120")
    deadline = time.monotonic() + 120
    assert proc.stderr is not None
    while "concurrent:" not in proc.stderr.readline():  # wait for the concurrent phase
        assert time.monotonic() < deadline and proc.poll() is None
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    model = EtaModel.load(out)
    assert "interrupted" in model.notes and len(model.classes) == 3

    early = tmp_path / "none.json"
    proc = _train_cli(early, "--duration", "120")
    while "isolation:" not in proc.stderr.readline():  # type: ignore[union-attr]
        assert time.monotonic() < deadline and proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no model written" in stderr
    assert not early.exists() and not list(tmp_path.glob(".none.json*"))


def test_train_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    for args, message in (
        (["--classes", "1,23"], "TPC-H has queries 1 to 22"),
        (["--classes", "one"], "--classes takes 'all'"),
        (["--backend", "mysql://x"], "postgresql://"),
        (["--out", str(tmp_path / "no" / "such" / "m.json")], "does not exist"),
    ):
        result = subprocess.run(
            [ADMISSION, "train", *args], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
