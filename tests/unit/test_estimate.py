"""The statistics behind training's intervals and the machine-speed probe."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from training.estimate import interquartile_range, median_interval, most_common
from training.speed import UNIT, probe


def _coverage(n: int, j: int) -> float:
    return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n


def test_median_interval_from_order_statistics() -> None:
    assert median_interval([0.3, 0.1, 0.2, 0.5, 0.4]) is None  # 5 runs: [min, max] is 94 %
    assert median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)  # 6 runs: 97 %
    # the textbook ranks: n = 20 → x(6), x(15); n = 100 → x(40), x(61)
    assert median_interval(list(range(1, 21))) == (6, 15)
    assert median_interval(list(range(1, 101))) == (40, 61)
    for n in range(6, 60):  # the widest rank that still covers 95 %, and no narrower one
        low, _ = median_interval(list(range(1, n + 1)))  # type: ignore[misc]
        assert _coverage(n, low) >= 0.95 > _coverage(n, low + 1)


def test_median_interval_covers_the_median() -> None:
    rng = random.Random(1)
    hits = 0
    for _ in range(400):  # skewed run times: lognormal, true median 1
        runs = [rng.lognormvariate(0, 0.3) for _ in range(15)]
        low, high = median_interval(runs)  # type: ignore[misc]
        assert low <= statistics.median(runs) <= high
        hits += low <= 1.0 <= high
    assert hits / 400 >= 0.93


def test_spread_and_most_common() -> None:
    assert interquartile_range([1.0]) == 0.0
    assert interquartile_range([1, 2, 3, 4, 5]) == pytest.approx(2.0)
    assert most_common({1: 3, 2: 9}) == 2
    assert most_common({1: 4, 2: 4}) == 2  # a tie goes to the larger, safer fork size


def test_speed_probe_is_short_and_positive() -> None:
    reading = probe(tries=3)
    assert len(reading.tries) == 3 and reading.speed == max(reading.tries) > 0
    assert "iterations/s" in UNIT


def test_speed_measure_runs_the_probe_in_a_process_of_its_own() -> None:
    """The training process shares its interpreter lock with the proxy; ``measure`` takes the
    probe elsewhere, and its rates are those of a real probe."""
    import subprocess
    import sys

    from training.speed import measure

    printed = subprocess.run(
        [sys.executable, "-m", "training.speed", "2"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(printed) == 2 and all(float(rate) > 10_000 for rate in printed)
    reading = measure(tries=2)
    assert len(reading.tries) == 2 and reading.speed == max(reading.tries) > 10_000
