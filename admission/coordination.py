"""Several proxies, one budget: the arithmetic of leases on a global MPL (pure; time passed in).

N proxies in front of one database share a global budget of G statements in service. Each
proxy *holds* a number of units (a row in the coordinator's lease table, ``proxy.coordinator``)
and admits at most that many statements locally, so no statement waits for the coordinator
in the common case. The invariant the protocol keeps is

    Σ_i held_i ≤ G   and   in service_i ≤ held_i,  local limit_i ≤ held_i   for every proxy i,

so the statements in service across all proxies never exceed G. A heartbeat of proxy i runs
in two steps:

1. **Release, locally, before asking** (``release``): the local limit drops to what the proxy
   still needs — no more than its demand plus a little slack and its fair share as last
   computed — at once, on the event loop, so no statement is admitted above what it is about
   to give back; it keeps the units of the statements still in service beyond that until
   they finish (a busy proxy's statements finish and are not replaced, so its units flow
   back within a statement's time).
2. **Grow, in one serialized transaction** (``grow``): with every proxy's row read under a
   lock, the free units are G − Σ held; the proxy takes up to its fair share from them and
   raises its local limit only after the transaction committed.

Shrinking first and growing after the commit is what keeps the invariant: the local limit is
lowered before the row is, and raised after it is.

**Fair share** (``fair_shares``): G split over the proxies in proportion to their demand (in
service + waiting) by water-filling — each gets min(demand, level) with the level that spends
G — in whole units, the remainder going to the largest unmet demands, ties broken by a
rotation (``epoch``) so that no proxy always loses a one-unit coin toss. A proxy that holds
more than its share gives units back as its statements finish (step 1 of its next
heartbeat); a proxy below its share takes them as they come free. One busy host cannot starve
another: its share is what its demand earns, not what it grabbed first.

**Workload classes** (``tenant_shares``): where the proxies serve tenants with weights
(``admission.workloads``), each proxy reports its demand per tenant and the budget is shared
among *tenants*, not hosts: a tenant's units are its weight's part of the budget, pooled over
every proxy that serves it (``weighted_fill``: water-filling in which each tenant's level is
its weight times a common one), and then split among those proxies by their demand for it
(``fair_shares``: ``tenant_split``). A proxy's fair share is the sum over its tenants, and it
spends its units as the split counted them (proxy.coordinator sets its scheduler's DRR
weights to its tenants' units there, ``Scheduler.set_tenant_weights``). So tenants weighted
2:1 get 2:1 of a saturated budget whichever hosts serve them, and a tenant served by three
hosts does not get three times its share. Background tenants get only what the foreground
leaves, as they do locally; interactive and batch share by weight (strict tiers across hosts
would starve a batch-only host, with no aging to rescue it). Where proxies give one tenant
different weights the largest counts. With no workload classes every proxy has one tenant,
``default``, and the shares are exactly ``fair_shares`` of the proxies' demands.

**Slack**: a proxy keeps ``slack(demand)`` units beyond its demand while the budget has room, so
an arrival finds a unit free locally; when the budget is short, fairness caps it first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_TENANT",
    "Claim",
    "Grant",
    "fair_shares",
    "grow",
    "release",
    "shares_with_slack",
    "slack",
    "tenant_shares",
    "tenant_split",
    "weighted_fill",
]

DEFAULT_TENANT = "default"  # the one tenant of a proxy without workload classes


def slack(demand: int) -> int:
    """Units held beyond the demand while there is room: a quarter of it, at least one."""
    return max(1, math.ceil(demand / 4))


def fair_shares(budget: int, demands: Mapping[str, int], epoch: int = 0) -> dict[str, int]:
    """Whole units of ``budget`` per proxy by water-filling over ``demands``: nobody gets more
    than its demand, the units are spent while demand is left, and shares differ by at most
    one unit among proxies whose demand is not met. The remainder units go to the largest
    unmet demands; among equal ones, the order rotates with ``epoch``."""
    names = sorted(demands)
    want = {n: max(0, demands[n]) for n in names}
    share = dict.fromkeys(names, 0)
    left = max(0, budget)
    open_ = [n for n in names if want[n] > 0]
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:
            # fewer units than proxies wanting: one each to the largest unmet, rotated
            rank = {n: (i - epoch) % len(names) for i, n in enumerate(names)}
            for n in sorted(open_, key=lambda n: (-(want[n] - share[n]), rank[n]))[:left]:
                share[n] += 1
            break
        for n in open_:
            give = min(each, want[n] - share[n])
            share[n] += give
            left -= give
        open_ = [n for n in open_ if share[n] < want[n]]
    return share


@dataclass(frozen=True, slots=True)
class Claim:
    """One tenant's demand at one proxy: units in service plus queued, its weight, and whether
    it is background work (served only from what the foreground leaves)."""

    demand: int
    weight: float = 1.0
    background: bool = False


def weighted_fill(
    budget: int,
    demands: Mapping[str, int],
    weights: Mapping[str, float],
    epoch: int = 0,
) -> dict[str, int]:
    """Whole units of ``budget`` by weighted water-filling: tenant t gets min(demand_t,
    weight_t · λ) with the level λ that spends the budget (or every demand), rounded to whole
    units by largest remainder (ties rotated by ``epoch``). Nobody gets more than its demand;
    among tenants whose demand is not met, shares per weight differ by less than one unit
    per weight. With equal weights it is ``fair_shares``."""
    names = sorted(demands)
    want = {n: max(0, demands[n]) for n in names}
    if len({weights[n] for n in names if want[n] > 0}) <= 1:
        return fair_shares(budget, want, epoch)
    spend = min(max(0, budget), sum(want.values()))
    # the level: tenants in order of demand per weight; those at or below it are met (the
    # weight of the rest summed afresh each step: subtracting floats drifts to zero or below
    # when weights are many orders of magnitude apart)
    order = sorted((n for n in names if want[n] > 0), key=lambda n: want[n] / weights[n])
    left, level = float(spend), math.inf
    for i, n in enumerate(order):
        weight_left = math.fsum(weights[m] for m in order[i:])
        if weight_left > 0 and want[n] / weights[n] > left / weight_left:
            level = left / weight_left
            break
        left -= want[n]
    exact = {n: max(0.0, min(float(want[n]), weights[n] * level)) for n in names}
    share = {n: min(want[n], math.floor(exact[n] + 1e-9)) for n in names}
    rank = {n: (i - epoch) % len(names) for i, n in enumerate(names)}
    rest = spend - sum(share.values())
    while rest > 0:
        open_ = sorted(
            (n for n in names if share[n] < want[n]),
            key=lambda n: (-(exact[n] - share[n]), rank[n]),
        )[:rest]
        if not open_:  # (cannot happen: the spend is at most the demands)
            break
        for n in open_:
            share[n] += 1
        rest -= len(open_)
    return share


def tenant_split(
    budget: int, claims: Mapping[str, int | Mapping[str, Claim]], epoch: int = 0
) -> dict[str, dict[str, int]]:
    """Whole units of ``budget`` per proxy and tenant when proxies report demand per tenant
    (``claims[proxy][tenant]``; a bare number is one ``default`` tenant): the foreground
    tenants' pooled demands weighted-filled, the background ones from what is left, then
    each tenant's units split among its proxies by ``fair_shares`` of their demands for it."""
    by_proxy_claims = {p: _claims(d) for p, d in claims.items()}
    pooled: dict[tuple[bool, str], dict[str, int]] = {}
    weight: dict[tuple[bool, str], float] = {}
    for proxy, tenants in by_proxy_claims.items():
        for name, c in tenants.items():
            key = (c.background, name)
            by_proxy = pooled.setdefault(key, {})
            by_proxy[proxy] = by_proxy.get(proxy, 0) + max(0, c.demand)
            weight[key] = max(weight.get(key, 0.0), c.weight)
    split = {p: dict.fromkeys(cs, 0) for p, cs in by_proxy_claims.items()}
    left = max(0, budget)
    for background in (False, True):
        keys = sorted(k for k in pooled if k[0] is background)
        totals = {k[1]: sum(pooled[k].values()) for k in keys}
        units = weighted_fill(left, totals, {k[1]: weight[k] for k in keys}, epoch)
        for k in keys:
            for proxy, s in fair_shares(units[k[1]], pooled[k], epoch).items():
                split[proxy][k[1]] += s
        left -= sum(units.values())
    return split


def tenant_shares(
    budget: int, claims: Mapping[str, int | Mapping[str, Claim]], epoch: int = 0
) -> dict[str, int]:
    """Whole units of ``budget`` per proxy: the sum of its tenants' (``tenant_split``)."""
    return {p: sum(units.values()) for p, units in tenant_split(budget, claims, epoch).items()}


def _claims(demand: int | Mapping[str, Claim]) -> Mapping[str, Claim]:
    return {DEFAULT_TENANT: Claim(demand)} if isinstance(demand, int) else demand


def shares_with_slack(
    budget: int,
    demands: Mapping[str, int | Mapping[str, Claim]],
    epoch: int = 0,
    split: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, int]:
    """Fair shares of the demands first — per proxy, or per tenant where a proxy reports its
    demand by tenant (``tenant_split``, or ``split`` when the caller has it already; a bare
    number is one ``default`` tenant) — then what the budget has left shared out as slack
    (``slack(demand)`` at most each): an idle proxy's slack never comes before a busy
    proxy's demand."""
    claims = {n: _claims(d) for n, d in demands.items()}
    if split is None:
        split = tenant_split(budget, claims, epoch)
    shares = {n: sum(units.values()) for n, units in split.items()}
    left = budget - sum(shares.values())
    if left > 0:
        total = {n: sum(max(0, c.demand) for c in cs.values()) for n, cs in claims.items()}
        extra = fair_shares(left, {n: slack(d) for n, d in total.items()}, epoch)
        shares = {n: shares[n] + extra[n] for n in shares}
    return shares


@dataclass(frozen=True, slots=True)
class Grant:
    """What one heartbeat decided for a proxy."""

    held: int  # units it holds now (its local limit)
    target: int  # its fair share at this heartbeat
    free: int  # units left free in the pool after it (negative: over the budget, see grow)


def release(held: int, in_service: int, demand: int, target: int | None) -> tuple[int, int]:
    """Step 1: (the local limit, the units kept). The local limit drops to what the proxy
    needs — no more than it holds, its demand plus slack, and (when one was computed) its
    fair share — and may be below the statements in service: none is admitted until enough
    have finished. The units kept are the limit or, while more are in service, those: a
    statement in service is never recalled, its unit comes back when it finishes."""
    limit = min(held, demand + slack(demand))
    if target is not None:
        limit = min(limit, max(target, 0))
    return limit, max(in_service, limit)


def grow(
    budget: int,
    keep: int,
    others_held: int,
    demand: int,
    target: int,
) -> Grant:
    """Step 2, inside the serialized transaction: from ``keep`` (what step 1 kept), take free
    units up to the fair ``target`` and the demand plus slack. ``others_held``: Σ held of
    every other live proxy. Never takes a unit that is not free; never gives back below
    ``keep`` (statements in service are not recalled). When the others and ``keep`` already
    exceed the budget (a proxy back from a partition with statements in flight, a budget
    lowered) it takes nothing and ``free`` is negative until statements finish."""
    free = budget - others_held - keep
    want = min(target, demand + slack(demand))
    take = max(0, min(free, want - keep))
    return Grant(held=keep + take, target=target, free=free - take)
