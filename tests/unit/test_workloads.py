"""Workload classes: the config, the matcher, the tenant scheduler (DRR, tiers, background)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission import ClassProfile, EtaModel, JobState, Limits, Scheduler
from admission.sim import SimClass, SimConfig, Workload
from admission.sim.study import Estimate, replicate
from admission.sim.theory import mg1_priority_waits
from admission.workloads import (
    IdlePredictor,
    Tier,
    WorkloadConfig,
    WorkloadError,
    parse_tag,
)
from admission.workloads import Workload as Tenant

EXAMPLE = """
[scheduler]
hold = 0.001
batch_max_wait = 10

[background]
mpl = 2
pressure_bound = 0.9

[[workload]]
name = "web"
weight = 2
match = { application_name = "web-*" }
mpl = 6

[[workload]]
name = "reports"
priority = "batch"
match = { user = "analyst*", database = "tpch" }
queue_timeout = 30

[[workload]]
name = "vacuum"
priority = "background"
"""


def test_a_config_file_loads_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text(EXAMPLE)
    cfg = WorkloadConfig.load(path)
    assert cfg.hold == 0.001 and cfg.batch_max_wait == 10 and cfg.background_mpl == 2
    assert cfg.pressure_bound == 0.9
    web = cfg.workload("web")
    assert web.weight == 2 and web.tier is Tier.INTERACTIVE and web.mpl == 6
    assert cfg.workload("reports").tier is Tier.BATCH
    assert cfg.names == ["web", "reports", "vacuum", "default"]
    assert [row["name"] for row in cfg.describe()] == cfg.names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[workload]]\nname='a'\nweight=0", "weight must be positive"),
        ("[[workload]]\nname='a'\npriority='urgent'", "priority must be one of"),
        ("[[workload]]\nname='a'\n[[workload]]\nname='a'", "must be unique"),
        ("[[workload]]\nname='a b'", "name must be"),
        ("[[workload]]\nname='a'\ncolour=1", "unknown key"),
        ("[[workload]]\nname='a'\nmatch={host='x'}", "only"),
        ("[[workload]]\nname='a'\nmpl=0", "whole number"),
        ("[[workload]]\nname='a'\nmemory_share=1.5", "memory_share"),
        ("[pools]\nx=1", "unknown section"),
        ("[scheduler]\nhold=-1", "at least 0"),
        ("[[workload]\nname=", "not valid TOML"),
    ],
)
def test_a_bad_config_is_refused_with_the_file_and_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message) as err:
        WorkloadConfig.load(path)
    assert str(path) in str(err.value)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no such workload-classes file"):
        WorkloadConfig.load(tmp_path / "nope.toml")


def test_statements_are_assigned_by_connection_then_tag() -> None:
    cfg = WorkloadConfig.from_dict(
        {
            "workload": [
                {"name": "web", "match": {"application_name": "web-*"}},
                {"name": "etl", "priority": "batch", "match": {"user": "etl"}},
                {"name": "maint", "priority": "background"},
            ]
        }
    )
    assert cfg.assign({"application_name": "web-7"}) == ("web", Tier.INTERACTIVE)
    assert cfg.assign({"user": "etl"}) == ("etl", Tier.BATCH)
    assert cfg.assign({"user": "bob"}) == ("default", Tier.INTERACTIVE)
    # a tag chooses the tenant; its priority may lower the tier, never raise it
    tagged = "select 1 /* admission: tenant=web, priority=batch */"
    assert cfg.assign({"user": "bob"}, tagged) == ("web", Tier.BATCH)
    raise_it = "/* admission: priority=interactive */ select 1"
    assert cfg.assign({"user": "etl"}, raise_it) == ("etl", Tier.BATCH)
    assert cfg.assign({}, "/* admission: tenant=nobody */ select 1") == ("default", 0)
    assert cfg.assign({}, "/* admission: priority=urgent */ select 1") == ("default", 0)
    closed = WorkloadConfig.from_dict(
        {"workload": [{"name": "web"}], "scheduler": {"allow_tags": False}}
    )
    assert closed.assign({}, tagged) == ("default", Tier.BATCH)


def test_parse_tag() -> None:
    assert parse_tag("select 1") == {}
    assert parse_tag("/* Admission: Tenant=a-1 , priority=batch */ select") == {
        "tenant": "a-1",
        "priority": "batch",
    }
    assert parse_tag("select '/* admission:' ") == {}


def test_the_cluster_window_follows_how_long_busy_periods_cluster() -> None:
    predictor = IdlePredictor()
    now = 0.0
    # long busy periods (6 statements) come in clusters of 3 among short ones (1 statement)
    for i in range(200):
        n = 6 if (i // 3) % 4 == 0 else 1
        for _ in range(n):
            predictor.arrival(now)
        now += 1.0
        predictor.idle(now)
        now += 1.0
    assert predictor.threshold == 6
    assert 1 <= predictor.cws <= 3  # clustered: a short window, aggressive soon after
    # right after a long busy period background waits into the idle period
    for _ in range(6):
        predictor.arrival(now)
    predictor.idle(now + 1)
    assert predictor.conservative
    start = predictor.start_at()
    assert start is not None and start > now + 1


# -- the scheduler with tenants ---------------------------------------------------------------


def _model(*costs: float) -> EtaModel:
    return EtaModel(
        classes=tuple(
            ClassProfile(fingerprint=f"q{i}", name=f"Q{i}", D=d, f=1) for i, d in enumerate(costs)
        )
    )


def _config(**kw: object) -> WorkloadConfig:
    workloads = kw.pop("workloads", ())
    return WorkloadConfig(workloads=tuple(workloads), **kw)  # type: ignore[arg-type]


def test_interactive_goes_before_batch_and_batch_ages_in() -> None:
    cfg = _config(
        workloads=[Tenant("web"), Tenant("etl", tier=Tier.BATCH)], batch_max_wait=5.0, hold=0
    )
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=1), workloads=cfg)
    assert [j.id for j in s.submit("w0", "q0", 0.0, tenant="web")] == ["w0"]
    s.submit("b1", "q0", 0.1, tenant="etl")
    s.submit("w1", "q0", 0.2, tenant="web")
    assert [j.id for j in s.complete("w0", 1.0)] == ["w1"]  # the later interactive first
    s.submit("w2", "q0", 1.5, tenant="web")
    assert [j.id for j in s.complete("w1", 2.0)] == ["w2"]
    s.submit("w3", "q0", 2.5, tenant="web")
    # b1 has waited 5 s at 5.1: aged into the top tier, it goes before w3
    assert s.next_deadline() == pytest.approx(5.1)
    assert [j.id for j in s.complete("w2", 6.0)] == ["b1"]
    assert s.stats.aged == 1


def test_a_tenant_at_its_mpl_leaves_the_capacity_to_others() -> None:
    cfg = _config(workloads=[Tenant("a", mpl=1), Tenant("b")], hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=3), workloads=cfg)
    granted = []
    for i in range(3):
        granted += s.submit(f"a{i}", "q0", 0.0, tenant="a")
    granted += s.submit("b0", "q0", 0.1, tenant="b")
    assert [j.id for j in granted] == ["a0", "b0"]
    assert s.running == 2 and s.queued == 2
    assert [j.id for j in s.complete("a0", 1.0)] == ["a1"]


def test_tenant_load_is_what_a_proxy_reports_by_tenant() -> None:
    """What each tenant's statements hold in service and its queued ones would take: the
    demand by tenant a proxy sharing a global budget reports (proxy.coordinator)."""
    cfg = _config(
        workloads=[Tenant("gold", weight=2.0), Tenant("bg", tier=Tier.BACKGROUND)], hold=0
    )
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=2), workloads=cfg)
    s.submit("g0", "q0", 0.0, tenant="gold", fork=2)
    s.submit("g1", "q0", 0.0, tenant="gold", fork=3)
    s.submit("g2", "q0", 0.0, tenant="gold")
    s.submit("b0", "q0", 0.0, tenant="bg")
    s.submit("d0", "q0", 0.0, tenant="nobody")  # no such workload: default's
    assert s.running == 2
    assert s.tenant_load() == {
        ("gold", False): (2.0, 3, 6, 0),
        ("bg", True): (1.0, 1, 1, 0),
        ("default", False): (1.0, 1, 1, 0),
    }
    s.complete("g0", 1.0)
    s.complete("g1", 1.0)
    s.complete("g2", 1.0)
    assert ("gold", False) not in s.tenant_load()
    plain = Scheduler(_model(1.0), "fcfs", Limits(mpl=1))
    plain.submit("a", "q0", 0.0)
    plain.submit("b", "q0", 0.0)
    assert plain.tenant_load() == {("default", False): (1.0, 2, 2, 0)}


def test_tenant_weights_set_from_outside_steer_the_drr_and_can_be_restored() -> None:
    """A coordinator's split gives gold 1 unit here and silver 3: the DRR weighs them so
    (silver first, three to gold's one), whatever the configured weights say; restored, the
    configured 2:1 again. tenant_load reports the configured weight either way."""
    cfg = _config(workloads=[Tenant("gold", weight=2.0), Tenant("silver", weight=1.0)], hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=1), workloads=cfg)
    s.submit("x", "q0", 0.0, tenant="gold")  # in service: the rest queue
    for i in range(30):
        s.submit(f"g{i}", "q0", 0.0, tenant="gold")
        s.submit(f"s{i}", "q0", 0.0, tenant="silver")
    s.set_tenant_weights({"gold": 1.0, "silver": 3.0})
    order, running, now = [], "x", 0.0
    for _ in range(8):
        now += 1.0
        (nxt,) = s.complete(running, now)
        running = nxt.id
        order.append(running[0])
    assert order.count("s") == 6 and order.count("g") == 2, order
    assert s.tenant_load()[("gold", False)][0] == 2.0
    s.set_tenant_weights(None)
    order = []
    for _ in range(13):
        now += 1.0
        (nxt,) = s.complete(running, now)
        running = nxt.id
        order.append(running[0])
    # the round under way ends on the weights it began with; then 2:1
    assert order[4:].count("g") == 6 and order[4:].count("s") == 3, order


def test_tenant_weights_set_from_outside_survive_a_reload_and_reach_new_tenants() -> None:
    """A reload of the workload file (POST /workloads/reload) gives tenants their new
    configured weights, but a weight a coordinator set stays in force until the coordinator
    sets another — before, the reload put the configured weights back until its next
    heartbeat. A tenant first seen after the weights were set takes the one set for it."""
    cfg = _config(workloads=[Tenant("gold", weight=2.0), Tenant("silver", weight=1.0)], hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=1), workloads=cfg)
    s.submit("g0", "q0", 0.0, tenant="gold")
    s.set_tenant_weights({"gold": 1.0, "bronze": 4.0, "silver": float("nan")})

    def weights() -> dict[str, float]:
        return {t["tenant"]: t["drr_weight"] for t in s.tenant_stats()}

    assert weights() == {"default": 1.0, "gold": 1.0}
    reloaded = _config(
        workloads=[
            Tenant("gold", weight=5.0),
            Tenant("silver", weight=3.0),
            Tenant("bronze", weight=1.0),
        ],
        hold=0,
    )
    s.set_workloads(reloaded, 1.0)
    s.submit("s0", "q0", 1.0, tenant="silver")  # a weight not valid: its configured one
    s.submit("b0", "q0", 1.0, tenant="bronze")
    assert weights() == {"default": 1.0, "gold": 1.0, "silver": 3.0, "bronze": 4.0}
    assert s.tenant_load()[("gold", False)][0] == 5.0  # (the configured one, reported)
    s.set_tenant_weights(None)
    assert weights() == {"default": 1.0, "gold": 5.0, "silver": 3.0, "bronze": 1.0}


def test_background_runs_only_when_the_foreground_is_idle() -> None:
    cfg = _config(workloads=[Tenant("web"), Tenant("bg", tier=Tier.BACKGROUND)], hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=4), workloads=cfg)
    s.submit("w0", "q0", 0.0, tenant="web")
    assert s.submit("g0", "q0", 0.1, tenant="bg") == []  # a foreground statement runs
    s.submit("g1", "q0", 0.2, tenant="bg")
    granted = s.complete("w0", 1.0)
    assert [j.id for j in granted] == ["g0"]  # idle (aggressive: no wait yet), one at a time
    assert s.complete("g0", 2.0)[0].id == "g1"
    s.submit("w1", "q0", 2.5, tenant="web")
    assert s.running == 2  # foreground is admitted beside it (no preemption)
    s.submit("g2", "q0", 2.6, tenant="bg")
    assert s.complete("g1", 3.0) == []  # foreground in service: background waits
    s.set_pressure(0.99, 3.5)  # (no bound configured: the signal is not looked at)
    assert [j.id for j in s.complete("w1", 4.0)] == ["g2"]
    assert s.running == 1


def test_background_waits_while_the_feedback_signal_is_high() -> None:
    cfg = _config(workloads=[Tenant("bg", tier=Tier.BACKGROUND)], pressure_bound=0.8, hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=4), workloads=cfg)
    s.set_pressure(0.95, 0.0)
    assert s.submit("g0", "q0", 0.1, tenant="bg") == []
    assert [j.id for j in s.set_pressure(0.5, 1.0)] == ["g0"]


def test_the_hold_rule_keeps_a_tenants_turn_briefly() -> None:
    cfg = _config(workloads=[Tenant("a", weight=4), Tenant("b")], hold=0.01)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=2), workloads=cfg)
    s.submit("a0", "q0", 0.0, tenant="a")
    s.submit("a1", "q0", 0.0, tenant="a")
    s.submit("b0", "q0", 0.0, tenant="b")
    # a1 completes: the round gives a 4 statements' worth, b 1; a has the turn and tokens,
    # a0 in service and nothing queued: held
    assert s.complete("a1", 0.1) == [] and s.held_for == 1
    assert s.next_deadline() == pytest.approx(0.11)
    # a's next statement comes within the hold: it keeps the turn
    assert [j.id for j in s.submit("a2", "q0", 0.105, tenant="a")] == ["a2"]
    assert s.complete("a2", 0.2) == []
    expiry = s.next_deadline()
    assert expiry == pytest.approx(0.21)
    assert [j.id for j in s.tick(expiry)] == ["b0"]  # the hold expired: b's turn


def _drr_sim(weights: tuple[float, float], demands: tuple[float, float], seed: int) -> list[float]:
    """Two tenants, each saturating (closed, no think time), one class each: service shares."""
    work = Workload("two", (SimClass("A", ((1, demands[0]),)), SimClass("B", ((1, demands[1]),))))
    cfg = SimConfig(
        cores=2,
        fcr=None,
        mpl=2,
        jobs=16,
        mix=(0.5, 0.5),
        think=0.0,
        routing="least-loaded",
        service="exponential",
        completions=6_000,
        warmup=500,
        workloads=_config(
            workloads=[Tenant("a", weight=weights[0]), Tenant("b", weight=weights[1])], hold=0
        ),
        tenants=("a", "b"),
    )
    # the model knows the class demands only roughly (both 1.0): the completion charges fix it
    (run,) = replicate(work, cfg, work.model(1, None), "fcfs", 1, seed=seed)
    service = {row["tenant"]: row["service_seconds"] for row in run.tenants}
    total = service["a"] + service["b"]
    return [service["a"] / total, service["b"] / total]


@pytest.mark.parametrize("demands", [(1.0, 1.0), (0.2, 3.0), (3.0, 0.2)])
def test_drr_shares_service_by_weight_whatever_the_statement_lengths(
    demands: tuple[float, float],
) -> None:
    shares = _drr_sim((2.0, 1.0), demands, seed=4)
    fairness = abs(shares[0] - 2 / 3) + abs(shares[1] - 1 / 3)
    assert fairness <= 0.03, (demands, shares)


def test_strict_priority_at_mpl_1_is_an_mg1_priority_queue() -> None:
    """Interactive (short) and batch (long) tenants, one core, MPL 1, no aging: Cobham's
    non-preemptive priority waits, within the interval over replications (+5 %)."""
    work = Workload("pri", (SimClass("I", ((1, 0.2),)), SimClass("B", ((1, 1.0),))))
    rho = 0.7
    lam = rho / 0.6
    cfg = SimConfig(
        cores=1,
        fcr=None,
        mpl=1,
        mix=(0.5, 0.5),
        arrival_rate=lam,
        service="exponential",
        due_factor=None,
        completions=8_000,
        warmup=800,
        workloads=_config(
            workloads=[Tenant("i"), Tenant("b", tier=Tier.BATCH)], batch_max_wait=None, hold=0.05
        ),
        tenants=("i", "b"),
    )
    runs = replicate(work, cfg, work.model(1, None), "fcfs", 4, seed=5)
    ref = mg1_priority_waits([lam / 2, lam / 2], [0.2, 1.0], [2 * 0.2**2, 2 * 1.0**2])
    for c in range(2):
        measured = Estimate.of([r.waits[c] for r in runs])
        assert measured.covers(ref[c], slack=0.05 * ref[c]), (c, measured, ref[c])


def test_a_tenant_arriving_late_gets_its_turn_within_a_round() -> None:
    cfg = _config(workloads=[Tenant("a"), Tenant("b"), Tenant("c")], hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=1), workloads=cfg)
    s.submit("a0", "q0", 0.0, tenant="a")
    for i in range(1, 20):
        s.submit(f"a{i}", "q0", 0.0, tenant="a")
        s.submit(f"b{i}", "q0", 0.0, tenant="b")
    order = []
    running = "a0"
    now = 0.0
    for step in range(12):
        now += 1.0
        if step == 4:
            s.submit("c0", "q0", now - 0.5, tenant="c")
            s.submit("c1", "q0", now - 0.5, tenant="c")
        (nxt,) = s.complete(running, now)
        running = str(nxt.id)
        order.append(running[0])
    first_c = order.index("c")
    assert first_c <= 4 + 3, order  # within one round of three tenants
    tail = order[first_c : first_c + 6]
    assert tail.count("c") == 2 and tail.count("a") >= 1 and tail.count("b") >= 1, order


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["submit", "complete", "cancel", "tick", "pressure"]),
            st.integers(0, 3),
            st.integers(0, 2),
        ),
        max_size=80,
    ),
    timeout=st.sampled_from([None, 0.5]),
)
def test_capacity_always_comes_back_to_every_tenant(
    ops: list[tuple[str, int, int]], timeout: float | None
) -> None:
    cfg = _config(
        workloads=[
            Tenant("a", weight=2, mpl=2),
            Tenant("b", tier=Tier.BATCH, threads=3, queue_timeout=timeout),
            Tenant("g", tier=Tier.BACKGROUND),
        ],
        hold=0.05,
        batch_max_wait=1.0,
        pressure_bound=0.5,
    )
    s = Scheduler(_model(0.1, 1.0), "min-q", Limits(mpl=3, threads=6, memory=None), workloads=cfg)
    tenants = ["a", "b", "g", "nobody"]
    now, seq = 0.0, 0
    live: list[str] = []
    for op, who, extra in ops:
        now += 0.1 * (extra + 1)
        if op == "submit":
            seq += 1
            s.submit(f"j{seq}", f"q{extra % 2}", now, tenant=tenants[who], fork=extra + 1)
            live.append(f"j{seq}")
        elif op == "complete" and live:
            s.complete(live.pop(who % len(live)), now)
        elif op == "cancel" and live:
            s.cancel(live[who % len(live)], now)
        elif op == "pressure":
            s.set_pressure(0.3 * extra, now)
        else:
            s.tick(now)
        s.take_timed_out()
        running = [j for j in s.live_jobs() if j.state is JobState.RUNNING]
        assert s.running == len(running)
        assert s.running - s._bg_running <= 3 and s._bg_running <= 1  # (background: beside)
        assert s.threads_in_use == sum(j.held for j in running) <= 6
        by_tenant = {t["tenant"]: t for t in s.tenant_stats()}
        assert by_tenant.get("a", {"running": 0})["running"] <= 2
        assert by_tenant.get("b", {"threads": 0})["threads"] <= 3
        assert sum(t["queued"] for t in by_tenant.values()) == s.queued
    # everything leaves: every tenant's holdings come back to zero, the foreground is idle
    s.set_pressure(0.0, now)
    for _ in range(200):
        now += 1.0
        for job in [j for j in s.live_jobs() if j.state is JobState.RUNNING]:
            s.complete(job.id, now)
        s.tick(now)
        s.take_timed_out()
        if not s.live_jobs():
            break
    assert not s.live_jobs()
    assert s.running == s.queued == s.threads_in_use == 0
    assert all(t["running"] == t["threads"] == t["queued"] == 0 for t in s.tenant_stats())
    assert s._fg == 0 and s._bg_running == 0


def _forked(*forks: int) -> EtaModel:
    return EtaModel(
        classes=tuple(
            ClassProfile(fingerprint=f"q{i}", name=f"Q{i}", D=1.0, f=f) for i, f in enumerate(forks)
        )
    )


@pytest.mark.parametrize("backfill", [False, True])
def test_a_tenant_at_its_own_thread_limit_does_not_block_another(backfill: bool) -> None:
    cfg = _config(workloads=[Tenant("a", threads=4), Tenant("b")], hold=0)
    limits = Limits(mpl=8, threads=16, backfill=backfill)
    s = Scheduler(_forked(3, 1), "fcfs", limits, workloads=cfg)
    assert [j.id for j in s.submit("a0", "q0", 0.0, tenant="a")] == ["a0"]  # 3 of a's 4
    assert s.submit("a1", "q0", 0.1, tenant="a") == []  # 3 more do not fit a's 1 left
    assert [j.id for j in s.submit("b0", "q1", 0.2, tenant="b")] == ["b0"]
    assert [j.id for j in s.complete("a0", 1.0)] == ["a1"]


def test_backfill_looks_past_a_tenant_whose_heads_do_not_fit() -> None:
    cfg = _config(workloads=[Tenant("a"), Tenant("b")], hold=0)
    s = Scheduler(_forked(4, 1), "fcfs", Limits(mpl=8, threads=5, backfill=True), workloads=cfg)
    s.submit("a0", "q0", 0.0, tenant="a")  # 4 of 5
    assert s.submit("a1", "q0", 0.1, tenant="a") == []
    assert [j.id for j in s.submit("b0", "q1", 0.2, tenant="b")] == ["b0"]


def test_aging_acts_at_the_deadline_it_names() -> None:
    cfg = _config(
        workloads=[Tenant("web"), Tenant("etl", tier=Tier.BATCH)], hold=0, batch_max_wait=1.0
    )
    s = Scheduler(_forked(4, 1), "fcfs", Limits(mpl=4, threads=6), workloads=cfg)
    s.submit("w0", "q0", 0.0, tenant="web")
    s.submit("w1", "q0", 0.1, tenant="web")  # does not fit: the interactive head blocks
    arrival = 15.30999999999999  # (arrival + 1.0 − arrival is not 1.0 in floating point)
    s.tick(arrival)
    s.submit("e0", "q1", arrival, tenant="etl")
    deadline = s.next_deadline()
    assert deadline is not None
    assert [j.id for j in s.tick(deadline)] == ["e0"]


def test_drr_never_ends_a_decision_with_a_lane_able_to_go_and_no_tokens() -> None:
    cfg = _config(workloads=[Tenant(n, weight=0.5) for n in "abx"], hold=0)
    s = Scheduler(_model(0.7), "fcfs", Limits(mpl=1), workloads=cfg)
    for name, t in (("b", 0.0), ("x", 0.7)):
        s.submit(f"{name}0", "q0", t, tenant=name)
        s.complete(f"{name}0", t + 0.7)
    s.submit("a0", "q0", 1.4, tenant="a")
    s.submit("a1", "q0", 1.5, tenant="a")
    lane = s._lane_by_key["a", 0]
    lane.deficit = -(24 * (s._quantum * 0.5))  # 24 quanta behind: the sum rounds to 0.0
    for other in s._rings[0]:
        if other is not lane:
            other.deficit = 0.0
    s._cursor[0] = 2
    assert [j.id for j in s.complete("a0", 2.1)] == ["a1"]


def test_no_hold_for_a_tenant_at_its_mpl() -> None:
    cfg = _config(workloads=[Tenant("a", weight=4, mpl=1), Tenant("b")], hold=0.01)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=2), workloads=cfg)
    s.submit("a0", "q0", 0.0, tenant="a")
    s.submit("b0", "q0", 0.0, tenant="b")
    s.submit("b1", "q0", 0.0, tenant="b")
    assert [j.id for j in s.complete("b0", 0.1)] == ["b1"] and s.held_for == 0


def test_workload_classes_can_be_switched_on_with_statements_live() -> None:
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=1))
    s.submit("j0", "q0", 0.0)
    s.submit("j1", "q0", 0.1)
    cfg = _config(workloads=[Tenant("web")], hold=0)
    assert s.set_workloads(cfg, 0.2) == []
    assert s._fg == 2 and s.idle is not None and s.idle.busy
    s.submit("w0", "q0", 0.3, tenant="web")
    assert [j.id for j in s.complete("j0", 1.0)] in (["j1"], ["w0"])
    for job in list(s.live_jobs()):
        s.complete(job.id, 5.0)
    assert s._fg == 0 and not s.idle.busy
    default = {r["tenant"]: r for r in s.tenant_stats()}["default"]
    assert default["service_seconds"] == pytest.approx(
        1.0 + (5.0 - 1.0) * (default["completed"] - 1)
    )


def test_a_zero_weight_is_refused_however_it_is_made() -> None:
    with pytest.raises(WorkloadError, match="weight must be positive"):
        Tenant("a", weight=0)


def test_background_never_holds_a_foreground_slot() -> None:
    cfg = _config(workloads=[Tenant("web"), Tenant("bg", tier=Tier.BACKGROUND)], hold=0)
    s = Scheduler(_model(1.0), "fcfs", Limits(mpl=1), workloads=cfg)
    assert [j.id for j in s.submit("g0", "q0", 0.0, tenant="bg")] == ["g0"]  # idle: at once
    assert [j.id for j in s.submit("w0", "q0", 0.1, tenant="web")] == ["w0"]  # beside it
    assert s.submit("w1", "q0", 0.2, tenant="web") == []  # the MPL is the foreground's
    assert s.running == 2
    assert [j.id for j in s.complete("w0", 1.0)] == ["w1"]
