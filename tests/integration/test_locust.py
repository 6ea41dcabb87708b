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


def test_headless_locust_run_reports_each_class(tmp_path: Path) -> None:
    data = generate(0.01, tmp_path / "cache")
    server = Embedded(Limits(mpl=2), lambda con: load_duckdb(con, data, 0.01), workers=4)
    try:
        result = subprocess.run(
            [
                LOCUST,
                "-f",
                str(ROOT / "workloads/tpch/locustfile.py"),
                "--headless",
                "-u",
                "6",
                "-r",
                "6",
                "-t",
                "6s",
                "--host",
                server.url,
                "--tpch-mix",
                "light",
                "--tpch-sf",
                "0.01",
                "--csv",
                str(tmp_path / "run"),
                "--only-summary",
                "--stop-timeout",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
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
        assert server.call(lambda: server.scheduler.in_service) == 0
    finally:
        server.close()


def test_locust_burst_shape_multiplies_the_users(tmp_path: Path) -> None:
    """The burst shape runs the same users, more of them inside a burst: the requests per
    second inside the burst exceed those outside."""
    data = generate(0.01, tmp_path / "cache")
    server = Embedded(Limits(mpl=2), lambda con: load_duckdb(con, data, 0.01), workers=4)
    try:
        result = subprocess.run(
            [
                LOCUST,
                "-f",
                str(ROOT / "workloads/tpch/bursts_locustfile.py"),
                "--headless",
                "-t",
                "8s",
                "--host",
                server.url,
                "--tpch-mix",
                "light",
                "--tpch-sf",
                "0.01",
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
                "--csv",
                str(tmp_path / "run"),
                "--csv-full-history",
                "--stop-timeout",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        with (tmp_path / "run_stats_history.csv").open() as f:
            users = [
                int(row["User Count"]) for row in csv.DictReader(f) if row["Name"] == "Aggregated"
            ]
        assert 2 in users and 6 in users, users  # 2 users, then 6 in the burst
        with (tmp_path / "run_stats.csv").open() as f:
            total = {row["Name"]: row for row in csv.DictReader(f)}["Aggregated"]
        assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0
    finally:
        server.close()
