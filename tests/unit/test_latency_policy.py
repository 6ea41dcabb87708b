"""The latency policy (SEPT + aging by expected time): hand-computed decisions, its deadline,
its tie groups, the no-starvation rule as a property, and the simulator against queueing theory.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission import ClassProfile, EtaModel, Event, Limits, Scheduler
from admission.policies import POLICIES
from admission.scheduler import DUE_FACTOR
from admission.sim import SimClass, SimConfig, Workload
from admission.sim.study import Estimate, replicate
from admission.sim.theory import mg1_priority_waits


def _model(*classes: tuple[str, float, float | None, float | None]) -> EtaModel:
    return EtaModel(
        classes=tuple(
            ClassProfile(fingerprint=n, name=n, D=d, D_low=lo, D_high=hi, f=1)
            for n, d, lo, hi in classes
        )
    )


SHORT_LONG = _model(("S", 1.0, None, None), ("L", 10.0, None, None))


def _granted(jobs: list) -> list[str]:  # type: ignore[type-arg]
    return [str(j.id) for j in jobs]


def test_the_priority_is_septs_order_with_each_class_d_as_its_aging_unit() -> None:
    model = _model(
        ("A", 1.0, 0.8, 1.3), ("B", 1.2, 1.0, 1.5), ("C", 5.0, 4.0, 6.0), ("D", 6.0, 5.8, 6.1)
    )
    prio = POLICIES["latency"].build(model)
    assert prio.bias == POLICIES["sept"].build(model).bias == (-1.0, -1.0, -5.0, -5.0)
    assert prio.due_scale == (1.0, 1.2, 5.0, 6.0)  # each class's own D_r, not its group's


def test_tied_classes_go_in_arrival_order() -> None:
    model = _model(("A", 1.0, 0.8, 1.3), ("B", 1.2, 1.0, 1.5), ("C", 5.0, 4.0, 6.0))
    s = Scheduler(model, "latency", Limits(short_lane=0, mpl=1, due_factor=None))
    s.submit("c0", "C", 0.0)
    s.submit("c1", "C", 0.1)
    s.submit("b1", "B", 0.2)
    s.submit("a1", "A", 0.3)
    assert _granted(s.complete("c0", 1.0)) == ["b1"]  # B ties with A and came first
    assert _granted(s.complete("b1", 2.0)) == ["a1"]
    assert _granted(s.complete("a1", 3.0)) == ["c1"]


def test_a_due_job_goes_first_and_due_jobs_go_by_wait_over_d() -> None:
    events: list[Event] = []
    s = Scheduler(SHORT_LONG, "latency", Limits(short_lane=0, mpl=1, due_factor=2), events.append)
    assert _granted(s.submit("s0", "S", 0.0)) == ["s0"]
    s.submit("l1", "L", 0.0)  # due at 0 + 2·10 = 20
    assert s.next_deadline() == 20.0
    s.submit("s1", "S", 1.0)  # due at 1 + 2·1 = 3
    assert s.next_deadline() == 3.0
    assert _granted(s.complete("s0", 2.0)) == ["s1"]  # nothing due: SEPT's order
    assert s.next_deadline() == 20.0
    s.submit("s2", "S", 20.5)  # due at 22.5
    assert _granted(s.complete("s1", 21.0)) == ["l1"]  # l1 is due, s2 is not
    assert events[-1].detail == "due" and s.stats.aged == 1
    # two due heads: the larger wait/D first, whatever the class
    s.submit("l2", "L", 22.0)  # due at 42; at 45 its ratio is 2.3
    s.submit("s3", "S", 42.5)  # due at 44.5, after s2; at 45 its ratio is 2.5
    assert _granted(s.complete("l1", 45.0)) == ["s2"]  # ratio 24.5
    assert _granted(s.complete("s2", 45.0)) == ["s3"]  # 2.5 > 2.3
    assert _granted(s.complete("s3", 45.1)) == ["l2"]
    s.submit("l3", "L", 46.0)  # due at 66; at 70 its ratio is 2.4
    s.submit("s4", "S", 67.9)  # due at 69.9; at 70 its ratio is 2.1
    assert _granted(s.complete("l2", 70.0)) == ["l3"]  # the long job first: 2.4 > 2.1


def test_next_deadline_names_the_next_head_to_become_due_and_never_the_past() -> None:
    s = Scheduler(SHORT_LONG, "latency", Limits(short_lane=0, mpl=1, due_factor=3, max_wait=100))
    s.submit("s0", "S", 0.0)
    s.submit("l1", "L", 0.0)
    assert s.next_deadline() == 30.0  # before max_wait's 100
    s.submit("s1", "S", 5.0)
    assert s.next_deadline() == 8.0
    assert s.tick(9.0) == [] and s.next_deadline() == 30.0  # s1 is due; the MPL is full
    assert s.tick(31.0) == [] and s.next_deadline() == 100.0  # both due: max_wait remains
    off = Scheduler(SHORT_LONG, "latency", Limits(short_lane=0, mpl=1, due_factor=None))
    off.submit("s0", "S", 0.0)
    off.submit("l1", "L", 0.0)
    assert not off.timed and off.next_deadline() is None  # SEPT, no timers needed
    assert not Scheduler(
        SHORT_LONG, "sept", Limits(short_lane=0, mpl=1)
    ).timed  # the rule is the policy's


def test_a_due_job_is_admitted_by_a_tick_while_the_shorter_pick_waits_for_threads() -> None:
    # faithful mode: SEPT's pick (s1) does not fit the budget; l1, once due, does
    model = EtaModel(
        classes=(
            ClassProfile(fingerprint="S", name="S", D=1.0, f=4),
            ClassProfile(fingerprint="L", name="L", D=8.0, f=1),
        )
    )
    s = Scheduler(model, "latency", Limits(short_lane=0, mpl=2, threads=5, due_factor=2))
    assert _granted(s.submit("s0", "S", 0.0)) == ["s0"]  # 4 of 5 threads
    assert _granted(s.submit("l0", "L", 0.0)) == ["l0"]  # the MPL is full
    s.submit("l1", "L", 0.0)  # due at 16
    s.submit("s1", "S", 15.5)  # due at 17.5
    assert _granted(s.complete("l0", 15.6)) == []  # s1 is picked and needs 4 threads
    assert s.next_deadline() == 16.0
    assert _granted(s.tick(16.0)) == ["l1"]


def test_continuous_short_work_cannot_starve_the_long_class() -> None:
    """At MPL 1 a short job is always waiting when one finishes: SEPT never admits the long
    one; latency admits it once due, within one short service of k·D_L."""
    for policy, k in (("sept", None), ("latency", 3.0)):
        s = Scheduler(SHORT_LONG, policy, Limits(short_lane=0, mpl=1, due_factor=k))
        now = 0.0
        s.submit("s0", "S", now)
        s.submit("long", "L", now)
        running, admitted_at = "s0", None
        for i in range(1, 200):
            s.submit(f"s{i}", "S", now + 0.5)  # the next short arrives before one finishes
            now += 1.0
            granted = s.complete(running, now)
            running = str(granted[0].id)
            if running == "long":
                admitted_at = now
                break
        if policy == "sept":
            assert admitted_at is None
        else:
            assert admitted_at is not None and admitted_at <= 0 + 3.0 * 10.0 + 1.0


# -- the no-starvation rule as a property ---------------------------------------------------

THREE = _model(("A", 0.5, None, None), ("B", 2.0, None, None), ("C", 7.0, None, None))
D = {"A": 0.5, "B": 2.0, "C": 7.0}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(("submit", "complete", "tick")), st.sampled_from("ABC")),
        max_size=80,
    ),
    gaps=st.lists(st.floats(0, 4), min_size=80, max_size=80),
    mpl=st.integers(1, 3),
    k=st.sampled_from((0.0, 1.0, 2.5, 10.0)),
)
def test_no_job_passes_a_due_one_except_a_due_one_with_a_larger_ratio(
    ops: list[tuple[str, str]], gaps: list[float], mpl: int, k: float
) -> None:
    """At every grant: if any queued job is due, the granted job is due and has the largest
    wait/D_r. So once due a job waits only for capacity and for jobs further behind their own
    expected times — the bound on each class's queueing slowdown."""
    box: dict[str, Scheduler] = {}
    now = [0.0]

    def check(e: Event) -> None:
        if e.kind != "grant":
            return
        s = box["s"]
        granted = s.job(e.job)
        assert granted is not None
        t = now[0]
        queued = [j for j in s.live_jobs() if j.state.value == "queued"]
        due = [j for j in queued if t >= j.arrival + k * D[j.class_name]]
        if due:
            ratio = (t - granted.arrival) / D[granted.class_name]
            assert t >= granted.arrival + k * D[granted.class_name], "passed a due job"
            assert all(ratio >= (t - j.arrival) / D[j.class_name] for j in due)

    s = box["s"] = Scheduler(THREE, "latency", Limits(short_lane=0, mpl=mpl, due_factor=k), check)
    running: list[str] = []
    for i, ((op, cls), gap) in enumerate(zip(ops, gaps, strict=False)):
        now[0] += gap
        if op == "submit":
            granted = s.submit(i, cls, now[0])
        elif op == "complete" and running:
            granted = s.complete(running.pop(0), now[0])
        else:
            granted = s.tick(now[0])
        running.extend(j.id for j in granted)  # type: ignore[misc]


# -- the simulator against queueing theory --------------------------------------------------

_MG1 = Workload("mg1", (SimClass("S", ((1, 0.2),)), SimClass("L", ((1, 1.0),))))


def _mg1_config(rho: float, due_factor: float | None) -> SimConfig:
    """One core, MPL 1, single-task jobs of fixed demands 0.2 and 1.0 in equal shares: M/G/1.
    Fixed demands leave the arrivals the only random stream, the same under every policy."""
    mean = 0.5 * 0.2 + 0.5 * 1.0
    return SimConfig(
        cores=1,
        fcr=None,
        mpl=1,
        mix=(0.5, 0.5),
        arrival_rate=rho / mean,
        due_factor=due_factor,
        completions=6_000,
        warmup=600,
    )


def test_latency_without_aging_at_mpl_1_is_an_mg1_priority_queue() -> None:
    """Non-preemptive priority, short class first: each class's mean wait is Cobham's, and
    FCFS's is Pollaczek–Khinchine's (within the 95 % interval over replications, widened by
    5 % of the reference)."""
    rho = 0.7
    lam = rho / 0.6
    cfg = _mg1_config(rho, None)
    runs = replicate(_MG1, cfg, _MG1.model(1, None), "latency", 4, seed=3)
    ref = mg1_priority_waits([lam / 2, lam / 2], [0.2, 1.0], [0.2**2, 1.0**2])
    for c in range(2):
        measured = Estimate.of([r.waits[c] for r in runs])
        assert measured.covers(ref[c], slack=0.05 * ref[c]), (c, measured, ref[c])
    fcfs = replicate(_MG1, cfg, _MG1.model(1, None), "fcfs", 4, seed=3)
    pk = mg1_priority_waits([lam], [0.6], [0.5 * 0.2**2 + 0.5 * 1.0**2])[0]
    waits = [
        sum(w * n for w, n in zip(r.waits, r.admissions, strict=True)) / sum(r.admissions)
        for r in fcfs
    ]
    assert Estimate.of(waits).covers(pk, slack=0.05 * pk), (Estimate.of(waits), pk)


def test_latency_beats_fcfs_on_an_open_two_class_queue_at_rho_0_9() -> None:
    cfg = _mg1_config(0.9, DUE_FACTOR)
    model = _MG1.model(1, None)
    latency = replicate(_MG1, cfg, model, "latency", 3, seed=8)
    fcfs = replicate(_MG1, cfg, model, "fcfs", 3, seed=8)
    for lat, first in zip(latency, fcfs, strict=True):  # the same arrivals (common streams)
        assert lat.mean_response() < 0.8 * first.mean_response()
        assert abs(lat.throughput / first.throughput - 1) < 0.02


def test_classes_within_the_band_of_their_groups_shortest_are_tied() -> None:
    """Eight trained TPC-H classes (SF 1, D_r in seconds): the short four tie, the long four
    tie — latency orders short before long and FCFS inside each, where SEPT orders all eight
    (and starves the longest at saturation)."""
    from admission.policies.base import banded_groups, overlap_groups
    from admission.policies.latency import BAND, latency_groups

    trained = _model(
        ("Q2", 0.0227, 0.0220, 0.0237),
        ("Q11", 0.0242, 0.0216, 0.0272),
        ("Q6", 0.0276, 0.0263, 0.0286),
        ("Q14", 0.0372, 0.0353, 0.0406),
        ("Q13", 0.1422, 0.1296, 0.1469),
        ("Q9", 0.1727, 0.1679, 0.1811),
        ("Q1", 0.2026, 0.1941, 0.2101),
        ("Q18", 0.2848, 0.265, 0.2994),
    )
    assert BAND == 4.0
    assert latency_groups(trained.classes) == [0, 0, 0, 0, 1, 1, 1, 1]
    bias = POLICIES["latency"].build(trained).bias
    assert bias == (-0.0227,) * 4 + (-0.1422,) * 4
    assert len(set(POLICIES["sept"].build(trained).bias)) == 6  # SEPT: Q2 ≈ Q11 ≈ Q6 tie only
    # the band is measured from the group's first value, not chained from neighbour to neighbour
    values = [1.0, 1.5, 2.25, 3.4, 5.1]  # each within 1.5× of the last
    none: list[float | None] = [None] * 5
    assert banded_groups(values, none, none, 4.0) == [0, 0, 0, 0, 1]
    # band 1 is overlap_groups
    lows: list[float | None] = [0.9, None, 2.0, 3.0, None]
    highs: list[float | None] = [1.6, None, 2.5, 3.5, None]
    assert banded_groups(values, lows, highs, 1.0) == overlap_groups(values, lows, highs)
