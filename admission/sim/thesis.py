"""The thesis' published Var-Service figures (Table 5.3), for calibration checks and reports."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TABLE_5_3", "PublishedRow"]


@dataclass(frozen=True)
class PublishedRow:
    p_row_sum: float
    U: float
    A: float
    Q: float
    # priority ranks the thesis gives (3 = high): P_{r,c}, U_r, −A^c_r, −Q_r
    rank_p: int
    rank_u: int
    rank_a: int
    rank_q: int


# Var-Service, η tables built from FCFS; U as a fraction of all cores, A and Q in tasks.
TABLE_5_3: dict[str, tuple[PublishedRow, PublishedRow, PublishedRow]] = {
    "I": (
        PublishedRow(-0.19, 0.45, 46.5, 43.4, 1, 3, 1, 1),
        PublishedRow(0.02, 0.23, 21.9, 22.2, 2, 1, 3, 3),
        PublishedRow(0.04, 0.29, 27.2, 27.9, 3, 2, 2, 2),
    ),
    "II": (
        PublishedRow(-0.08, 0.12, 14.0, 12.0, 1, 1, 3, 3),
        PublishedRow(0.33, 0.59, 59.1, 58.1, 3, 3, 1, 1),
        PublishedRow(0.24, 0.26, 24.7, 25.2, 2, 2, 2, 2),
    ),
    "III": (
        PublishedRow(-0.09, 0.10, 12.4, 10.1, 1, 1, 3, 3),
        PublishedRow(0.16, 0.17, 17.8, 17.1, 2, 2, 2, 2),
        PublishedRow(1.05, 0.69, 67.7, 68.3, 3, 3, 1, 1),
    ),
}
