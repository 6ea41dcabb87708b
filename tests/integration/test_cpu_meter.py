"""``CpuMeter``, what ``--mpl auto`` is told of the database's cores: real work reads busy.

The adaptive MPL does not look above an MPL whose cores it measured all but fully busy
(``admission.mpl``), so the meter must read a CPU-bound load as busy — the embedded DuckDB's
(this process's CPU time) and a local PostgreSQL's (``/proc/stat``) — and a load that waits
(``pg_sleep``) as far less so.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import duckdb
import psycopg
import pytest

from proxy.cpu import CpuMeter
from testing.pgcluster import Cluster

CORES = len(os.sched_getaffinity(0))


def _read_while(meter: CpuMeter, work: list[threading.Thread], seconds: float) -> float:
    for thread in work:
        thread.start()
    time.sleep(0.3)  # (all of them running)
    meter()
    time.sleep(seconds)
    share = meter()
    for thread in work:
        thread.join()
    assert share is not None
    return share


def test_duckdb_in_this_process_reads_busy() -> None:
    con = duckdb.connect(":memory:")
    meter = CpuMeter.process()
    time.sleep(0.5)
    idle = meter()
    assert idle is not None and idle < 0.3, idle

    stop = time.monotonic() + 2.5

    def spin() -> None:
        cursor = con.cursor()
        while time.monotonic() < stop:
            cursor.execute("select sum(hash(i)) from range(20000000) t(i)").fetchall()

    busy = _read_while(meter, [threading.Thread(target=spin) for _ in range(CORES)], 1.5)
    assert busy > 0.7, busy


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the host meter reads /proc/stat")
def test_a_local_postgresql_reads_busy_and_one_that_waits_does_not(pg: Cluster) -> None:
    meter = CpuMeter.host()
    assert meter is not None

    def load(sql: str) -> list[threading.Thread]:
        stop = time.monotonic() + 2.2

        def run() -> None:
            with psycopg.connect(pg.dsn(), autocommit=True) as conn:
                while time.monotonic() < stop:
                    conn.execute(sql)

        return [threading.Thread(target=run) for _ in range(CORES)]

    busy = _read_while(meter, load("select count(*) from generate_series(1, 2000000)"), 1.5)
    waiting = _read_while(meter, load("select pg_sleep(0.2)"), 1.5)
    assert busy > 0.7, busy
    assert waiting < busy - 0.3, (waiting, busy)
