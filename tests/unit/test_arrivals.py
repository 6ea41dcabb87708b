"""Open-arrival schedules, written-out mixes and the bench's burst recovery, checked against
what they must be (counts against the Poisson law, the thinned rate inside and outside bursts)."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from lab.bench import (
    BenchConfig,
    budgeted,
    burst_recovery,
    grants,
    learns,
    memory_aware,
    parse_policy,
    tunes_mpl,
)
from workloads.arrivals import Bursts, bursty, poisson, rate_at, read_trace
from workloads.tpch.mixes import MIXES, mix_by_name


def test_poisson_count_and_gaps_follow_the_law() -> None:
    rate, duration = 50.0, 400.0
    offsets = poisson(rate, duration, random.Random(1))
    n = len(offsets)
    # N ~ Poisson(λT): within 4 standard deviations
    assert abs(n - rate * duration) < 4 * math.sqrt(rate * duration)
    assert offsets == sorted(offsets) and 0 <= offsets[0] and offsets[-1] < duration
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert abs(mean - 1 / rate) < 0.05 / rate and abs(cv - 1) < 0.05  # exponential: CV 1
    assert poisson(rate, duration, random.Random(1)) == offsets  # seeded: repeatable
    with pytest.raises(ValueError, match="positive"):
        poisson(0, 1, random.Random())


def test_bursts_multiply_the_rate_inside_their_windows_only() -> None:
    b = Bursts(factor=3.0, every=10.0, length=4.0)
    assert b.windows(35.0) == [(10.0, 14.0), (20.0, 24.0), (30.0, 34.0)]
    assert rate_at(5.0, 2.0, b) == 2.0 and rate_at(11.0, 2.0, b) == 6.0
    assert rate_at(15.0, 2.0, b) == 2.0
    offsets = bursty(20.0, 2000.0, b, random.Random(2))
    inside = sum(1 for t in offsets if t >= 10 and t % 10 < 4)
    outside = len(offsets) - inside
    # expected: inside 3·20·(4/10)·(2000−10) s, outside 20·(2000 − 4/10·1990) s
    expect_in, expect_out = 60 * 0.4 * 1990, 20 * (2000 - 0.4 * 1990)
    assert abs(inside - expect_in) < 4 * math.sqrt(expect_in)
    assert abs(outside - expect_out) < 4 * math.sqrt(expect_out)
    for bad in ({"length": 0}, {"length": 11.0}, {"factor": 0}):
        with pytest.raises(ValueError):
            Bursts(**{"factor": 2.0, "every": 10.0, "length": 4.0, **bad})  # type: ignore[arg-type]


def test_trace_rows_sorted_and_errors_name_the_line(tmp_path: Path) -> None:
    good = tmp_path / "t.csv"
    good.write_text('offset,sql\n0.5,select 2\n0.1,"select 1, 2"\n\n')
    rows = read_trace(good)
    assert [(r.offset, r.sql) for r in rows] == [(0.1, "select 1, 2"), (0.5, "select 2")]
    for text, message in (
        ("0.1,select 1\nsoon,select 2\n", "t.csv:2: 'soon' is not an offset"),
        ("-1,select 1\n", "must be ≥ 0"),
        ("0.1,\n", "the SQL is empty"),
        ("0.1\n", "expected offset,sql"),
        ("offset,sql\n", "no statements"),
    ):
        good.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_trace(good)
    with pytest.raises(ValueError, match="cannot read the trace"):
        read_trace(tmp_path / "missing.csv")


def test_written_out_mixes() -> None:
    assert mix_by_name("MEDIUM") is MIXES["medium"]
    m = mix_by_name("6:4, 14:4, 9:1, 18:1")
    assert m.queries == (6, 14, 9, 18) and m.weights[6] == pytest.approx(0.4)
    assert mix_by_name("2,9").weights == {2: 0.5, 9: 0.5}
    for bad, message in (
        ("6:0", "must be positive"),
        ("0", "1 to 22"),
        ("6,6", "twice"),
        ("6::1", "not QUERY or QUERY:WEIGHT"),
        ("", "unknown mix"),
        ("extreme", "unknown mix"),
    ):
        with pytest.raises(ValueError, match=message):
            mix_by_name(bad)


def test_bench_policy_specs_and_open_config_errors() -> None:
    assert parse_policy("fcfs@2") == ("fcfs", 2) and parse_policy("none") == ("none", None)
    for spec in ("fcfs@4+mem", "latency@2+mem+learn", "latency@2+learn+mem"):
        assert parse_policy(spec)[1] in (2, 4) and memory_aware(spec)
    assert learns("latency@2+mem+learn") and learns("latency@2+learn+mem")
    assert not memory_aware("fcfs@4") and not memory_aware("fcfs@4+learn")
    assert tunes_mpl("latency@auto+mem") and not tunes_mpl("latency@2+mem")
    assert grants("fcfs@2+grant") and grants("latency@2+mem+grant") and not grants("fcfs@2+mem")
    assert budgeted("fcfs@2+grant") and budgeted("fcfs@2+mem") and not budgeted("fcfs@2")
    for bad, message in (
        ("none+mem", "none is no admission control"),
        ("fcfs@4+mem+mem", "whole number"),
        ("lifo", "unknown policy"),
        ("none@2", "takes no MPL"),
        ("fcfs@0", "at least 1"),
        ("fcfs@x", "whole number"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_policy(bad)
    mix = MIXES["light"]
    for kwargs, message in (
        ({"arrivals": "poisson"}, "needs --rate or --load"),
        ({"arrivals": "poisson", "rate": 1.0, "load": 0.5}, "needs --rate or --load"),
        ({"rate": 1.0}, "need open arrivals"),
        ({"arrivals": "trace"}, "needs --trace"),
        ({"arrivals": "sometimes"}, "must be one of"),
        ({"arrivals": "poisson", "load": -1.0}, "must be positive"),
        ({"policies": ("fcfs", "fcfs")}, "listed twice"),
        ({"policies": ("fcfs@2+grant",), "grant_work_mem": 2**20}, "PostgreSQL's work_mem"),
        (
            {"policies": ("fcfs@2+grant",), "backend": "postgresql://127.0.0.1:1/x"},
            "needs --grant-work-mem",
        ),
        ({"policies": ("none+grant",)}, "none is no admission control"),
    ):
        with pytest.raises(ValueError, match=message):
            BenchConfig(mix=mix, **kwargs)  # type: ignore[arg-type]


def test_burst_recovery_measures_the_way_back_to_the_pre_burst_level() -> None:
    b = Bursts(factor=2.0, every=20.0, length=5.0)  # one burst in 40 s: 20–25 s

    def queue(t: float) -> int:  # 1 before, 9 during, then one fewer every second
        return 1 if t < 20 else max(1, 9 - max(0, math.floor(t - 25)))

    timeline = [(t / 2, queue(t / 2), 2) for t in range(80)]
    assert burst_recovery(timeline, b, 40.0, 1.0) == [pytest.approx(8.0)]
    # not back before the run ends
    assert burst_recovery(timeline, b, 30.0, 1.0) == [None]
    # bursts every 10 s: the pre-burst level comes from the first 10 s; at 25 s the queue is
    # still 9 and not back before the next burst at 30 s
    two = Bursts(factor=2.0, every=10.0, length=5.0)
    assert burst_recovery(timeline, two, 40.0, 1.0) == [0.0, None, pytest.approx(0.0)]
