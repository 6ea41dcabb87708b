"""The queue-length policies (thesis §5.4.1): admit what adds the least backlog.

−Q_r uses the time-averaged tasks in execution of each class; −A^c_r the mean tasks of class r
seen when a class-c job is admitted, so the choice depends on the mix in service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.policies.base import Policy, Priority

if TYPE_CHECKING:
    from admission.model import EtaModel


def _min_q(model: EtaModel) -> Priority:
    k = len(model.classes)
    return Priority.from_rows(k, lambda r: (-model.classes[r].Q,) * k)


def _min_a(model: EtaModel) -> Priority:
    a = model.a_matrix()
    return Priority.from_rows(len(model.classes), lambda r: tuple(-x for x in a[r]))


MIN_Q = Policy("min-q", "−Q_r", "least time-averaged backlog Q_r first", _min_q)
MIN_A = Policy("min-a", "−A^c_r", "least backlog seen at admission, given the mix", _min_a)
