"""P_{r,c} (thesis §5.4.3): deviation from the no-interference baseline.

In a product-form network of processor-sharing cores U_r/U_c = A^c_r/A^r_c exactly (Theorem 1),
so P_{r,c} = U_r/U_c − A^c_r/A^r_c is zero there; P_{r,c} > 0 means class r gets more CPU work
done per thread it queues at the cores than class c does. The diagonal is 0. A ratio whose
denominator is 0 (a class never measured) contributes 0: no evidence either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority

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


def _build(model: EtaModel) -> Priority:
    p = interference_matrix(model)
    return Priority.from_rows(len(p), lambda r: p[r])


MAX_P = Policy("max-p", "P_{r,c}", "most work per queued thread (interference baseline)", _build)
