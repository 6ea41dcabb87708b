"""``admission bench``: the closed TPC-H workload through the proxy under each policy, compared
with no admission control and with a plain FCFS pool; a table or JSON, and figures.

The bench itself is the lab's (``lab.bench``); this module parses the options and reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from admission.model import EtaModel, ModelError
from cli.options import (
    BackfillOption,
    MaxWaitOption,
    OutputFormat,
    QueueTimeoutOption,
    ThreadsOption,
    check_backend,
    env,
    fail,
    limits,
    out,
    progress_printer,
)

if TYPE_CHECKING:
    from lab.bench import BenchConfig, BenchResult, Progress


def bench(
    mix: Annotated[str, typer.Option(help="TPC-H mix: light, medium, heavy or all.")],
    backend: Annotated[
        str,
        typer.Option(
            help="duckdb (embedded, in memory) or postgresql://HOST:PORT/DB.",
            envvar=env("backend"),
        ),
    ] = "duckdb",
    tpch: Annotated[float, typer.Option(help="TPC-H scale factor.", min=0.001)] = 0.1,
    model: Annotated[
        Path | None,
        typer.Option(help="η model file; without it a quick model is trained first."),
    ] = None,
    clients: Annotated[int, typer.Option(help="Closed-loop clients.", min=1)] = 16,
    think: Annotated[
        float, typer.Option(help="Mean think time between statements, s.", min=0)
    ] = 0.0,
    duration: Annotated[float, typer.Option(help="Seconds per run.", min=1.0)] = 30.0,
    warmup: Annotated[
        float | None,
        typer.Option(help="Seconds not measured at the start of each run (default 10%)."),
    ] = None,
    mpl: Annotated[
        int, typer.Option(help="MPL for every policy but none (0 = unlimited).", min=0)
    ] = 4,
    threads: ThreadsOption = 0,
    backfill: BackfillOption = False,
    max_wait: MaxWaitOption = None,
    queue_timeout: QueueTimeoutOption = None,
    policies: Annotated[
        str, typer.Option(help="Comma-separated: none, fcfs, sept, min-q, min-a, max-u, max-p.")
    ] = ",".join(("none", "fcfs", "sept", "min-q", "min-a", "max-u", "max-p")),
    repetitions: Annotated[int, typer.Option(help="Repetitions of every policy.", min=1)] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the clients' query streams.")] = 0,
    output: Annotated[OutputFormat, typer.Option("--format", help="table or json.")] = (
        OutputFormat.table
    ),
    plot: Annotated[
        Path | None, typer.Option(help="Write PNG figures into this directory.")
    ] = None,
    save: Annotated[
        Path | None, typer.Option(help="Also write the JSON result to this file.")
    ] = None,
) -> None:
    """Run the closed TPC-H workload through the proxy under each policy and compare.

    Besides the policies, "none" runs with no admission control at all and "fcfs" with the
    same MPL (what a connection pool gives). Results are means over repetitions with 95%
    confidence intervals, measured after a warm-up.
    """
    from lab.bench import BenchConfig
    from workloads.tpch.mixes import mix_by_name

    try:
        chosen = _policies(policies)
        check_backend(backend)
        config = BenchConfig(
            mix=mix_by_name(mix),
            backend=backend,
            tpch=tpch,
            clients=clients,
            think=think,
            duration=duration,
            warmup=warmup,
            limits=limits(mpl, threads, backfill, max_wait, queue_timeout),
            policies=chosen,
            repetitions=repetitions,
            seed=seed,
        )
        if config.warmup_seconds >= duration:
            raise ValueError("--warmup must be shorter than --duration")
        trained = EtaModel.load(model) if model is not None else None
    except (ValueError, ModelError) as e:
        raise fail(str(e)) from None
    say = progress_printer()
    result = _run(config, trained, say)
    if plot is not None:
        from lab.figures import policy_figures

        name = config.mix.name
        written = policy_figures(result.summaries, plot, f"bench-{name}", f"TPC-H {name}", "s")
        say(f"wrote {len(written)} figures into {plot}")
    if save is not None:
        save.write_text(json.dumps(result.json(), indent=1) + "\n")
    if output is OutputFormat.json:
        out.print_json(json.dumps(result.json()))
    else:
        _print_result(result)


def _policies(text: str) -> tuple[str, ...]:
    """Comma-separated bench policies: the scheduler's and "none"."""
    from lab.bench import ALL_POLICIES

    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in chosen if p not in ALL_POLICIES]
    if unknown or not chosen:
        raise ValueError(
            f"unknown policies {unknown or text!r}; choose from {', '.join(ALL_POLICIES)}"
        )
    return chosen


def _run(config: BenchConfig, trained: EtaModel | None, say: Progress) -> BenchResult:
    """Every run, after training a quick model if none was given; failures end in one line."""
    from lab.bench import quick_model, run_bench

    try:
        model = trained or quick_model(config, say)
        total = len(config.policies) * config.repetitions
        say(
            f"{total} runs of {config.duration:g} s: {', '.join(config.policies)} × "
            f"{config.repetitions}, {config.clients} clients, mix {config.mix.name}, "
            f"MPL {config.limits.mpl or 'unlimited'}"
        )
        return run_bench(config, model, say)
    except (RuntimeError, ValueError, OSError) as e:
        raise fail(str(e)) from None
    except Exception as e:  # psycopg's connection errors, DuckDB's
        raise fail(f"benchmark failed: {e}") from None


def _print_result(result: BenchResult) -> None:
    """The policies' table, then mean response time per class and policy."""
    c = result.config
    table = Table(
        title=f"{c.backend} TPC-H SF {c.tpch:g}, mix {c.mix.name}, {c.clients} clients, "
        f"MPL {c.limits.mpl or '∞'}, {c.repetitions} × {c.duration:g} s (95% CI)"
    )
    for col in ("policy", "throughput /s", "mean R (s)", "p95 R (s)", "p99 R (s)", "w. slowdown"):
        table.add_column(col, justify="right")
    for col in ("aged", "timeouts", "errors"):
        table.add_column(col, justify="right")
    for name, s in result.summaries.items():
        table.add_row(
            name,
            str(s.throughput),
            str(s.mean_response),
            str(s.p95_response),
            str(s.p99_response),
            str(s.weighted_slowdown),
            str(s.aged),
            str(s.timed_out),
            str(result.errors.get(name, 0)),
        )
    out.print(table)
    classes = Table(title="mean response time per class (s)")
    classes.add_column("policy")
    names = list(next(iter(result.summaries.values())).per_class)
    for n in names:
        classes.add_column(n, justify="right")
    for name, s in result.summaries.items():
        classes.add_row(name, *(f"{s.per_class[n]['mean_response'].mean:.3g}" for n in names))
    out.print(classes)
