"""A short headless locust run of the TPC-H locustfile through the embedded proxy: every query
of the mix shows up as its own request name, and none fails."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from admission import Limits
from testing.embeddedharness import Embedded
from workloads.tpch.data import generate, load_duckdb
from workloads.tpch.mixes import MIXES

LOCUST = str(Path(sys.executable).with_name("locust"))
ROOT = Path(__file__).resolve().parents[2]


def _locust(tmp_path: Path, locustfile: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A headless locust run of ``locustfile`` through an embedded proxy (MPL 2) with TPC-H
    SF 0.01, the light mix, CSV statistics in ``tmp_path/run*``; all capacity is back after."""
    data = generate(0.01, tmp_path / "cache")
    server = Embedded(Limits(mpl=2), lambda con: load_duckdb(con, data, 0.01), workers=4)
    try:
        result = subprocess.run(
            [
                LOCUST,
                "-f",
                str(ROOT / "workloads/tpch" / locustfile),
                "--headless",
                "--host",
                server.url,
                "--tpch-mix",
                "light",
                "--tpch-sf",
                "0.01",
                "--csv",
                str(tmp_path / "run"),
                "--stop-timeout",
                "10",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert server.call(lambda: server.scheduler.in_service) == 0
        return result
    finally:
        server.close()


def test_headless_locust_run_reports_each_class(tmp_path: Path) -> None:
    result = _locust(tmp_path, "locustfile.py", "-u", "6", "-r", "6", "-t", "6s", "--only-summary")
    assert result.returncode == 0, result.stderr[-3000:]
    with (tmp_path / "run_stats.csv").open() as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    expected = {f"Q{q}" for q in MIXES["light"].queries}
    assert expected <= set(rows), rows.keys()
    for name in expected:
        assert int(rows[name]["Request Count"]) > 0, name
        assert int(rows[name]["Failure Count"]) == 0, name
        assert rows[name]["Type"] == "SQL"
    total = rows["Aggregated"]
    assert int(total["Request Count"]) >= 20 and int(total["Failure Count"]) == 0


def test_locust_burst_shape_multiplies_the_users(tmp_path: Path) -> None:
    """The burst shape runs the same users, more of them inside a burst."""
    result = _locust(
        tmp_path,
        "bursts_locustfile.py",
        "-t",
        "8s",
        "--tpch-think",
        "0.05",
        "--burst-users",
        "2",
        "--burst-factor",
        "3",
        "--burst-every",
        "4",
        "--burst-length",
        "3",
        "--csv-full-history",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with (tmp_path / "run_stats_history.csv").open() as f:
        users = [int(r["User Count"]) for r in csv.DictReader(f) if r["Name"] == "Aggregated"]
    assert 2 in users and 6 in users, users  # 2 users, then 6 in the burst
    with (tmp_path / "run_stats.csv").open() as f:
        total = {row["Name"]: row for row in csv.DictReader(f)}["Aggregated"]
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0
