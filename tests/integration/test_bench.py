"""``admission bench`` for real on the embedded DuckDB: the JSON the issue specifies, figures,
the table, and a quick model trained when none is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    result = _bench("--policies", "fcfs,max-p", "--model", str(model), "--max-wait", "5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "w. slowdown" in result.stdout and "max-p" in result.stdout
    assert "mean response time per class" in result.stdout
    for args, message in (
        (["--policies", "fcfs,lifo"], "unknown policies"),
        (["--mix", "extreme"], "unknown mix"),
        (["--warmup", "5"], "--warmup must be shorter"),
        (["--model", str(tmp_path / "missing.json")], "cannot read the model file"),
    ):
        bad = _bench(*args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


def test_none_means_no_admission_control() -> None:
    config = BenchConfig(mix=MIXES["light"], limits=Limits(mpl=4, threads=8, max_wait=3.0))
    assert _limits(config, "none") == Limits()
    assert _limits(config, "fcfs") == Limits(mpl=4, threads=8, max_wait=3.0)


def test_bench_on_postgresql(pg: Cluster, tmp_path: Path) -> None:
    from admission import ClassProfile, EtaModel

    pg.psql("drop database if exists tpch_bench")
    pg.psql("create database tpch_bench")
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
