"""The statistics behind training's intervals and the machine-speed probe."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from training.estimate import (
    Estimator,
    batch_means_interval,
    fork_quantile,
    interquartile_range,
    median_interval,
)
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


def test_spread_and_fork_quantile() -> None:
    assert interquartile_range([1.0]) == 0.0
    assert interquartile_range([1, 2, 3, 4, 5]) == pytest.approx(2.0)
    assert fork_quantile({1: 3, 2: 9}) == 2
    assert fork_quantile({1: 38, 2: 35}) == fork_quantile({1: 34, 2: 36}) == 2  # no coin flip
    assert fork_quantile({1: 57, 2: 16}) == 2  # 22% of runs take 2: reserve 2
    assert fork_quantile({1: 95, 2: 5}) == 1  # a stray run does not move it
    assert fork_quantile({3: 1, 1: 9}) == 1 and fork_quantile({4: 2}) == 4


def test_speed_probe_is_short_and_positive() -> None:
    import time

    started = time.monotonic()
    reading = probe(tries=3)
    assert time.monotonic() - started < 10  # ~0.3 s here; a generous bound for a slow machine
    assert len(reading.tries) == 3 and reading.speed == statistics.median(reading.tries) > 0
    assert "rows/s" in UNIT and "median" in UNIT


@pytest.mark.serial  # "quiet" must be quiet: no test running beside it
def test_speed_probe_sees_a_load_on_one_core_of_several() -> None:
    """The reason it is a parallel probe, and the median: with a busy process on one core
    the probe reads slower (a single-threaded probe read the same). Skipped on one core.
    A quiet reading and a busy one are taken side by side up to three times: on a shared
    machine another tenant can slow one quiet reading by more than the hog does (seen once:
    quiet 233 M rows/s, busy 252 M), but not, by chance, every one of three in a row."""
    import os
    import subprocess
    import sys
    import time

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores")
    pairs = []
    for _ in range(3):
        quiet = probe(tries=5).speed
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.3)
            busy = probe(tries=5).speed
        finally:
            hog.kill()
            hog.wait()
        pairs.append((quiet, busy))
        if busy < 0.95 * quiet:
            return
    raise AssertionError(f"the probe did not read a busy core as slower: (quiet, busy) {pairs}")


def test_rescale_puts_time_on_the_other_machine() -> None:
    from admission.model import ClassProfile, EtaModel, Phase, Profile, Speed
    from training.speed import rescale

    c = ClassProfile(
        fingerprint="a",
        name="a",
        D=0.2,
        D_low=0.18,
        D_high=0.25,
        f=2,
        U=0.3,
        Q=1.5,
        phases=(Phase(threads=2, duration=0.15), Phase(threads=1, duration=0.05)),
    )
    there = EtaModel(
        classes=(c,),
        speed=Speed(before=1.9e8, after=2.1e8, unit=UNIT),
        default=Profile(D=1.0, f=1),
    )
    here = rescale(there, 1.0e8)  # half the speed: twice the time
    (r,) = here.classes
    assert (r.D, r.D_low, r.D_high) == pytest.approx((0.4, 0.36, 0.5))
    assert [p.duration for p in r.phases] == pytest.approx([0.3, 0.1])
    assert (r.f, r.U, r.Q) == (2, 0.3, 1.5) and here.default is not None
    assert here.default.D == pytest.approx(2.0)
    assert here.speed == Speed(before=1.0e8, after=1.0e8, unit=UNIT) and "rescaled" in here.notes
    EtaModel.from_json(here.to_json())  # still a valid model, η recomputed
    with pytest.raises(ValueError, match="another probe"):
        rescale(there.model_copy(update={"speed": Speed(before=1, after=1, unit="x")}), 1.0)
    with pytest.raises(ValueError, match="no machine speed"):
        rescale(there.model_copy(update={"speed": None}), 1.0)


def test_speed_measure_runs_the_probe_in_a_process_of_its_own() -> None:
    """The training process shares its interpreter lock with the proxy; ``measure`` takes the
    probe elsewhere, and its rates are those of a real probe."""
    import subprocess
    import sys

    from training.speed import measure

    printed = subprocess.run(
        [sys.executable, "-m", "training.speed", "2"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(printed) == 2 and all(float(rate) > 1_000_000 for rate in printed)
    reading = measure(tries=2)
    assert len(reading.tries) == 2 and reading.speed == statistics.median(reading.tries) > 1e6


# -- Q_r's interval by batch means -----------------------------------------------------------


def _ar1_run(n: int, rng: random.Random, mean: float = 5.0, phi: float = 0.9) -> Estimator:
    """One class whose tasks in execution follow an AR(1) series around ``mean``, sampled
    every second: neighbouring samples strongly correlated, as in a real run."""
    est = Estimator(cores=4)
    est.admit("j", "a", 0.0)
    x = mean
    for t in range(n):
        est.sample(float(t), {"j": max(0.0, x)})
        x = mean + phi * (x - mean) + rng.gauss(0, 0.5)
    return est


def test_batch_means_interval_is_the_t_interval_of_the_batches() -> None:
    low, high = batch_means_interval([1, 2, 3, 4])  # type: ignore[misc]
    half = 3.182 * statistics.stdev([1, 2, 3, 4]) / 2
    assert (low, high) == pytest.approx((2.5 - half, 2.5 + half))
    assert batch_means_interval([1, 2, 3]) is None  # fewer than 4 batches
    assert batch_means_interval([2.0] * 10) == (2.0, 2.0)


def test_batch_means_average_to_q() -> None:
    est = _ar1_run(500, random.Random(1))
    q = est.estimates()["a"].Q
    for batches in (4, 7, 10):
        means = est.batch_means(batches)["a"]
        assert len(means) == batches and statistics.fmean(means) == pytest.approx(q)
    interval = est.q_intervals()["a"]
    assert interval is not None and interval[0] <= q <= interval[1]


def test_q_interval_covers_the_mean_of_an_autocorrelated_series() -> None:
    """About 95 % of the intervals hold the true mean, where the plain t-interval of the
    (autocorrelated) samples holds it far less often; and the interval narrows as the run
    gets longer (≈ 1/√length)."""
    rng = random.Random(26)
    covered = naive = 0
    trials = 200
    for _ in range(trials):
        est = _ar1_run(2000, rng)
        low, high = est.q_intervals()["a"]  # type: ignore[misc]
        covered += low <= 5.0 <= high
        samples = [n for _, _, held in est._segments for n in held.values()]
        half = 1.96 * statistics.stdev(samples) / math.sqrt(len(samples))
        naive += abs(statistics.fmean(samples) - 5.0) <= half
    assert 0.88 <= covered / trials <= 0.99
    assert naive / trials < 0.7

    def width(n: int) -> float:
        ws = []
        for _ in range(40):
            low, high = _ar1_run(n, rng).q_intervals()["a"]  # type: ignore[misc]
            ws.append(high - low)
        return statistics.fmean(ws)

    short, long = width(1000), width(4000)
    assert 0.35 < long / short < 0.7


def test_q_interval_needs_four_batches_of_enough_samples() -> None:
    rng = random.Random(3)
    assert _ar1_run(30, rng).q_intervals() == {"a": None}  # 3 batches of 10 samples
    assert _ar1_run(60, rng).q_intervals()["a"] is not None  # 5 batches
    assert len(_ar1_run(60, rng).q_intervals(batches=10)) == 1
    # a batch spans at least the mean response time: 4-second jobs one after another,
    # sampled every 0.25 s over 32 s, give 8 batches (not 10 of 3.2 s), each with Q = 1
    est = Estimator(cores=1)
    for i in range(8):
        est.admit(i, "a", 4.0 * i)
        for t in range(16):
            est.sample(4.0 * i + t / 4, {i: 1.0})
        est.complete(i, 4.0 * i + 4)
    est.sample(32.0, {})
    assert len(est.batch_means(8)["a"]) == 8
    assert est.q_intervals() == {"a": (1.0, 1.0)}
    assert Estimator(cores=1).q_intervals() == {}


def _admissions_run(n: int, rng: random.Random) -> Estimator:
    """Class a's tasks in execution follow the AR(1) series of ``_ar1_run`` (mean 5); short
    class-b statements (fork size 1, never sampled in execution) are admitted at random
    instants, independent of it, so A^b_a, the mean of a's tasks at b's admissions, is 5."""
    est = Estimator(cores=4, fork={"b": 1})
    est.admit("j", "a", 0.0)
    x, b = 5.0, 0
    for t in range(n):
        est.sample(float(t), {"j": max(0.0, x)})
        for _ in range(rng.randrange(3)):
            at = t + rng.random() * 0.9
            est.admit(("b", b), "b", at)
            est.complete(("b", b), at + 0.05, cpu=0.05)
            b += 1
        x = 5.0 + 0.9 * (x - 5.0) + rng.gauss(0, 0.5)
    return est


def test_a_interval_covers_a_of_an_autocorrelated_series() -> None:
    """A^b_a's batch-means interval holds the true mean about 95 % of the time; A^b_b, the
    admitted statement's own fork size every time, is the point 1."""
    rng = random.Random(17)
    covered, trials = 0, 150
    for _ in range(trials):
        est = _admissions_run(1000, rng)
        bounds = est.a_intervals(["a", "b"])
        assert bounds is not None
        (low, high) = bounds
        a = est.a_matrix(["a", "b"])
        assert low[0][1] <= a[0][1] <= high[0][1]
        covered += low[0][1] <= 5.0 <= high[0][1]
        assert low[1][1] == high[1][1] == a[1][1] == 1.0
        assert low[0][0] == high[0][0] == a[0][0]  # one admission of a: no interval, the point
    assert 0.88 <= covered / trials <= 0.99


def test_u_interval_covers_the_cpu_rate_and_needs_batches() -> None:
    """Statements of CPU ~ Exp(mean 0.4 s) completing as a Poisson stream of 2/s on 4 cores:
    U = 2 × 0.4 / 4 = 0.2; the interval holds it about 95 % of the time, and holds U_r."""
    rng = random.Random(5)
    covered, trials = 0, 150
    for _ in range(trials):
        est = Estimator(cores=4)
        t, i = 0.0, 0
        while t < 500:
            est.sample(t, {})
            est.admit(i, "a", t)
            t += rng.expovariate(2.0)
            est.complete(i, t, cpu=rng.expovariate(1 / 0.4))
            i += 1
        est.sample(t, {})
        low, high = est.u_intervals()["a"]  # type: ignore[misc]
        u = est.estimates()["a"].U
        assert low <= u <= high
        covered += low <= 0.2 <= high
    assert 0.88 <= covered / trials <= 0.99
    assert _ar1_run(30, rng).u_intervals() == {"a": None}  # too short: 3 batches
    assert Estimator(cores=1).u_intervals() == {} and Estimator(cores=1).a_intervals([]) is None


def test_the_t_quantile_table_is_students() -> None:
    from scipy.stats import t

    from training.estimate import _T975

    for df, value in enumerate(_T975, start=1):
        assert value == pytest.approx(t.ppf(0.975, df), abs=1e-3), df


def test_completions_whose_cpu_is_unknown_count_as_the_measured_ones() -> None:
    est = Estimator(cores=1)
    est.sample(0.0, {})
    for job in ("a", "b", "c"):
        est.admit(job, "r", 0.0)
    est.complete("a", 1.0, 0.4)
    est.complete("b", 1.0, None)  # (a live sampler's statement on a backend it could not read)
    est.complete("c", 1.0, 0.2)
    est.sample(2.0, {})
    e = est.estimates()["r"]
    assert e.count == 3 and e.cpu == pytest.approx(0.3)  # the mean of the two measured
    assert e.U == pytest.approx(3 * 0.3 / 2.0)  # three statements of 0.3 s over 2 s, 1 core
    known = Estimator(cores=1)
    known.sample(0.0, {})
    known.admit("a", "r", 0.0)
    known.complete("a", 1.0, 0.4)
    known.sample(2.0, {})
    assert known.estimates()["r"].U == 0.4 / 2.0  # all known: exactly the sum, as before
