"""P_{r,c} (thesis §5.4.3): deviation from the no-interference baseline.

In a product-form network of processor-sharing cores U_r/U_c = A^c_r/A^r_c exactly (Theorem 1),
so P_{r,c} = U_r/U_c − A^c_r/A^r_c is zero there; P_{r,c} > 0 means class r gets more CPU work
done per thread it queues at the cores than class c does. The diagonal is 0. A ratio whose
denominator is 0 (a class never measured) contributes 0: no evidence either way.

Where the model carries 95 % intervals of U_r and of the A matrix, each P_{r,c} gets an
interval by interval arithmetic (the ratio of two intervals spans the ratios of their ends; a
denominator interval that reaches 0 makes the ratio unbounded above) and, column by column,
classes whose P intervals overlap are tied (``base.column_floor``): noise in one concurrent
run cannot decide between them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority, column_floor

if TYPE_CHECKING:
    from admission.model import EtaModel


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def interference_matrix(model: EtaModel) -> tuple[tuple[float, ...], ...]:
    """P[r][c] = U_r/U_c − A[r][c]/A[c][r], with A[r][c] = A^c_r."""
    a = model.a_matrix()
    u = [c.U for c in model.classes]
    k = len(u)
    return tuple(
        tuple(0.0 if r == c else _ratio(u[r], u[c]) - _ratio(a[r][c], a[c][r]) for c in range(k))
        for r in range(k)
    )


def _ratio_bounds(
    num: tuple[float, float], den: tuple[float, float], point_den: float
) -> tuple[float, float]:
    """The interval of num/den for num, den in the given intervals (both ≥ 0); [0, 0] where
    the point denominator is 0 (as ``_ratio``)."""
    if point_den <= 0:
        return 0.0, 0.0
    low = num[0] / den[1] if den[1] > 0 else 0.0
    high = num[1] / den[0] if den[0] > 0 else math.inf
    return low, high


def interference_bounds(
    model: EtaModel,
) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]] | None:
    """The low and high ends of each P_{r,c}'s interval, None when the model carries no
    intervals of U_r or A^c_r (a missing one is taken as its point value)."""
    a_low, a_high = model.a_bounds()
    if a_low is None and all(c.U_low is None for c in model.classes):
        return None
    a = model.a_matrix()
    lo_a = a_low or a
    hi_a = a_high or a
    u = [
        (c.U if c.U_low is None else c.U_low, c.U if c.U_high is None else c.U_high)
        for c in model.classes
    ]
    k = len(u)
    low = [[0.0] * k for _ in range(k)]
    high = [[0.0] * k for _ in range(k)]
    for r in range(k):
        for c in range(k):
            if r == c:
                continue
            ur = _ratio_bounds(u[r], u[c], model.classes[c].U)
            ar = _ratio_bounds((lo_a[r][c], hi_a[r][c]), (lo_a[c][r], hi_a[c][r]), a[c][r])
            low[r][c] = ur[0] - ar[1]
            high[r][c] = ur[1] - ar[0]
    return tuple(map(tuple, low)), tuple(map(tuple, high))


def _build(model: EtaModel) -> Priority:
    p = interference_matrix(model)
    bounds = interference_bounds(model)
    if bounds is not None:
        p = column_floor(p, *bounds)
    return Priority.from_rows(len(p), lambda r: p[r])


MAX_P = Policy("max-p", "P_{r,c}", "most work per queued thread (interference baseline)", _build)
