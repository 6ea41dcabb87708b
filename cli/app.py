"""The ``admission`` typer app, assembled from one module per command.

Commands import what they run (the proxy, training, the lab, the simulator) when they run, so
``admission --help`` and ``admission classify`` start without loading the proxy or DuckDB.
"""

from __future__ import annotations

import inspect

import typer

from cli.bench import bench
from cli.classify import classify
from cli.model import model_app
from cli.passwd import passwd
from cli.serve import serve
from cli.simulate import simulate
from cli.train import train

app = typer.Typer(
    name="admission",
    help="Admission control for in-memory databases: decide which waiting query runs next.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(model_app, name="model")
app.command()(simulate)
app.command()(serve)
app.command()(classify)
app.command()(train)
app.command()(bench)
app.command()(passwd)


def _reflowed(doc: str) -> str:
    """A docstring as help text: its paragraphs kept, the line breaks inside each dropped
    (the rich help would print the source's wrapping at every terminal width)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


for _typer_app in (app, model_app):
    for _info in _typer_app.registered_commands:
        if _info.help is None and _info.callback is not None and _info.callback.__doc__:
            _info.help = _reflowed(_info.callback.__doc__)
