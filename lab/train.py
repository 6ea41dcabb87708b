"""Training against a real database: the target (the proxy at MPL 1 in front of the database,
TPC-H loaded) opened, both phases of ``training.train`` run through it, the target closed.

``admission train`` and the bench's quick model both start here; what is measured and how is
``training``'s, where the data comes from is the lab's.
"""

from __future__ import annotations

from admission.scheduler import Limits
from lab.target import open_target
from proxy.server import parse_backend
from training import train as phases
from training.train import Bar, Progress, TrainConfig, TrainResult

__all__ = ["train"]


def _quiet(_message: str) -> None:
    pass


def train(config: TrainConfig, progress: Progress = _quiet, bar: Bar | None = None) -> TrainResult:
    """Run both phases on ``config.backend`` and return the model (the caller saves it)."""
    if not config.classes:
        raise ValueError("no classes to train")
    if not config.is_duckdb:
        progress(f"loading TPC-H SF {config.tpch:g} into {parse_backend(config.backend)}")
    target = open_target(config.backend, config.tpch, limits=Limits(mpl=1), progress=progress)
    try:
        return phases.train(config, target.proxy, target.conninfo, progress, bar)
    finally:
        target.close()
