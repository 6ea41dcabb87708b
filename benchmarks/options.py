"""Command-line options more than one benchmark takes."""

from __future__ import annotations

import argparse

__all__ = ["add_load_basis", "check_load_basis"]


def add_load_basis(parser: argparse.ArgumentParser, what: str) -> None:
    """``--load-basis model|measured`` and ``--capacity-seconds``, as ``admission bench``
    takes them; ``what`` says what ρ is of with the model basis."""
    parser.add_argument(
        "--load-basis",
        choices=("model", "measured"),
        default="model",
        help=f"ρ of {what}, or of the capacity measured before the runs",
    )
    parser.add_argument(
        "--capacity-seconds", type=float, default=10.0, help="length of that capacity run"
    )


def check_load_basis(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as a usage error, what ``BenchConfig`` would refuse with a traceback."""
    if args.load_basis == "measured" and args.rate is not None:
        parser.error("--load-basis measured takes --load (a share of the capacity), not --rate")
    if not args.capacity_seconds >= 1:
        parser.error(f"--capacity-seconds must be at least 1, not {args.capacity_seconds}")
