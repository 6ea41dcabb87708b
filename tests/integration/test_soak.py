"""A minute of the soak benchmark (``benchmarks/soak.py``): ``admission serve`` on the embedded
DuckDB as its own process, locust's TPC-H users through it, connections renewed often.

Asserted: no client saw an error, every request locust counted reached the proxy and finished
there, statements in service, the thread budget and the queue were back to 0 once the load
stopped, and the proxy's RSS grew by at most a quarter from 20 s in to the end. A minute is
short for memory — the proxy's RSS still rises by some 10–13 % over those 40 s while DuckDB and
the allocator settle — hence the generous bound; the load is set so that it still catches a
real leak: ~100 statements/s and a new connection every ~5 statements, so that keeping 15 kB
per statement or 100 kB per connection takes the growth to ~40 % (measured by injecting each).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import SoakConfig, run_soak


def test_a_minute_of_load_leaves_no_errors_no_capacity_and_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADMISSION_DATA", str(tmp_path))  # the proxy generates SF 0.01 here
    config = SoakConfig(
        duration=60,
        interval=10,
        warmup=20,
        scale_factor=0.01,
        users=12,
        mix="all",
        mpl=2,
        reconnect=5,
        max_growth=0.25,
        settle=10,
    )
    result = run_soak(config)
    assert not result.errors, result.errors
    assert result.requests > 1000, result.requests  # the load really ran
    assert result.locust_counts == (result.requests, 0)
    assert result.proxy_completed == result.requests
    assert result.drained_after is not None, result.final_status
    final = result.final_status
    assert (final["in_service"], final["threads_in_use"], final["queued"]) == (0, 0, 0)
    assert result.growth is not None and result.growth <= config.max_growth, (
        result.rss_base_kb,
        result.rss_end_kb,
    )
    assert result.proxy_returncode == 0, result.proxy_log
    assert not result.misses, result.misses
