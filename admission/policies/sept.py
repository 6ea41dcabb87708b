"""SEPT: shortest expected processing time (smallest D_r) first; arrival order within a class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority

if TYPE_CHECKING:
    from admission.model import EtaModel


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    zero = (0.0,) * k
    return Priority(tuple(zero for _ in range(k)), tuple(-c.D for c in model.classes))


SEPT = Policy("sept", "SEPT", "smallest service demand D_r first", _build)
