"""Latency (SEPT + aging by expected time): the recommended policy under open arrivals.

Order. As SEPT: the tie group of the shortest service demand D_r first, arrival order inside a
group (classes whose 95 % D intervals overlap are tied, ``sept.demand_groups``). Shortest
expected first is what queueing theory recommends for a mix of short and long statements near
saturation (M/G/1 non-preemptive priority against processor sharing), and it needs only D_r,
the quantity training measures best.

Aging in units of expected time. Pure priority starves the long classes under load, so a queued
job becomes *due* once it has waited ``Limits.due_factor`` × D_r of its own class; due jobs go
before every other job, the largest wait/D_r (response ratio) first. A class's queueing
slowdown is so bounded by about the due factor, whatever the load of shorter classes. The
scheduler keeps the rule (``Priority.due_scale``): the decision stays O(K) because a class's
oldest job always has its class's largest ratio, and ``next_deadline`` reports when the next
head becomes due.

No short lane: admitting the shortest group beyond the MPL (Redshift's short-query
acceleration) was built and measured in the simulator; it lowered the mean response time but
raised p99 (benchmarks/open_policies.py), so it is not part of the policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority, group_floor
from admission.policies.sept import demand_groups

if TYPE_CHECKING:
    from admission.model import EtaModel

__all__ = ["LATENCY"]


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    zero = (0.0,) * k
    demands = [c.D for c in model.classes]
    groups = demand_groups(model.classes)
    shortest = group_floor(demands, groups)
    return Priority(
        tuple(zero for _ in range(k)),
        tuple(-d for d in shortest),
        due_scale=tuple(demands),
    )


LATENCY = Policy(
    "latency",
    "SEPT+aging",
    "smallest D_r first (tied when D_r intervals overlap); a job that waited due_factor × D_r "
    "goes first, highest wait/D_r first",
    _build,
)
