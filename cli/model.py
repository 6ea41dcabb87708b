"""``admission model check|show|rescale``: is a model file one the proxy and the simulator can
load, what does it say (class profiles, one policy's η matrix), and the model put on another
machine's speed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from admission.policies import POLICIES
from cli.options import class_table, fail, load_model, out

model_app = typer.Typer(help="Inspect, check and rescale η model files.", no_args_is_help=True)


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


@model_app.command("rescale")
def model_rescale(
    path: Path,
    out_path: Annotated[
        Path, typer.Option("--out", help="Where to write the rescaled model (atomically).")
    ],
    speed: Annotated[
        float | None,
        typer.Option(
            help="The target machine's speed in the probe's rows/s (what `admission train` "
            "printed there). Default: measure this machine now (about a second).",
            min=1.0,
        ),
    ] = None,
) -> None:
    """Put a model trained on another machine (or on this one at another time) on this
    machine's speed: D_r, its interval and the fork profile × the model's speed / this one's.

    The speed is a fixed parallel DuckDB probe stored in the model by training. The time
    quantities scale; f_r, U_r, Q_r and A^c_r (ratios of the machine to itself) are kept.
    This assumes CPU-bound statements and machines alike in cores and memory.
    """
    from training import speed as probe

    m = load_model(path)
    try:
        probe.rescale(m, 1.0)  # can it be rescaled at all (before a second of measuring)
    except ValueError as e:
        raise fail(f"{path}: {e}") from None
    if speed is None:
        reading = probe.measure()
        speed = reading.speed
        out.print(f"this machine: {speed:,.0f} {probe.UNIT}")
    try:
        rescaled = probe.rescale(m, speed)
    except ValueError as e:
        raise fail(f"{path}: {e}") from None
    rescaled.save(out_path)
    assert m.speed is not None
    there = (m.speed.before + m.speed.after) / 2
    out.print(
        f"wrote {out_path}: trained at {there:,.0f}, rescaled to {speed:,.0f} "
        f"(D_r × {there / speed:.3g})"
    )
