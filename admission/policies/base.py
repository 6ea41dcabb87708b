"""The one signature every policy has."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from admission.model import EtaModel

Matrix = tuple[tuple[float, ...], ...]


@dataclass(frozen=True, slots=True)
class Priority:
    """score_r = bias[r] + Σ_c eta[r][c] · N_c."""

    eta: Matrix
    bias: tuple[float, ...]

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
