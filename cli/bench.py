"""``admission bench``: a TPC-H workload (closed, or open arrivals: Poisson, bursty, a trace)
through the proxy under each policy, compared with no admission control and with a plain FCFS
pool; a table or JSON, and figures.

The bench itself is the lab's (``lab.bench``); this module parses the options and reports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from admission.model import EtaModel, ModelError
from cli.options import (
    BackfillOption,
    DueFactorOption,
    LifoAfterOption,
    MaxTempSizeOption,
    MaxWaitOption,
    MemoryLimitOption,
    OutputFormat,
    QueueTimeoutOption,
    ThreadsOption,
    check_backend,
    env,
    fail,
    limits,
    out,
    parse_embedded_sizes,
    parse_size,
    progress_printer,
)

if TYPE_CHECKING:
    from lab.bench import BenchConfig, BenchResult, Progress


def bench(
    mix: Annotated[
        str,
        typer.Option(
            help="TPC-H mix: light, medium, heavy, all, or queries with optional weights "
            "(6,14,9,18 or 6:4,14:4,9:1,18:1)."
        ),
    ],
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
    clients: Annotated[
        int,
        typer.Option(
            help="Closed-loop clients; with open arrivals, connections opened before the run "
            "(at least 64; more are opened when all are busy).",
            min=1,
        ),
    ] = 16,
    arrivals: Annotated[
        str,
        typer.Option(
            help="closed (clients wait for each answer), poisson (open: statements arrive "
            "whether or not earlier ones finished), bursty (poisson with bursts) or trace."
        ),
    ] = "closed",
    rate: Annotated[
        float | None, typer.Option(help="Open arrivals: statements per second.", min=0)
    ] = None,
    load: Annotated[
        float | None,
        typer.Option(
            help="Open arrivals: offered load ρ; the rate is derived and printed. By default "
            "ρ = λ·Σ p_r D_r (D_r from the model); see --load-basis.",
            min=0,
        ),
    ] = None,
    load_basis: Annotated[
        str,
        typer.Option(
            help="What --load is a share of: 'model' (λ·Σ p_r D_r, each D_r a statement alone "
            "as training measured it) or 'measured' (the statements/s this server completes "
            "of the mix in a closed loop with no admission control — FCFS over the pool with "
            "--pool-size — measured just before the runs: the load on the machine as it is "
            "now, whatever the training run said).",
        ),
    ] = "model",
    capacity_seconds: Annotated[
        float,
        typer.Option(help="--load-basis measured: seconds of the capacity run.", min=1.0),
    ] = 10.0,
    burst_factor: Annotated[
        float, typer.Option(help="bursty: rate multiplier inside a burst.", min=0)
    ] = 2.0,
    burst_every: Annotated[
        float, typer.Option(help="bursty: seconds from one burst's start to the next.", min=0)
    ] = 60.0,
    burst_length: Annotated[float, typer.Option(help="bursty: seconds a burst lasts.", min=0)] = (
        20.0
    ),
    trace: Annotated[
        Path | None,
        typer.Option(help="trace: CSV of offset_seconds,sql rows to replay."),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(help="Open arrivals: per-class SLOs in seconds, e.g. Q6=0.2,Q18=2."),
    ] = None,
    slo_factor: Annotated[
        float | None,
        typer.Option(help="SLO of the classes --slo does not name: k·D_r (default 10).", min=0),
    ] = None,
    max_connections: Annotated[
        int, typer.Option(help="Open arrivals: at most this many connections.", min=1)
    ] = 256,
    think: Annotated[
        float, typer.Option(help="Mean think time between statements, s.", min=0)
    ] = 0.0,
    duration: Annotated[float, typer.Option(help="Seconds per run.", min=1.0)] = 30.0,
    warmup: Annotated[
        float | None,
        typer.Option(help="Seconds not measured at the start of each run (default 10%)."),
    ] = None,
    mpl: Annotated[
        int | None,
        typer.Option(
            help="MPL for every policy but none (0 = unlimited). Default: 4, or the pool size "
            "with --pool-size.",
            min=0,
        ),
    ] = None,
    threads: ThreadsOption = 0,
    memory: Annotated[
        str | None,
        typer.Option(
            help="The memory budget of the POLICY+mem runs (4GB, 512MiB): each statement's "
            "class M_r reserved, as serve --memory does; default, on the embedded DuckDB, 80% "
            "of what its memory_limit leaves beside the data. Runs without +mem have none.",
        ),
    ] = None,
    grant_work_mem: Annotated[
        str | None,
        typer.Option(
            help="In front of PostgreSQL: the work memory of the POLICY+grant runs, in total "
            "(2GB, 512MiB): each admitted statement runs with its share as its work_mem, as "
            "serve --grant-work-mem does. Runs without +grant use the server's work_mem.",
            metavar="SIZE",
        ),
    ] = None,
    pool_size: Annotated[
        int | None,
        typer.Option(
            help="In front of PostgreSQL: transaction pooling (serve --pool-mode transaction) "
            "with this many server connections, shared by all the load's connections; every "
            "policy's MPL is this (--mpl or POLICY@N above it is refused), and fcfs at it is "
            "exactly a PgBouncer pool of this size (none is not a setting then). Default: a "
            "server connection per client.",
            min=1,
        ),
    ] = None,
    memory_limit: MemoryLimitOption = None,
    max_temp_size: MaxTempSizeOption = None,
    backfill: BackfillOption = False,
    max_wait: MaxWaitOption = None,
    queue_timeout: QueueTimeoutOption = None,
    due_factor: DueFactorOption = None,
    lifo_after: LifoAfterOption = None,
    release_after: Annotated[
        float | None,
        typer.Option(
            help="POLICY+release: seconds in service after which a statement gives its MPL "
            "slot to the queue (as serve --release-after). Default: 1. Settings without "
            "+release keep their MPL a hard cap.",
            min=0,
        ),
    ] = None,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: none, fcfs, sept, min-q, min-a, max-u, max-p, …; POLICY@N "
            "runs that policy at MPL N (fcfs@1,fcfs@2,fcfs@4: pools of each size); "
            "POLICY@auto tunes the MPL while it runs (as serve --mpl auto), from --mpl or the "
            "cores; POLICY+learn starts from no model and learns D_r while it runs; POLICY+mem "
            "admits under the memory budget (--memory); POLICY+grant (PostgreSQL) gives each "
            "statement admitted its share of --grant-work-mem as its work_mem; POLICY+release "
            "gives the MPL slot of a statement in service --release-after seconds (default "
            "1) to the queue (as serve --release-after); POLICY+lane admits statements at "
            "least 8 times shorter (by D_r) than the least expected remaining time in service "
            "beside a full MPL (+lane=X: X times; +lane=0: none, also for latency, whose own "
            "lane it is; as serve --short-lane); "
            "latency@N+due=X runs latency with "
            "due factor X (0: no aging) whatever --due-factor says; SETTING+again "
            "runs a listed setting a second time under its own name (an A/A control: the "
            "verdict says how far two runs of one setting differed)."
        ),
    ] = ",".join(("none", "fcfs", "sept", "min-q", "min-a", "max-u", "max-p")),
    repetitions: Annotated[
        int,
        typer.Option(help="Repetitions of every policy, interleaved in a balanced order.", min=1),
    ] = 3,
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
    """Run a TPC-H workload through the proxy under each policy and compare.

    Besides the policies, "none" runs with no admission control at all and "fcfs" with the
    same MPL (what a connection pool gives). The load is a closed loop (--clients, --think) or
    open arrivals (--arrivals poisson|bursty|trace with --rate or --load), where admission
    control can change the mean response time. Results are means over repetitions with 95%
    confidence intervals, measured after a warm-up; every policy of a repetition gets the same
    arrivals.
    """
    from lab.bench import BenchConfig
    from workloads.arrivals import Bursts
    from workloads.tpch.mixes import mix_by_name

    try:
        chosen = _policies(policies)
        check_backend(backend)
        duckdb_limit, temp_limit = parse_embedded_sizes(
            None if backend == "duckdb" else backend, memory_limit, max_temp_size
        )
        config = BenchConfig(
            arrivals=arrivals,
            rate=rate,
            load=load,
            load_basis=load_basis,
            capacity_seconds=capacity_seconds,
            bursts=Bursts(burst_factor, burst_every, burst_length)
            if arrivals == "bursty"
            else None,
            trace=trace,
            slo=_slo_map(slo),
            slo_factor=slo_factor,
            max_connections=max_connections,
            memory=parse_size(memory) if memory is not None else None,
            pool_size=pool_size,
            grant_work_mem=parse_size(grant_work_mem, "--grant-work-mem")
            if grant_work_mem is not None
            else None,
            memory_limit=duckdb_limit,
            max_temp_size=temp_limit,
            mix=mix_by_name(mix),
            backend=backend,
            tpch=tpch,
            clients=clients,
            think=think,
            duration=duration,
            warmup=warmup,
            limits=limits(
                (pool_size or 4) if mpl is None else mpl,
                threads,
                backfill,
                max_wait,
                queue_timeout,
                due_factor,
                lifo_after,
            ),
            release_after=release_after or None,
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
        if config.open:
            written.append(_timeline(result, plot / f"bench-{name}-timeline.png"))
        say(f"wrote {len(written)} figures into {plot}")
    if save is not None:
        save.write_text(json.dumps(result.json(), indent=1) + "\n")
    if output is OutputFormat.json:
        out.print_json(json.dumps(result.json()))
    else:
        _print_result(result)


def _policies(text: str) -> tuple[str, ...]:
    """Comma-separated bench policies: the scheduler's and "none", each optionally @MPL."""
    from lab.bench import parse_policy

    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    if not chosen:
        raise ValueError("unknown policies: the list is empty")
    for p in chosen:
        try:
            parse_policy(p)
        except ValueError as e:
            raise ValueError(f"unknown policies: {e}") from None
    return chosen


def _slo_map(text: str | None) -> dict[str, float]:
    """``Q6=0.2,Q18=2`` → {"Q6": 0.2, "Q18": 2.0}."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, eq, value = part.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if not eq or not name.strip() or not seconds > 0:
            raise ValueError(f"--slo: {part.strip()!r} is not CLASS=SECONDS (e.g. Q6=0.2)")
        out[name.strip()] = seconds
    return out


def _run(config: BenchConfig, trained: EtaModel | None, say: Progress) -> BenchResult:
    """Every run, after training a quick model if none was given; failures end in one line."""
    from lab.bench import quick_model, run_bench

    try:
        model = trained or quick_model(config, say)
        total = len(config.policies) * config.repetitions
        who = f"{config.arrivals} arrivals" if config.open else f"{config.clients} clients"
        say(
            f"{total} runs of {config.duration:g} s: {', '.join(config.policies)} × "
            f"{config.repetitions}, {who}, mix {config.mix.name}, "
            f"MPL {config.limits.mpl or 'unlimited'}"
            + (f", transaction pool of {config.pool_size}" if config.pool_size else "")
        )
        return run_bench(config, model, say)
    except (RuntimeError, ValueError, OSError) as e:
        raise fail(str(e)) from None
    except Exception as e:  # psycopg's connection errors, DuckDB's
        raise fail(f"benchmark failed: {e}") from None


def _print_result(result: BenchResult) -> None:
    """The policies' table, then mean response time per class and policy."""
    c = result.config
    if c.open:
        load = (
            f"{c.arrivals} arrivals, {result.rate:.3g}/s (ρ = {c.load:g} of the measured "
            f"{result.capacity:.3g}/s; by D_r {result.offered_load:.2f})"
            if result.capacity is not None and result.offered_load is not None
            else f"{c.arrivals} arrivals, {result.rate:.3g}/s (ρ = {result.offered_load:.2f})"
            if result.rate is not None and result.offered_load is not None
            else f"{c.arrivals} arrivals"
        )
    else:
        load = f"{c.clients} clients"
    table = Table(
        title=f"{c.backend} TPC-H SF {c.tpch:g}, mix {c.mix.name}, {load}, "
        f"MPL {c.limits.mpl or '∞'}, {c.repetitions} × {c.duration:g} s (95% CI)"
    )
    for col in ("policy", "throughput /s", "mean R (s)", "p95 R (s)", "p99 R (s)", "w. slowdown"):
        table.add_column(col, justify="right")
    if c.open:
        table.add_column("in SLO", justify="right")
        table.add_column("goodput /s", justify="right")
    for col in ("aged", "timeouts", "errors"):
        table.add_column(col, justify="right")
    released = any(s.released for s in result.summaries.values())
    if released:  # POLICY+release: statements that gave their MPL slot back
        table.add_column("released", justify="right")
    spilled = any(r.spill for r in result.runs)
    if spilled:  # DuckDB: its temporary files at their largest; PostgreSQL: temp bytes written
        table.add_column("spill MiB", justify="right")
    for name, s in result.summaries.items():
        extra = []
        if c.open:
            o = result.open[name]
            share = o.slo_attainment
            extra = [
                f"{share.mean:.1%}" + (f" ± {share.ci:.1%}" if share.ci is not None else ""),
                str(o.goodput),
            ]
        table.add_row(
            name,
            str(s.throughput),
            str(s.mean_response),
            str(s.p95_response),
            str(s.p99_response),
            str(s.weighted_slowdown),
            *extra,
            str(s.aged),
            str(s.timed_out),
            str(result.errors.get(name, 0)),
            *([str(s.released)] if released else []),
            *([_spill(result, name)] if spilled else []),
        )
    out.print(table)
    if c.open:
        _print_open(result)
    from lab.bench import verdict

    for line in verdict(result):
        out.print(line)
    names, rest = _shown_classes(result)
    title = "mean response time per class (s)"
    if rest:  # (ad hoc SQL: a class per statement shape; the JSON has every class)
        title += f"; the {len(names)} busiest classes, then the {len(rest)} others together"
    classes = Table(title=title)
    classes.add_column("policy")
    for n in names:
        classes.add_column(n, justify="right")
    if rest:
        classes.add_column(f"{len(rest)} others", justify="right")
    for name, s in result.summaries.items():
        cells = [f"{s.per_class[n]['mean_response'].mean:.3g}" for n in names]
        if rest:
            cells.append(f"{_pooled_mean(s.per_class, rest):.3g}")
        classes.add_row(name, *cells)
    out.print(classes)


SHOWN_CLASSES = 12  # per-class columns printed; the rest in one (all of them in the JSON)


def _shown_classes(result: BenchResult) -> tuple[list[str], list[str]]:
    """The classes the per-class table shows each in a column of its own — all of them, or
    the ``SHOWN_CLASSES`` that completed most statements over all runs — and the rest."""
    names = list(next(iter(result.summaries.values())).per_class)
    if len(names) <= SHOWN_CLASSES:
        return names, []
    done = {
        n: sum(
            s.per_class[n]["throughput"].mean for s in result.summaries.values() if n in s.per_class
        )
        for n in names
    }
    busiest = sorted(names, key=lambda n: -done[n])[:SHOWN_CLASSES]
    shown = [n for n in names if n in busiest]  # (in the order they came)
    return shown, [n for n in names if n not in busiest]


def _pooled_mean(per_class: Mapping[str, Mapping[str, Any]], names: list[str]) -> float:
    """The mean response time of the statements of ``names`` together: each class's mean
    weighted by its throughput (nan when none completed)."""
    weight = total = 0.0
    for n in names:
        m = per_class.get(n)
        if m is None:
            continue
        x, r = m["throughput"].mean, m["mean_response"].mean
        if x > 0 and math.isfinite(r):
            weight, total = weight + x, total + x * r
    return total / weight if weight else math.nan


def _spill(result: BenchResult, policy: str) -> str:
    """What a run of ``policy`` spilled to disk — the embedded DuckDB's temporary files at
    their largest, the bytes PostgreSQL wrote to temporary files — the mean over its
    repetitions with the 95 % interval."""
    from admission.sim.study import Estimate

    peaks = [r.spill / 2**20 for r in result.runs if r.policy == policy]
    return str(Estimate.of(peaks))


def _print_open(result: BenchResult) -> None:
    """The SLOs, errors by SQLSTATE, the generator's health and the queue after bursts."""
    slo = list(result.slo.items())
    slos = ", ".join(f"{k} {v:.3g} s" for k, v in slo[:SHOWN_CLASSES])
    if len(slo) > SHOWN_CLASSES:
        slos += f" and {len(slo) - SHOWN_CLASSES} more classes (in the JSON)"
    out.print(f"SLOs: {slos}")
    for name, o in result.open.items():
        notes = []
        if o.errors_by_sqlstate:
            notes.append(
                "errors " + ", ".join(f"{k}: {v}" for k, v in sorted(o.errors_by_sqlstate.items()))
            )
        if o.late:
            notes.append(f"{o.late} sent > 10 ms late (no free connection)")
        if o.unsent:
            notes.append(f"{o.unsent} never sent")
        if o.recovery:
            notes.append(
                "queue back to its pre-burst level "
                + ", ".join("not within the run" if r is None else f"{r:.1f} s" for r in o.recovery)
                + " after the bursts"
            )
        if notes:
            out.print(f"{name}: " + "; ".join(notes))


def _timeline(result: BenchResult, path: Path) -> Path:
    """The first repetition of every policy over time (queue, in service, response times)."""
    from lab.figures import timeline_figure

    c = result.config
    runs = {}
    for run in result.runs:
        if run.repetition == 0:
            origin = run.load.started
            runs[run.policy] = (
                run.timeline,
                [(s.start - origin, s.response) for s in run.load.ok],
            )
    bursts = c.bursts.windows(c.duration) if c.bursts and c.arrivals == "bursty" else []
    rate = f", {result.rate:.3g}/s" if result.rate is not None else ""
    return timeline_figure(
        runs, path, f"{c.arrivals} arrivals{rate}, mix {c.mix.name}: repetition 1", bursts
    )
