"""``admission bench``'s per-class table with more classes than columns (ad hoc SQL gives a
class per statement shape): the busiest shown, the rest pooled by throughput."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from cli.bench import SHOWN_CLASSES, _pooled_mean, _shown_classes


def _cls(throughput: float, mean: float) -> dict[str, Any]:
    return {
        "throughput": SimpleNamespace(mean=throughput),
        "mean_response": SimpleNamespace(mean=mean),
    }


def _result(per_policy: dict[str, dict[str, dict[str, Any]]]) -> Any:
    return SimpleNamespace(
        summaries={p: SimpleNamespace(per_class=c) for p, c in per_policy.items()}
    )


def test_few_classes_are_all_shown() -> None:
    classes = {f"Q{i}": _cls(1.0, 0.1) for i in range(SHOWN_CLASSES)}
    assert _shown_classes(_result({"none": classes})) == (list(classes), [])


def test_the_busiest_are_shown_in_their_order_and_the_rest_pooled() -> None:
    n = SHOWN_CLASSES + 8
    # class i completes i statements/s under one policy and i/2 under the other; a class
    # missing from one policy (it ran no statement there) counts what the other ran
    a = {f"c{i}": _cls(float(i), 0.01 * i) for i in range(n)}
    b = {f"c{i}": _cls(float(i) / 2, 0.02 * i) for i in range(n) if i != n - 1}
    shown, rest = _shown_classes(_result({"a": a, "b": b}))
    assert shown == [f"c{i}" for i in range(8, n)]  # the 12 busiest, in the table's order
    assert rest == [f"c{i}" for i in range(8)]
    # pooled: weighted by throughput; classes that completed nothing do not count
    pooled = _pooled_mean(a, rest)
    assert math.isclose(pooled, sum(i * 0.01 * i for i in range(8)) / sum(range(8)))
    assert math.isnan(_pooled_mean({"x": _cls(0.0, 1.0)}, ["x", "missing"]))
