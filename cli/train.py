"""``admission train``: learn each TPC-H class's profile through the proxy, write the η model
file, its class table and its η heat map.

The measuring is ``training``'s and the target it measures is the lab's; this module parses
the options, draws the progress bars and reports.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from admission.model import EtaModel, ModelError
from cli.options import check_backend, class_table, env, err, fail, out, progress_printer

if TYPE_CHECKING:
    from training.train import TrainConfig, TrainResult


def train(
    backend: Annotated[
        str,
        typer.Option(
            help="duckdb (the embedded in-memory DuckDB) or postgresql://HOST:PORT/DB.",
            envvar=env("backend"),
        ),
    ] = "duckdb",
    tpch: Annotated[
        float, typer.Option(help="TPC-H scale factor to generate and load.", min=0.001)
    ] = 0.1,
    classes: Annotated[
        str, typer.Option(help="TPC-H queries to train: 'all' or a list such as 1,4,9,16,18,21.")
    ] = "all",
    isolation_reps: Annotated[
        int,
        typer.Option(
            help="Least runs of each class alone (D_r, phases, fork size); more are made "
            "until D_r's 95% interval is within ±5% or --isolation-seconds pass.",
            min=1,
        ),
    ] = 3,
    isolation_seconds: Annotated[
        float,
        typer.Option(
            help="Time cap of the isolation runs, all classes together (seconds).", min=0.0
        ),
    ] = 40.0,
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

    First every class runs alone, the classes in turn, until each D_r is known within ±5%
    (D_r, its 95% interval, the fork profile, f_r), then CONCURRENCY clients run the
    classes at once under FCFS while threads and CPU are sampled every Δ (U_r, Q_r, A^c_r).
    The model file is written atomically; Ctrl-C (or SIGTERM) in the concurrent run keeps what
    was measured.
    """
    from training.train import TrainConfig

    try:
        check_backend(backend)
        config = TrainConfig(
            backend=backend,
            tpch=tpch,
            classes=parse_classes(classes),
            isolation_reps=isolation_reps,
            isolation_seconds=isolation_seconds,
            concurrency=concurrency,
            duration=duration,
            interval=interval,
            mpl=mpl or None,
            seed=seed,
        )
    except ValueError as e:
        raise fail(str(e)) from None
    if not out_path.parent.exists():
        raise fail(f"cannot write {out_path}: the directory {out_path.parent} does not exist")
    result = _run(config)
    _report(result, out_path, plot or out_path.with_suffix(".png"), interval)


def parse_classes(text: str) -> tuple[int, ...]:
    """``all`` or TPC-H query numbers, comma-separated (duplicates dropped, order kept)."""
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


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a training run as Ctrl-C does — a partial model from the concurrent run,
    none before it — rather than at once with nothing: what a service manager, a container
    stop or ``kill`` sends, and what reaches a run started in the background, where the shell
    has SIGINT ignored."""

    def interrupt(_signum: int, _frame: object) -> None:
        # once: a second SIGTERM while the run stops ends the process at once, as before
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(config: TrainConfig) -> TrainResult:
    """Both phases with progress lines and bars on stderr; failures end in one line."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from lab.train import train as run_training

    say = progress_printer()
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
            with _terminate_as_interrupt():
                return run_training(config, progress=say, bar=bar)
        except KeyboardInterrupt:
            raise fail("interrupted before the concurrent run: no model written") from None
        except (RuntimeError, ValueError, OSError) as e:
            raise fail(str(e)) from None
        except Exception as e:  # psycopg's connection errors, DuckDB's
            raise fail(f"training failed: {e}") from None


def _speed_against_earlier(model: EtaModel, path: Path) -> str:
    """When ``path`` holds a model trained earlier with the same speed probe and the machine's
    speed has since moved by more than 10 %, a line saying so: the two models' D_r differ by
    about that much for no reason of the workload's (``admission model rescale``)."""
    try:
        before = EtaModel.load(path) if path.exists() else None
    except ModelError:
        return ""
    if before is None or before.speed is None or model.speed is None:
        return ""
    if before.speed.unit != model.speed.unit:
        return ""
    then = (before.speed.before + before.speed.after) / 2
    now = (model.speed.before + model.speed.after) / 2
    if abs(now / then - 1) <= 0.10:
        return ""
    return (
        f"note: the machine ran at {now / then:.0%} of the speed it had when the model this "
        f"replaces was trained ({now:,.0f} vs {then:,.0f} {model.speed.unit}): expect its "
        f"D_r about {then / now:.2g}× those (another load on the machine?)"
    )


def _report(result: TrainResult, out_path: Path, picture: Path, interval: float) -> None:
    """Write the model and its heat map; print the class table and the checks."""
    from lab.figures import eta_heatmap

    earlier = _speed_against_earlier(result.model, out_path)
    result.model.save(out_path)
    written = eta_heatmap(result.model, picture)
    out.print(class_table(result.model, f"{out_path} — {result.model.notes}"))
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
        f"wrote {out_path} and {written}"
        + (" (interrupted: partial run)" if result.interrupted else "")
    )
    if earlier:
        out.print(earlier)
