"""``admission simulate``: the admission system in virtual time, policies compared (thesis §5.5).

The options describe the network — closed (N jobs with think time Z, the thesis) or open
(Poisson arrivals at ``--arrival-rate`` λ, or at the rate that makes ``--load`` ρ = λ·Σ_r p_r D_r
with D_r the model's and p_r the mix's shares) — over synthetic workloads of the thesis' Table 5.2
or the classes of a trained model file, and the admission limits; replications run in worker
processes; the result is a table or JSON on stdout, and PNG figures when asked.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from admission.model import EtaModel, ModelError
from admission.policies import POLICIES
from admission.scheduler import DUE_FACTOR
from cli.options import (
    BackfillOption,
    DueFactorOption,
    LifoAfterOption,
    MaxWaitOption,
    OutputFormat,
    QueueTimeoutOption,
    ReleaseAfterOption,
    ShortLaneOption,
    env,
    err,
    fail,
    float_list,
    out,
    parse_mpl,
    parse_size,
    policy_list,
    resolve_lifo_after,
)

if TYPE_CHECKING:
    from admission.sim import SimConfig, Workload
    from admission.sim.study import StudyResult


class EtaSource(StrEnum):
    simulation = "simulation"
    model = "model"


def simulate(
    workload: Annotated[
        str,
        typer.Option(
            help="Synthetic workload (thesis Table 5.2): var-service, var-para, inv-increase, "
            "lin-increase. Ignored with --model.",
            envvar=env("workload"),
        ),
    ] = "var-service",
    mix: Annotated[
        str,
        typer.Option(help="Mix I [.6,.2,.2], II [.2,.6,.2] or III [.2,.2,.6].", envvar=env("mix")),
    ] = "I",
    policies: Annotated[
        str, typer.Option(help="Comma-separated policies to compare.", envvar=env("policies"))
    ] = ",".join(POLICIES),
    jobs: Annotated[
        int,
        typer.Option(help="N: jobs circulating in the closed network.", envvar=env("jobs"), min=1),
    ] = 30,
    cores: Annotated[
        int, typer.Option(help="M: processor-sharing cores.", envvar=env("cores"), min=1)
    ] = 64,
    fcr: Annotated[
        int, typer.Option(help="N_fcr: thread budget (0 = unlimited).", envvar=env("fcr"), min=0)
    ] = 100,
    memory: Annotated[
        str,
        typer.Option(
            help="Memory budget (4GB, 512MiB; 0 = none): each job reserves its class's M_r "
            "from --model (classes without one reserve nothing), as serve --memory does.",
            envvar=env("memory"),
        ),
    ] = "0",
    mpl: Annotated[
        str,
        typer.Option(
            help="Multiprogramming limit (0 = unlimited), or 'auto': tuned as the run goes (as "
            "serve --mpl auto), from the cores.",
            envvar=env("mpl"),
            metavar="N|auto",
        ),
    ] = "0",
    think: Annotated[
        float, typer.Option(help="Mean exponential think time Z.", envvar=env("think"), min=0)
    ] = 5.0,
    completions: Annotated[
        int,
        typer.Option(
            help="Job completions measured per replication.", envvar=env("completions"), min=1
        ),
    ] = 20_000,
    warmup: Annotated[
        int, typer.Option(help="Job completions discarded first.", envvar=env("warmup"), min=0)
    ] = 2_000,
    replications: Annotated[
        int,
        typer.Option(
            help="Independent replications (95% CIs need ≥ 2).", envvar=env("replications"), min=1
        ),
    ] = 5,
    seed: Annotated[int, typer.Option(help="Seed of every random stream.", envvar=env("seed"))] = 1,
    backfill: BackfillOption = False,
    routing: Annotated[
        str,
        typer.Option(
            help="Task placement: random, round-robin or least-loaded.", envvar=env("routing")
        ),
    ] = "random",
    service: Annotated[
        str,
        typer.Option(
            help="Task demands: deterministic (thesis) or exponential.", envvar=env("service")
        ),
    ] = "deterministic",
    class_per_cycle: Annotated[
        bool,
        typer.Option(
            help="Draw each job's class per cycle instead of fixed populations.",
            envvar=env("class_per_cycle"),
        ),
    ] = False,
    max_wait: MaxWaitOption = None,
    queue_timeout: QueueTimeoutOption = None,
    arrival_rate: Annotated[
        float | None,
        typer.Option(
            help="Open network: Poisson arrivals at this rate (jobs per second); --jobs and "
            "--think are then unused.",
            envvar=env("arrival_rate"),
            min=0,
        ),
    ] = None,
    load: Annotated[
        float | None,
        typer.Option(
            help="Open network at offered load ρ: λ = ρ / Σ_r p_r D_r (D_r of the model, p_r "
            "the mix's shares); the rate used is printed.",
            envvar=env("load"),
            min=0,
        ),
    ] = None,
    due_factor: DueFactorOption = None,
    lifo_after: LifoAfterOption = None,
    release_after: ReleaseAfterOption = None,
    short_lane: ShortLaneOption = None,
    tails: Annotated[
        str | None,
        typer.Option(
            help="Classes with a heavy tail, in class order, separated by ';': P,M (a share P of "
            "the class's runs take M times its others, its mean kept) or - (none), e.g. "
            "'-;0.05,40;-'. Each class's D_tail is then set from the FCFS runs, as the live "
            "learning sets it.",
            envvar=env("tails"),
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="Trace-driven: classes and phases from a trained model file.", envvar=env("model")
        ),
    ] = None,
    mix_vector: Annotated[
        str | None,
        typer.Option(
            help="Shares per class, comma-separated (with --model; default: equal).",
            envvar=env("mix_vector"),
        ),
    ] = None,
    eta_source: Annotated[
        EtaSource,
        typer.Option(
            help="Build η from an FCFS simulation (thesis) or take the model file's.",
            envvar=env("eta_source"),
        ),
    ] = EtaSource.simulation,
    output: Annotated[
        OutputFormat, typer.Option("--format", help="table or json.", envvar=env("format"))
    ] = OutputFormat.table,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Write PNG figures (bars per policy, CCDF) to this directory.", envvar=env("plot")
        ),
    ] = None,
    workload_classes: Annotated[
        Path | None,
        typer.Option(
            "--workload-classes",
            help="A workload-classes TOML file (as serve takes): tenants with weights, "
            "priorities and limits; with --tenants, each class's jobs are a tenant's.",
            envvar=env("workload_classes"),
            dir_okay=False,
        ),
    ] = None,
    tenants: Annotated[
        str | None,
        typer.Option(
            help="The tenant of each class, comma-separated in class order (with "
            "--workload-classes), e.g. web,web,reports.",
            envvar=env("tenants"),
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="Worker processes for replications (default: one per core).",
            envvar=env("workers"),
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
    from admission.sim import SimConfig

    chosen = policy_list(policies)
    if arrival_rate is not None and load is not None:
        raise fail("give --arrival-rate or --load, not both")
    mpl_number, mpl_auto = parse_mpl(mpl)
    try:
        work, shares, mix_name, trained = _workload(workload, mix, model, mix_vector)
        rate = arrival_rate
        if load is not None:
            rate = _rate_for_load(load, work, shares, trained, cores, fcr)
        if rate is not None and rate <= 0:
            raise ValueError("an open network needs a positive arrival rate")
        config = SimConfig(
            cores=cores,
            jobs=jobs,
            mix=shares,
            think=think,
            fcr=fcr or None,
            memory=parse_size(memory) or None,
            mpl=mpl_number or None,
            mpl_auto=mpl_auto,
            backfill=backfill,
            max_wait=max_wait,
            queue_timeout=queue_timeout,
            routing=routing,
            service=service,
            class_per_cycle=class_per_cycle,
            arrival_rate=rate,
            due_factor=DUE_FACTOR if due_factor is None else (due_factor or None),
            lifo_after=resolve_lifo_after(lifo_after, queue_timeout),
            release_after=release_after or None,
            short_lane=short_lane,
            tails=_tails(tails, len(shares)),
            completions=completions,
            warmup=warmup,
            **_tenants(workload_classes, tenants, len(shares)),
        )
    except (ValueError, ModelError) as e:
        raise fail(str(e)) from None
    given = _given_eta(eta_source, trained)
    n_workers = workers or min(replications, os.cpu_count() or 1)
    study = _run(work, config, mix_name, chosen, replications, seed, given, n_workers)
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(study.json(), indent=1) + "\n")
    else:
        _print_study(study)
    if plot is not None:
        from lab.figures import write_figures

        for path in write_figures(study, plot):
            err.print(f"wrote {path}")


def _tails(text: str | None, classes: int) -> tuple[tuple[float, float] | None, ...] | None:
    """SimConfig's tails from --tails: one entry per class, P,M or -."""
    if text is None:
        return None
    parts = [x.strip() for x in text.split(";")]
    if len(parts) != classes:
        raise ValueError(
            f"--tails gives {len(parts)} entries for {classes} classes (one per class, in class "
            "order, separated by ';': P,M or -)"
        )
    tails: list[tuple[float, float] | None] = []
    for part in parts:
        if part == "-":
            tails.append(None)
            continue
        try:
            share, times = (float(x) for x in part.split(","))
        except ValueError:
            raise ValueError(
                f"--tails entry {part!r}: P,M (e.g. 0.05,40: one run in 20 takes 40 times the "
                "others) or - (none)"
            ) from None
        tails.append((share, times))
    return tuple(tails)


def _tenants(path: Path | None, names: str | None, classes: int) -> dict[str, Any]:
    """SimConfig's workloads and tenants from --workload-classes and --tenants."""
    from admission.workloads import WorkloadConfig

    if path is None:
        if names is not None:
            raise ValueError("--tenants needs --workload-classes")
        return {}
    config = WorkloadConfig.load(path)
    chosen = tuple(n.strip() for n in (names or "").split(",") if n.strip())
    if len(chosen) != classes:
        raise ValueError(
            f"--tenants names {len(chosen)} tenants for {classes} classes (one per class, "
            "in class order)"
        )
    return {"workloads": config, "tenants": chosen}


def _workload(
    workload: str, mix: str, model: Path | None, mix_vector: str | None
) -> tuple[Workload, tuple[float, ...], str, EtaModel | None]:
    """The classes to simulate, their shares and the mix's name, and the model file if any."""
    from admission.sim import MIXES, Workload, synthetic

    if model is None:
        work = synthetic(workload)
        if mix not in MIXES:
            raise typer.BadParameter(f"--mix must be one of {', '.join(MIXES)}, not {mix!r}")
        return work, MIXES[mix], mix, None
    trained = EtaModel.load(model)
    work = Workload.from_model(trained, model.stem)
    shares = float_list(mix_vector) if mix_vector else (1.0,) * len(work.classes)
    if len(shares) != len(work.classes):
        raise typer.BadParameter(
            f"--mix-vector has {len(shares)} shares; the model has "
            f"{len(work.classes)} classes ({', '.join(c.name for c in work.classes)})"
        )
    return work, shares, mix_vector or "equal", trained


def _rate_for_load(
    load: float,
    work: Workload,
    shares: tuple[float, ...],
    trained: EtaModel | None,
    cores: int,
    fcr: int,
) -> float:
    """λ = ρ / Σ_r p_r D_r: D_r from the model file, or the synthetic classes' phase lengths."""
    model = trained if trained is not None else work.model(cores, fcr or None)
    demands = [c.D for c in model.classes[: len(shares)]]
    mean_demand = sum(p * d for p, d in zip(shares, demands, strict=True)) / sum(shares)
    if mean_demand <= 0:
        raise ValueError("--load needs classes with a positive D_r")
    rate = load / mean_demand
    err.print(
        f"open arrivals: λ = {rate:.4g}/s for ρ = {load:g} "
        f"(Σ p_r D_r = {mean_demand:.4g} s; D_r {', '.join(f'{d:.3g}' for d in demands)})"
    )
    return rate


def _given_eta(source: EtaSource, trained: EtaModel | None) -> EtaModel | None:
    """With ``--eta-source model``, the model file's η (its classes named as the simulator
    names them); otherwise None: the study builds η from its FCFS run."""
    if source is not EtaSource.model:
        return None
    if trained is None:
        raise fail("--eta-source model needs --model FILE")
    return trained.model_copy(
        update={
            "classes": tuple(c.model_copy(update={"fingerprint": c.name}) for c in trained.classes)
        }
    )


def _run(
    work: Workload,
    config: SimConfig,
    mix_name: str,
    policies: list[str],
    replications: int,
    seed: int,
    given: EtaModel | None,
    workers: int,
) -> StudyResult:
    """The study, its replications spread over ``workers`` processes, progress on stderr."""
    from admission.sim.study import run_study

    with err.status("simulating…") as status:

        def progress(message: str) -> None:
            status.update(f"simulating: {message}")

        pool = ProcessPoolExecutor(workers) if workers > 1 else None
        try:
            return run_study(
                work,
                config,
                mix_name=mix_name,
                policies=policies,
                replications=replications,
                seed=seed,
                model=given,
                progress=progress,
                map_fn=pool.map if pool is not None else map,
            )
        except ValueError as e:
            raise fail(str(e)) from None
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)


def _ci(row: dict[str, Any], key: str, digits: int = 3) -> str:
    value, ci = row[key], row.get(f"{key}_ci")
    text = f"{value:.{digits}g}"
    return text + (f" ±{ci:.2g}" if ci is not None else "")


def _print_study(study: StudyResult) -> None:
    cfg = study.config
    network = (
        f"open λ={cfg.arrival_rate:.4g}/s"
        if cfg.arrival_rate is not None
        else f"N={cfg.jobs} Z={cfg.think}"
    )
    out.print(
        f"[bold]{study.workload}[/] mix {study.mix}: {network} M={cfg.cores} "
        f"N_fcr={cfg.fcr or '∞'} MPL={_mpl_text(cfg)} routing={cfg.routing} "
        f"service={cfg.service}, {study.replications} replications × {cfg.completions} "
        "completions; ± is a 95% CI"
    )
    out.print(_class_table(study))
    out.print(_policy_table(study))


def _mpl_text(cfg: SimConfig) -> str:
    if cfg.mpl_auto:
        return f"auto (from {cfg.mpl or cfg.cores})"
    return str(cfg.mpl or "∞")


def _class_table(study: StudyResult) -> Table:
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
    return classes


def _policy_table(study: StudyResult) -> Table:
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
    tuned = study.config.mpl_auto
    if tuned:
        table.add_column("MPL held", justify="right")
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
            *([str(s.mpl_mean)] if tuned else []),
        )
    return table
