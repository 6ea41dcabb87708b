"""What every command of the command line shares: the consoles, option names read from
``ADMISSION_…`` environment variables, the admission-limit options, parsing of lists and
limits, and the one way an error ends a command (a one-line message, exit status 2).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from admission.model import ClassProfile, EtaModel, ModelError
from admission.policies import POLICIES
from admission.policies.base import order_text
from admission.scheduler import DUE_FACTOR, Limits
from admission.units import size_bytes
from training.estimate import fork_quantile

# Piped output (files, CI logs) gets wide tables rather than rich's 80-column default.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)  # messages stay one line each in logs


def env(name: str) -> str:
    """The environment variable an option is also read from: ``max_wait`` → ADMISSION_MAX_WAIT."""
    return f"ADMISSION_{name.upper().replace('-', '_')}"


def fail(message: str) -> typer.Exit:
    """Print ``message`` as the command's one error line; raise what this returns."""
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(2)


def progress_printer() -> Callable[[str], None]:
    """Progress lines on standard error, each with the seconds since the first."""
    started = time.monotonic()

    def show(message: str) -> None:
        err.print(f"[dim]{time.monotonic() - started:7.1f}s[/] {message}")

    return show


RECOMMENDED_POLICY = "latency"
# ``--release-after`` where ``admission serve`` chooses its own MPL (no --mpl: the model's
# recommended one, or tuned from the cores; --mpl auto): a statement of a shape never measured
# cannot take the short lane, and without it two long ad hoc statements would hold a short one
# for their whole run (README "Long statements and the MPL")
DEFAULT_RELEASE_AFTER = 1.0


def recommended_mpl(model: EtaModel) -> int:
    """The MPL ``admission serve`` uses with a model and no --mpl: the cores the model was
    trained on (see the README's "Where admission pays" for the measurements behind it)."""
    return max(1, model.cores)


AUTO = "auto"


def parse_mpl(value: str | None) -> tuple[int | None, bool]:
    """An --mpl value: a whole number ≥ 0 (0 = unlimited), or "auto" (tuned while serving).
    Returns the number (None for auto or not given) and whether it is tuned."""
    if value is None:
        return None, False
    if value.strip().lower() == AUTO:
        return None, True
    try:
        number = int(value)
    except ValueError:
        raise fail(f"--mpl takes a whole number or 'auto', not {value!r}") from None
    if number < 0:
        raise fail(f"--mpl must be 0 (unlimited) or more, not {number}")
    return number, False


def parse_size(value: str, option: str = "--memory") -> int:
    """A size as people and DuckDB write it — 4GB, 512 MiB, 1.5GiB, 1000000 (bytes) — in bytes."""
    size = size_bytes(value)
    if size is None:
        raise fail(f"{option} takes a size such as 4GB, 512MiB or a number of bytes, not {value!r}")
    return size


def parse_memory(value: str | None) -> tuple[int | None, bool]:
    """A --memory value: bytes (None: no budget) and whether it is "auto" — on the embedded
    DuckDB 80 % of what its memory_limit leaves once the data is loaded."""
    if value is None or value.strip().lower() == AUTO:
        return None, True
    return parse_size(value) or None, False


MemoryOption = Annotated[
    str,
    typer.Option(
        help="Memory budget: the statements in service at once may together take this much "
        "at their peaks (each its class's M_r, measured by training). A size (4GB, 512MiB), 0 "
        "for none, or 'auto': on the embedded DuckDB 80% of what its memory_limit leaves once "
        "the data is loaded, in front of PostgreSQL none. A class without a measured M_r "
        "reserves nothing; a statement larger than the whole budget runs alone.",
        envvar=env("memory"),
    ),
]

MemoryLimitOption = Annotated[
    str | None,
    typer.Option(
        help="Embedded DuckDB only: DuckDB's memory_limit (4GB, 512MiB …; default DuckDB's "
        "own, 80% of the machine's memory). An in-memory database's tables count against it; "
        "the memory budget --memory auto is 80% of what it leaves beside them.",
        envvar=env("memory_limit"),
    ),
]
MaxTempSizeOption = Annotated[
    str | None,
    typer.Option(
        help="Embedded DuckDB only: DuckDB's max_temp_directory_size, what statements may "
        "spill to disk together (4GB …; 0: nothing — a statement that outgrows memory_limit "
        "fails with out of memory, 53200; default DuckDB's, 90% of the disk's free space).",
        envvar=env("max_temp_size"),
    ),
]

GrantWorkMemOption = Annotated[
    str | None,
    typer.Option(
        help="In front of PostgreSQL only: work memory granted to the statements admitted, "
        "in total (2GB, 512MiB). Each admitted statement runs with work_mem set to its share — "
        "SIZE/MPL (or, under --threads without an MPL, in proportion to its threads) divided "
        "by its plan's sorts and hash tables per process, as training counted them — so "
        "together they stay within SIZE while each spills less than at the server's work_mem. "
        "Needs an MPL or --threads; a session that sets work_mem itself keeps its own. "
        "Default: no grants (the server's work_mem).",
        envvar=env("grant_work_mem"),
        metavar="SIZE",
    ),
]


def parse_grant(backend: object | None, value: str | None, mpl: int, threads: int) -> int | None:
    """--grant-work-mem in bytes (None: no grants); it needs PostgreSQL and something that
    bounds what runs at once."""
    if value is None:
        return None
    if backend is None:
        raise fail("--grant-work-mem sets PostgreSQL's work_mem: it needs --backend")
    size = parse_size(value, "--grant-work-mem")
    if size <= 0:
        raise fail("--grant-work-mem must be more than 0 (leave it out for no grants)")
    if mpl <= 0 and threads <= 0:
        raise fail(
            "--grant-work-mem divides SIZE among the statements that may run at once: it needs "
            "an MPL (--mpl N or auto) or a thread budget (--threads)"
        )
    return size


def parse_embedded_sizes(
    backend: object | None, memory_limit: str | None, max_temp_size: str | None
) -> tuple[int | None, int | None]:
    """--memory-limit and --max-temp-size in bytes; both are the embedded DuckDB's, so
    neither goes with a ``backend``."""
    sizes = []
    for value, option in ((memory_limit, "--memory-limit"), (max_temp_size, "--max-temp-size")):
        if value is not None and backend is not None:
            raise fail(f"{option} is the embedded DuckDB's: not with --backend")
        sizes.append(None if value is None else parse_size(value, option))
    return sizes[0], sizes[1]


def limits(
    mpl: int,
    threads: int,
    backfill: bool,
    max_wait: float | None,
    queue_timeout: float | None,
    due_factor: float | None = None,
    lifo_after: float | None = None,
    memory: int | None = None,
    release_after: float | None = None,
    short_lane: float | None = None,
) -> Limits:
    """The admission limits the options of serve and bench describe (0 means unlimited; a
    due factor of 0 turns the latency policy's aging off, None keeps its default)."""
    return Limits(
        mpl=mpl or None,
        threads=threads or None,
        memory=memory or None,
        backfill=backfill,
        max_wait=max_wait,
        queue_timeout=queue_timeout,
        due_factor=DUE_FACTOR if due_factor is None else (due_factor or None),
        lifo_after=resolve_lifo_after(lifo_after, queue_timeout),
        release_after=release_after or None,
        short_lane=short_lane,
    )


def resolve_lifo_after(lifo_after: float | None, queue_timeout: float | None) -> float | None:
    """--lifo-after: unset follows --queue-timeout (adaptive LIFO only where the oldest are
    shed by a timeout, never left to starve); 0 turns it off."""
    if lifo_after is None:
        return queue_timeout or None
    if lifo_after and not queue_timeout:
        raise fail(
            "--lifo-after needs --queue-timeout: once the newest go first, only the timeout "
            "admits or sheds the oldest, which would otherwise wait for ever"
        )
    return lifo_after or None


def load_model(path: Path) -> EtaModel:
    """A model file, or the command ends with what is wrong with it."""
    try:
        return EtaModel.load(path)
    except ModelError as e:
        raise fail(str(e)) from None


def policy_list(text: str) -> list[str]:
    """Comma-separated policy names, each one the scheduler knows."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(POLICIES)}"
        )
    return names


def float_list(text: str) -> tuple[float, ...]:
    """Comma-separated shares: non-negative, not all zero."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from None
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise typer.BadParameter("shares must be non-negative and not all zero")
    return values


def check_backend(backend: str) -> None:
    """``duckdb`` or a postgresql:// address (ValueError with what is wrong otherwise)."""
    if backend != "duckdb":
        from proxy.server import parse_backend

        parse_backend(backend)


def class_table(m: EtaModel, title: str) -> Table:
    """A model's class profiles, as ``admission train`` and ``admission model show`` print them:
    D_r as "estimate [95 % interval] (runs)", f_r with its runs per fork size when it varied,
    U_r and Q_r with their 95 % intervals (batch means of the concurrent run) when training
    gave them. The numbers never wrap; the fork-size runs and the fingerprint give way first
    on a narrow terminal."""
    table = Table(title=title)
    for col in (
        "class",
        "D_r [95%] (runs)",
        "f_r",
        "U_r [95%]",
        "Q_r [95%]",
        "A_r",
        "M_r (spill)",
        "count",
        "fingerprint",
    ):
        table.add_column(col, justify="right", no_wrap=col not in ("f_r", "fingerprint"))
    for c in m.classes:
        table.add_row(
            c.name,
            d_text(c),
            f_text(c),
            u_text(c),
            q_text(c),
            f"{c.A:.3g}",
            m_text(c),
            str(c.count),
            c.fingerprint,
        )
    caption = []
    if any(c.converged is False for c in m.classes):
        caption.append("~: D_r's 95% interval did not get within ±5%")
    caption += order_captions(m)
    if any(c.f_engine and c.f_runs and fork_quantile(c.f_runs) != c.f for c in m.classes):
        caption.append(
            "*: f_r is the database's own report; the /proc samples of the runs gave another"
        )
    if m.speed is not None:
        caption.append(
            f"machine speed {m.speed.before:,.0f} before, {m.speed.after:,.0f} after "
            f"({m.speed.change:+.0%}) {m.speed.unit}"
        )
    table.caption = "\n".join(caption) or None
    return table


def d_text(c: ClassProfile) -> str:
    """D_r as "0.0412 [0.0405, 0.0420] (24)", with a mark when it did not converge."""
    text = f"{c.D:.4g}"
    if c.D_low is not None and c.D_high is not None:
        text += f" [{c.D_low:.4g}, {c.D_high:.4g}]"
    if c.D_runs:
        text += f" ({c.D_runs})"
    if c.converged is False:
        text += " ~"
    return text


def m_text(c: ClassProfile) -> str:
    """M_r as "47.1 MiB", with what the class spilled when it did ("140 MiB (+12 MiB)") and,
    in front of PostgreSQL, its plan's work_mem units ("1.1 MiB (+3.3 MiB) ×9 work_mem");
    "-" when not measured."""
    if c.M is None:
        return "-"
    text = _mib(c.M)
    if c.spill:
        text += f" (+{_mib(c.spill)})"
    if c.work_mem_units:
        text += f" ×{c.work_mem_units:.3g} work_mem"
    return text


def _mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 / 10 else f"{n / 2**10:.3g} KiB"


def order_captions(m: EtaModel, most: int = 6) -> list[str]:
    """One line per learned policy: the order it admits the classes in, classes whose 95 %
    intervals overlap tied ("SEPT admits Q6 ≈ Q14 before Q9 before Q18 (≈: tied)"). A
    mix-dependent
    policy (−A^c_r, P_{r,c}) gives the order with one class in service, for each class —
    for at most ``most`` classes; past that, where the model file keeps them."""
    if not m.classes:
        return []
    lines = []
    for name, orders in m.with_eta().orders.items():
        if name == "fcfs":
            continue
        label = name.upper()
        if isinstance(orders, list):
            lines.append(f"{label} admits {order_text(orders, ' before ')} (≈: tied)")
        elif len(orders) <= most:
            parts = [f"with {c} in service {order_text(o, ' before ')}" for c, o in orders.items()]
            lines.append(f"{label} admits, " + "; ".join(parts) + " (≈: tied)")
        else:
            lines.append(f"{label}: its order depends on the mix (per class: orders.{name})")
    return lines


def u_text(c: ClassProfile) -> str:
    """U_r as "0.412 [0.391, 0.433]" (the interval only when training gave one)."""
    text = f"{c.U:.3g}"
    if c.U_low is not None and c.U_high is not None:
        text += f" [{c.U_low:.3g}, {c.U_high:.3g}]"
    return text


def q_text(c: ClassProfile) -> str:
    """Q_r as "1.42 [1.31, 1.53]" (the interval only when training gave one)."""
    text = f"{c.Q:.3g}"
    if c.Q_low is not None and c.Q_high is not None:
        text += f" [{c.Q_low:.3g}, {c.Q_high:.3g}]"
    return text


def f_text(c: ClassProfile) -> str:
    """f_r, and when the runs it was taken from disagreed their distribution: "2 (2: 9, 1:
    3)"; a "*" when the /proc samples' cross-check gives another f_r than the database's
    own report (where f_r was taken from)."""
    text = str(c.f)
    if c.f_varies:
        runs = sorted((c.f_engine or c.f_runs).items(), key=lambda kv: (-kv[1], -kv[0]))
        text += " (" + ", ".join(f"{size}: {n}" for size, n in runs) + ")"
    if c.f_engine and c.f_runs and fork_quantile(c.f_runs) != c.f:
        text += " *"
    return text


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


# Admission limits, shared by every command that runs the scheduler (serve, bench, simulate).
ThreadsOption = Annotated[
    int,
    typer.Option(
        help="Thread budget N_fcr: sum of nominal fork sizes in service (0 = unlimited).",
        envvar=env("threads"),
        min=0,
    ),
]
BackfillOption = Annotated[
    bool,
    typer.Option(
        help="Admit the best statement that fits instead of blocking at the head of the line.",
        envvar=env("backfill"),
    ),
]
MaxWaitOption = Annotated[
    float | None,
    typer.Option(
        help="Aging: a statement queued this many seconds is admitted next.",
        envvar=env("max_wait"),
        min=0,
    ),
]
DueFactorOption = Annotated[
    float | None,
    typer.Option(
        help=f"latency policy: a statement is due — admitted before any not due — after "
        f"waiting this many times its class's D_r (default {DUE_FACTOR:g}; 0: never).",
        envvar=env("due_factor"),
        min=0,
    ),
]
LifoAfterOption = Annotated[
    float | None,
    typer.Option(
        help="Overload: once statements have been waiting without a break for this many "
        "seconds, admit the newest first (the policy still picks the class) and let a full "
        "queue shed its oldest with SQLSTATE 53300 — adaptive LIFO, so the statements "
        "admitted wait little while the oldest are shed. Default: the --queue-timeout, when "
        "one is set; 0: never.",
        envvar=env("lifo_after"),
        min=0,
    ),
]
ReleaseAfterOption = Annotated[
    float | None,
    typer.Option(
        help="A statement in service this many seconds gives its MPL slot to the queue and "
        "runs on beside the MPL (its threads and memory still held), at most MPL of them at "
        "once: a few long statements cannot hold every slot while short ones wait behind "
        "them. In service there are then at most 2 × MPL statements. Default: 1 s where "
        "serve chooses the MPL itself (no --mpl, or --mpl auto), in session pooling; with "
        "an --mpl number, never (0).",
        envvar=env("release_after"),
        min=0,
    ),
]
ShortLaneOption = Annotated[
    float | None,
    typer.Option(
        help="The short lane: with the MPL full, a statement whose class's D_r is at most "
        "1/FACTOR of the least expected remaining time of the statements in service (their "
        "D_r minus the time they have run) is admitted beside the MPL, at most MPL of them at "
        "once — a statement of a millisecond does not wait for a slot that frees in a second. "
        "Only classes whose D_r was measured (trained, or learned live) take it. "
        "Default: the policy's own — 8 for latency (the default with --model), none for the "
        "others; 0: none.",
        envvar=env("short_lane"),
        min=0,
    ),
]
QueueTimeoutOption = Annotated[
    float | None,
    typer.Option(
        help="Fail a statement still queued after this many seconds (SQLSTATE 57014).",
        envvar=env("queue_timeout"),
        min=0,
    ),
]
