"""The one signature every policy has."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from admission.model import EtaModel

Matrix = tuple[tuple[float, ...], ...]


@dataclass(frozen=True, slots=True)
class Priority:
    """score_r = bias[r] + Σ_c eta[r][c] · N_c.

    ``due_scale``, used by the latency policy alone, is each class's expected time: a queued
    job is due once it has waited ``Limits.due_factor`` times it, and due jobs go first, the
    largest wait/scale first. Empty: no such aging.
    """

    eta: Matrix
    bias: tuple[float, ...]
    due_scale: tuple[float, ...] = ()

    @classmethod
    def from_rows(cls, k: int, row: Callable[[int], tuple[float, ...]]) -> Priority:
        return cls(tuple(row(r) for r in range(k)), (0.0,) * k)


@dataclass(frozen=True, slots=True)
class Policy:
    """A named rule that builds a ``Priority`` from a model."""

    name: str  # CLI / API name
    symbol: str  # the thesis' notation
    summary: str
    build: Callable[[EtaModel], Priority]
    # the short lane it runs with unless the limits say otherwise (``Limits.short_lane``)
    short_lane: float | None = None


def overlap_groups(
    values: Sequence[float],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
) -> list[int]:
    """Each value's group, 0 for the smallest: taken in order of value, a value joins the
    current group when its interval [low, high] reaches the group's (chained overlap), else
    starts the next. A missing end is the value itself, so without intervals only equal
    values share a group. Estimates whose 95 % intervals overlap are not told apart by the
    measurements, so a policy built on them treats a group as tied."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    group = [0] * len(values)
    current, reach = -1, float("-inf")
    for i in order:
        lo, hi = lows[i], highs[i]
        low = values[i] if lo is None else lo
        high = values[i] if hi is None else hi
        if current < 0 or low > reach:
            current += 1
            reach = high
        else:
            reach = max(reach, high)
        group[i] = current
    return group


def banded_groups(
    values: Sequence[float],
    lows: Sequence[float | None],
    highs: Sequence[float | None],
    band: float,
) -> list[int]:
    """``overlap_groups`` with a band: taken in order of value, a value also joins the current
    group while it is at most ``band`` × the group's first (smallest) value. Each group so
    spans at most a factor ``band`` unless overlapping intervals chain it further; ``band`` 1
    is ``overlap_groups``."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    group = [0] * len(values)
    current, reach, anchor = -1, float("-inf"), 0.0
    for i in order:
        lo, hi = lows[i], highs[i]
        low = values[i] if lo is None else lo
        high = values[i] if hi is None else hi
        if current < 0 or (low > reach and values[i] > band * anchor):
            current += 1
            reach, anchor = high, values[i]
        else:
            reach = max(reach, high)
        group[i] = current
    return group


def group_floor(values: Sequence[float], groups: Sequence[int]) -> list[float]:
    """Each value replaced by the smallest of its group: one score per tied group."""
    least: dict[int, float] = {}
    for v, g in zip(values, groups, strict=True):
        least[g] = min(least.get(g, v), v)
    return [least[g] for g in groups]


def ordered_names(
    names: Sequence[str], values: Sequence[float], groups: Sequence[int]
) -> list[list[str]]:
    """The names in order of value, one list per group (``[["Q6", "Q14"], ["Q18"]]`` reads
    Q6 ≈ Q14 < Q18)."""
    out: list[list[str]] = [[] for _ in range(max(groups, default=-1) + 1)]
    for i in sorted(range(len(values)), key=lambda i: values[i]):
        out[groups[i]].append(names[i])
    return out


def column_floor(
    matrix: Sequence[Sequence[float]],
    lows: Sequence[Sequence[float]] | None,
    highs: Sequence[Sequence[float]] | None,
) -> Matrix:
    """``matrix`` with each column's entries tied as ``overlap_groups`` ties values: within a
    column c, the rows r whose intervals [lows[r][c], highs[r][c]] chain into one group all
    take the group's smallest entry. For the mix-dependent policies (−A^c_r, P_{r,c}) the
    score of class r is a sum over the classes c in service of a column-c entry, so rows tied
    in every column of the mix get one score and arrival order decides between them. Groups
    keep their order (a later group's entries all exceed an earlier one's), so the floor
    serves a policy that prefers large entries as well as one that prefers small. Without
    intervals only equal entries tie."""
    k = len(matrix)
    columns = []
    for c in range(k):
        values = [matrix[r][c] for r in range(k)]
        lo = [None if lows is None else lows[r][c] for r in range(k)]
        hi = [None if highs is None else highs[r][c] for r in range(k)]
        columns.append(group_floor(values, overlap_groups(values, lo, hi)))
    return tuple(tuple(columns[c][r] for c in range(k)) for r in range(k))


def priority_orders(
    names: Sequence[str], priority: Priority
) -> list[list[str]] | dict[str, list[list[str]]]:
    """The order a priority admits the classes in, tied classes together, read from the
    scores themselves: with one task of class c in service class r scores
    ``bias[r] + eta[r][c]``, the highest first, equal scores tied (arrival order decides).
    One list when every class in service gives the same order (SEPT, −Q_r, U_r); else, for
    the mix-dependent policies, the order with each class in service (``{"Q9": [...]}``).
    Aging (the latency policy's due jobs) is not part of it."""
    k = len(names)
    per_column: dict[str, list[list[str]]] = {}
    for c in range(k):
        scores = [priority.bias[r] + priority.eta[r][c] for r in range(k)]
        distinct = sorted(set(scores), reverse=True)
        rank = {s: i for i, s in enumerate(distinct)}
        groups: list[list[str]] = [[] for _ in distinct]
        for r in sorted(range(k), key=lambda r: (rank[scores[r]], r)):
            groups[rank[scores[r]]].append(names[r])
        per_column[names[c]] = groups
    orders = list(per_column.values())
    if not orders:
        return []
    if all(o == orders[0] for o in orders):
        return orders[0]
    return per_column


def order_text(groups: Sequence[Sequence[str]], before: str = " < ") -> str:
    """``[["Q6", "Q14"], ["Q18"]]`` as "Q6 ≈ Q14 < Q18" (first admitted first; ``before``
    between the groups)."""
    return before.join(" ≈ ".join(g) for g in groups)
