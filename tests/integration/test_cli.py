"""The ``admission`` command line, run as a user would: a real subprocess of the installed
entry point, checking output, exit codes and error messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from admission import ClassProfile, EtaModel, Phase

ADMISSION = str(Path(sys.executable).with_name("admission"))


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ADMISSION, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


def test_help_lists_the_subcommands() -> None:
    result = run("--help")
    assert result.returncode == 0
    for word in ("simulate", "classify", "model"):
        assert word in result.stdout


@pytest.mark.parametrize(
    ("command", "paragraphs"), [(("bench",), 2), (("serve",), 3), (("model", "rescale"), 2)]
)
def test_help_flows_the_text_to_the_terminal(command: tuple[str, ...], paragraphs: int) -> None:
    """A command's description is wrapped at the terminal's width, not the source's: on a
    wide terminal each paragraph is one line."""
    result = run(*command, "--help", env={"COLUMNS": "2000"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next(i for i, line in enumerate(lines) if "─" in line)
    assert len([line for line in lines[start:end] if line.strip()]) == paragraphs


def test_simulate_json_has_the_documented_shape(tmp_path: Path) -> None:
    result = run(
        "simulate",
        "--workload",
        "var-para",
        "--mix",
        "II",
        "--policies",
        "fcfs,sept,min-a",
        "--completions",
        "1500",
        "--warmup",
        "150",
        "--replications",
        "2",
        "--format",
        "json",
        "--plot",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["workload"] == "var-para" and data["mix"] == "II"
    assert [c["name"] for c in data["classes"]] == ["SC1", "SC2", "SC3"]
    for c in data["classes"]:
        assert {"U", "U_ci", "Q", "A", "P_row_sum", "rank"} <= set(c)
        assert set(c["rank"]) == {"fcfs", "sept", "min-a"}
    assert set(data["policies"]) == {"fcfs", "sept", "min-a"}
    for p in data["policies"].values():
        assert {
            "throughput",
            "mean_response",
            "p95_response",
            "p99_response",
            "weighted_slowdown",
            "per_class",
        } <= set(p)
        assert set(p["per_class"]) == {"SC1", "SC2", "SC3"}
    pngs = sorted(x.name for x in tmp_path.glob("*.png"))
    assert pngs == [
        f"var-para-II-{k}.png" for k in ("ccdf", "mean_response", "throughput", "weighted_slowdown")
    ]


def test_simulate_options_from_environment() -> None:
    result = run(
        "simulate",
        "--policies",
        "fcfs",
        "--format",
        "json",
        "--replications",
        "1",
        env={
            "ADMISSION_COMPLETIONS": "500",
            "ADMISSION_WARMUP": "50",
            "ADMISSION_WORKLOAD": "lin-increase",
        },
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["workload"] == "lin-increase"


def test_simulate_with_tenants(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[[workload]]\nname = 'web'\n[[workload]]\nname = 'etl'\npriority = 'batch'\n")
    common = ("simulate", "--policies", "fcfs", "--completions", "600", "--warmup", "60")
    result = run(
        *common,
        "--replications",
        "1",
        "--mpl",
        "4",
        "--format",
        "json",
        "--workload-classes",
        str(path),
        "--tenants",
        "web,etl,etl",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["policies"]
    wrong = run(*common, "--workload-classes", str(path), "--tenants", "web")
    assert wrong.returncode == 2 and "one per class" in wrong.stderr.replace("\n", " ")


def test_simulate_with_a_heavy_tailed_class() -> None:
    """--tails: one class's runs one in 10 ten times the others — its p99 response grows
    beyond the same class's without (the mean kept), and its D_tail is in the model."""
    common = (
        "simulate",
        "--workload",
        "var-service",
        "--policies",
        "fcfs,latency",
        "--load",
        "0.7",
        "--cores",
        "2",
        "--completions",
        "3000",
        "--warmup",
        "300",
        "--replications",
        "2",
        "--format",
        "json",
    )
    even = run(*common)
    tailed = run(*common, "--tails", "-;-;0.1,10")
    assert even.returncode == 0 and tailed.returncode == 0, (even.stderr, tailed.stderr)
    a, b = json.loads(even.stdout), json.loads(tailed.stdout)
    assert b["policies"]["fcfs"]["p99_response"] > a["policies"]["fcfs"]["p99_response"]
    assert b["classes"][2]["D_tail"] and a["classes"][2]["D_tail"] is None


def test_simulate_table_output() -> None:
    result = run(
        "simulate",
        "--policies",
        "fcfs,max-p",
        "--completions",
        "800",
        "--warmup",
        "80",
        "--replications",
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert "weighted slowdown" in result.stdout and "max-p" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "fcfs,lifo"], "unknown policy lifo"),
        (["--workload", "var-everything"], "unknown workload"),
        (["--mix", "IV"], "--mix must be one of"),
        (["--routing", "sideways"], "routing must be one of"),
        (["--replications", "0"], "replications"),
        (["--model", "/nonexistent/model.json"], "cannot read the model file"),
        (["--lifo-after", "1"], "--lifo-after needs --queue-timeout"),
        (["--mpl", "lots"], "--mpl takes a whole number or 'auto'"),
        (["--tenants", "a,b,c"], "--tenants needs --workload-classes"),
        (["--tails", "-;0.05,40"], "--tails gives 2 entries for 3 classes"),
        (["--tails", "-;often;-"], "--tails entry 'often'"),
        (["--tails", "-;1.5,40;-"], "needs 0 < p < 1 and m > 0"),
    ],
)
def test_simulate_bad_arguments_are_clear(args: list[str], message: str) -> None:
    result = run("simulate", *args)
    assert result.returncode == 2
    assert message in result.stderr.replace("\n", " ") or message in result.stdout
    assert "Traceback" not in result.stderr


def _trained_model(path: Path) -> None:
    EtaModel(
        backend="duckdb",
        dataset="tpch-sf0.01",
        cores=2,
        classes=(
            ClassProfile(
                fingerprint="pg:1",
                name="Q16",
                D=0.05,
                f=2,
                U=0.1,
                Q=0.5,
                A=0.6,
                phases=(Phase(threads=2, duration=0.02), Phase(threads=1, duration=0.03)),
            ),
            ClassProfile(
                fingerprint="pg:2",
                name="Q9",
                D=0.4,
                f=2,
                U=0.4,
                Q=1.5,
                A=1.7,
                phases=(Phase(threads=2, duration=0.4),),
            ),
        ),
        A_matrix=((0.7, 0.4), (1.2, 1.9)),
    ).save(path)


def test_simulate_trace_driven_from_a_model_file(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _trained_model(path)
    for source in ("simulation", "model"):
        result = run(
            "simulate",
            "--model",
            str(path),
            "--mix-vector",
            "0.7,0.3",
            "--cores",
            "2",
            "--fcr",
            "4",
            "--jobs",
            "8",
            "--think",
            "0.2",
            "--completions",
            "600",
            "--warmup",
            "60",
            "--replications",
            "2",
            "--eta-source",
            source,
            "--format",
            "json",
        )
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert [c["name"] for c in data["classes"]] == ["Q16", "Q9"]
    bad = run("simulate", "--model", str(path), "--mix-vector", "1,2,3")
    assert bad.returncode == 2 and "model has 2 classes" in bad.stderr.replace("\n", " ")


def test_model_check_and_show(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _trained_model(path)
    assert run("model", "check", str(path)).returncode == 0
    shown = run("model", "show", str(path), "--policy", "max-p")
    assert shown.returncode == 0 and "Q16" in shown.stdout and "P_{r,c}" in shown.stdout
    broken = tmp_path / "broken.json"
    broken.write_text(path.read_text().replace('"f": 2', '"f": "two"', 1))
    result = run("model", "check", str(broken))
    assert result.returncode == 2
    assert "classes.0.f" in result.stderr and str(broken) in result.stderr.replace("\n", "")


def test_classify_from_arguments_and_stdin() -> None:
    result = run("classify", "select * from t where a = 1", "SET x = 1")
    assert result.returncode == 0 and "pg:" in result.stdout and "yes" in result.stdout
    piped = run("classify", stdin="select 1\nselect 2\n")
    assert piped.returncode == 0 and piped.stdout.count("pg:") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mpl", "some"], "--mpl takes a whole number or 'auto'"),
        (["--mpl", "-1"], "--mpl must be 0 (unlimited) or more"),
        (["--explain-dsn", "host=x"], "--explain-dsn belongs to --backend"),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--pool-mode",
                "transaction",
                "--contention",
            ],
            "--contention with --pool-mode transaction is not supported",
        ),
        (
            ["--backend", "postgresql://127.0.0.1:1", "--explain-dsn", "host=x", "--no-learn"],
            "it has none with --no-learn",
        ),
        (["--lifo-after", "3"], "--lifo-after needs --queue-timeout"),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--mpl",
                "2",
                "--coordinator",
                "postgresql://127.0.0.1:1",
                "--release-after",
                "1",
            ],
            "--release-after with --coordinator is not supported",
        ),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--pool-mode",
                "transaction",
                "--release-after",
                "1",
            ],
            "--release-after with --pool-mode transaction is not supported",
        ),
        (["--release-after", "-1"], "--release-after"),
        (["--mpl", "0", "--release-after", "1"], "it needs an MPL"),
        (["--mpl", "0", "--short-lane", "4"], "--short-lane lets statements run beside the MPL"),
        (["--mpl", "2", "--short-lane", "0.5"], "short_lane"),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--pool-mode",
                "transaction",
                "--short-lane",
                "4",
            ],
            "--short-lane with --pool-mode transaction is not supported",
        ),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--mpl",
                "2",
                "--grant-work-mem",
                "1GB",
                "--release-after",
                "1",
            ],
            "--release-after with --grant-work-mem is not supported",
        ),
        (["--sample-interval", "5", "--profile-window", "2"], "--profile-window must be longer"),
        (["--memory", "lots"], "--memory takes a size such as 4GB"),
        (["--memory", "4 parsecs"], "--memory takes a size such as 4GB"),
        (["--memory-limit", "-1GB"], "--memory-limit takes a size"),
        (
            ["--backend", "postgresql://127.0.0.1:1", "--memory-limit", "1GB"],
            "--memory-limit is the embedded DuckDB's",
        ),
        (["--max-temp-size", "much"], "--max-temp-size takes a size"),
        (
            ["--backend", "postgresql://127.0.0.1:1", "--max-temp-size", "0"],
            "--max-temp-size is the embedded DuckDB's",
        ),
        (["--grant-work-mem", "1GB"], "--grant-work-mem sets PostgreSQL's work_mem"),
        (["--workload-classes", "/nonexistent/w.toml"], "no such workload-classes file"),
        (
            ["--backend", "postgresql://127.0.0.1:1", "--grant-work-mem", "some"],
            "--grant-work-mem takes a size",
        ),
        (
            ["--backend", "postgresql://127.0.0.1:1", "--grant-work-mem", "0"],
            "--grant-work-mem must be more than 0",
        ),
        (
            ["--backend", "postgresql://127.0.0.1:1", "--grant-work-mem", "1GB", "--mpl", "0"],
            "it needs an MPL",
        ),
        (["--pool-mode", "statement"], "--pool-mode must be session or transaction"),
        (["--pool-mode", "transaction"], "the embedded DuckDB has none to pool"),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--pool-mode",
                "transaction",
                "--pool-size",
                "0",
            ],
            "--pool-size",
        ),
        (
            [
                "--backend",
                "postgresql://127.0.0.1:1",
                "--pool-mode",
                "transaction",
                "--grant-work-mem",
                "1GB",
                "--mpl",
                "4",
            ],
            "--grant-work-mem needs --pool-mode session",
        ),
    ],
)
def test_serve_bad_arguments_are_clear(args: list[str], message: str) -> None:
    result = run("serve", "--listen", "127.0.0.1:0", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.stderr


def test_model_rescale_to_a_given_speed_and_to_this_machine(tmp_path: Path) -> None:
    from admission.model import Speed
    from training.speed import UNIT

    path, out = tmp_path / "model.json", tmp_path / "here.json"
    _trained_model(path)
    unmeasured = run("model", "rescale", str(path), "--out", str(out))
    assert unmeasured.returncode == 2 and "no machine speed" in unmeasured.stderr
    assert not out.exists()
    m = EtaModel.load(path)
    m.model_copy(update={"speed": Speed(before=2e8, after=2e8, unit=UNIT)}).save(path)
    done = run("model", "rescale", str(path), "--out", str(out), "--speed", "1e8")
    assert done.returncode == 0, done.stderr
    here = EtaModel.load(out)
    assert [c.D for c in here.classes] == [0.1, 0.8] and here.speed is not None
    assert "D_r × 2" in done.stdout.replace("\n", " ")
    measured = run("model", "rescale", str(path), "--out", str(out))  # this machine's probe
    assert measured.returncode == 0 and "this machine:" in measured.stdout, measured.stderr
    speed = EtaModel.load(out).speed
    assert speed is not None and speed.before > 1e6
    assert EtaModel.load(out).classes[0].D == pytest.approx(0.05 * 2e8 / speed.before)


def test_train_notes_a_machine_slower_than_for_the_model_it_replaces(tmp_path: Path) -> None:
    from admission.model import Speed
    from cli.train import _speed_against_earlier
    from training.speed import UNIT

    path = tmp_path / "model.json"
    _trained_model(path)
    m = EtaModel.load(path)
    assert _speed_against_earlier(m, path) == ""  # no speed in the earlier file
    m.model_copy(update={"speed": Speed(before=3e8, after=3e8, unit=UNIT)}).save(path)
    slow = m.model_copy(update={"speed": Speed(before=2.0e8, after=2.2e8, unit=UNIT)})
    note = _speed_against_earlier(slow, path)
    assert "70%" in note and "1.4×" in note
    same = m.model_copy(update={"speed": Speed(before=2.8e8, after=2.9e8, unit=UNIT)})
    assert _speed_against_earlier(same, path) == ""  # within 10 %
    assert _speed_against_earlier(slow, tmp_path / "absent.json") == ""
