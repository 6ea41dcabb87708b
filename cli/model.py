"""``admission model check|show``: is a model file one the proxy and the simulator can load,
and what does it say (class profiles, one policy's η matrix)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from admission.policies import POLICIES
from cli.options import class_table, fail, load_model, out

model_app = typer.Typer(help="Inspect and check η model files.", no_args_is_help=True)


@model_app.command("check")
def model_check(path: Path) -> None:
    """Validate a model file: exit 0 if the proxy and the simulator can load it."""
    m = load_model(path)
    out.print(f"{path}: ok, {len(m.classes)} classes, backend {m.backend}, version {m.version}")


@model_app.command("show")
def model_show(
    path: Path,
    policy: Annotated[str, typer.Option(help="Whose η matrix to print.")] = "min-a",
) -> None:
    """Print a model's class profiles and one policy's η matrix."""
    m = load_model(path)
    if policy not in POLICIES:
        raise fail(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    out.print(class_table(m, f"{path} — {m.backend} {m.dataset}, {m.cores} cores"))
    eta = POLICIES[policy].build(m)
    grid = Table(title=f"η for {policy} ({POLICIES[policy].symbol}); row r, column c")
    grid.add_column("r \\ c")
    for c in m.classes:
        grid.add_column(c.name, justify="right")
    for c, row in zip(m.classes, eta.eta, strict=True):
        grid.add_row(c.name, *(f"{v:.3g}" for v in row))
    out.print(grid)
