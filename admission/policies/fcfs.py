"""FCFS: η = 0, so every class ties and the earliest arrival wins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority

if TYPE_CHECKING:
    from admission.model import EtaModel


def _build(model: EtaModel) -> Priority:
    k = len(model.classes)
    return Priority.from_rows(k, lambda r: (0.0,) * k)


FCFS = Policy("fcfs", "FCFS", "earliest arrival first", _build)
