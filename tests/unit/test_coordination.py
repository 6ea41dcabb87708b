"""The lease arithmetic of several proxies sharing one budget (``admission.coordination``)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from admission.coordination import (
    Claim,
    fair_shares,
    grow,
    release,
    shares_with_slack,
    slack,
    tenant_shares,
    tenant_split,
    weighted_fill,
)
from proxy.coordinator import _claims_of, drr_weights


def test_fair_shares_water_fill_in_whole_units() -> None:
    assert fair_shares(4, {"a": 8, "b": 8}) == {"a": 2, "b": 2}
    assert fair_shares(4, {"a": 1, "b": 8, "c": 8}) == {"a": 1, "b": 2, "c": 1}
    assert fair_shares(10, {"a": 1, "b": 2, "c": 30}) == {"a": 1, "b": 2, "c": 7}
    assert fair_shares(4, {"a": 0, "b": 0}) == {"a": 0, "b": 0}
    assert fair_shares(0, {"a": 3}) == {"a": 0}
    assert fair_shares(5, {}) == {}
    # one unit short for three equal proxies: who gets the extra rotates with the epoch
    winners = {
        next(n for n, s in fair_shares(4, {"a": 8, "b": 8, "c": 8}, e).items() if s == 2)
        for e in range(3)
    }
    assert winners == {"a", "b", "c"}


@given(
    st.integers(0, 40),
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 30), max_size=6),
    st.integers(0, 10),
)
def test_fair_shares_spend_the_budget_and_are_even(
    budget: int, demands: dict[str, int], epoch: int
) -> None:
    share = fair_shares(budget, demands, epoch)
    assert all(0 <= share[n] <= demands[n] for n in demands)
    assert sum(share.values()) == min(budget, sum(demands.values()))
    unmet = [share[n] for n in demands if share[n] < demands[n]]
    if unmet:  # everyone not satisfied is within one unit of the others, and of the level
        assert max(unmet) - min(unmet) <= 1
        assert all(share[n] <= max(unmet) + 1 for n in demands)


def test_weighted_fill_shares_by_weight_in_whole_units() -> None:
    assert weighted_fill(6, {"g": 8, "s": 8}, {"g": 2, "s": 1}) == {"g": 4, "s": 2}
    assert weighted_fill(4, {"g": 8, "s": 8}, {"g": 2, "s": 1}) == {"g": 3, "s": 1}
    # a met demand leaves its units to the others, by weight
    assert weighted_fill(9, {"a": 1, "b": 20, "c": 20}, {"a": 4, "b": 2, "c": 1}) == {
        "a": 1,
        "b": 5,
        "c": 3,
    }
    assert weighted_fill(50, {"g": 8, "s": 8}, {"g": 2, "s": 1}) == {"g": 8, "s": 8}
    assert weighted_fill(0, {"g": 8, "s": 8}, {"g": 2, "s": 1}) == {"g": 0, "s": 0}


_WEIGHTS = st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, 10.0])


@given(
    st.integers(0, 40),
    st.dictionaries(st.sampled_from("abcdef"), st.tuples(st.integers(0, 30), _WEIGHTS)),
    st.integers(0, 10),
)
def test_weighted_fill_spends_the_budget_by_weight(
    budget: int, tenants: dict[str, tuple[int, float]], epoch: int
) -> None:
    demands = {n: d for n, (d, _w) in tenants.items()}
    weights = {n: w for n, (_d, w) in tenants.items()}
    share = weighted_fill(budget, demands, weights, epoch)
    assert all(0 <= share[n] <= demands[n] for n in demands)
    assert sum(share.values()) == min(budget, sum(demands.values()))
    # no tenant is ahead of one left wanting by a unit or more per weight of each
    for a in demands:
        if share[a] < demands[a]:
            for b in demands:
                assert share[b] / weights[b] < (share[a] + 1) / weights[a] + 1 / weights[b]
    if len({weights[n] for n in demands if demands[n] > 0}) <= 1:
        assert share == fair_shares(budget, demands, epoch)


@settings(max_examples=300)
@given(
    st.integers(0, 300),
    st.dictionaries(
        st.sampled_from("abcdef"),
        st.tuples(st.integers(0, 40), st.floats(1e-6, 1e12)),
        min_size=1,
    ),
    st.integers(0, 10),
)
def test_weighted_fill_holds_for_weights_far_apart(
    budget: int, tenants: dict[str, tuple[int, float]], epoch: int
) -> None:
    """Weights many orders of magnitude apart (a sum of floats taken apart drifts to zero or
    below): it still spends exactly the budget or every demand, and ends."""
    demands = {n: d for n, (d, _w) in tenants.items()}
    share = weighted_fill(budget, demands, {n: w for n, (_d, w) in tenants.items()}, epoch)
    assert all(0 <= share[n] <= demands[n] for n in demands)
    assert sum(share.values()) == min(budget, sum(demands.values()))


def test_the_split_is_by_tenant_and_proxy() -> None:
    both = {"P1": {"gold": Claim(20, 2.0), "silver": Claim(20, 1.0)}, "P2": {"silver": Claim(20)}}
    assert tenant_split(12, both) == {"P1": {"gold": 8, "silver": 2}, "P2": {"silver": 2}}
    assert tenant_split(4, {"P1": 3, "P2": 5}) == {"P1": {"default": 2}, "P2": {"default": 2}}


def test_drr_weights_follow_the_split_at_the_configured_scale() -> None:
    """A proxy spends its units as the split counted them: DRR weights in the units'
    proportions, summing to the configured weights (a quantum stays a few statements
    however large the budget), a tenant given nothing a twentieth of the least."""
    claims = {"gold": Claim(90, 2.0), "silver": Claim(90, 1.0)}
    w = drr_weights({"gold": 67, "silver": 33}, claims)
    assert w["gold"] / w["silver"] == 67 / 33 and sum(w.values()) == 3.0
    w = drr_weights({"gold": 6, "silver": 0}, claims)
    assert w["gold"] == 3.0 and w["silver"] == 0.05 * 3.0
    assert drr_weights({"gold": 0, "silver": 0}, claims) == {}
    # a tenant with foreground and background work: its foreground units count
    both = {"gold": Claim(4, 2.0), "gold/background": Claim(4, 2.0, background=True)}
    assert drr_weights({"gold": 3, "gold/background": 1}, both) == {"gold": 2.0}


def test_another_proxys_row_is_read_whatever_it_holds() -> None:
    assert _claims_of(5, {}) == 5 and _claims_of(5, None) == 5
    assert _claims_of(5, {"gold": [3, 2, False], "bg": [2, 1.5, True]}) == {
        "gold": Claim(3, 2.0, False),
        "bg": Claim(2, 1.5, True),
    }
    # a weight out of range is clamped; a flag that is not JSON's true is not background
    assert _claims_of(1, {"x": [1, 1e300, "false"]}) == {"x": Claim(1, 1e6, False)}
    # rows in a shape this version does not write count by their total
    for odd in ({"x": {"demand": 3}}, {"x": [1]}, {"x": ["a", 1, False]}, {"x": 3}):
        assert _claims_of(4, odd) == 4


def test_tenant_shares_weigh_tenants_not_hosts() -> None:
    gold, silver = Claim(8, 2.0), Claim(8, 1.0)
    assert tenant_shares(6, {"A": {"gold": gold}, "B": {"silver": silver}}) == {"A": 4, "B": 2}
    # a tenant on three hosts gets its weight's part once, split among them
    spread = {"A": {"gold": gold}, "B": {"silver": silver}, "C": {"silver": silver}}
    assert tenant_shares(6, spread) == {"A": 4, "B": 1, "C": 1}
    # background only from what the foreground leaves
    bg = {"A": {"gold": Claim(3, 2.0)}, "B": {"maint": Claim(8, 5.0, background=True)}}
    assert tenant_shares(6, bg) == {"A": 3, "B": 3}
    assert tenant_shares(3, bg) == {"A": 3, "B": 0}
    # the largest weight given to a tenant counts
    two = {"A": {"gold": Claim(8, 1.0)}, "B": {"gold": Claim(8, 3.0), "tin": Claim(8, 1.0)}}
    assert tenant_shares(8, two) == {"A": 3, "B": 5}


_CLAIMS = st.dictionaries(
    st.sampled_from("pqrs"),
    st.dictionaries(
        st.sampled_from(["default", "gold", "silver", "maint"]),
        st.builds(Claim, st.integers(0, 20), _WEIGHTS, st.booleans()),
        max_size=3,
    ),
    max_size=4,
)


@given(st.integers(0, 40), _CLAIMS, st.integers(0, 10))
def test_tenant_shares_spend_the_budget_within_every_demand(
    budget: int, claims: dict[str, dict[str, Claim]], epoch: int
) -> None:
    share = tenant_shares(budget, claims, epoch)
    demand = {p: sum(c.demand for c in cs.values()) for p, cs in claims.items()}
    assert set(share) == set(claims)
    assert all(0 <= share[p] <= demand[p] for p in claims)
    assert sum(share.values()) == min(budget, sum(demand.values()))
    # background work gets only units the foreground does not want, anywhere
    fg = {p: sum(c.demand for c in cs.values() if not c.background) for p, cs in claims.items()}
    if budget <= sum(fg.values()):
        assert all(share[p] <= fg[p] for p in claims)
    else:
        assert all(share[p] >= fg[p] for p in claims)


@given(
    st.integers(0, 40),
    st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 30), max_size=6),
    st.integers(0, 10),
)
def test_one_tenant_everywhere_is_the_proxies_fair_shares(
    budget: int, demands: dict[str, int], epoch: int
) -> None:
    """Without workload classes (one ``default`` tenant per proxy) the shares are exactly the
    water-filling over the proxies' demands."""
    claims = {p: {"default": Claim(d)} for p, d in demands.items()}
    assert tenant_shares(budget, claims, epoch) == fair_shares(budget, demands, epoch)
    assert shares_with_slack(budget, claims, epoch) == shares_with_slack(budget, demands, epoch)


def test_slack_comes_after_every_demand() -> None:
    """An idle proxy's slack never takes a unit a busy proxy's demand wants; with room, each
    keeps its demand and a little more."""
    idle = {"busy": 25, "a": 0, "b": 0, "c": 0, "d": 0}
    assert shares_with_slack(4, idle) == {"busy": 4, "a": 0, "b": 0, "c": 0, "d": 0}
    assert shares_with_slack(64, {"a": 4, "b": 4, "c": 4}) == {"a": 5, "b": 5, "c": 5}
    assert shares_with_slack(13, {"a": 4, "b": 4, "c": 4}) == {"a": 5, "b": 4, "c": 4}


def test_release_keeps_what_is_in_service_and_gives_back_the_rest() -> None:
    assert release(held=6, in_service=2, demand=2, target=None) == (3, 3)  # demand + slack
    # over its share: admits nothing more, keeps the units of what is in service
    assert release(held=6, in_service=5, demand=8, target=2) == (2, 5)
    assert release(held=2, in_service=1, demand=8, target=6) == (2, 2)  # never above held
    assert slack(0) == 1 and slack(8) == 2


def test_grow_takes_only_free_units() -> None:
    g = grow(budget=4, keep=1, others_held=2, demand=8, target=2)
    assert (g.held, g.free) == (2, 0)
    assert grow(4, keep=1, others_held=3, demand=8, target=3).held == 1  # none free
    over = grow(4, keep=3, others_held=3, demand=3, target=2)  # back from a partition
    assert over.held == 3 and over.free == -2


@dataclass
class _Proxy:
    row: int = 0  # held, as the coordinator's table has it
    limit: int = 0  # the local MPL
    running: int = 0
    waiting: int = 0
    target: int | None = None
    keep: int | None = None  # between release and grow

    @property
    def demand(self) -> int:
        return self.running + self.waiting

    def admit(self) -> None:
        while self.waiting and self.running < self.limit:
            self.waiting -= 1
            self.running += 1


_EVENTS = st.lists(
    st.tuples(st.sampled_from(["arrive", "finish", "release", "grow"]), st.integers(0, 3)),
    max_size=300,
)


@settings(max_examples=300)
@given(st.integers(1, 8), _EVENTS)
def test_interleaved_heartbeats_never_exceed_the_budget(
    budget: int, events: list[tuple[str, int]]
) -> None:
    """Any interleaving of arrivals, completions and the two steps of every proxy's heartbeat
    (a transaction sees every row as committed): the statements in service never exceed the
    budget, nor do the units held, and every proxy runs within its own row."""
    proxies = [_Proxy() for _ in range(4)]
    reported = [0] * 4
    epoch = 0
    for kind, i in events:
        p = proxies[i]
        if kind == "arrive":
            p.waiting += 1
        elif kind == "finish" and p.running:
            p.running -= 1
        elif kind == "release" and p.keep is None:
            p.limit, p.keep = release(p.row, p.running, p.demand, p.target)
        elif kind == "grow" and p.keep is not None:
            reported[i] = p.demand
            epoch += 1
            targets = fair_shares(budget, {str(j): reported[j] for j in range(4)}, epoch)
            others = sum(q.row for j, q in enumerate(proxies) if j != i)
            g = grow(budget, p.keep, others, p.demand, targets[str(i)])
            p.row, p.limit = g.held, p.limit + g.held - p.keep
            p.target, p.keep = g.target, None
        p.admit()
        assert sum(q.running for q in proxies) <= budget
        assert sum(q.row for q in proxies) <= budget
        assert all(q.running <= q.row and q.limit <= q.row for q in proxies)


def test_saturating_proxies_converge_to_even_shares() -> None:
    """Three proxies with more work than the budget, one of them first to grab it all; each
    round every statement in service finishes (throughput follows the units held) and each
    proxy heartbeats: the grabbed units flow back at once, shares stay within one unit, the
    extra unit goes to the largest backlog, and the work served evens out."""
    budget = 4
    proxies = [_Proxy(waiting=1000) for _ in range(3)]
    proxies[0].row = proxies[0].limit = 4
    proxies[0].admit()
    served = [0, 0, 0]
    held_over_time = []
    for step in range(60):
        for i, p in enumerate(proxies):
            served[i] += p.running
            p.running = 0
            p.limit, p.keep = release(p.row, p.running, p.demand, p.target)
            targets = fair_shares(budget, {str(j): q.demand for j, q in enumerate(proxies)}, step)
            others = sum(q.row for j, q in enumerate(proxies) if j != i)
            g = grow(budget, p.keep, others, p.demand, targets[str(i)])
            p.row, p.limit = g.held, p.limit + g.held - p.keep
            p.target, p.keep = g.target, None
            p.admit()
        held_over_time.append(tuple(p.row for p in proxies))
    late = held_over_time[1:]
    assert all(max(h) - min(h) <= 1 for h in late)
    # in this lock-step model a unit given back waits for the next proxy's heartbeat about a
    # quarter of the rounds (the live proxies are told at once: NOTIFY, proxy.coordinator)
    assert sum(sum(h) == budget for h in late) >= 0.7 * len(late)
    assert max(served) - min(served) <= 0.05 * max(served), served
