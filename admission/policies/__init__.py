"""Admission policies: each turns an ``EtaModel`` into a ``Priority``.

A priority is the η matrix of SPEC §4 plus a static per-class bias; the scheduler scores
class r as ``bias_r + Σ_c η[r][c]·N_c`` (N_c = class-c tasks in service now), picks the best
non-empty class and, within it and on ties between classes, the earliest arrival. FCFS is all
zeros (every class ties, so arrival order decides); SEPT is a bias of −D_r and no η. Latency
is SEPT's order plus aging in units of each class's D_r (``Priority.due_scale``).

Adding a policy is one module with a ``Policy`` object and one line in ``POLICIES`` below.
"""

from __future__ import annotations

from admission.policies.base import Policy, Priority
from admission.policies.fcfs import FCFS
from admission.policies.interference import MAX_P
from admission.policies.latency import LATENCY
from admission.policies.queue_length import MIN_A, MIN_Q
from admission.policies.sept import SEPT
from admission.policies.utilization import MAX_U

POLICIES: dict[str, Policy] = {p.name: p for p in (FCFS, SEPT, MIN_Q, MIN_A, MAX_U, MAX_P, LATENCY)}


def policy_by_name(name: str) -> Policy:
    """Look a policy up by its CLI/API name, with an error that lists the choices."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


__all__ = ["POLICIES", "Policy", "Priority", "policy_by_name"]
