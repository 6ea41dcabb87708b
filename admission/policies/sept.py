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

from admission.policies.base import Policy, Priority, group_floor, ordered_names, overlap_groups

if TYPE_CHECKING:
    from admission.model import ClassProfile, EtaModel

__all__ = ["SEPT", "demand_groups", "demand_order"]


def demand_groups(classes: Sequence[ClassProfile]) -> list[int]:
    """Each class's group: 0 for the shortest, classes with chained overlapping D intervals
    in one group (a class without an interval is the point D_r)."""
    return overlap_groups(
        [c.D for c in classes], [c.D_low for c in classes], [c.D_high for c in classes]
    )


def demand_order(classes: Sequence[ClassProfile]) -> list[list[str]]:
    """The class names in the order SEPT admits them, tied classes together: the order the
    measurements support (``[["Q6", "Q14"], ["Q18"]]`` reads Q6 ≈ Q14 < Q18)."""
    return ordered_names([c.name for c in classes], [c.D for c in classes], demand_groups(classes))


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    zero = (0.0,) * k
    # every class of a group gets its group's shortest D: one score, so arrival order decides
    shortest = group_floor([c.D for c in model.classes], demand_groups(model.classes))
    return Priority(tuple(zero for _ in range(k)), tuple(-d for d in shortest))


SEPT = Policy(
    "sept",
    "SEPT",
    "smallest service demand D_r first (classes whose D_r intervals overlap tie)",
    _build,
)
