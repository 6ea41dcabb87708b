"""``Limits.short_lane``: with the MPL full, a statement whose class's D_r is at most 1/factor of
the least expected remaining time of the statements holding the MPL is admitted beside it (at
most MPL of them at once), so that a statement of a millisecond does not wait a second for a
slot. Only classes whose D_r was measured take it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from admission import ClassProfile, EtaModel, Limits, Scheduler
from admission.policies.latency import SHORT_LANE
from admission.sim import SimClass, SimConfig, Workload, simulate


def _model() -> EtaModel:
    return EtaModel(
        classes=(
            ClassProfile(fingerprint="tiny", name="tiny", D=0.01, f=1),
            ClassProfile(fingerprint="mid", name="mid", D=0.5, f=1),
            ClassProfile(fingerprint="long", name="long", D=2.0, f=1),
        )
    )


def _ids(jobs: list) -> list:  # type: ignore[type-arg]
    return [j.id for j in jobs]


def test_a_tiny_statement_passes_a_full_mpl_held_by_long_ones() -> None:
    s = Scheduler(_model(), "latency", Limits(mpl=2, short_lane=4.0, due_factor=None))
    assert _ids(s.submit("L1", "long", 0.0)) == ["L1"]
    assert _ids(s.submit("L2", "long", 0.0)) == ["L2"]
    assert _ids(s.submit("t1", "tiny", 0.1)) == ["t1"]  # 0.01 × 4 ≤ 1.9 s left
    assert s.released_in_service == 1 and s.stats.short == 1 and s.in_service == 3
    assert _ids(s.submit("t2", "tiny", 0.2)) == ["t2"]
    assert s.submit("t3", "tiny", 0.3) == []  # MPL beside the MPL already
    assert _ids(s.complete("t1", 0.31)) == ["t3"]  # a lane job leaving makes lane room
    # mid: 0.5 × 4 = 2 s > what L1 and L2 have left: it waits for a counted slot
    assert s.submit("m", "mid", 0.4) == []
    s.complete("t2", 0.5)
    assert s.queued == 1  # (the lane has room, but mid is not short enough)
    assert _ids(s.complete("L1", 1.0)) == ["m"]  # a counted slot: mid, through the MPL
    assert s.released_in_service == 1  # t3
    for job in ("L2", "t3", "m"):
        s.complete(job, 2.5)
    assert s.in_service == 0 and s.released_in_service == 0 and s.queued == 0


def test_the_remaining_time_shrinks_as_statements_run() -> None:
    s = Scheduler(_model(), "fcfs", Limits(mpl=1, short_lane=3.0))
    s.submit("L", "long", 0.0)
    assert _ids(s.submit("m1", "mid", 0.4)) == ["m1"]  # 1.6 s left of L's 2 ≥ 3 × 0.5
    s.complete("m1", 0.5)
    assert s.submit("m2", "mid", 0.6) == []  # 1.4 s left: a mid statement waits …
    assert _ids(s.complete("L", 1.9)) == ["m2"]  # … for the slot
    assert s.stats.short == 1


def test_a_statement_near_or_past_its_d_r_has_half_its_d_r_left() -> None:
    """D_r is an average: a statement near or past it is neither at its end nor at its start
    (a long statement sharing the cores runs past the D_r it has alone). It counts as having
    half its D_r left, so a statement 8 × shorter than that passes it however long it has
    run; one that is not waits for the slot, and no timer opens the lane for it."""
    s = Scheduler(_model(), "fcfs", Limits(mpl=1, short_lane=4.0))
    s.submit("L", "long", 0.0)
    assert _ids(s.submit("t1", "tiny", 1.99)) == ["t1"]  # 0.01 s of L's 2 s left: 1 s counted
    s.complete("t1", 2.0)
    assert _ids(s.submit("t2", "tiny", 5.0)) == ["t2"]  # L overran its D_r: 1 s counted
    assert s.stats.short == 2
    s.complete("t2", 5.02)
    assert s.submit("m", "mid", 5.1) == []  # 4 × 0.5 s > the 1 s counted for L …
    assert s.next_deadline() is None  # … and time will not change that
    assert _ids(s.complete("L", 6.0)) == ["m"]  # the slot, through the MPL
    assert s.stats.short == 2


def test_a_statement_past_its_class_tail_counts_as_long_as_it_ran() -> None:
    """A class of mostly short statements with rare long ones (a 2 ms range query whose odd
    run scans everything): D_r is the short ones'. One of its statements past the class's
    tail (D_tail, what 9 in 10 end within) is one of the long ones, and counts as having as
    long to go as it ran — not half its class's D_r, which kept the lane shut behind it.
    Without a known tail the rule before holds."""

    def model(tail: float | None) -> EtaModel:
        return EtaModel(
            classes=(
                ClassProfile(fingerprint="range", name="range", D=0.002, D_tail=tail, f=1),
                ClassProfile(fingerprint="point", name="point", D=0.001, f=1),
            )
        )

    s = Scheduler(model(0.004), "fcfs", Limits(mpl=1, short_lane=8.0))
    s.submit("R", "range", 0.0)
    assert s.submit("p1", "point", 0.003) == []
    # 12 ms run, past twice the 4 ms tail: 12 ms counted ≥ 8 × 1 ms — the oldest point passes
    assert _ids(s.submit("p2", "point", 0.012)) == ["p1"]
    assert s.stats.short == 1 and s.stats.long == 0
    s = Scheduler(model(None), "fcfs", Limits(mpl=1, short_lane=8.0))
    s.submit("R", "range", 0.0)
    assert s.submit("p1", "point", 0.003) == []
    assert s.submit("p2", "point", 0.05) == []  # no tail known: 1 ms counted, however long
    assert s.stats.short == 0


def test_a_long_run_gives_its_mpl_slot_up_at_four_times_its_class_tail() -> None:
    """Holding the MPL past four times its class's tail, a statement is one of the class's
    rare long runs: it gives its slot to the queue and runs on beside the MPL — at the time
    itself (a timer, not the next arrival) — and so does one in the lane past twice its tail,
    at most 2 × MPL of them at once. Without a tail known, or with no short lane (a faithful MPL),
    the slot stays held."""
    model = EtaModel(
        classes=(
            ClassProfile(fingerprint="range", name="range", D=0.002, D_tail=0.004, f=1),
            ClassProfile(fingerprint="point", name="point", D=0.001, D_tail=0.001, f=1),
        )
    )
    s = Scheduler(model, "latency", Limits(mpl=1, short_lane=8.0, due_factor=None))
    s.submit("R1", "range", 0.0)
    for i, at in ((2, 0.001), (3, 0.002), (4, 0.003)):
        assert s.submit(f"R{i}", "range", at) == []
    # the lane wants 8 × 2 ms left of R1: at 8 ms R1 counts as long as it ran (8 ms): not yet
    assert s.next_deadline() == pytest.approx(0.016, abs=1e-6)  # R1's four tails
    assert _ids(s.tick(0.016 + 1e-6)) == ["R2"]  # R1 gave its slot up; R2 holds the MPL
    assert s.stats.long == 1 and s.released_in_service == 1
    assert s.next_deadline() == pytest.approx(0.032, abs=1e-5)  # R2's four tails
    assert _ids(s.tick(0.032 + 1e-5)) == ["R3"] and s.stats.long == 2
    # at most 2 × MPL beside it as long runs: R3 keeps its slot, and past twice its tail it
    # counts as long as it ran — R4 passes by the lane
    assert _ids(s.tick(1.0)) == ["R4"] and s.stats.short == 1 and s.stats.long == 2
    assert s.submit("R5", "range", 1.1) == []  # R4 keeps the lane's place: no room beside
    granted = s.complete("R1", 1.2)  # R1 ends: R3 gives its slot up to R5
    assert _ids(granted) == ["R5"] and s.stats.long == 3
    for tail, lane in ((None, 8.0), (0.004, 0.0)):
        classes = (ClassProfile(fingerprint="range", name="range", D=0.002, D_tail=tail, f=1),)
        s = Scheduler(EtaModel(classes=classes), "latency", Limits(mpl=1, short_lane=lane))
        s.submit("R1", "range", 0.0)
        assert s.submit("R2", "range", 0.001) == []
        assert s.tick(1.0) == [] and s.stats.long == 0, (tail, lane)


def test_a_long_run_in_the_lane_gives_its_place_up_at_twice_its_class_tail() -> None:
    """A range query let in by the lane beside a long statement turns out one of its class's
    long runs: past twice its class's tail it gives its place up (at the time itself) and a
    point lookup passes by the lane, rather than waiting for it."""
    model = EtaModel(
        classes=(
            ClassProfile(fingerprint="long", name="long", D=1.0, f=1),
            ClassProfile(fingerprint="range", name="range", D=0.002, D_tail=0.004, f=1),
            ClassProfile(fingerprint="point", name="point", D=0.001, D_tail=0.001, f=1),
        )
    )
    s = Scheduler(model, "latency", Limits(mpl=1, short_lane=8.0))
    s.submit("L", "long", 0.0)
    assert _ids(s.submit("R", "range", 0.001)) == ["R"]  # by the lane
    assert s.submit("P", "point", 0.005) == []  # the lane's one place is R's
    assert s.next_deadline() == pytest.approx(0.009, abs=1e-6)  # R's two tails
    assert _ids(s.tick(0.009 + 1e-6)) == ["P"]
    assert s.stats.short == 2 and s.stats.long == 1 and s.released_in_service == 2


def test_a_class_first_seen_live_waits_until_measured() -> None:
    s = Scheduler(_model(), "latency", Limits(mpl=1, short_lane=4.0))
    s.submit("L", "long", 0.0)
    assert s.submit("n", "NEW", 0.1, name="new") == []  # its D_r is a prior: no lane
    assert s.stats.short == 0
    # the live learning measured it short (a model with the class's live estimate)
    model = s.model
    classes = tuple(
        c.model_copy(update={"D": 0.005, "live": 20}) if c.fingerprint == "NEW" else c
        for c in model.classes
    )
    assert _ids(s.set_model(model.model_copy(update={"classes": classes}), 0.2)) == ["n"]
    assert s.stats.short == 1


def test_a_bypass_statement_holding_the_mpl_counts_with_its_class() -> None:
    s = Scheduler(_model(), "fcfs", Limits(mpl=1, short_lane=4.0))
    s.submit("B", "mid", 0.0, bypass=True)  # in a transaction block: holds the slot
    assert _ids(s.submit("t", "tiny", 0.1)) == ["t"]  # 0.4 s left of B's D_r
    assert s.stats.short == 1
    assert s.submit("m", "mid", 0.2) == []  # mid is not 4 × shorter than mid


def test_the_latency_policy_has_a_lane_of_its_own_and_the_others_none() -> None:
    s = Scheduler(_model(), "latency", Limits(mpl=1))
    assert s.short_lane == SHORT_LANE
    s.submit("L", "long", 0.0)
    assert _ids(s.submit("t", "tiny", 0.1)) == ["t"]  # 8 × 0.01 ≤ 1.9 s left
    for policy in ("fcfs", "sept", "min-q", "min-a", "max-u", "max-p"):
        assert Scheduler(_model(), policy, Limits(mpl=1)).short_lane is None
    assert Scheduler(_model(), "fcfs", Limits(mpl=1, short_lane=2)).short_lane == 2


def test_without_a_lane_the_mpl_holds() -> None:
    s = Scheduler(_model(), "latency", Limits(mpl=1, short_lane=0))  # 0: none, not the policy's
    assert s.short_lane is None
    s.submit("L", "long", 0.0)
    assert s.submit("t", "tiny", 0.1) == []
    assert s.released_in_service == 0 and s.stats.short == 0
    # a policy switched to keeps the limits' word; latency's own lane comes with it when the
    # limits leave it to the policy
    s = Scheduler(_model(), "fcfs", Limits(mpl=1))
    s.submit("L", "long", 0.0)
    assert s.submit("t", "tiny", 0.1) == []
    assert _ids(s.set_policy("latency", 0.2)) == ["t"]


def test_switching_the_lane_on_counts_what_is_in_service() -> None:
    s = Scheduler(_model(), "fcfs", Limits(mpl=1))
    s.submit("L", "long", 0.0)
    s.submit("t", "tiny", 0.5)
    assert _ids(s.set_limits(Limits(mpl=1, short_lane=4.0), 0.6)) == ["t"]
    assert _ids(s.set_limits(Limits(mpl=1), 0.7)) == []  # off: t stays beside the MPL …
    assert s.released_in_service == 1
    s.complete("t", 0.8)
    assert s.released_in_service == 0 and s.in_service == 1


@pytest.mark.parametrize("bad", [0.5, -1.0, float("inf"), float("nan")])
def test_the_factor_must_be_at_least_one(bad: float) -> None:
    with pytest.raises(ValueError, match="short_lane"):
        Limits(mpl=2, short_lane=bad)


def test_in_the_simulator_short_jobs_stop_waiting_behind_long_ones() -> None:
    """M/G/1-like open queue at MPL 1: with the lane, the short class's mean response time
    drops to about its service time (it no longer waits a long job's residual), and the long
    class pays at most what the short work takes from it."""
    work = Workload("pair", (SimClass("short", ((1, 0.001),)), SimClass("long", ((1, 0.2),))))
    base = SimConfig(
        cores=1,
        fcr=None,
        mix=(0.5, 0.5),
        arrival_rate=3.0,  # ρ = 3 × (0.5 × 0.001 + 0.5 × 0.2) ≈ 0.30
        mpl=1,
        completions=6000,
        warmup=600,
    )
    model = work.model(1, None, [0.001, 0.2])
    plain = simulate(work, replace(base, short_lane=0), model, "latency", np.random.default_rng(3))
    lane = simulate(work, replace(base, short_lane=4.0), model, "latency", np.random.default_rng(3))
    short_plain = float(plain.response_times[0].mean())
    short_lane = float(lane.response_times[0].mean())
    # without: a short job waits the residual of a long one about ρ_long of the time
    # (≈ 0.3 × 0.1 s); with: it shares the core for ~1 ms and is done
    assert short_plain > 0.02
    assert short_lane < 0.005
    long_plain = float(plain.response_times[1].mean())
    long_lane = float(lane.response_times[1].mean())
    assert long_lane < long_plain * 1.05


def test_a_statement_of_a_class_not_measured_has_as_long_to_go_as_it_has_run() -> None:
    """A report first seen live holds the slot: its D_r is a prior, so what it has run is the
    evidence of what it has left, and the lane opens for a tiny statement once it has run
    factor × the tiny one's D_r (a timer: nothing else happens meanwhile)."""
    s = Scheduler(_model(), "fcfs", Limits(mpl=1, short_lane=4.0))
    assert _ids(s.submit("R", "REPORT", 0.0, name="report")) == ["R"]
    assert s.submit("t1", "tiny", 0.01) == []  # R ran 0.01 s < 4 × 0.01
    assert s.next_deadline() == pytest.approx(0.04)
    assert s.tick(0.03) == []
    assert _ids(s.tick(s.next_deadline())) == ["t1"]  # type: ignore[arg-type]
    assert s.submit("m", "mid", 0.5) == []  # mid needs R to have run 2 s …
    assert s.next_deadline() is None  # … and the lane is full (t1: MPL 1 beside it)
    assert s.complete("t1", 1.0) == []
    assert s.next_deadline() == pytest.approx(2.0)
    assert _ids(s.tick(s.next_deadline())) == ["m"]  # type: ignore[arg-type]
    assert s.released_in_service == 1 and s.stats.short == 2
