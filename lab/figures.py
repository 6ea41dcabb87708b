"""Figures: bars per policy and the response-time CCDF like the thesis' 5.7–5.13 (for the
simulator's study and the live bench alike), and the η heat map written beside a trained model.

Drawing needs matplotlib, which the pure core does not depend on; the figures therefore live
here, above everything whose results they show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from admission.model import EtaModel
from admission.policies import POLICIES
from admission.sim.study import PolicySummary, StudyResult

__all__ = ["eta_heatmap", "policy_figures", "timeline_figure", "write_figures"]

_BARS = (
    ("throughput", "Throughput (jobs per unit time)"),
    ("mean_response", "Mean response time"),
    ("weighted_slowdown", "Weighted slowdown"),
)


def write_figures(study: StudyResult, directory: str | Path) -> list[Path]:
    """Write one PNG per metric and the CCDF; returns the files written."""
    stem = f"{study.workload}-{study.mix}".strip("-") or "study"
    return policy_figures(study.policies, directory, stem, f"{study.workload} Mix-{study.mix}")


def policy_figures(
    policies: Mapping[str, PolicySummary],
    directory: str | Path,
    stem: str,
    title: str,
    unit: str = "",
) -> list[Path]:
    """Bars with 95% confidence intervals per policy for each metric, and the response-time
    CCDF (the simulator's study and the live benchmark draw the same figures)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    names = list(policies)
    written = []
    for key, label in _BARS:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        estimates = [getattr(policies[p], key) for p in names]
        ax.bar(
            names,
            [e.mean for e in estimates],
            yerr=[e.ci or 0.0 for e in estimates],
            capsize=4,
            color="#4a7ab5",
        )
        ax.set_ylabel(label + (f" ({unit})" if unit and key == "mean_response" else ""))
        ax.set_title(f"{title}: {label.lower()}")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = out / f"{stem}-{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for p in names:
        if policies[p].ccdf:
            xs, ys = zip(*policies[p].ccdf, strict=True)
            ax.plot(xs, ys, label=p)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("response time" + (f" ({unit})" if unit else ""))
    ax.set_ylabel("P(R > x)")
    ax.set_title(f"{title}: response-time CCDF")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{stem}-ccdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def _save(fig: Figure, path: str | Path) -> Path:
    """Write the figure as a PNG (creating its directory) and free it."""
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


Timeline = Sequence[tuple[float, int, int]]  # (seconds from the start, queued, in service)


def timeline_figure(
    runs: Mapping[str, tuple[Timeline, Sequence[tuple[float, float]]]],
    path: str | Path,
    title: str,
    bursts: Sequence[tuple[float, float]] = (),
) -> Path:
    """One run per policy over time: statements queued in the proxy, statements in service,
    and response times by arrival (one dot each); bursts shaded."""
    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    for name, (timeline, responses) in runs.items():
        if timeline:
            ts, queued, running = zip(*timeline, strict=True)
            (line,) = axes[0].plot(ts, queued, label=name, linewidth=1)
            axes[1].plot(ts, running, color=line.get_color(), linewidth=1)
        else:
            line = None
        if responses:
            xs, ys = zip(*responses, strict=True)
            axes[2].scatter(
                xs, ys, s=3, alpha=0.5, color=line.get_color() if line else None, label=name
            )
    for ax, label in zip(
        axes, ("queued statements", "statements in service", "response time (s)"), strict=True
    ):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for start, end in bursts:
            ax.axvspan(start, end, color="#d62728", alpha=0.08)
    axes[2].set_yscale("log")
    axes[2].set_xlabel("seconds from the start of the run (by arrival)")
    axes[0].legend(fontsize=8, ncol=3)
    axes[0].set_title(title)
    return _save(fig, path)


_PANELS = ("min-q", "min-a", "max-u", "max-p")


def eta_heatmap(model: EtaModel, path: str | Path) -> Path:
    """A PNG of η_{r,c} for −Q_r, −A^c_r, U_r and P_{r,c} (row r: the class scored)."""
    names = [c.name for c in model.classes]
    k = len(names)
    fig, axes = plt.subplots(2, 2, figsize=(4 + 0.45 * k, 3 + 0.45 * k), squeeze=False)
    for ax, policy in zip(axes.flat, _PANELS, strict=True):
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
    return _save(fig, path)
