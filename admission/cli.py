"""The ``admission`` command line: one entry point, a subcommand per job.

This module is the shell around the pure core: it parses options (each also readable from an
``ADMISSION_…`` environment variable), shows progress on stderr, runs replications in worker
processes and prints tables or JSON on stdout. Errors in the input end with a one-line message
and exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from admission.classify import classify_sql
from admission.model import EtaModel, ModelError
from admission.policies import POLICIES
from admission.scheduler import Limits

app = typer.Typer(
    name="admission",
    help="Admission control for in-memory databases: decide which waiting query runs next.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Inspect and check η model files.", no_args_is_help=True)
app.add_typer(model_app, name="model")

# Piped output (files, CI logs) gets wide tables rather than rich's 80-column default.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)  # messages stay one line each in logs


def _limits(
    mpl: int, threads: int, backfill: bool, max_wait: float | None, queue_timeout: float | None
) -> Limits:
    """The admission limits the options of serve and bench describe (0 means unlimited)."""
    return Limits(
        mpl=mpl or None,
        threads=threads or None,
        backfill=backfill,
        max_wait=max_wait,
        queue_timeout=queue_timeout,
    )


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(2)


def _progress_printer() -> Callable[[str], None]:
    """Progress lines on standard error, each with the seconds since the first."""
    started = time.monotonic()

    def show(message: str) -> None:
        err.print(f"[dim]{time.monotonic() - started:7.1f}s[/] {message}")

    return show


def _env(name: str) -> str:
    return f"ADMISSION_{name.upper().replace('-', '_')}"


# Admission limits, shared by every command that runs the scheduler (serve, bench, simulate).
ThreadsOption = Annotated[
    int,
    typer.Option(
        help="Thread budget N_fcr: sum of nominal fork sizes in service (0 = unlimited).",
        envvar=_env("threads"),
        min=0,
    ),
]
BackfillOption = Annotated[
    bool,
    typer.Option(
        help="Admit the best statement that fits instead of blocking at the head of the line.",
        envvar=_env("backfill"),
    ),
]
MaxWaitOption = Annotated[
    float | None,
    typer.Option(
        help="Aging: a statement queued this many seconds is admitted next.",
        envvar=_env("max_wait"),
        min=0,
    ),
]
QueueTimeoutOption = Annotated[
    float | None,
    typer.Option(
        help="Fail a statement still queued after this many seconds (SQLSTATE 57014).",
        envvar=_env("queue_timeout"),
        min=0,
    ),
]


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


class EtaSource(StrEnum):
    simulation = "simulation"
    model = "model"


# -- simulate ------------------------------------------------------------------------------


def _policy_list(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(POLICIES)}"
        )
    return names


def _float_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from None
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise typer.BadParameter("shares must be non-negative and not all zero")
    return values


@app.command()
def simulate(
    workload: Annotated[
        str,
        typer.Option(
            help="Synthetic workload (thesis Table 5.2): var-service, var-para, inv-increase, "
            "lin-increase. Ignored with --model.",
            envvar=_env("workload"),
        ),
    ] = "var-service",
    mix: Annotated[
        str,
        typer.Option(help="Mix I [.6,.2,.2], II [.2,.6,.2] or III [.2,.2,.6].", envvar=_env("mix")),
    ] = "I",
    policies: Annotated[
        str, typer.Option(help="Comma-separated policies to compare.", envvar=_env("policies"))
    ] = ",".join(POLICIES),
    jobs: Annotated[
        int,
        typer.Option(help="N: jobs circulating in the closed network.", envvar=_env("jobs"), min=1),
    ] = 30,
    cores: Annotated[
        int, typer.Option(help="M: processor-sharing cores.", envvar=_env("cores"), min=1)
    ] = 64,
    fcr: Annotated[
        int, typer.Option(help="N_fcr: thread budget (0 = unlimited).", envvar=_env("fcr"), min=0)
    ] = 100,
    mpl: Annotated[
        int, typer.Option(help="Multiprogramming limit (0 = unlimited).", envvar=_env("mpl"), min=0)
    ] = 0,
    think: Annotated[
        float, typer.Option(help="Mean exponential think time Z.", envvar=_env("think"), min=0)
    ] = 5.0,
    completions: Annotated[
        int,
        typer.Option(
            help="Job completions measured per replication.", envvar=_env("completions"), min=1
        ),
    ] = 20_000,
    warmup: Annotated[
        int, typer.Option(help="Job completions discarded first.", envvar=_env("warmup"), min=0)
    ] = 2_000,
    replications: Annotated[
        int,
        typer.Option(
            help="Independent replications (95% CIs need ≥ 2).", envvar=_env("replications"), min=1
        ),
    ] = 5,
    seed: Annotated[
        int, typer.Option(help="Seed of every random stream.", envvar=_env("seed"))
    ] = 1,
    backfill: BackfillOption = False,
    routing: Annotated[
        str,
        typer.Option(
            help="Task placement: random, round-robin or least-loaded.", envvar=_env("routing")
        ),
    ] = "random",
    service: Annotated[
        str,
        typer.Option(
            help="Task demands: deterministic (thesis) or exponential.", envvar=_env("service")
        ),
    ] = "deterministic",
    class_per_cycle: Annotated[
        bool,
        typer.Option(
            help="Draw each job's class per cycle instead of fixed populations.",
            envvar=_env("class_per_cycle"),
        ),
    ] = False,
    max_wait: MaxWaitOption = None,
    queue_timeout: QueueTimeoutOption = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="Trace-driven: classes and phases from a trained model file.", envvar=_env("model")
        ),
    ] = None,
    mix_vector: Annotated[
        str | None,
        typer.Option(
            help="Shares per class, comma-separated (with --model; default: equal).",
            envvar=_env("mix_vector"),
        ),
    ] = None,
    eta_source: Annotated[
        EtaSource,
        typer.Option(
            help="Build η from an FCFS simulation (thesis) or take the model file's.",
            envvar=_env("eta_source"),
        ),
    ] = EtaSource.simulation,
    output: Annotated[
        OutputFormat, typer.Option("--format", help="table or json.", envvar=_env("format"))
    ] = OutputFormat.table,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Write PNG figures (bars per policy, CCDF) to this directory.", envvar=_env("plot")
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="Worker processes for replications (default: one per core).",
            envvar=_env("workers"),
            min=0,
        ),
    ] = 0,
) -> None:
    """Simulate the admission system (thesis §5.5) and compare policies.

    FCFS runs first and its measurements (U_r, Q_r, A^c_r) build the η tables; every policy
    then runs with them. Reports per class U_r, Q_r, A_r, Σ_c P_{r,c} and each policy's rank,
    and per policy throughput, mean/p95/p99 response time and weighted slowdown, all with 95%
    confidence intervals over the replications.
    """
    from admission.sim import MIXES, SimConfig, Workload, synthetic
    from admission.sim.study import run_study

    chosen = _policy_list(policies)
    try:
        if model is not None:
            trained = EtaModel.load(model)
            work = Workload.from_model(trained, model.stem)
            shares = _float_list(mix_vector) if mix_vector else (1.0,) * len(work.classes)
            if len(shares) != len(work.classes):
                raise typer.BadParameter(
                    f"--mix-vector has {len(shares)} shares; the model has "
                    f"{len(work.classes)} classes ({', '.join(c.name for c in work.classes)})"
                )
            mix_name = mix_vector or "equal"
        else:
            work = synthetic(workload)
            if mix not in MIXES:
                raise typer.BadParameter(f"--mix must be one of {', '.join(MIXES)}, not {mix!r}")
            shares, mix_name = MIXES[mix], mix
        config = SimConfig(
            cores=cores,
            jobs=jobs,
            mix=shares,
            think=think,
            fcr=fcr or None,
            mpl=mpl or None,
            backfill=backfill,
            max_wait=max_wait,
            queue_timeout=queue_timeout,
            routing=routing,
            service=service,
            class_per_cycle=class_per_cycle,
            completions=completions,
            warmup=warmup,
        )
    except (ValueError, ModelError) as e:
        raise _fail(str(e)) from None
    given = None
    if eta_source is EtaSource.model:
        if model is None:
            raise _fail("--eta-source model needs --model FILE")
        given = trained.model_copy(
            update={
                "classes": tuple(
                    c.model_copy(update={"fingerprint": c.name}) for c in trained.classes
                )
            }
        )
    n_workers = workers or min(replications, os.cpu_count() or 1)
    with err.status("simulating…") as status:

        def progress(message: str) -> None:
            status.update(f"simulating: {message}")

        pool = ProcessPoolExecutor(n_workers) if n_workers > 1 else None
        try:
            study = run_study(
                work,
                config,
                mix_name=mix_name,
                policies=chosen,
                replications=replications,
                seed=seed,
                model=given,
                progress=progress,
                map_fn=pool.map if pool is not None else map,
            )
        except ValueError as e:
            raise _fail(str(e)) from None
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(study.json(), indent=1) + "\n")
    else:
        _print_study(study)
    if plot is not None:
        from admission.sim.plots import write_figures

        for path in write_figures(study, plot):
            err.print(f"wrote {path}")


def _ci(row: dict[str, Any], key: str, digits: int = 3) -> str:
    value, ci = row[key], row.get(f"{key}_ci")
    text = f"{value:.{digits}g}"
    return text + (f" ±{ci:.2g}" if ci is not None else "")


def _print_study(study: Any) -> None:
    cfg = study.config
    out.print(
        f"[bold]{study.workload}[/] mix {study.mix}: N={cfg.jobs} M={cfg.cores} "
        f"N_fcr={cfg.fcr or '∞'} MPL={cfg.mpl or '∞'} Z={cfg.think} routing={cfg.routing} "
        f"service={cfg.service}, {study.replications} replications × {cfg.completions} "
        "completions; ± is a 95% CI"
    )
    classes = Table(title="classes, measured under FCFS (rank: K = highest priority)")
    for col in ("class", "D_r", "f_r", "U_r", "U_r/ΣU", "Q_r", "A_r", "Σ_c P_{r,c}"):
        classes.add_column(col, justify="right")
    for p in study.policies:
        classes.add_column(p, justify="right")
    for row in study.class_rows():
        ranks = [str(row["rank"][p]) if row["rank"][p] else "-" for p in study.policies]
        classes.add_row(
            row["name"],
            f"{row['D']:.3g}",
            str(row["f"]),
            _ci(row, "U"),
            _ci(row, "U_share"),
            _ci(row, "Q"),
            _ci(row, "A"),
            _ci(row, "P_row_sum", 2),
            *ranks,
        )
    out.print(classes)
    table = Table(title="policies")
    for col in (
        "policy",
        "throughput",
        "mean R",
        "p95 R",
        "p99 R",
        "weighted slowdown",
        "aged",
        "timed out",
    ):
        table.add_column(col, justify="right")
    for name, s in study.policies.items():
        table.add_row(
            name,
            str(s.throughput),
            str(s.mean_response),
            str(s.p95_response),
            str(s.p99_response),
            str(s.weighted_slowdown),
            str(s.aged),
            str(s.timed_out),
        )
    out.print(table)


# -- serve ---------------------------------------------------------------------------------


@app.command()
def serve(
    backend: Annotated[
        str | None,
        typer.Option(
            help="The database: postgresql://HOST:PORT (database and user come from each client)."
            " Without it the proxy hosts an in-memory DuckDB database itself.",
            envvar=_env("backend"),
        ),
    ] = None,
    tpch: Annotated[
        float | None,
        typer.Option(
            help="Embedded DuckDB only: generate TPC-H at this scale factor (cached) and load it.",
            envvar=_env("tpch"),
            min=0.001,
        ),
    ] = None,
    database: Annotated[
        str,
        typer.Option(
            help="Embedded DuckDB only: a database file to open instead of memory.",
            envvar=_env("database"),
        ),
    ] = ":memory:",
    workers: Annotated[
        int,
        typer.Option(
            help="Embedded DuckDB only: worker threads, the most statements DuckDB runs at once.",
            envvar=_env("workers"),
            min=1,
        ),
    ] = 8,
    listen: Annotated[
        str, typer.Option(help="Address to accept clients on, HOST:PORT.", envvar=_env("listen"))
    ] = "127.0.0.1:6432",
    policy: Annotated[
        str, typer.Option(help=f"Admission policy: {', '.join(POLICIES)}.", envvar=_env("policy"))
    ] = "fcfs",
    model: Annotated[
        Path | None,
        typer.Option(help="η model file written by `admission train`.", envvar=_env("model")),
    ] = None,
    mpl: Annotated[
        int,
        typer.Option(
            help="Multiprogramming limit: statements in service at once (0 = unlimited).",
            envvar=_env("mpl"),
            min=0,
        ),
    ] = 0,
    threads: ThreadsOption = 0,
    backfill: BackfillOption = False,
    max_wait: MaxWaitOption = None,
    queue_timeout: QueueTimeoutOption = None,
    max_queue: Annotated[
        int,
        typer.Option(
            help="Statements allowed to wait; more are refused with SQLSTATE 53300.",
            envvar=_env("max_queue"),
            min=1,
        ),
    ] = 10_000,
    max_message: Annotated[
        int,
        typer.Option(
            help="Largest protocol message accepted from a client, in bytes.",
            envvar=_env("max_message"),
            min=1024,
        ),
    ] = 256 * 1024 * 1024,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="Certificate for TLS with clients (with --tls-key).", envvar=_env("tls_cert")
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="Private key for --tls-cert.", envvar=_env("tls_key"))
    ] = None,
    admin: Annotated[
        str | None,
        typer.Option(
            help="Serve the admin API (status, classes, η, policy, limits, metrics) on HOST:PORT;"
            " off unless given.",
            envvar=_env("admin"),
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            help="Bearer token the admin API requires (needed when it listens beyond loopback).",
            envvar=_env("admin_token"),
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error.", envvar=_env("log_level"))
    ] = "info",
) -> None:
    """Run the admission-control proxy in front of a database.

    By default the proxy hosts an in-memory DuckDB database and answers the PostgreSQL protocol
    for it (--tpch SF loads TPC-H into it); with --backend it sits in front of a PostgreSQL
    server. Clients connect here instead of to the database. Every statement is classified by
    its SQL skeleton and waits in the admission queue until the policy admits it under the MPL
    and the thread budget; session control and statements inside a transaction block pass at
    once.
    """
    import logging

    from proxy.app import LOOPBACK, ProxyConfig, run
    from proxy.server import parse_backend

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if backend is not None and (tpch is not None or database != ":memory:"):
        raise _fail("--tpch and --database belong to the embedded DuckDB backend, not --backend")
    if policy not in POLICIES:
        raise _fail(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if (tls_cert is None) != (tls_key is None):
        raise _fail("--tls-cert and --tls-key go together")
    try:
        address = parse_backend(backend) if backend is not None else None
        host, _, port = listen.rpartition(":")
        admin_host, admin_port = None, 6433
        if admin is not None:
            admin_host, _, admin_text = admin.rpartition(":")
            admin_host, admin_port = admin_host or "127.0.0.1", int(admin_text)
            if admin_host not in LOOPBACK and not admin_token:
                raise ValueError(
                    f"the admin API on {admin_host} needs --admin-token: it can change the "
                    "policy and the limits"
                )
        limits = _limits(mpl, threads, backfill, max_wait, queue_timeout)
        loaded = EtaModel.load(model) if model is not None else None
        config = ProxyConfig(
            backend=address,
            listen_host=host or "127.0.0.1",
            listen_port=int(port),
            policy=policy,
            model=loaded,
            model_path=model,
            limits=limits,
            max_queue=max_queue,
            max_message=max_message,
            tls_cert=tls_cert,
            tls_key=tls_key,
            admin_host=admin_host,
            admin_port=admin_port,
            admin_token=admin_token,
            database=database,
            tpch=tpch,
            workers=workers,
        )
    except (ValueError, ModelError) as e:
        raise _fail(str(e)) from None
    try:
        run(config, progress=_progress_printer())
    except (ValueError, RuntimeError, subprocess.CalledProcessError) as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"cannot listen on {listen}: {e.strerror or e}") from None


# -- classify ------------------------------------------------------------------------------


@app.command()
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


# -- model ---------------------------------------------------------------------------------


def _load(path: Path) -> EtaModel:
    try:
        return EtaModel.load(path)
    except ModelError as e:
        raise _fail(str(e)) from None


# -- train ---------------------------------------------------------------------------------


def _parse_classes(text: str) -> tuple[int, ...]:
    if text.strip().lower() == "all":
        return tuple(range(1, 23))
    try:
        numbers = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(
            f"--classes takes 'all' or TPC-H query numbers like 1,4,9, not {text!r}"
        ) from None
    bad = [q for q in numbers if not 1 <= q <= 22]
    if bad or not numbers:
        raise ValueError(f"TPC-H has queries 1 to 22; --classes got {text!r}")
    return tuple(dict.fromkeys(numbers))


@app.command()
def train(
    backend: Annotated[
        str,
        typer.Option(
            help="duckdb (the embedded in-memory DuckDB) or postgresql://HOST:PORT/DB.",
            envvar=_env("backend"),
        ),
    ] = "duckdb",
    tpch: Annotated[
        float, typer.Option(help="TPC-H scale factor to generate and load.", min=0.001)
    ] = 0.1,
    classes: Annotated[
        str, typer.Option(help="TPC-H queries to train: 'all' or a list such as 1,4,9,16,18,21.")
    ] = "all",
    isolation_reps: Annotated[
        int, typer.Option(help="Runs of each class alone (D_r, phases, fork size).", min=1)
    ] = 3,
    concurrency: Annotated[
        int, typer.Option(help="Closed-loop clients in the concurrent FCFS run.", min=1)
    ] = 8,
    duration: Annotated[float, typer.Option(help="Seconds of the concurrent run.", min=1.0)] = 60.0,
    interval: Annotated[
        float, typer.Option(help="Sampling interval Δ in seconds.", min=0.001, max=5.0)
    ] = 0.05,
    mpl: Annotated[
        int, typer.Option(help="MPL of the concurrent run (0 = everything at once).", min=0)
    ] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the query parameters and the mix.")] = 0,
    out_path: Annotated[
        Path, typer.Option("--out", help="Where to write the model file (JSON).")
    ] = Path("model.json"),
    plot: Annotated[
        Path | None,
        typer.Option(help="η heat map PNG (default: beside --out, with .png)."),
    ] = None,
) -> None:
    """Learn each TPC-H class's profile through the proxy and write the η model.

    First every class runs alone (D_r, the fork profile, f_r), then CONCURRENCY clients run the
    classes at once under FCFS while threads and CPU are sampled every Δ (U_r, Q_r, A^c_r).
    The model file is written atomically; Ctrl-C in the concurrent run keeps what was measured.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from training.report import eta_heatmap
    from training.train import TrainConfig
    from training.train import train as run_training

    try:
        if backend != "duckdb":
            from proxy.server import parse_backend

            parse_backend(backend)
        config = TrainConfig(
            backend=backend,
            tpch=tpch,
            classes=_parse_classes(classes),
            isolation_reps=isolation_reps,
            concurrency=concurrency,
            duration=duration,
            interval=interval,
            mpl=mpl or None,
            seed=seed,
        )
    except ValueError as e:
        raise _fail(str(e)) from None
    if not out_path.parent.exists():
        raise _fail(f"cannot write {out_path}: the directory {out_path.parent} does not exist")
    say = _progress_printer()
    with Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bars:

        def bar(name: str, total: int) -> Callable[[int], None]:
            task = bars.add_task(name, total=total)
            return lambda done: bars.update(task, completed=done)

        try:
            result = run_training(config, progress=say, bar=bar)
        except KeyboardInterrupt:
            raise _fail("interrupted before the concurrent run: no model written") from None
        except (RuntimeError, ValueError, OSError) as e:
            raise _fail(str(e)) from None
        except Exception as e:  # psycopg's connection errors, DuckDB's
            raise _fail(f"training failed: {e}") from None
    result.model.save(out_path)
    picture = eta_heatmap(result.model, plot or out_path.with_suffix(".png"))
    out.print(_class_table(result.model, f"{out_path} — {result.model.notes}"))
    checks = result.checks
    os_cpu = (
        f"OS {checks.os_cpu:.2f} s ({checks.cpu_error:.1%} apart)"
        if checks.os_cpu is not None
        else "the OS's count is not visible (remote server)"
    )
    out.print(
        f"window {checks.window:.1f} s, {len(result.load.statements)} statements "
        f"({len(result.load.failed)} failed), {checks.samples} samples\n"
        f"Σ U_r = {checks.u_sum:.3f}; CPU: model {checks.model_cpu:.2f} s, {os_cpu}\n"
        f"sampler: {checks.sampler_cpu:.2%} of one core at Δ = {interval:g} s\n"
        f"wrote {out_path} and {picture}"
        + (" (interrupted: partial run)" if result.interrupted else "")
    )


# -- bench ---------------------------------------------------------------------------------


@app.command()
def bench(
    mix: Annotated[str, typer.Option(help="TPC-H mix: light, medium, heavy or all.")],
    backend: Annotated[
        str,
        typer.Option(
            help="duckdb (embedded, in memory) or postgresql://HOST:PORT/DB.",
            envvar=_env("backend"),
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
    from admission.sim.plots import policy_figures
    from workloads.tpch.bench import ALL_POLICIES, BenchConfig, quick_model, run_bench
    from workloads.tpch.mixes import mix_by_name

    try:
        chosen = tuple(p.strip() for p in policies.split(",") if p.strip())
        unknown = [p for p in chosen if p not in ALL_POLICIES]
        if unknown or not chosen:
            raise ValueError(
                f"unknown policies {unknown or policies!r}; choose from {', '.join(ALL_POLICIES)}"
            )
        if backend != "duckdb":
            from proxy.server import parse_backend

            parse_backend(backend)
        config = BenchConfig(
            mix=mix_by_name(mix),
            backend=backend,
            tpch=tpch,
            clients=clients,
            think=think,
            duration=duration,
            warmup=warmup,
            limits=_limits(mpl, threads, backfill, max_wait, queue_timeout),
            policies=chosen,
            repetitions=repetitions,
            seed=seed,
        )
        if config.warmup_seconds >= duration:
            raise ValueError("--warmup must be shorter than --duration")
        trained = EtaModel.load(model) if model is not None else None
    except (ValueError, ModelError) as e:
        raise _fail(str(e)) from None
    say = _progress_printer()
    try:
        trained = trained or quick_model(config, say)
        total = len(chosen) * repetitions
        say(
            f"{total} runs of {duration:g} s: {', '.join(chosen)} × {repetitions}, "
            f"{clients} clients, mix {config.mix.name}, MPL {mpl or 'unlimited'}"
        )
        result = run_bench(config, trained, say)
    except (RuntimeError, ValueError, OSError) as e:
        raise _fail(str(e)) from None
    except Exception as e:  # psycopg's connection errors, DuckDB's
        raise _fail(f"benchmark failed: {e}") from None
    if plot is not None:
        written = policy_figures(
            result.summaries, plot, f"bench-{config.mix.name}", f"TPC-H {config.mix.name}", "s"
        )
        say(f"wrote {len(written)} figures into {plot}")
    if save is not None:
        save.write_text(json.dumps(result.json(), indent=1) + "\n")
    if output is OutputFormat.json:
        out.print_json(json.dumps(result.json()))
        return
    table = Table(
        title=f"{backend} TPC-H SF {tpch:g}, mix {config.mix.name}, {clients} clients, "
        f"MPL {mpl or '∞'}, {repetitions} × {duration:g} s (95% CI)"
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


def _class_table(m: EtaModel, title: str) -> Table:
    table = Table(title=title)
    for col in ("class", "D_r", "f_r", "U_r", "Q_r", "A_r", "count", "fingerprint"):
        table.add_column(col, justify="right")
    for c in m.classes:
        table.add_row(
            c.name,
            f"{c.D:.4g}",
            str(c.f),
            f"{c.U:.3g}",
            f"{c.Q:.3g}",
            f"{c.A:.3g}",
            str(c.count),
            c.fingerprint,
        )
    return table


@model_app.command("check")
def model_check(path: Path) -> None:
    """Validate a model file: exit 0 if the proxy and the simulator can load it."""
    m = _load(path)
    out.print(f"{path}: ok, {len(m.classes)} classes, backend {m.backend}, version {m.version}")


@model_app.command("show")
def model_show(
    path: Path,
    policy: Annotated[str, typer.Option(help="Whose η matrix to print.")] = "min-a",
) -> None:
    """Print a model's class profiles and one policy's η matrix."""
    m = _load(path)
    if policy not in POLICIES:
        raise _fail(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    out.print(_class_table(m, f"{path} — {m.backend} {m.dataset}, {m.cores} cores"))
    eta = POLICIES[policy].build(m)
    grid = Table(title=f"η for {policy} ({POLICIES[policy].symbol}); row r, column c")
    grid.add_column("r \\ c")
    for c in m.classes:
        grid.add_column(c.name, justify="right")
    for c, row in zip(m.classes, eta.eta, strict=True):
        grid.add_row(c.name, *(f"{v:.3g}" for v in row))
    out.print(grid)


def main() -> None:  # pragma: no cover - console entry point
    app()
