"""The thesis' TPC-H mixes (SPEC §7), shared by the CLI, the simulator and locust.

Queries are grouped by running time: short {16, 18}, medium {1, 4}, long {9, 21}. A mix gives the
probability of each group; within a group the queries are equally likely. ``all`` is the full
22-class mix with every query equally likely.
"""

from __future__ import annotations

from dataclasses import dataclass

QUERY_GROUPS: dict[str, tuple[int, ...]] = {
    "short": (16, 18),
    "medium": (1, 4),
    "long": (9, 21),
}


@dataclass(frozen=True)
class Mix:
    """A probability for each TPC-H query number."""

    name: str
    weights: dict[int, float]

    @property
    def queries(self) -> tuple[int, ...]:
        return tuple(q for q, w in self.weights.items() if w > 0)


def _grouped(name: str, short: float, medium: float, long: float) -> Mix:
    weights: dict[int, float] = {}
    for group, share in (("short", short), ("medium", medium), ("long", long)):
        members = QUERY_GROUPS[group]
        for q in members:
            weights[q] = share / len(members)
    return Mix(name, weights)


MIXES: dict[str, Mix] = {
    "light": _grouped("light", 0.6, 0.2, 0.2),
    "medium": _grouped("medium", 0.2, 0.6, 0.2),
    "heavy": _grouped("heavy", 0.2, 0.2, 0.6),
    "all": Mix("all", {q: 1 / 22 for q in range(1, 23)}),
}


def mix_by_name(name: str) -> Mix:
    """Look a mix up by name, with an error that lists the choices."""
    try:
        return MIXES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown mix {name!r}; choose one of {', '.join(MIXES)}") from None
