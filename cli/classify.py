"""``admission classify``: what class the proxy gives a statement, without running one."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from admission.classify import classify_sql
from cli.options import out


def classify(
    sql: Annotated[
        list[str] | None,
        typer.Argument(help="SQL texts; with none, one statement per line from standard input."),
    ] = None,
) -> None:
    """Print the class (skeleton fingerprint and readable name) of SQL statements."""
    texts = sql or [line for line in sys.stdin.read().splitlines() if line.strip()]
    table = Table("fingerprint", "name", "bypass", "sql")
    for text in texts:
        c = classify_sql(text)
        table.add_row(c.fingerprint, c.name, "yes" if c.control else "", text[:60])
    out.print(table)
