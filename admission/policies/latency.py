"""Latency (short before long, FCFS among similar, aging by expected time): the recommended
policy under open arrivals.

Order. Classes are put in groups by their service demand D_r, and the group of the shortest
goes first; inside a group, arrival order. A group takes every class up to ``BAND`` (4) × its
shortest D_r, and, as in SEPT, classes whose 95 % D intervals overlap (``base.banded_groups``).
Shortest expected first is what queueing theory recommends for a mix of short and long
statements near saturation (M/G/1 non-preemptive priority against processor sharing), and it
needs only D_r, the quantity training measures best. Ordering *every* class by D_r (SEPT) gains
a little more mean and pays for it in the tail: the longest class waits behind all the others.
For eight trained TPC-H classes (D_r 0.023–0.285 s, equal shares) Cobham's formula gives, at
ρ = 0.95, mean R 1.94 s under FCFS, 0.93 s under SEPT, 1.20 s with two groups — but Q18's mean
5.56 s under SEPT against 2.35 s with two groups and 2.11 s under FCFS; at ρ = 0.85, 0.66 /
0.40 / 0.46 s. Two groups keep most of the gain and the tail close to FCFS's. The band is a
factor, so it does not depend on the unit or the machine's speed, and it is measured from the
group's shortest class, so a continuum of classes does not chain into one group.

Aging in units of expected time. Pure priority starves the long classes under load, so a queued
job becomes *due* once it has waited ``Limits.due_factor`` × D_r of its own class; due jobs go
before every other job, the largest wait/D_r (response ratio) first. A class's queueing
slowdown is so bounded by about the due factor, whatever the load of shorter classes. The
scheduler keeps the rule (``Priority.due_scale``): the decision stays O(K) because a class's
oldest job always has its class's largest ratio, and ``next_deadline`` reports when the next
head becomes due.

The short lane. The MPL cannot preempt: with every slot held by long statements, an order
lookup of a millisecond waits for a slot that frees in a second, where DuckDB alone would have
answered it beside them (processor sharing). So the policy comes with a short lane
(``Limits.short_lane``, ``SHORT_LANE`` = 8): a queued statement whose class's D_r is at most an
eighth of the least expected remaining time of those holding the MPL runs beside it, at most
MPL of them at once — shortest remaining first, as far as a non-preemptive gate can get to it.
The factor was chosen by measurement: 4 (the band) lost mean and tail on TPC-H's mix, whose
"short" queries take both cores for 10–19 ms beside 61–107 ms ones; 8 leaves that mix alone and
takes back what the MPL cost the short statements of a mix spanning 400× (README, "A mix it was
never tuned on"; benchmarks/short_lane.py in the simulator). An earlier lane that admitted the
whole shortest group beyond the MPL lowered the mean and raised p99 in the simulator
(benchmarks/open_policies.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from admission.policies.base import (
    Policy,
    Priority,
    banded_groups,
    group_floor,
    ordered_names,
)

if TYPE_CHECKING:
    from admission.model import ClassProfile, EtaModel

__all__ = ["BAND", "LATENCY", "SHORT_LANE", "latency_groups", "latency_order"]

BAND = 4.0  # classes within this factor of their group's shortest D_r are tied
# The short lane's factor (``Limits.short_lane``): a statement passes a full MPL when its class's
# D_r is at most 1/SHORT_LANE of the least expected remaining time of those in service.
SHORT_LANE = 8.0


def latency_groups(classes: Sequence[ClassProfile]) -> list[int]:
    """Each class's group: SEPT's overlapping-interval groups, widened so that a group takes
    every class up to BAND × its shortest D_r."""
    return banded_groups(
        [c.D for c in classes], [c.D_low for c in classes], [c.D_high for c in classes], BAND
    )


def latency_order(classes: Sequence[ClassProfile]) -> list[list[str]]:
    """The class names in the order latency admits them before aging, tied groups together
    (``[["Q6", "Q14"], ["Q18"]]`` reads Q6 ≈ Q14 < Q18)."""
    return ordered_names([c.name for c in classes], [c.D for c in classes], latency_groups(classes))


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    zero = (0.0,) * k
    demands = [c.D for c in model.classes]
    groups = latency_groups(model.classes)
    shortest = group_floor(demands, groups)
    return Priority(
        tuple(zero for _ in range(k)),
        tuple(-d for d in shortest),
        due_scale=tuple(demands),
    )


LATENCY = Policy(
    "latency",
    "SEPT+aging",
    "short before long (classes within 4× of their group's shortest D_r tied, FCFS among "
    "them); a job that waited due_factor × D_r goes first, highest wait/D_r first; a job 8× "
    "shorter than what the statements in service have left runs beside a full MPL",
    _build,
    short_lane=SHORT_LANE,
)
