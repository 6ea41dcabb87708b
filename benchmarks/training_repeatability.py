"""How repeatable training is: train N times through the code ``admission train`` uses
(``lab.train``) and compare the models class by class.

Per class: D_r of every run as "estimate [95 % interval] (isolation runs)", the smallest and
largest D_r and their ratio, f_r of every run (with the runs per fork size when they varied),
Q_r [95 % interval] and A_r of every run. Then the order each policy's key gives the classes
in every run — SEPT by D_r, MIN-Q by Q_r, MIN-A by A_r, and every policy's order as the
scheduler admits (classes whose intervals overlap tied, "≈"; for −A^c_r and P_{r,c}, with
each class in service) — and whether the runs
agree (or are compatible: no pair in opposite strict orders); and each run's training
time (the target opened, TPC-H loaded, both phases).

    python -m benchmarks.training_repeatability [--runs 3] [--tpch 1] [--classes 6,14,9,18]
        [--backend duckdb] [--isolation-seconds 40] [--duration 60] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from admission.model import ClassProfile, EtaModel
from admission.policies import POLICIES
from admission.policies.base import order_text, priority_orders
from training.estimate import fork_runs_text

__all__ = ["main", "report"]

ORDERS: dict[str, Callable[[ClassProfile], float]] = {
    "SEPT (D_r)": lambda c: c.D,
    "MIN-Q (Q_r)": lambda c: c.Q,
    "MIN-A (A_r)": lambda c: c.A,
}


def _d(c: ClassProfile) -> str:
    interval = f" [{c.D_low:.4g}, {c.D_high:.4g}]" if c.D_low is not None else ""
    mark = "" if c.converged is not False else " ~"
    return f"{c.D:.4g}{interval} ({c.D_runs}){mark}"


def _q(c: ClassProfile) -> str:
    interval = f" [{c.Q_low:.3g}, {c.Q_high:.3g}]" if c.Q_low is not None else ""
    return f"{c.Q:.3g}{interval}"


def _f(c: ClassProfile) -> str:
    """f_r with the runs by fork size it was taken from when they varied, and the /proc
    samples' when the database reported it ("2 (1: 1, 2: 32; /proc 1: 20, 2: 13)")."""

    shown = [fork_runs_text(c.f_engine)] if len(c.f_engine) > 1 else []
    if c.f_engine and len(c.f_runs) > 1:
        shown.append(f"/proc {fork_runs_text(c.f_runs)}")
    elif not c.f_engine and len(c.f_runs) > 1:
        shown.append(fork_runs_text(c.f_runs))
    return f"{c.f} ({'; '.join(shown)})" if shown else str(c.f)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    line = "  ".join("{:<" + str(w) + "}" for w in widths)
    return [line.format(*header), line.format(*("-" * w for w in widths))] + [
        line.format(*r) for r in rows
    ]


def _compatible(orders: Sequence[list[list[str]]]) -> bool:
    """No two runs put a pair of classes strictly in opposite orders (a tie in one run is
    compatible with either order in another)."""
    ranks = [{n: g for g, names in enumerate(order) for n in names} for order in orders]
    for a in ranks:
        for b in ranks:
            for x in a:
                for y in a:
                    if x in b and y in b and a[x] < a[y] and b[x] > b[y]:
                        return False
    return True


def report(models: Sequence[EtaModel], seconds: Sequence[float]) -> str:
    """The comparison of ``models`` (trained in ``seconds`` each) as plain text tables."""
    names = [c.name for c in models[0].classes]
    runs = range(1, len(models) + 1)
    by_name = [{c.name: c for c in m.classes} for m in models]
    out = [
        "training time: "
        + ", ".join(f"run {i} {s:.1f} s" for i, s in zip(runs, seconds, strict=True))
    ]
    for i, m in enumerate(models, 1):
        if m.speed is not None:
            out.append(
                f"run {i} machine speed: {m.speed.before:,.0f} → {m.speed.after:,.0f} "
                f"({m.speed.change:+.1%}) {m.speed.unit}"
            )
    out.append("")
    header = ["class", *(f"D_r run {i} [95%] (runs)" for i in runs), "min", "max", "max/min"]
    rows = []
    for name in names:
        ds = [b[name].D for b in by_name]
        rows.append(
            [
                name,
                *(_d(b[name]) for b in by_name),
                f"{min(ds):.4g}",
                f"{max(ds):.4g}",
                f"{max(ds) / min(ds):.3f}",
            ]
        )
    out += _table(header, rows)
    speeds = [m.speed for m in models]
    if all(sp is not None for sp in speeds) and len({sp.unit for sp in speeds if sp}) == 1:
        # D_r put on one machine speed (``training.speed.rescale``): what is left of the
        # spread once the machine's own drift between trainings, as the probe saw it, is out
        mean_speed = [(sp.before + sp.after) / 2 for sp in speeds if sp]
        out.append("")
        out.append(
            "D_r × this run's speed / run 1's (the probe's mean of before and after): "
            + ", ".join(
                f"run {i} {v / mean_speed[0]:.3f}" for i, v in zip(runs, mean_speed, strict=True)
            )
        )
        rows = []
        for name in names:
            ds = [b[name].D * v / mean_speed[0] for b, v in zip(by_name, mean_speed, strict=True)]
            rows.append([name, *(f"{d:.4g}" for d in ds), f"{max(ds) / min(ds):.3f}"])
        out += _table(["class", *(f"D_r run {i} rescaled" for i in runs), "max/min"], rows)
    out.append("")
    header = ["class"]
    header += [f"f_r run {i}" for i in runs]
    header += [f"Q_r [95%] run {i}" for i in runs]
    header += [f"A_r run {i}" for i in runs]
    rows = [
        [
            name,
            *(_f(b[name]) for b in by_name),
            *(_q(b[name]) for b in by_name),
            *(f"{b[name].A:.3g}" for b in by_name),
        ]
        for name in names
    ]
    out += _table(header, rows)
    out.append("")
    rows = []
    for policy, key in ORDERS.items():
        orders = [" < ".join(c.name for c in sorted(m.classes, key=key)) for m in models]
        rows.append([policy, *orders, "yes" if len(set(orders)) == 1 else "NO"])
    for name, rule in POLICIES.items():
        if name == "fcfs":
            continue
        found = [priority_orders([c.name for c in m.classes], rule.build(m)) for m in models]
        columns = sorted({c for o in found if isinstance(o, dict) for c in o})
        views = [("", [o if isinstance(o, list) else o.get("", []) for o in found])]
        if columns:  # mix-dependent: compare the order with each class in service
            views = [
                (f" ({c} in service)", [o if isinstance(o, list) else o[c] for o in found])
                for c in columns
            ]
        for suffix, tied in views:
            texts = [order_text(order) for order in tied]
            agree = "yes" if len(set(texts)) == 1 else "compatible" if _compatible(tied) else "NO"
            rows.append([f"{name.upper()} as admitted{suffix}", *texts, agree])
    out += _table(["order", *(f"run {i}" for i in runs), "agree"], rows)
    unconverged = [
        f"run {i}: {', '.join(c.name for c in m.classes if c.converged is False)}"
        for i, m in enumerate(models, 1)
        if any(c.converged is False for c in m.classes)
    ]
    if unconverged:
        out.append("")
        out.append("D_r not within ±5% at 95% (~): " + "; ".join(unconverged))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--classes", default="6,14,9,18")
    parser.add_argument("--backend", default="duckdb")
    parser.add_argument("--isolation-reps", type=int, default=3)
    parser.add_argument("--isolation-seconds", type=float, default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--out-dir", type=Path, default=None, help="also write each model here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    from lab.train import train
    from training.train import TrainConfig

    extra = {} if args.isolation_seconds is None else {"isolation_seconds": args.isolation_seconds}
    config = TrainConfig(
        backend=args.backend,
        tpch=args.tpch,
        classes=tuple(int(q) for q in args.classes.split(",") if q.strip()),
        isolation_reps=args.isolation_reps,
        concurrency=args.concurrency,
        duration=args.duration,
        **extra,
    )
    models, seconds = [], []
    for i in range(1, args.runs + 1):
        print(f"training run {i} of {args.runs} …", flush=True)
        started = time.monotonic()
        result = train(config, progress=lambda line: print(f"  {line}", flush=True))
        seconds.append(time.monotonic() - started)
        models.append(result.model)
        if args.out_dir is not None:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            result.model.save(args.out_dir / f"model-{i}.json")
    print()
    print(report(models, seconds))


if __name__ == "__main__":
    main()
