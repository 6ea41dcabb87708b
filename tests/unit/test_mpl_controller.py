"""The adaptive MPL controller (``admission.mpl``) on throughput curves whose answer is known:
it must settle on the lowest MPL within 5 % of the best throughput, never count unsaturated
time, stay within its bounds, and follow the curve when the workload changes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from admission.mpl import MplController

TICK = 0.1  # seconds between the driver's reports, as the proxy's


def drive(
    controller: MplController,
    curve: Callable[[int, float], float],
    seconds: float,
    *,
    start: float = 0.0,
    noise: float = 0.15,
    saturated: Callable[[float], bool] = lambda _t: True,
    seed: int = 0,
) -> Counter[int]:
    """Run the controller against ``curve(mpl, t)`` (work per second) with multiplicative
    noise per tick; returns the seconds spent at each MPL in the last half."""
    rng = np.random.default_rng(seed)
    spent: Counter[int] = Counter()
    t = start
    while t < start + seconds:
        t += TICK
        work = curve(controller.mpl, t) * TICK * max(0.0, 1 + noise * rng.standard_normal())
        if t > start + seconds / 2:
            spent[controller.mpl] += 1
        controller.observe(t, TICK, saturated(t), work)
    return spent


def settled(spent: Counter[int]) -> int:
    mpl, ticks = spent.most_common(1)[0]
    assert ticks >= 0.7 * sum(spent.values()), f"did not settle: {dict(spent)}"
    return mpl


def knee(k: int) -> Callable[[int, float], float]:
    """Throughput grows linearly up to k statements, then stays (k cores, one thread each)."""
    return lambda m, _t: min(m, k) / 1.0


def test_it_finds_the_cores_of_a_machine_of_single_threaded_statements() -> None:
    for cores, start in ((3, 1), (3, 8), (6, 2)):
        controller = MplController(start)
        assert settled(drive(controller, knee(cores), 900)) == cores


def test_the_lowest_mpl_within_tolerance_wins_over_the_highest_throughput() -> None:
    # beyond 2 the curve gains 3 % — not worth the extra statement in service
    curve = {1: 0.6, 2: 0.97, 3: 1.0, 4: 1.0, 5: 0.98}
    controller = MplController(4)
    assert settled(drive(controller, lambda m, _t: curve.get(m, 0.95), 900)) == 2


def test_thrashing_beyond_the_knee_moves_it_down() -> None:
    # too many statements slow each other down (memory, locks): throughput falls past 3
    controller = MplController(10, high=16)
    assert settled(drive(controller, lambda m, _t: min(m, 3) - 0.15 * max(0, m - 3), 900)) == 3


def test_unsaturated_time_says_nothing() -> None:
    controller = MplController(4)
    drive(controller, knee(2), 600, saturated=lambda _t: False)
    assert controller.mpl == 4 and controller.changes == 0 and controller.estimates() == []


def test_it_follows_a_workload_whose_knee_moves() -> None:
    controller = MplController(2)
    assert settled(drive(controller, knee(2), 900)) == 2
    # the statements now leave room for more (say, fewer threads each): within the samples'
    # staleness plus a search, the controller climbs to the new knee
    assert settled(drive(controller, knee(5), 1500, start=900)) == 5


def test_bounds_hold() -> None:
    controller = MplController(3, low=2, high=4)
    spent = drive(controller, knee(8), 900)
    assert set(spent) <= {2, 3, 4} and settled(spent) == 4
    controller = MplController(3, low=2, high=4)
    assert settled(drive(controller, knee(1), 900)) == 2


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="low ≤ high"):
        MplController(2, low=3, high=2)
    with pytest.raises(ValueError, match="tolerance"):
        MplController(2, tolerance=1.0)
    with pytest.raises(ValueError, match="min_samples"):
        MplController(2, samples=3, min_samples=4)
