"""U_r (thesis §5.4.2): admit the most CPU-intensive class first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority

if TYPE_CHECKING:
    from admission.model import EtaModel


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    return Priority.from_rows(k, lambda r: (model.classes[r].U,) * k)


MAX_U = Policy("max-u", "U_r", "highest CPU utilization U_r first", _build)
