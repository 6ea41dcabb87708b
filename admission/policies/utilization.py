"""U_r (thesis §5.4.2): admit the most CPU-intensive class first.

U_r is measured from one concurrent run, with noise. Where the model carries 95 % intervals
of U_r (batch means of the run), classes whose intervals overlap are tied, as SEPT ties
overlapping D_r (``base.overlap_groups``): they share one score and arrival order decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority, group_floor, overlap_groups

if TYPE_CHECKING:
    from admission.model import ClassProfile, EtaModel

__all__ = ["MAX_U", "utilization_groups"]


def utilization_groups(classes: Sequence[ClassProfile]) -> list[int]:
    """Each class's group: 0 for the least U_r, classes with chained overlapping U intervals
    in one group (a class without an interval is the point U_r)."""
    return overlap_groups(
        [c.U for c in classes], [c.U_low for c in classes], [c.U_high for c in classes]
    )


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    # a tied group scores as its least U: groups keep their order, arrival order within one
    u = group_floor([c.U for c in model.classes], utilization_groups(model.classes))
    return Priority.from_rows(k, lambda r: (u[r],) * k)


MAX_U = Policy(
    "max-u",
    "U_r",
    "highest CPU utilization U_r first (classes whose U_r intervals overlap tie)",
    _build,
)
