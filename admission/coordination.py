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

**Slack**: a proxy keeps ``slack(demand)`` units beyond its demand while the budget has room, so
an arrival finds a unit free locally; when the budget is short, fairness caps it first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Grant", "fair_shares", "grow", "release", "shares_with_slack", "slack"]


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


def shares_with_slack(budget: int, demands: Mapping[str, int], epoch: int = 0) -> dict[str, int]:
    """Fair shares of the demands first, then what the budget has left shared out as slack
    (``slack(demand)`` at most each): an idle proxy's slack never comes before a busy
    proxy's demand."""
    shares = fair_shares(budget, demands, epoch)
    left = budget - sum(shares.values())
    if left > 0:
        extra = fair_shares(left, {n: slack(d) for n, d in demands.items()}, epoch)
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
