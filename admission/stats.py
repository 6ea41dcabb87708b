"""Statistics the core and training share: a distribution-free interval for a median."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["median_interval"]


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the median of ``values``: the order
    statistics [x_(j), x_(n+1-j)] with the largest j whose coverage, 1 − 2·P(B ≤ j − 1) for
    B ~ Binomial(n, ½), is at least ``confidence``; None when even [min, max] falls short
    (fewer than 6 values at 95 %).

    Order statistics rather than a bootstrap: the coverage is exact for any continuous
    distribution (run times are skewed, with a slow tail on a shared machine, so no normal
    approximation), nothing is random (the same runs give the same interval), and for the
    few runs there are a bootstrap of the median is lumpy and too narrow.
    """
    n = len(values)
    ordered = sorted(values)
    best: int | None = None
    tail = 0.0  # P(B ≤ j − 1)
    for j in range(1, n // 2 + 1):
        tail += math.comb(n, j - 1) / 2**n
        if 1 - 2 * tail < confidence:
            break
        best = j
    if best is None:
        return None
    return ordered[best - 1], ordered[n - best]
