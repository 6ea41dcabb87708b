"""The queue-length policies (thesis §5.4.1): admit what adds the least backlog.

−Q_r uses the time-averaged tasks in execution of each class; −A^c_r the mean tasks of class r
seen when a class-c job is admitted, so the choice depends on the mix in service.

Q_r is measured from one concurrent run, with noise. Where the model carries 95 % intervals of
Q_r (training writes them, by batch means), −Q_r ties classes whose intervals overlap — chained
in Q order, as SEPT does for D_r (``base.overlap_groups``): every class of a group gets the
group's smallest Q_r, so arrival order decides between them and noise cannot starve one of
them. A model without intervals orders by Q_r alone.

−A^c_r is tied the same way, column by column (``base.column_floor``): where the model carries
95 % intervals of the A matrix (batch means of the admissions of the concurrent run), the
classes r whose A^c_r intervals overlap within column c share the column's smallest entry, so
with class-c work in service they score alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from admission.policies.base import (
    Policy,
    Priority,
    column_floor,
    group_floor,
    ordered_names,
    overlap_groups,
)

if TYPE_CHECKING:
    from admission.model import ClassProfile, EtaModel

__all__ = ["MIN_A", "MIN_Q", "backlog_groups", "backlog_order"]


def backlog_groups(classes: Sequence[ClassProfile]) -> list[int]:
    """Each class's group: 0 for the least Q_r, classes with chained overlapping Q intervals
    in one group (a class without an interval is the point Q_r)."""
    return overlap_groups(
        [c.Q for c in classes], [c.Q_low for c in classes], [c.Q_high for c in classes]
    )


def backlog_order(classes: Sequence[ClassProfile]) -> list[list[str]]:
    """The class names in the order −Q_r admits them, tied classes together."""
    return ordered_names([c.name for c in classes], [c.Q for c in classes], backlog_groups(classes))


def _min_q(model: EtaModel) -> Priority:
    k = len(model.classes)
    least = group_floor([c.Q for c in model.classes], backlog_groups(model.classes))
    return Priority.from_rows(k, lambda r: (-least[r],) * k)


def _min_a(model: EtaModel) -> Priority:
    low, high = model.a_bounds()
    a = column_floor(model.a_matrix(), low, high)
    return Priority.from_rows(len(model.classes), lambda r: tuple(-x for x in a[r]))


MIN_Q = Policy(
    "min-q",
    "−Q_r",
    "least time-averaged backlog Q_r first (classes whose Q_r intervals overlap tie)",
    _min_q,
)
MIN_A = Policy(
    "min-a",
    "−A^c_r",
    "least backlog seen at admission, given the mix (classes whose A^c_r intervals overlap tie)",
    _min_a,
)
