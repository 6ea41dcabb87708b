"""The ``admission`` command line: one entry point, a subcommand per job, on top of every
other layer (nothing imports it).

It is the shell around the pure core: it parses options (each also readable from an
``ADMISSION_…`` environment variable), shows progress on stderr, runs replications in worker
processes and prints tables or JSON on stdout. Errors in the input end with a one-line message
and exit status 2, never a traceback.

The command line needs the optional dependencies (``pip install 'admission[all]'``); the
core (``admission``) does not. ``main`` is the console script: without them it says so in one
line instead of a traceback.
"""

from __future__ import annotations

import sys

# What ``admission[all]`` brings that the command line and the layers it runs import.
EXTRA_MODULES = frozenset(
    {
        "click",
        "duckdb",
        "fastapi",
        "matplotlib",
        "prometheus_client",
        "psycopg",
        "pytz",
        "rich",
        "scramp",
        "starlette",
        "typer",
        "uvicorn",
    }
)
INSTALL_HINT = "pip install 'admission[all]'"


def main() -> None:
    """The console script ``admission``."""
    try:
        from cli.app import app

        app()
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in EXTRA_MODULES:
            raise
        sys.stderr.write(
            f"error: {missing} is not installed; the admission command line needs the "
            f"optional dependencies: {INSTALL_HINT}\n"
        )
        raise SystemExit(1) from None
