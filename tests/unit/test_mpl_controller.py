"""The adaptive MPL controller (``admission.mpl``) on capacity curves whose answer is known.

Statements of D = 50 ms complete as a Poisson stream at the curve's rate, so the samples are
as noisy as real ones. Saturated all the time (a closed loop), the controller must give up no
capacity: the lowest MPL of the highest capacity. With spare capacity (an open load that leaves
the gate idle much of the time) it must find the lowest MPL within 5 % of the best — but not
one the demand would load beyond 80 % — without the tolerance compounding step by step, keep
climbing a curve that keeps paying, never count unsaturated time as capacity, stay within its
bounds, and follow a workload that moves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from admission.mpl import MplController

TICK = 0.1  # seconds between the driver's reports, as the proxy's
CLIENTS = 16  # a closed loop's: the number in the system
D = 0.05  # seconds of work per statement

Curve = Callable[[int, float], float]


def drive(
    controller: MplController,
    curve: Curve,
    seconds: float,
    *,
    start: float = 0.0,
    busy: float = 1.0,
    idle_rate: float = 0.0,
    seed: int = 0,
    d: float = D,
    cpu: Callable[[int], float] | None = None,
) -> Counter[int]:
    """Run the controller against ``curve(mpl, t)`` (capacity, work per second): a tick is
    saturated with probability ``busy`` and then completes statements at the curve's rate,
    else at ``idle_rate``; what completes is what arrived (a closed loop, or a load the MPL
    carries). ``cpu(mpl)``: the cores' busy share, told the controller. Returns the ticks
    spent at each MPL in the last half."""
    rng = np.random.default_rng(seed)
    spent: Counter[int] = Counter()
    t = start
    while t < start + seconds:
        t += TICK
        saturated = bool(rng.random() < busy)
        rate = curve(controller.mpl, t) if saturated else idle_rate
        done = int(rng.poisson(rate * TICK / d))
        if t > start + seconds / 2:
            spent[controller.mpl] += 1
        controller.observe(
            t,
            TICK,
            saturated,
            done * d,
            done,
            arrived=done * d,
            in_system=CLIENTS,
            cpu=None if cpu is None else cpu(controller.mpl),
        )
    return spent


def drive_open(
    controller: MplController,
    curve: Curve,
    load: float | Callable[[float], float],
    seconds: float,
    *,
    start: float = 0.0,
    backlog: list[int] | None = None,
    seed: int = 0,
    cpu: Callable[[int], float] | None = None,
) -> tuple[Counter[int], float]:
    """Open arrivals: statements of D arrive as a Poisson stream of ``load`` work per second
    (or ``load(t)``), whatever the MPL; the MPL's worth are in service, the rest queue, and
    they complete at the curve's rate (at most all there are). Returns the ticks spent at each
    MPL and the mean number in the system, both over the last half: by Little's law, the
    arrival rate times the mean response. ``backlog``: the number in the system, carried from
    one call to the next (one that goes on from ``start``). ``cpu(mpl)``: the cores' busy
    share while that MPL is saturated, told the controller (a share of it when not: the
    statements in service over the MPL)."""
    rng = np.random.default_rng(seed)
    spent: Counter[int] = Counter()
    n, area, ticks = backlog[0] if backlog else 0, 0, 0
    t = start
    while t < start + seconds:
        t += TICK
        saturated = n > controller.mpl  # as the proxy: queued at the start of the tick
        busy = None if cpu is None else cpu(controller.mpl) * min(1.0, n / controller.mpl)
        rate = load(t) if callable(load) else load
        arrived = int(rng.poisson(rate * TICK / D))
        n += arrived
        done = min(n, int(rng.poisson(curve(controller.mpl, t) * TICK / D)))
        n -= done
        if t > start + seconds / 2:
            spent[controller.mpl] += 1
            area += n
            ticks += 1
        controller.observe(
            t, TICK, saturated, done * D, done, arrived=arrived * D, in_system=n, cpu=busy
        )
    if backlog:
        backlog[0] = n
    return spent, area / ticks


def settled(spent: Counter[int]) -> int:
    mpl, ticks = spent.most_common(1)[0]
    assert ticks >= 0.5 * sum(spent.values()), f"did not settle: {dict(spent)}"
    return mpl


SEEDS = range(8)


def most(check: Callable[[int], bool], share: float = 0.75) -> None:
    """``check(seed)`` holds for at least ``share`` of SEEDS: the controller decides on noisy
    samples, so a property of it is a property of most runs, not of every one."""
    held = [seed for seed in SEEDS if check(seed)]
    assert len(held) >= share * len(SEEDS), f"held for seeds {held} of {list(SEEDS)}"


def mode(spent: Counter[int]) -> int:
    return spent.most_common(1)[0][0]


def knee(k: int) -> Curve:
    """Capacity grows linearly up to k statements, then stays (k cores, one thread each)."""
    return lambda m, _t: min(m, k) / 1.0


def table(values: dict[int, float], beyond: float) -> Curve:
    return lambda m, _t: values.get(m, beyond)


def test_a_machine_of_single_threaded_statements_runs_one_per_core() -> None:
    for cores, start in ((3, 1), (3, 8), (6, 2)):
        # from above, MPL cores + 1 has the same capacity: held now and then, never below
        most(lambda seed: mode(drive(MplController(start), knee(cores), 1800, seed=seed)) == cores)  # noqa: B023
        spent = drive(MplController(start), knee(cores), 1800)
        assert sum(n for m, n in spent.items() if m < cores) < 0.1 * sum(spent.values())


def test_a_closed_loop_gives_up_no_capacity() -> None:
    # saturated all the time: whatever completes is the demand, so the floor is the best, and
    # 2's 20 % less (plain in the noise) rules it out, as it would with spare capacity not
    spent = drive(MplController(4), table({1: 0.5, 2: 0.8, 3: 1.0, 4: 1.0}, 1.0), 900)
    assert settled(spent) == 3


def test_with_spare_capacity_the_lowest_mpl_within_tolerance_wins() -> None:
    # beyond 2 the curve gains 3 % — not worth another statement in service while the load
    # leaves the gate idle 70 % of the time
    curve = table({1: 0.6, 2: 0.97, 3: 1.0, 4: 1.0}, 0.98)
    most(
        lambda seed: (
            mode(drive(MplController(4), curve, 1800, busy=0.3, idle_rate=0.3, seed=seed)) == 2
        )
    )


def test_a_demand_that_would_load_the_lower_mpl_keeps_the_higher() -> None:
    curve = table({1: 0.4, 2: 0.8, 3: 1.0, 4: 1.0}, 1.0)

    def light(seed: int) -> bool:
        controller = MplController(4, tolerance=0.25)
        return mode(drive(controller, curve, 1800, busy=0.3, idle_rate=0.3, seed=seed)) == 2

    def heavy(seed: int) -> bool:  # 0.8 would carry a demand of ~0.9 at 113 %
        # (from 2, it must leave it; on the plateau of 1.0 it may wander: the lower of two
        # equal MPLs is chosen only when it measures at least as much, near saturation)
        controller = MplController(2, tolerance=0.25)
        spent = drive(controller, curve, 1800, busy=0.6, idle_rate=0.75, seed=seed)
        return spent[1] + spent[2] < 0.1 * sum(spent.values())

    most(light)
    most(heavy)


# near saturation a lower MPL that gives up 17 % of the capacity is one the load cannot bear:
# MPL 1 carries 0.83, the load is 0.85 of MPL 2's 1.0 — a difference the noise of six samples
# of 2 s cannot show significant, which must not give MPL 1 the benefit of the doubt
NEAR = table({1: 0.83, 2: 1.0, 3: 0.99, 4: 0.98}, 0.97)


def test_near_saturation_it_keeps_an_mpl_that_carries_the_load() -> None:
    def holds(seed: int) -> bool:
        spent, _ = drive_open(MplController(2), NEAR, 0.85, 1800, seed=seed)
        return spent[1] < 0.1 * sum(spent.values())

    most(holds)
    # and the queue stays what MPL 2 makes it, not MPL 1's (which grows without bound)
    _, auto = drive_open(MplController(2), NEAR, 0.85, 1800)
    _, two = drive_open(MplController(2, low=2, high=2), NEAR, 0.85, 1800)
    assert auto < 1.5 * two, (auto, two)


def test_at_095_of_the_capacity_the_mpl_below_is_not_tried() -> None:
    # after a look above and back, MPL 2 runs with a backlog: saturated all the time and
    # completing about what arrives, as a closed loop would. Arrivals that do not follow
    # completions tell the open stream apart, and MPL 1 — which this load would overload —
    # is not tried: an excursion there builds a backlog that takes minutes to drain
    def holds(seed: int) -> bool:
        controller = MplController(2)
        spent, auto = drive_open(controller, NEAR, 0.95, 1800, seed=seed)
        _, two = drive_open(MplController(2, low=2, high=2), NEAR, 0.95, 1800, seed=seed)
        return not controller.loop and spent[1] == 0 and auto < 1.5 * two

    most(holds)


# past MPL 2 the statements slow each other down; MPL 1 leaves a core idle part of the time
DOWN = table({1: 0.95, 2: 1.0, 3: 0.9, 4: 0.8}, 0.8)
DOWN_CPU = {1: 0.93, 2: 0.985}  # the cores' busy share, saturated (0.99 beyond)


def test_busy_cores_spare_it_the_look_above() -> None:
    # MPL 2 keeps the cores 98.5 % busy: a higher MPL could gain at most 1.5 %, less than
    # the tolerance (5 %), so the look every ``stale`` seconds — a dozen seconds at MPL 3's
    # lower capacity, a backlog at 0.9 of the capacity — is not taken. Told nothing of the
    # CPU, it looks
    def spared(seed: int) -> bool:
        controller = MplController(2)
        busy = lambda m: DOWN_CPU.get(m, 0.99)  # noqa: E731
        _, auto = drive_open(controller, DOWN, 0.9, 1800, seed=seed, cpu=busy)
        _, two = drive_open(MplController(2, low=2, high=2), DOWN, 0.9, 1800, seed=seed)
        looked = {e.mpl for e in controller.estimates()}
        return 3 not in looked and auto < 1.25 * two

    most(spared)
    blind = MplController(2)
    drive_open(blind, DOWN, 0.9, 1800)
    assert 3 in {e.mpl for e in blind.estimates()}
    # (what it measured is in its reason, for /status)
    controller = MplController(2)
    drive_open(controller, DOWN, 0.9, 900, cpu=lambda m: DOWN_CPU.get(m, 0.99))
    assert "cores 98% busy" in controller.reason or controller.mpl != 2, controller.reason


def test_cores_left_idle_still_let_it_climb() -> None:
    # four single-threaded statements fill four cores: at MPL 2 half of them are idle, so
    # the look above is taken and the curve climbed to the knee under a heavy open load —
    # and no further: at four the cores are busy
    def climbs(seed: int) -> bool:
        controller = MplController(2)
        spent, _ = drive_open(
            controller, knee(4), 3.4, 1200, seed=seed, cpu=lambda m: min(m, 4) / 4 * 0.99
        )
        return mode(spent) == 4  # (and, its cores busy there, not beyond)

    most(climbs)


def test_arrivals_that_follow_completions_read_as_a_loop() -> None:
    closed = MplController(2)
    drive(closed, knee(2), 300)
    assert closed.loop
    for load in (0.5, 0.95):
        stream = MplController(2, low=2, high=2)
        drive_open(stream, knee(2), load * 2, 300)
        assert not stream.loop, load


def test_an_mpl_chosen_at_a_lighter_load_must_carry_the_load_once_it_rises() -> None:
    # with a tolerance of 25 %, MPL 1 (17 % less) is the choice at 0.6 of the capacity (it
    # meets the floor the demand raises, 0.6 / 0.8, on its estimate); at 0.85 it would run at
    # 102 %: the doubt it was kept on lapses as the demand grows. It leaves within about a
    # minute (the demand is a minute's average) and looks at MPL 1 again when its samples go
    # stale, every 10 minutes
    def chosen(seed: int) -> bool:
        spent, _ = drive_open(MplController(2, tolerance=0.25), NEAR, 0.6, 1200, seed=seed)
        return spent[1] >= 0.75 * sum(spent.values())

    def moves_up(seed: int) -> bool:
        controller, backlog = MplController(2, tolerance=0.25), [0]
        drive_open(controller, NEAR, 0.6, 1200, backlog=backlog, seed=seed)
        spent, _ = drive_open(
            controller, NEAR, 0.85, 1200, start=1200, backlog=backlog, seed=seed + 100
        )
        return spent[1] < 0.2 * sum(spent.values())

    most(chosen)
    most(moves_up)


def test_the_tolerance_does_not_compound_over_hours() -> None:
    # 4 % more capacity per statement up to 16: each step down is within 5 % of the one above,
    # but only 15 is within 5 % of the best — also once 16's samples went stale long ago
    # (statements of 5 ms: samples precise enough to tell 4 % apart)
    curve: Curve = lambda m, _t: 1.04 ** min(m, 16)  # noqa: E731
    controller = MplController(16, high=32)
    spent = drive(controller, curve, 7200, busy=0.3, idle_rate=0.5, d=0.005)
    near = sum(n for mpl, n in spent.items() if mpl >= 12)
    assert near >= 0.85 * sum(spent.values()) and min(spent) >= 11, dict(spent)


def test_it_keeps_climbing_a_curve_that_keeps_paying() -> None:
    # smooth, concave: every step up gains less. It climbs while a step up gains
    # significantly more than half the tolerance, and looks higher again every so often; it
    # never drifts back down. (A local search: on a curve this flat it stops below the
    # maximum, where a step gains less than the noise can show — real capacity curves bend at
    # the cores.) Statements of 10 ms: samples precise enough to tell 7 % apart.
    curve: Curve = lambda m, _t: m / (1 + 0.08 * (m - 1))  # noqa: E731
    controller = MplController(4, high=64)
    drive(controller, curve, 550, busy=0.3, idle_rate=1.0, d=0.01)  # before any timed look
    assert controller.mpl >= 8, controller.estimates()
    spent = drive(controller, curve, 3600, start=550, busy=0.3, idle_rate=1.0, d=0.01)
    assert min(spent) >= 7, dict(spent)


# point lookups through the embedded server, 8 closed clients, as --mpl auto measured them:
# MPL 2 2.15k/s, 3 2.41k/s, 4 2.28k/s (a dip: statically 2.43–2.55k/s), 8 (none) 2.8k/s; the
# proxy's process 64–70 % busy, the clients had the rest
LOOKUPS = table({1: 1.2, 2: 2.15, 3: 2.41, 4: 2.28, 5: 2.6, 6: 2.7, 7: 2.76, 8: 2.8}, 2.8)


def lookups_cpu(m: int) -> float:
    return min(0.64 + 0.025 * (m - 2), 0.8)


def test_cores_left_idle_take_it_past_a_dip() -> None:
    # one step at a time it stops at 3 (4 measured worse) until the next timed look
    # (``stale``), 14 % short of the best; with the cores a third idle it looks at the top
    # once and settles within 5 % of 8's capacity in minutes
    def past(seed: int) -> bool:
        controller = MplController(2, high=8)
        spent = drive(controller, LOOKUPS, 500, seed=seed, d=0.0005, cpu=lookups_cpu)
        return LOOKUPS(mode(spent), 0) >= 0.95 * 2.8

    most(past)
    # not told the CPU, it does not look past the dip; with the cores busy it does not even
    # look above 2 (a higher MPL could not gain the tolerance)
    for cpu, stays in ((None, 3), (lambda _m: 0.97, 2)):
        controller = MplController(2, high=8)
        spent = drive(controller, LOOKUPS, 500, d=0.0005, cpu=cpu)
        assert set(spent) == {stays}, dict(spent)


def test_idle_cores_do_not_wait_for_the_demand_window_to_look_up() -> None:
    # the demand window (a minute) is what a step *down* needs; a look *up* with the cores a
    # third idle cannot cost what the cores would have given, so it is taken at once: past
    # the dip within the minute. Not told the CPU, or with busy cores, it holds its start
    # MPL for the minute, as before
    def early(seed: int) -> bool:
        controller = MplController(2, high=8)
        spent = drive(controller, LOOKUPS, 55, seed=seed, d=0.0005, cpu=lookups_cpu)
        return max(spent) >= 5

    most(early)
    for cpu in (None, lambda _m: 0.97):
        controller = MplController(2, high=8)
        spent = drive(controller, LOOKUPS, 55, d=0.0005, cpu=cpu)
        assert set(spent) == {2}, dict(spent)


def test_thrashing_beyond_the_knee_moves_it_down() -> None:
    # too many statements slow each other down (memory, locks): capacity falls past 3
    controller = MplController(10, high=16)
    assert settled(drive(controller, lambda m, _t: min(m, 3) - 0.15 * max(0, m - 3), 900)) == 3


def test_unsaturated_time_says_nothing_of_capacity() -> None:
    controller = MplController(4)
    drive(controller, knee(2), 600, busy=0.0, idle_rate=0.5)
    assert controller.mpl == 4 and controller.changes == 0 and controller.estimates() == []
    assert controller.demand == pytest.approx(0.5, rel=0.2)  # but it is the demand


def test_it_follows_a_workload_whose_knee_moves() -> None:
    controller = MplController(2)
    assert settled(drive(controller, knee(2), 900)) == 2
    # the statements now leave room for more (say, fewer threads each)
    assert settled(drive(controller, knee(5), 1500, start=900)) == 5


def test_bounds_hold() -> None:
    controller = MplController(3, low=2, high=4)
    spent = drive(controller, knee(8), 900)
    assert set(spent) <= {2, 3, 4} and settled(spent) == 4
    controller = MplController(3, low=2, high=4)
    assert settled(drive(controller, knee(1), 900)) == 2


def test_long_statements_make_longer_samples() -> None:
    # statements of 2 s at MPL 2: a sample needs 10 of them, not 2 s — no decision on noise
    controller = MplController(2)
    t = 0.0
    for _ in range(200):  # 20 s saturated, about 10 completions in all
        t += TICK
        done = 1 if int(t * 10) % 20 == 0 else 0
        controller.observe(t, TICK, True, 0.1, done, arrived=done * 2.0, in_system=4)
    assert controller.estimates() == [] or controller.estimates()[0].samples <= 1
    assert controller.changes == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="low ≤ high"):
        MplController(2, low=3, high=2)
    with pytest.raises(ValueError, match="tolerance"):
        MplController(2, tolerance=1.0)
    with pytest.raises(ValueError, match="utilization"):
        MplController(2, utilization=0)
    with pytest.raises(ValueError, match="min_samples"):
        MplController(2, samples=3, min_samples=4)


def first_move(controller: MplController, curve: Curve, d: float, seconds: float) -> float:
    """When the controller first moved, driven saturated (cores 60 % busy: room above)."""
    rng = np.random.default_rng(0)
    t = 0.0
    while t < seconds and controller.changes == 0:
        t += TICK
        done = int(rng.poisson(curve(controller.mpl, t) * TICK / d))
        controller.observe(
            t, TICK, True, done * d, done, arrived=done * d, in_system=CLIENTS, cpu=0.6
        )
    return t if controller.changes else float("inf")


def test_many_short_statements_close_samples_sooner() -> None:
    # 250 completions in at least half a second make a sample (and end the settling), as a
    # 2 s window does for longer statements: lookups of a millisecond (2,000 a second at MPL
    # 2) have their first move (a look above, the cores being idle) after ~4 s, not ~14 s —
    # while 50 ms statements (40 a second) still sample the 2 s window
    assert first_move(MplController(2, high=8), knee(8), 0.001, 60) <= 5.0
    assert 13.5 <= first_move(MplController(2, high=8), knee(8), D, 60) <= 16.0


def test_a_few_long_statements_among_many_short_ones_keep_the_window() -> None:
    # 600 statements of 2 ms a second and one of 300 ms every 0.3 s: the long ones carry
    # nearly half the work, so a half-second sample is as noisy as their count (about two),
    # not as the 300 short ones. Told the squared work, it keeps the 2 s window; not told, a
    # completion counts as one
    def first(told: bool) -> float:
        controller = MplController(2, high=8)
        t = 0.0
        for tick in range(600):
            t += TICK
            long = 1 if tick % 3 == 0 else 0
            work = 60 * 0.002 + long * 0.3
            squares = 60 * 0.002**2 + long * 0.3**2
            controller.observe(
                t,
                TICK,
                True,
                work,
                60 + long,
                arrived=work,
                in_system=CLIENTS,
                cpu=0.6,
                work_squared=squares if told else None,
            )
            if controller.changes:
                return t
        return float("inf")

    assert first(told=False) <= 5.0
    assert 13.5 <= first(told=True) <= 16.0


def test_quick_samples_are_validated() -> None:
    with pytest.raises(ValueError, match="quick_completions"):
        MplController(2, quick_completions=5, min_completions=10)
    with pytest.raises(ValueError, match="quick_window"):
        MplController(2, quick_window=0)
