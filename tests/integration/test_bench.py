"""``admission bench`` for real on the embedded DuckDB: the JSON it is specified to write, figures,
the table, and a quick model trained when none is given."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from admission.scheduler import Limits
from lab.bench import BenchConfig, _limits
from testing.pgcluster import Cluster
from workloads.tpch.mixes import MIXES

ADMISSION = str(Path(sys.executable).with_name("admission"))
KEYS = {"throughput", "mean_response", "p95_response", "p99_response", "weighted_slowdown"}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            ADMISSION,
            "bench",
            "--mix",
            "light",
            "--tpch",
            "0.01",
            "--clients",
            "4",
            "--duration",
            "3",
            "--repetitions",
            "2",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )


def _refused(*args: str) -> tuple[int, str]:
    """``admission bench`` as ``_bench`` runs it, refused on its arguments, in this process
    (a new interpreter spends 1–2 s importing before it can refuse anything): the exit status
    and what it printed, its whitespace made single spaces (the console wraps long lines)."""
    import click
    from typer.testing import CliRunner

    from cli.app import app

    argv = ["bench", "--mix", "light", "--tpch", "0.01", "--clients", "4", "--duration", "3"]
    result = CliRunner().invoke(app, [*argv, "--repetitions", "2", *args])
    said = " ".join(click.unstyle(result.output).split())
    if result.exit_code != 2 and result.exception is not None:
        said += f" ({result.exception!r})"
    return result.exit_code, said


def test_bench_json_figures_and_quick_model(tmp_path: Path) -> None:
    result = _bench(
        "--policies",
        "none,fcfs,min-a,sept",
        "--format",
        "json",
        "--plot",
        str(tmp_path),
        "--save",
        str(tmp_path / "saved.json"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training a quick one" in result.stderr
    out = json.loads(result.stdout)
    assert json.loads((tmp_path / "saved.json").read_text()) == out
    assert list(out["policies"]) == ["none", "fcfs", "min-a", "sept"]
    for name, summary in out["policies"].items():
        assert KEYS <= set(summary), name
        assert summary["throughput"] > 0 and summary["throughput_ci"] is not None
        assert 0 < summary["mean_response"] <= summary["p95_response"] <= summary["p99_response"]
        assert summary["weighted_slowdown"] > 0
        assert set(summary["per_class"]) == {f"Q{q}" for q in MIXES["light"].queries}
        assert summary["errors"] == 0
    assert out["mpl"] == 4 and out["mix"] == "light"
    figures = sorted(p.name for p in tmp_path.glob("*.png"))
    assert figures == [
        "bench-light-ccdf.png",
        "bench-light-mean_response.png",
        "bench-light-throughput.png",
        "bench-light-weighted_slowdown.png",
    ]


def test_bench_table_with_a_model_and_bad_arguments(tmp_path: Path) -> None:
    from admission import ClassProfile, EtaModel

    model = tmp_path / "m.json"
    EtaModel(classes=(ClassProfile(fingerprint="x", name="x", D=0.01, f=1),)).save(model)
    result = _bench("--policies", "fcfs,max-p,fcfs+again", "--model", str(model), "--max-wait", "5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "w. slowdown" in result.stdout and "max-p" in result.stdout
    assert "mean response time per class" in result.stdout
    assert "A/A control: fcfs run twice differed by" in result.stdout  # an A/A control
    assert "fcfs+again (recommended" not in result.stdout
    for args, message in (
        (["--policies", "fcfs,lifo"], "unknown policies"),
        (["--policies", "none,fcfs@2+again"], "not among the policies"),
        (["--mix", "extreme"], "unknown mix"),
        (["--warmup", "5"], "--warmup must be shorter"),
        (["--model", str(tmp_path / "missing.json")], "cannot read the model file"),
    ):
        status, said = _refused(*args)
        assert status == 2 and message in said, (args, said)


def test_none_means_no_admission_control() -> None:
    config = BenchConfig(mix=MIXES["light"], limits=Limits(mpl=4, threads=8, max_wait=3.0))
    assert _limits(config, "none") == Limits()
    assert _limits(config, "fcfs") == Limits(mpl=4, threads=8, max_wait=3.0)


def test_bench_on_postgresql(pg: Cluster, tmp_path: Path) -> None:
    from admission import ClassProfile, EtaModel

    pg.psql("drop database if exists tpch_bench")
    pg.psql("create database tpch_bench")
    pg.psql("alter database tpch_bench set work_mem = '64kB'")  # sorts and hashes spill
    model = tmp_path / "m.json"
    EtaModel(classes=(ClassProfile(fingerprint="x", name="x", D=0.01, f=1),)).save(model)
    result = _bench(
        "--backend",
        f"postgresql://postgres@127.0.0.1:{pg.port}/tpch_bench",
        "--policies",
        "none,fcfs,sept",
        "--model",
        str(model),
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["backend"].startswith("postgresql://")
    for summary in out["policies"].values():
        assert summary["throughput"] > 0 and summary["errors"] == 0
        # what PostgreSQL wrote to temporary files during each run
        assert all(r["spill_bytes"] > 0 for r in summary["repetitions"]), summary


def test_bench_through_a_transaction_pool_on_postgresql(pg: Cluster, tmp_path: Path) -> None:
    """--pool-size: eight clients share two server connections; the policies order the pool's
    queue; none is refused, as is a pool in front of the embedded DuckDB."""
    from admission import ClassProfile, EtaModel

    pg.psql("drop database if exists tpch_pool")
    pg.psql("create database tpch_pool")
    model = tmp_path / "m.json"
    EtaModel(classes=(ClassProfile(fingerprint="x", name="x", D=0.01, f=1),)).save(model)
    url = f"postgresql://postgres@127.0.0.1:{pg.port}/tpch_pool"
    common = ["--backend", url, "--model", str(model), "--pool-size", "2", "--clients", "8"]
    result = _bench(*common, "--policies", "fcfs,sept", "--format", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["pool_size"] == 2
    assert out["mpl"] == 2  # the pool's size, when --mpl is not given
    (pool,) = out["pools"]
    assert pool["pool_size"] == 2 and 1 <= pool["opened"] <= 2  # never more than the pool
    assert pool["handovers"] > 8 and pool["failed"] == 0
    for summary in out["policies"].values():
        assert summary["throughput"] > 0 and summary["errors"] == 0
    for args, message in (
        ([*common, "--policies", "none,fcfs"], "none is not a setting with --pool-size"),
        ([*common, "--policies", "fcfs,sept@3"], "an MPL above --pool-size 2"),
        ([*common, "--mpl", "0", "--policies", "fcfs"], "an MPL above --pool-size 2"),
        (["--pool-size", "2", "--policies", "fcfs"], "the embedded DuckDB has none to pool"),
    ):
        status, said = _refused(*args)
        assert status == 2 and message in said, (args, said[-2000:])


def test_open_arrivals_poisson_bursty_and_trace(tmp_path: Path) -> None:
    """Open arrivals through the proxy: the rate from --load and the model, SLOs, goodput and
    burst recovery in the JSON; a trace replayed and named by the model's classes."""
    from admission import ClassProfile, EtaModel
    from admission.classify import classify_sql
    from workloads.tpch.queries import draw_parameters, render_query

    sqls = {
        q: render_query(q, draw_parameters(q, random.Random(q), 0.01), "duckdb") for q in (6, 14)
    }
    model = tmp_path / "m.json"
    profiles = tuple(
        ClassProfile(fingerprint=classify_sql(sql).fingerprint, name=f"Q{q}", D=0.01, f=1)
        for q, sql in sqls.items()
    )
    EtaModel(classes=profiles).save(model)
    common = ("--mix", "6,14", "--model", str(model), "--format", "json")
    result = _bench(
        *common,
        "--arrivals",
        "poisson",
        "--load",
        "0.3",
        "--policies",
        "none,fcfs@1,sept",
        "--slo",
        "Q6=0.5",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["arrivals"] == "poisson" and out["rate"] == pytest.approx(30.0)
    assert out["offered_load"] == pytest.approx(0.3)
    assert out["slo"] == {"Q6": 0.5, "Q14": pytest.approx(0.1)}  # 10 · D_r by default
    assert list(out["policies"]) == ["none", "fcfs@1", "sept"]
    for name, p in out["policies"].items():
        assert p["errors"] == 0 and p["errors_by_sqlstate"] == {}, name
        assert 0 <= p["slo_attainment"] <= 1 and p["goodput"] <= p["throughput"] + 1e-9
        # an open load at ρ = 0.3 is carried: throughput near the rate (few statements: wide)
        assert 15 < p["throughput"] < 45, (name, p["throughput"])
        assert set(p["per_class_slo_attainment"]) == {"Q6", "Q14"}
        assert [r["repetition"] for r in p["repetitions"]] == [0, 1]
        assert all(r["throughput"] > 0 for r in p["repetitions"])
    assert "offered load ρ = λ·Σ p_r D_r = 0.3" in result.stderr

    # ρ of the capacity measured just before the runs, not of the model's D_r (which, at
    # 0.01 s for both, would put this rate at ρ = 0.01 · λ)
    measured = _bench(
        *common,
        "--arrivals",
        "poisson",
        "--load",
        "0.5",
        "--load-basis",
        "measured",
        "--capacity-seconds",
        "2",
        "--policies",
        "fcfs@2",
    )
    assert measured.returncode == 0, measured.stderr[-3000:]
    m = json.loads(measured.stdout)
    assert m["load_basis"] == "measured" and m["load"] == 0.5 and m["capacity"] > 10
    assert m["rate"] == pytest.approx(0.5 * m["capacity"])
    assert m["offered_load"] == pytest.approx(0.01 * m["rate"])
    assert "measuring capacity: " in measured.stderr and "of the measured" in measured.stderr
    fcfs = m["policies"]["fcfs@2"]
    assert fcfs["errors"] == 0 and 0.5 * m["rate"] < fcfs["throughput"] < 1.5 * m["rate"]

    bursts = _bench(
        *common,
        "--arrivals",
        "bursty",
        "--rate",
        "20",
        "--burst-every",
        "1.5",
        "--burst-length",
        "0.5",
        "--burst-factor",
        "3",
        "--policies",
        "fcfs",
        "--plot",
        str(tmp_path / "figures"),
    )
    assert bursts.returncode == 0, bursts.stderr[-3000:]
    b = json.loads(bursts.stdout)
    assert b["bursts"] == {"factor": 3.0, "every": 1.5, "length": 0.5}
    assert len(b["policies"]["fcfs"]["burst_recovery"]) == 2 * 1  # one burst ends in 3 s, ×2
    assert (tmp_path / "figures" / "bench-6:1,14:1-timeline.png").stat().st_size > 10_000

    trace = tmp_path / "trace.csv"
    trace.write_text(
        "offset,sql\n"
        + "".join(f'{i * 0.05:.2f},"{sqls[6 if i % 2 else 14]}"\n' for i in range(40))
    )
    replay = _bench(*common, "--arrivals", "trace", "--trace", str(trace), "--policies", "fcfs")
    assert replay.returncode == 0, replay.stderr[-3000:]
    r = json.loads(replay.stdout)
    assert set(r["policies"]["fcfs"]["per_class"]) == {"Q6", "Q14"}
    assert r["policies"]["fcfs"]["errors"] == 0
    for args, message in (
        (("--arrivals", "poisson"), "needs --rate or --load"),
        (("--arrivals", "poisson", "--rate", "5", "--load-basis", "measured"), "give --load"),
        (("--arrivals", "poisson", "--load", "0.5", "--load-basis", "cores"), "must be one of"),
        (("--arrivals", "poisson", "--rate", "5", "--slo", "Q6"), "is not CLASS=SECONDS"),
        (("--arrivals", "poisson", "--rate", "5", "--slo", "Q9=1"), "not in the workload"),
        (("--arrivals", "trace", "--trace", str(tmp_path / "none.csv")), "cannot read the trace"),
        (("--policies", "fcfs@0"), "the MPL must be at least 1"),
    ):
        status, said = _refused(*common, *args)
        assert status == 2 and message in said, (args, said[-2000:])
