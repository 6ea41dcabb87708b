"""The η heat map written beside a trained model: one panel per η-based policy."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from admission.model import EtaModel
from admission.policies import POLICIES

__all__ = ["eta_heatmap"]

PANELS = ("min-q", "min-a", "max-u", "max-p")


def eta_heatmap(model: EtaModel, path: str | Path) -> Path:
    """A PNG of η_{r,c} for −Q_r, −A^c_r, U_r and P_{r,c} (row r: the class scored)."""
    names = [c.name for c in model.classes]
    k = len(names)
    fig, axes = plt.subplots(2, 2, figsize=(4 + 0.45 * k, 3 + 0.45 * k), squeeze=False)
    for ax, policy in zip(axes.flat, PANELS, strict=True):
        eta = POLICIES[policy].build(model).eta
        limit = max((abs(v) for row in eta for v in row), default=1.0) or 1.0
        image = ax.imshow(eta, cmap="RdBu", vmin=-limit, vmax=limit)
        ax.set_title(f"{policy}  ({POLICIES[policy].symbol})", fontsize=10)
        ax.set_xticks(range(k), names, rotation=90, fontsize=7)
        ax.set_yticks(range(k), names, fontsize=7)
        ax.set_xlabel("c (class in service)", fontsize=8)
        ax.set_ylabel("r (class scored)", fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"η — {model.backend} {model.dataset}, {model.cores} cores", fontsize=11)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
