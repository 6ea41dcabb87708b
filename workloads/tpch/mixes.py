"""The thesis' TPC-H mixes (SPEC §7), shared by the CLI, the simulator and locust.

Queries are grouped by running time: short {16, 18}, medium {1, 4}, long {9, 21}. A mix gives the
probability of each group; within a group the queries are equally likely. ``all`` is the full
22-class mix with every query equally likely.

Any other mix is written out: ``6,14,9,18`` (equally likely) or ``6:4,14:4,9:1,18:1`` (weights,
normalised), so a benchmark can put together short and long classes of its own choosing.
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
    """A named mix, or one written out as ``Q:W,...`` / ``Q,...`` (see the module docstring),
    with an error that lists the choices."""
    named = MIXES.get(name.lower().strip())
    if named is not None:
        return named
    if not name.strip() or not all(c.isdigit() or c in ":., " for c in name):
        raise ValueError(
            f"unknown mix {name!r}; choose one of {', '.join(MIXES)} or list TPC-H queries "
            "with optional weights, such as 6,14,9,18 or 6:4,14:4,9:1,18:1"
        )
    weights: dict[int, float] = {}
    for part in name.split(","):
        query, _, weight = part.strip().partition(":")
        try:
            q, w = int(query), float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(
                f"mix {name!r}: {part.strip()!r} is not QUERY or QUERY:WEIGHT"
            ) from None
        if not 1 <= q <= 22:
            raise ValueError(f"mix {name!r}: TPC-H has queries 1 to 22, not {q}")
        if not w > 0 or w == float("inf"):
            raise ValueError(f"mix {name!r}: the weight of Q{q} must be positive, not {weight}")
        if q in weights:
            raise ValueError(f"mix {name!r}: Q{q} is listed twice")
        weights[q] = w
    total = sum(weights.values())
    label = ",".join(f"{q}:{w:g}" for q, w in weights.items())
    return Mix(label, {q: w / total for q, w in weights.items()})
