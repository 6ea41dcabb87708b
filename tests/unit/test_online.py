"""Learning D_r while serving (admission.online): estimates, calibration, drift, noise."""

from __future__ import annotations

import random

import pytest

from admission import ClassProfile, EtaModel, Limits, Scheduler
from admission.online import MIN_SAMPLES, OnlineEstimator, forget_learned, median_interval


def _serve(s: Scheduler, est: OnlineEstimator, fingerprint: str, service: float, n: int) -> None:
    """``n`` statements of a class, one at a time, each taking ``service`` seconds."""
    now = s._now if s._now > 0 else 0.0  # (the scheduler's clock; tests only)
    for _ in range(n):
        job = f"{fingerprint}-{now}"
        s.submit(job, fingerprint, now)
        now += service
        s.complete(job, now)


def _scheduler(model: EtaModel | None = None) -> tuple[Scheduler, OnlineEstimator]:
    s = Scheduler(model, "latency", Limits(mpl=2))
    est = OnlineEstimator()
    s.observe(finishes=est.finished)
    return s, est


def test_median_interval_holds_the_median() -> None:
    values = [float(v) for v in range(1, 33)]
    median, low, high = median_interval(values)
    assert median == 16.5 and low < median < high
    # order statistics 10 and 23 of 32: exact coverage 1 − 2·P(B ≤ 9) = 98.0 % (11 and 22
    # would cover 95.0 % — just under, as the binomial's steps fall)
    assert (low, high) == (10.0, 23.0)
    assert median_interval([2.0]) == (2.0, 2.0, 2.0)


def test_a_proxy_without_a_model_learns_each_class() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:short", 0.01, 4)
    assert est.refresh(s.model) is None  # fewer than min_samples
    _serve(s, est, "fp:short", 0.01, 4)
    _serve(s, est, "fp:long", 0.5, 8)
    model = est.refresh(s.model)
    assert model is not None
    by = {c.fingerprint: c for c in model.classes}
    assert by["fp:short"].D == pytest.approx(0.01) and by["fp:short"].live == 8
    assert by["fp:long"].D == pytest.approx(0.5)
    assert by["fp:long"].D_low is not None and by["fp:long"].D_high is not None
    s.set_model(model, 100.0)  # the latency policy now puts the short class first
    assert est.refresh(s.model) is None  # nothing moved since


def test_noise_within_the_change_threshold_keeps_the_model() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:a", 0.10, 8)
    model = est.refresh(s.model)
    assert model is not None
    s.set_model(model, 100.0)
    rng = random.Random(1)
    for _ in range(32):
        _serve(s, est, "fp:a", 0.10 * rng.uniform(0.9, 1.1), 1)
    assert est.refresh(s.model) is None


def test_a_first_estimate_on_few_statements_gets_its_interval_narrowed() -> None:
    # adopted at 5 statements its interval is their range; a window of statements spread less
    # gives an interval much narrower, and the model takes it (the estimate itself moved less
    # than the change threshold)
    s, est = _scheduler()
    rng = random.Random(7)
    for service in (0.05, 0.08, 0.10, 0.12, 0.15):
        _serve(s, est, "fp:a", service, 1)
    first = est.refresh(s.model)
    assert first is not None
    s.set_model(first, 100.0)
    (a,) = s.model.classes
    assert a.D_low is not None and a.D_high is not None
    for _ in range(32):
        _serve(s, est, "fp:a", 0.10 * rng.uniform(0.9, 1.1), 1)
    second = est.refresh(s.model)
    assert second is not None
    (b,) = second.classes
    assert b.D_low is not None and b.D_high is not None
    assert abs(b.D - a.D) <= 0.25 * a.D
    assert (b.D_high - b.D_low) / b.D < 0.5 * (a.D_high - a.D_low) / a.D
    assert b.live == 37
    s.set_model(second, 200.0)
    for _ in range(32):  # the same spread again: nothing narrower to take
        _serve(s, est, "fp:a", 0.10 * rng.uniform(0.9, 1.1), 1)
    assert est.refresh(s.model) is None


def test_a_class_that_grows_five_times_is_followed_within_fifty_statements() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:a", 0.02, 32)
    s.set_model(est.refresh(s.model) or s.model, 100.0)
    executions = 0
    while executions < 50 and abs(s.model.classes[0].D - 0.10) > 0.2 * 0.10:
        _serve(s, est, "fp:a", 0.10, 1)
        executions += 1
        model = est.refresh(s.model)
        if model is not None:
            s.set_model(model, s._now)
    assert executions == 17  # within 50: the median of 32 crosses over at the 17th
    assert s.model.classes[0].D == pytest.approx(0.10)


def _trained(fingerprint: str, name: str, d: float) -> ClassProfile:
    return ClassProfile(fingerprint=fingerprint, name=name, D=d, f=1, D_runs=10, count=10)


def test_live_times_are_put_in_the_trained_units() -> None:
    """Statements run 1.5× slower live than alone (contention): trained classes keep their
    D_r, and a class first seen live gets its time in trained units, not 1.5× too long."""
    model = EtaModel(
        classes=(
            _trained("fp:a", "A", 0.02),
            _trained("fp:b", "B", 0.10),
            _trained("fp:c", "C", 0.40),
        )
    )
    s, est = _scheduler(model)
    for fp, d in (("fp:a", 0.02), ("fp:b", 0.10), ("fp:c", 0.40), ("fp:new", 0.20)):
        _serve(s, est, fp, 1.5 * d, 8)
    assert est.scale(s.model) == pytest.approx(1 / 1.5)
    new = est.refresh(s.model)
    assert new is not None
    by = {c.fingerprint: c for c in new.classes}
    assert [by[f].D for f in ("fp:a", "fp:b", "fp:c")] == [0.02, 0.10, 0.40]  # kept
    assert by["fp:new"].D == pytest.approx(0.20) and by["fp:new"].live == 8


def test_one_trained_class_drifting_does_not_move_the_others() -> None:
    model = EtaModel(
        classes=(
            _trained("fp:a", "A", 0.02),
            _trained("fp:b", "B", 0.10),
            _trained("fp:c", "C", 0.40),
        )
    )
    s, est = _scheduler(model)
    _serve(s, est, "fp:a", 0.02, 8)
    _serve(s, est, "fp:b", 0.10, 8)
    _serve(s, est, "fp:c", 2.0, 8)  # its table grew five times
    new = est.refresh(s.model)
    assert new is not None
    by = {c.fingerprint: c for c in new.classes}
    assert (by["fp:a"].D, by["fp:b"].D) == (0.02, 0.10)
    assert by["fp:c"].D == pytest.approx(2.0) and by["fp:c"].live == 8


def test_only_statements_that_ran_count() -> None:
    s, est = _scheduler()
    s.set_limits(Limits(mpl=1), 0.0)
    s.submit("run", "fp:a", 0.0)
    s.submit("waits", "fp:a", 0.0)
    s.cancel("waits", 1.0)  # cancelled while queued: no service time
    s.submit("bypass", "fp:a", 1.0, bypass=True)
    s.complete("bypass", 1.5)  # session control: not a sample
    s.complete("run", 2.0)
    assert list(est.samples["fp:a"]) == [2.0]
    est.enabled = False
    s.submit("off", "fp:a", 3.0)
    s.complete("off", 4.0)
    assert list(est.samples["fp:a"]) == [2.0]


def test_a_class_not_measured_yet_follows_the_median_of_the_measured() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:rare", 0.05, 2)  # seen, but fewer than min_samples
    for fp, d in (("fp:a", 0.01), ("fp:b", 0.02), ("fp:c", 0.5)):
        _serve(s, est, fp, d, 8)
    model = est.refresh(s.model)
    assert model is not None
    rare = next(c for c in model.classes if c.fingerprint == "fp:rare")
    assert rare.D == pytest.approx(0.02) and rare.live == 0  # not the empty model's 1 s


def test_too_few_trained_classes_to_calibrate_leave_live_units() -> None:
    model = EtaModel(classes=(_trained("fp:a", "A", 0.02), _trained("fp:b", "B", 0.10)))
    s, est = _scheduler(model)
    _serve(s, est, "fp:a", 0.02, 8)
    _serve(s, est, "fp:b", 0.50, 8)  # drifted: with two, it would move the scale by half
    assert est.scale(s.model) == 1.0
    new = est.refresh(s.model)
    assert new is not None
    by = {c.fingerprint: c for c in new.classes}
    assert by["fp:a"].D == 0.02 and by["fp:b"].D == pytest.approx(0.50)


def test_a_class_not_measured_yet_starts_from_its_cost_estimate() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:new", 0.05, 2)  # seen, but fewer than min_samples
    # three measured classes whose D_r is 1 ms per 10,000 units of the planner's cost
    for fp, d in (("fp:a", 0.01), ("fp:b", 0.02), ("fp:c", 0.5)):
        _serve(s, est, fp, d, 8)
        est.planned(fp, d * 1e7)
    est.planned("fp:new", 3e6)
    model = est.refresh(s.model)
    assert model is not None
    by = {c.fingerprint: c for c in model.classes}
    assert by["fp:new"].D == pytest.approx(0.3) and by["fp:new"].live == 0
    assert by["fp:new"].cost == 3e6 and by["fp:a"].cost == 1e5  # kept in the model
    # once measured, the measurement wins over the prior
    _serve(s, est, "fp:new", 0.05, 6)
    s.set_model(model, 1000.0)
    measured = est.refresh(s.model)
    assert measured is not None
    assert next(c for c in measured.classes if c.fingerprint == "fp:new").D == pytest.approx(0.05)


def test_a_plans_work_mem_units_reach_a_class_training_did_not_count() -> None:
    counted = _trained("fp:a", "A", 0.02).model_copy(update={"work_mem_units": 6.0})
    s, est = _scheduler(EtaModel(classes=(counted,)))
    _serve(s, est, "fp:new", 0.05, 2)
    est.planned("fp:a", 1e5, 2.0)  # training's count stays
    est.planned("fp:new", 3e6, 5.0)
    est.planned("fp:bad", 3e6, float("nan"))
    model = est.refresh(s.model)
    assert model is not None
    by = {c.fingerprint: c for c in model.classes}
    assert by["fp:a"].work_mem_units == 6.0 and by["fp:new"].work_mem_units == 5.0
    assert "fp:bad" not in est.units


def test_without_enough_costed_classes_the_prior_is_the_median() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:new", 0.05, 2)
    for fp, d in (("fp:a", 0.01), ("fp:b", 0.02), ("fp:c", 0.5)):
        _serve(s, est, fp, d, 8)
    est.planned("fp:a", 1e5)  # one measured class with a cost: no scale to trust
    est.planned("fp:new", 3e6)
    est.planned("fp:b", float("nan"))  # a planner's nonsense is not kept
    model = est.refresh(s.model)
    assert model is not None
    assert next(c for c in model.classes if c.fingerprint == "fp:new").D == pytest.approx(0.02)
    assert "fp:b" not in est.costs


def test_the_calibration_keeps_its_classes_once_they_take_live_estimates() -> None:
    """Live times run 2× the trained ones; C drifts 4×. Once C takes its live estimate it still
    calibrates (by the D_r training measured, kept in the model): the scale stays ½ refresh
    after refresh, and no class flips into live units."""
    model = EtaModel(
        classes=(
            _trained("fp:a", "A", 0.01),
            _trained("fp:b", "B", 0.10),
            _trained("fp:c", "C", 1.00),
            _trained("fp:idle", "I", 0.50),  # nothing of it runs
        )
    )
    s, est = _scheduler(model)
    for fp, live in (("fp:a", 0.02), ("fp:b", 0.20), ("fp:c", 8.0)):
        _serve(s, est, fp, live, 8)
    first = est.refresh(s.model)
    assert first is not None
    s.set_model(first, 1000.0)
    by = {c.fingerprint: c for c in first.classes}
    assert by["fp:c"].D == pytest.approx(4.0) and by["fp:c"].D_trained == 1.0
    for _ in range(3):  # more of the same: nothing moves any more
        for fp, live in (("fp:a", 0.02), ("fp:b", 0.20), ("fp:c", 8.0)):
            _serve(s, est, fp, live, 4)
        assert est.scale(s.model) == pytest.approx(0.5)
        assert est.refresh(s.model) is None
    by = {c.fingerprint: c for c in s.model.classes}
    assert [by[f].D for f in ("fp:a", "fp:b", "fp:idle")] == [0.01, 0.10, 0.50]


def test_forget_learned_goes_back_to_training() -> None:
    from admission.online import forget_learned

    model = EtaModel(classes=(_trained("fp:a", "A", 0.01), _trained("fp:b", "B", 0.30)))
    s, est = _scheduler(model)
    _serve(s, est, "fp:a", 0.05, 8)  # drifted 5×
    _serve(s, est, "fp:new", 0.2, 8)  # never trained
    learned = est.refresh(s.model)
    assert learned is not None
    back = {c.fingerprint: c for c in forget_learned(learned).classes}
    assert back["fp:a"].D == 0.01 and back["fp:a"].live == 0 and back["fp:a"].D_trained is None
    assert back["fp:b"].D == 0.30  # untouched
    assert back["fp:new"].D == pytest.approx(0.155) and back["fp:new"].live == 0  # the median
    # and the file round trip keeps what reset needs
    again = EtaModel.model_validate_json(learned.model_dump_json())
    assert {c.fingerprint: c.D_trained for c in again.classes}["fp:a"] == 0.01


def test_a_window_of_the_live_profile_moves_the_model_halfway() -> None:
    from admission.online import WindowProfile, merge_profile

    trained = EtaModel(
        classes=(
            ClassProfile(fingerprint="fp:a", name="A", D=0.1, f=2, U=0.2, Q=1.0, A=2.0, count=50),
            ClassProfile(fingerprint="fp:b", name="B", D=0.5, f=1, U=0.1, Q=0.5, A=1.0, count=50),
        ),
        A_matrix=((2.0, 1.0), (1.0, 1.0)),
    )
    live = trained.with_class("fp:new", "N")  # the default profile, never measured
    window = {
        "fp:a": WindowProfile(U=0.4, Q=3.0, A=4.0, completed=20),
        "fp:b": WindowProfile(U=0.9, Q=9.0, A=9.0, completed=2),  # too few: left alone
        "fp:new": WindowProfile(U=0.05, Q=0.2, A=0.4, completed=8),
    }
    seen = {"fp:a": {"fp:a": 4.0, "fp:new": 1.0}, "fp:new": {"fp:a": 3.0, "fp:new": 0.6}}
    merged = merge_profile(live, window, seen)
    assert merged is not None
    a, b, new = merged.classes
    assert (a.U, a.Q, a.A, a.profiled) == (pytest.approx(0.3), 2.0, 3.0, 1)
    assert (b.U, b.Q, b.A, b.profiled) == (0.1, 0.5, 1.0, 0)
    assert (new.U, new.Q, new.A, new.profiled) == (0.05, 0.2, 0.4, 1)  # at once: no prior
    m = merged.a_matrix()  # m[r][c] = A^c_r; the columns of a and new moved
    assert m[0][0] == 3.0 and m[2][0] == pytest.approx(0.5 * live.a_matrix()[2][0] + 0.5)
    assert m[0][2] == 3.0 and m[2][2] == 0.6  # new: the window's at once
    assert m[0][1] == 1.0 and m[1][1] == 1.0  # b's column: not enough statements
    assert merge_profile(live, {"fp:b": window["fp:b"]}, {}) is None


def test_a_cost_prior_stays_within_what_the_measured_classes_took() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:huge", 0.05, 2)
    for fp, d in (("fp:a", 0.01), ("fp:b", 0.02), ("fp:c", 0.5)):
        _serve(s, est, fp, d, 8)
        est.planned(fp, d * 1e7)
    est.planned("fp:huge", 1e12)  # a plan the planner thinks enormous: 100,000 s by the scale
    model = est.refresh(s.model)
    assert model is not None
    assert next(c for c in model.classes if c.fingerprint == "fp:huge").D == 0.5


def test_memory_samples_after_the_first_are_one_in_32_and_at_most_one_a_second() -> None:
    from proxy.gate import AdmissionGate
    from proxy.learning import MEMORY_EVERY, MEMORY_FIRST, MEMORY_GAP, LiveModel

    now = [0.0]
    gate = AdmissionGate(Scheduler(EtaModel(), "fcfs", Limits()))
    learning = LiveModel(gate, clock=lambda: now[0])

    def taken(n: int, step: float) -> list[int]:
        out = []
        for _ in range(n):
            now[0] += step
            if learning.memory_wanted("fp:a"):
                out.append(learning._memory_seen["fp:a"])
        return out

    # a slow class (a statement every 0.1 s): the first 8, then every 32nd after them
    assert taken(MEMORY_FIRST + 2 * MEMORY_EVERY, 0.1) == [
        *range(1, MEMORY_FIRST + 1),
        MEMORY_FIRST + MEMORY_EVERY,
        MEMORY_FIRST + 2 * MEMORY_EVERY,
    ]
    # a class of tiny statements (10,000 a second): one a MEMORY_GAP, not 300
    fast = taken(30_000, 1e-4)
    assert len(fast) == pytest.approx(3 / MEMORY_GAP, abs=1)
    assert learning.memory_wanted("fp:new")  # another class starts with its first 8


def test_a_class_reaching_its_first_estimate_is_looked_at_within_ready_within() -> None:
    """A fresh server learns from nothing: the look that makes a class measured (and lets it
    take the short lane) comes within READY_WITHIN of its fifth statement, not a whole period
    later; a class that goes on completing does not move the look again."""
    import asyncio

    from proxy.gate import AdmissionGate
    from proxy.learning import READY_WITHIN, LiveModel

    async def run() -> tuple[int, int, float | None]:
        loop = asyncio.get_running_loop()
        gate = AdmissionGate(Scheduler(EtaModel(), "latency", Limits(mpl=2)))
        learning = LiveModel(gate, every=60.0)
        learning.start()
        s = gate.scheduler
        clock = [loop.time()]

        def serve(job: str) -> None:
            clock[0] = max(clock[0], loop.time())  # (a model swap tells the scheduler the time)
            s.submit(job, "fp:a", clock[0])
            clock[0] += 0.001
            s.complete(job, clock[0])

        for i in range(MIN_SAMPLES - 1):
            serve(f"a{i}")
        await asyncio.sleep(2 * READY_WITHIN)
        before = learning.updates  # four statements: nothing to adopt, nothing looked at
        serve("a-last")
        await asyncio.sleep(2 * READY_WITHIN)
        after = learning.updates
        for i in range(20):  # more of the same class: the next look is a period away
            serve(f"b{i}")
        assert learning._timer is not None
        left = learning._timer.when() - loop.time()
        learning.stop()
        d = next(c.D for c in s.model.classes if c.fingerprint == "fp:a")
        assert d == pytest.approx(0.001)
        return before, after, left

    before, after, left = asyncio.run(run())
    assert (before, after) == (0, 1)
    assert left is not None and left > 50


def test_the_tail_is_what_nine_in_ten_end_within_and_follows_when_it_moves() -> None:
    s, est = _scheduler()
    _serve(s, est, "fp:range", 0.002, 30)
    _serve(s, est, "fp:range", 0.2, 2)  # two of 32 ran long: past the tail, not in it
    model = est.refresh(s.model)
    assert model is not None
    c = next(c for c in model.classes if c.fingerprint == "fp:range")
    assert c.D == pytest.approx(0.002) and c.D_tail == pytest.approx(0.002)
    s.set_model(model, s._now)
    _serve(s, est, "fp:range", 0.2, 4)  # six of the last 32: the tail moves, D does not
    model = est.refresh(s.model)
    assert model is not None
    c = next(c for c in model.classes if c.fingerprint == "fp:range")
    assert c.D == pytest.approx(0.002) and c.D_tail == pytest.approx(0.2)
    s.set_model(model, s._now)
    _serve(s, est, "fp:range", 0.2, 1)  # the same tail: no new model
    assert est.refresh(s.model) is None
    # a trained class whose D_r held takes a live tail too; a reset forgets every tail
    trained = ClassProfile(fingerprint="fp:t", name="t", D=0.002, D_runs=3, f=1)
    s, est = _scheduler(EtaModel(classes=(trained,)))
    _serve(s, est, "fp:t", 0.002, 30)
    _serve(s, est, "fp:t", 0.2, 6)
    model = est.refresh(s.model)
    assert model is not None
    (c,) = model.classes
    assert (c.D, c.live, c.D_tail) == (0.002, 0, pytest.approx(0.2))
    assert forget_learned(model).classes[0].D_tail is None
