"""SEPT: shortest expected processing time (smallest D_r) first; arrival order within a class.

D_r is measured, and measured with noise: two trainings on a shared machine can put two close
classes in either order. Where the model carries 95% intervals of D_r (training writes them),
classes whose intervals overlap — chained in D order, so a class joins a group when its interval
reaches the group's — are *tied*: they get one score and arrival order decides between them.
So noise cannot put one of them always first and starve the other, and only orders the
measurements support are kept. A model without intervals (synthetic, older files) orders by
D_r alone, as the thesis' SEPT does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority

if TYPE_CHECKING:
    from admission.model import ClassProfile, EtaModel

__all__ = ["SEPT", "demand_groups", "demand_order"]


def demand_groups(classes: Sequence[ClassProfile]) -> list[int]:
    """Each class's group: 0 for the shortest, classes with chained overlapping D intervals
    in one group (a class without an interval is the point D_r)."""
    order = sorted(range(len(classes)), key=lambda i: classes[i].D)
    group = [0] * len(classes)
    current, reach = -1, float("-inf")
    for i in order:
        c = classes[i]
        low = c.D if c.D_low is None else c.D_low
        high = c.D if c.D_high is None else c.D_high
        if current < 0 or low > reach:
            current += 1
            reach = high
        else:
            reach = max(reach, high)
        group[i] = current
    return group


def demand_order(classes: Sequence[ClassProfile]) -> list[list[str]]:
    """The class names in the order SEPT admits them, tied classes together: the order the
    measurements support (``[["Q6", "Q14"], ["Q18"]]`` reads Q6 ≈ Q14 < Q18)."""
    groups = demand_groups(classes)
    out: list[list[str]] = [[] for _ in range(max(groups, default=-1) + 1)]
    for i in sorted(range(len(classes)), key=lambda i: classes[i].D):
        out[groups[i]].append(classes[i].name)
    return out


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    zero = (0.0,) * k
    groups = demand_groups(model.classes)
    # every class of a group gets its group's shortest D: one score, so arrival order decides
    shortest: dict[int, float] = {}
    for c, g in zip(model.classes, groups, strict=True):
        shortest[g] = min(shortest.get(g, c.D), c.D)
    return Priority(tuple(zero for _ in range(k)), tuple(-shortest[g] for g in groups))


SEPT = Policy(
    "sept",
    "SEPT",
    "smallest service demand D_r first (classes whose D_r intervals overlap tie)",
    _build,
)
