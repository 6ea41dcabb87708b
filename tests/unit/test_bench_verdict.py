"""The bench's verdict: the best baseline, and the recommended policy's change of the mean
against it paired by repetition — computed here by hand from runs whose response times are
known."""

from __future__ import annotations

import itertools

import pytest

from admission.model import EtaModel
from lab.bench import (
    BenchConfig,
    BenchResult,
    Run,
    _summary,
    paired_change,
    repetition_means,
    run_order,
    verdict,
)
from workloads.tpch.load import LoadResult, Statement
from workloads.tpch.mixes import mix_by_name


def _run(policy: str, rep: int, response: float, count: int = 50) -> Run:
    """A run of ``count`` statements, one every 0.1 s from t = 1 s, each taking ``response``."""
    load = LoadResult(started=0.0, ended=20.0)
    for i in range(count):
        start = 1.0 + 0.1 * i
        load.statements.append(Statement(6, start, start + response, i))
    return Run(policy, rep, load, 0, 0)


def _result(means: dict[str, list[float]], arrivals: str = "poisson") -> BenchResult:
    config = BenchConfig(
        mix=mix_by_name("6"),
        duration=10.0,
        warmup=0.5,
        policies=tuple(means),
        repetitions=len(next(iter(means.values()))),
        arrivals=arrivals,
        rate=1.0 if arrivals != "closed" else None,
    )
    result = BenchResult(config, EtaModel())
    for policy, values in means.items():
        for rep, value in enumerate(values):
            result.runs.append(_run(policy, rep, value))
    for policy in means:
        runs = [r for r in result.runs if r.policy == policy]
        result.summaries[policy] = _summary(policy, runs, {"Q6": 0.1}, config)
    return result


def test_paired_change_is_taken_repetition_by_repetition() -> None:
    # repetition 2 is slow for everyone (drift): pairing removes it
    result = _result({"none": [1.0, 2.0, 1.0], "latency@2": [0.5, 1.0, 0.5]})
    change = paired_change(result, "latency@2", "none")
    assert change.mean == pytest.approx(0.5) and change.ci == pytest.approx(0.0, abs=1e-12)
    assert repetition_means(result, "none") == pytest.approx([1.0, 2.0, 1.0])
    assert repetition_means(result, "latency@2") == pytest.approx([0.5, 1.0, 0.5])


def test_the_paired_change_is_symmetric_and_unbiased_for_one_setting_run_twice() -> None:
    """Two runs of one setting, ×2 in one repetition and ×½ in the other: no change either way
    round (the mean of 1 − R/R_base would read −25 % both ways); a steady ×½ is a 50 % cut
    with no spread; the interval is the log interval's wider side, so it covers 0 exactly when
    the log interval does."""
    import math

    result = _result({"fcfs@1": [1.0, 1.0], "fcfs@2": [2.0, 0.5], "fcfs@3": [0.5, 0.5]})
    for x, y in (("fcfs@1", "fcfs@2"), ("fcfs@2", "fcfs@1")):
        change = paired_change(result, x, y)
        assert change.mean == pytest.approx(0.0, abs=1e-12)
        assert change.ci is not None and change.covers(0.0)
    assert paired_change(result, "fcfs@3", "fcfs@1").mean == pytest.approx(0.5)
    wide = _result({"fcfs@1": [1.0, 1.0, 1.0], "fcfs@2": [0.5, 0.7, 0.55]})
    change = paired_change(wide, "fcfs@2", "fcfs@1")
    logs = [math.log(r) for r in (0.5, 0.7, 0.55)]
    m = sum(logs) / 3
    assert change.mean == pytest.approx(1 - math.exp(m))
    assert change.mean - change.ci < 1 - math.exp(m + 0.0) < change.mean + change.ci
    assert not change.covers(0.0)  # ×0.5–0.7 every time: a cut, significant


def test_verdict_names_the_best_baseline_and_the_recommended_policys_change() -> None:
    result = _result(
        {
            "none": [1.0, 1.2, 1.1],
            "fcfs@2": [0.8, 1.0, 0.9],
            "sept@2": [0.7, 0.9, 0.85],
            "latency@2": [0.4, 0.5, 0.45],
        }
    )
    lines = verdict(result)
    assert lines[0].startswith("Best baseline: fcfs@2")
    (rec,) = [line for line in lines if line.startswith("latency@2 (recommended)")]
    assert "mean R 50% ± 0% lower than fcfs@2 (significant at 95 %" in rec
    (thesis,) = [line for line in lines if "best thesis policy" in line]
    assert thesis.startswith("sept@2") and "throughput +0.0%" in thesis
    assert not any("N = X·R" in line for line in lines)


def test_an_again_control_is_reported_as_the_noise_of_one_setting_not_as_a_contender() -> None:
    """fcfs@2+again runs fcfs@2 a second time: it is never the best baseline (though its runs
    were the fastest here) nor a candidate, and the verdict says how far it differed from the
    first run of the same setting: +25 %, +25 %, −10 % → +12.0 % (their geometric mean)."""
    result = _result(
        {
            "none": [1.0, 1.2, 1.1],
            "fcfs@2": [0.8, 0.8, 1.0],
            "fcfs@2+again": [1.0, 1.0, 0.9],
            "latency@2": [0.4, 0.5, 0.45],
            "latency@2+again": [0.3, 0.3, 0.3],
        }
    )
    lines = verdict(result)
    assert lines[0].startswith("Best baseline: fcfs@2 ")
    assert not any(line.startswith("latency@2+again") for line in lines)
    (aa,) = [line for line in lines if "fcfs@2 run twice" in line]
    assert "by +12.0% ± " in aa and "per repetition +25.0%, +25.0%, -10.0%" in aa
    assert any("latency@2 run twice" in line for line in lines)


def test_an_again_control_needs_its_original_and_takes_no_other_meaning() -> None:
    from lab.bench import control, original, parse_policy

    assert control("fcfs@2+mem+again") and original("fcfs@2+mem+again") == "fcfs@2+mem"
    assert parse_policy("none+again") == ("none", None)
    assert not control("latency@2") and original("latency@2") == "latency@2"
    with pytest.raises(ValueError, match="not among the policies"):
        _result({"none": [1.0], "fcfs@2+again": [1.0]})


def test_a_release_setting_runs_with_release_after_and_is_no_baseline() -> None:
    """fcfs@2+release is FCFS at MPL 2 with a statement's slot given to the queue after
    release_after (1 s unless the bench sets another): not what a user has without the
    product, so never the best baseline, though it was the fastest here."""
    from lab.bench import RELEASE_AFTER, _limits, parse_policy, releases

    assert releases("latency@2+release+learn") and not releases("latency@2")
    assert parse_policy("fcfs@2+release") == ("fcfs", 2)
    with pytest.raises(ValueError, match="none is no admission control"):
        parse_policy("none+release")
    result = _result(
        {
            "none": [1.0, 1.2, 1.1],
            "fcfs@2": [0.8, 1.0, 0.9],
            "fcfs@2+release": [0.3, 0.3, 0.3],
            "latency@2": [0.4, 0.5, 0.45],
        }
    )
    assert verdict(result)[0].startswith("Best baseline: fcfs@2 ")
    config = result.config
    assert _limits(config, "fcfs@2+release").release_after == RELEASE_AFTER
    assert _limits(config, "fcfs@2").release_after is None
    assert _limits(config, "none").release_after is None
    two = BenchConfig(
        mix=mix_by_name("6"), policies=("fcfs@2", "fcfs@2+release"), release_after=2.5
    )
    assert _limits(two, "fcfs@2+release").release_after == 2.5
    assert _limits(two, "fcfs@2").release_after is None  # (a hard cap unless +release)
    with pytest.raises(ValueError, match=r"\+release is not supported"):
        BenchConfig(mix=mix_by_name("6"), policies=("fcfs@2+release",), pool_size=2)


def test_verdict_in_a_closed_loop_says_the_mean_cannot_move() -> None:
    result = _result({"none": [1.0, 1.1], "latency": [1.05, 1.0]}, arrivals="closed")
    lines = verdict(result)
    assert "(not significant at 95 %" in lines[1] and "N = X·R" in lines[-1]


def test_pool_counts_leave_out_the_capacity_run() -> None:
    """--load-basis measured with --pool-size: what the pools did before the runs (the capacity
    run's handovers, waits, opened connections) is taken out of the counts; the pool's state at
    the end and a pool first seen in the runs stay as they are."""
    import dataclasses

    from lab.bench import POOL_COUNTERS, pool_counts_since
    from proxy.pool import PoolStats

    assert set(POOL_COUNTERS) == {f.name for f in dataclasses.fields(PoolStats)}  # no drift

    def pool(database: str, n: float, **state: int) -> dict[str, object]:
        return {"database": database, "user": "u", **dict.fromkeys(POOL_COUNTERS, n), **state}

    before = [pool("a", 3, sv_idle=2)]
    now = [pool("a", 10, sv_idle=1, cl_waiting=4), pool("b", 5, sv_idle=1)]
    got = pool_counts_since(now, before)
    assert got[0] == pool("a", 7, sv_idle=1, cl_waiting=4)
    assert got[1] == now[1]
    assert pool_counts_since(now, []) == now


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_the_run_order_is_balanced_over_positions_and_predecessors(k: int) -> None:
    """Over a whole Williams design (k repetitions for an even k, 2k for an odd one) each
    policy runs equally often in each position and right after each other policy equally
    often; over the first k − 1 repetitions no policy runs after the same one twice — whatever
    the seed."""
    policies = [f"p{i}" for i in range(k)]
    design = k if k % 2 == 0 else 2 * k
    for seed in (0, 1, 7):
        orders = [run_order(policies, seed, rep) for rep in range(2 * design)]
        assert all(sorted(o) == policies for o in orders)
        assert orders[design:] == orders[:design]  # the design repeats
        whole = orders[:design]
        for position in range(k):
            counts = [sum(o[position] == p for o in whole) for p in policies]
            assert len(set(counts)) == 1, (seed, position, counts)
        before: dict[tuple[str, str], int] = {}
        for o in whole:
            for a, b in itertools.pairwise(o):
                before[a, b] = before.get((a, b), 0) + 1
        assert len(before) == k * (k - 1)
        assert len(set(before.values())) <= 1
        for p in policies:
            predecessors = [o[o.index(p) - 1] for o in orders[: k - 1] if o.index(p) > 0]
            assert len(predecessors) == len(set(predecessors)), (seed, p, predecessors)


def test_three_repetitions_of_five_settings_vary_the_run_before_each() -> None:
    """The case that found the rotation's flaw: five settings, three repetitions — no setting
    ran after the same one in all three (with a rotation one always followed "none")."""
    settings = ["none", "fcfs@2", "fcfs@4", "sept@2", "latency@2"]
    for seed in range(20):
        orders = [run_order(settings, seed, rep) for rep in range(3)]
        for s in settings:
            predecessors = [o[o.index(s) - 1] if o.index(s) else None for o in orders]
            assert len(set(predecessors)) == 3, (seed, s, predecessors)


def test_a_due_setting_runs_the_latency_policy_with_its_own_due_factor() -> None:
    """latency@2+due=10 and latency@2 are compared side by side in one bench: each run keeps
    its own aging (0 turns it off); other policies have no due factor to set."""
    from lab.bench import _limits, due_factor, learns, parse_policy

    assert parse_policy("latency@2+due=10") == ("latency", 2)
    assert due_factor("latency@2+due=10") == 10.0 and due_factor("latency@2") is None
    assert due_factor("latency@2+learn+due=2.5") == 2.5 and learns("latency@2+due=2.5+learn")
    result = _result({"none": [1.0], "latency@2": [0.5], "latency@2+due=10": [0.6]})
    config = result.config
    assert _limits(config, "latency@2+due=10").due_factor == 10.0
    assert _limits(config, "latency@2+due=0").due_factor is None
    assert _limits(config, "latency@2").due_factor == config.limits.due_factor
    for bad in ("fcfs@2+due=10", "none+due=5", "latency@2+due=x", "latency@2+due="):
        with pytest.raises(ValueError):
            parse_policy(bad)
