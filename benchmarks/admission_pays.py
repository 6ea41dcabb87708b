"""Where admission control pays: open Poisson arrivals of a mix of short and long statements at
offered loads near saturation, every policy against the two baselines a user has without this
product — no admission control at all ("none") and a plain FCFS pool at its best size — then,
optionally, a burst and the closed loop for contrast.

    python -m benchmarks.admission_pays --model MODEL.json --mix 1,2,6,9,11,13,14,18 --tpch 1 \\
        [--loads 0.85,0.95] [--duration 60] [--repetitions 3] [--recommended latency@2] \\
        [--policies none,fcfs@1,fcfs@2,fcfs@4,sept@2,min-q@2,min-a@2,latency@2] \\
        [--burst] [--closed] [--out-dir out/pays] [--load-basis model|measured]

Runs go through ``lab.bench`` (what ``admission bench`` runs): policies interleaved in a new
order in every repetition, every policy of a repetition fed the same arrivals. Printed per load:
each policy's throughput, mean and p99 response time and SLO attainment (95 % intervals over
repetitions); the best baseline (lowest mean R among none and the FCFS pools); the recommended
policy's reduction of the mean against it, *paired* by repetition (same arrivals) with a 95 %
interval; whether the targets hold (≥ 30 % at ρ = 0.95, ≥ 15 % at ρ = 0.85, p99 no worse,
throughput within 2 %); and, for scale, what M/G/1 theory predicts from the model's D_r for
processor sharing (what "none" approximates) and for non-preemptive shortest-expected-first.
Every run's JSON is written into ``--out-dir``. With ``--load-basis measured`` each ρ is a share
of the capacity measured just before its runs (``admission bench --load-basis``) rather than of
the model's D_r; the targets are then read at that ρ.

``--postgres`` runs the same on a throwaway PostgreSQL cluster of its own (the test suite's
binaries), loading TPC-H at ``--tpch`` and training the model into ``--model`` first when that
file does not exist yet:

    python -m benchmarks.admission_pays --postgres --tpch 0.1 --model out/pg-sf01.json \
        --policies none,fcfs@2,fcfs@4,sept@2,latency@2 --duration 40
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from admission.model import EtaModel
from admission.scheduler import Limits
from lab.bench import (
    BenchConfig,
    BenchResult,
    aa_line,
    baseline,
    control,
    paired_change,
    run_bench,
)
from workloads.arrivals import Bursts
from workloads.tpch.mixes import mix_by_name
from workloads.tpch.queries import Dialect

__all__ = ["main", "mg1_predictions"]

TARGETS = {0.95: 0.30, 0.85: 0.15}


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def mg1_predictions(
    demands: dict[str, float], weights: dict[str, float], rho: float
) -> tuple[float, float]:
    """Mean response time, M/G/1 with deterministic per-class service D_r at load ρ:
    processor sharing E[D]/(1−ρ), and non-preemptive priority to the shorter class
    (Cobham: W_k = W0 / ((1−σ_{k−1})(1−σ_k)), W0 = λE[D²]/2)."""
    names = sorted(demands, key=lambda n: demands[n])
    mean = sum(weights[n] * demands[n] for n in names)
    lam = rho / mean
    ps = mean / (1 - rho)
    w0 = lam * sum(weights[n] * demands[n] ** 2 for n in names) / 2
    sigma, prio = 0.0, 0.0
    for n in names:
        before = sigma
        sigma += lam * weights[n] * demands[n]
        prio += weights[n] * (w0 / ((1 - before) * (1 - sigma)) + demands[n])
    return ps, prio


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))


def report(result: BenchResult, recommended: str, label: str, targets: bool = True) -> list[str]:
    """The table and the verdict for one open scenario."""
    s = result.summaries
    lines = [f"== {label}"]
    header = ["policy", "X /s", "mean R s", "p99 R s", "in SLO"]
    released = any(summary.released for summary in s.values())
    if released:  # POLICY+release: statements that gave their MPL slot back, all repetitions
        header.append("released")
    rows = []
    for name, summary in s.items():
        o = result.open.get(name)
        rows.append(
            [
                name,
                str(summary.throughput),
                str(summary.mean_response),
                str(summary.p99_response),
                f"{o.slo_attainment.mean:.1%}" if o else "",
                *([str(summary.released)] if released else []),
            ]
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines += [_line(header, widths)] + [_line(r, widths) for r in rows]
    lines += [aa_line(result, p) for p in s if control(p)]
    baselines = [p for p in s if baseline(p)]
    if recommended not in s or not baselines:
        return lines
    best = min(baselines, key=lambda p: s[p].mean_response.mean)
    cut = paired_change(result, recommended, best)
    rec, base = s[recommended], s[best]
    lines.append(
        f"best baseline: {best} (mean R {base.mean_response}); {recommended}: mean R "
        f"{rec.mean_response}, {cut.mean:+.1%} lower"
        + (f" (95% CI ± {cut.ci:.1%}, paired by repetition)" if cut.ci is not None else "")
    )
    for other in s:
        if other not in (recommended, best):
            c2 = paired_change(result, recommended, other)
            lines.append(f"  vs {other}: {c2.mean:+.1%}" + (f" ± {c2.ci:.1%}" if c2.ci else ""))
    # the load the run was asked for: of the model's D_r, or of the measured capacity
    rho = result.config.load if result.capacity is not None else result.offered_load
    target = TARGETS.get(round(rho, 2)) if rho is not None and targets else None
    if target is not None:
        p99_ok = rec.p99_response.mean <= base.p99_response.mean
        # open arrivals: throughput is the arrival rate less what is still queued at the end,
        # so the target is "no throughput lost": at most 2 % below the baseline's
        x_ok = rec.throughput.mean / base.throughput.mean - 1 >= -0.02
        met = cut.mean >= target and p99_ok and x_ok
        lines.append(
            f"target at ρ = {rho:g}: mean R ≥ {target:.0%} lower — {cut.mean:.1%}; p99 ≤ "
            f"baseline's — {rec.p99_response.mean:.3g} vs {base.p99_response.mean:.3g}; "
            f"throughput no more than 2% lower — "
            f"{rec.throughput.mean / base.throughput.mean - 1:+.1%}: "
            + ("MET" if met else "NOT MET")
        )
        if not p99_ok:
            lines.append(
                "  (the tail: short-first moves waiting onto the long classes; how much mean "
                "each due factor trades for p99 over many mixes: benchmarks/tail_frontier.py; "
                "latency@2+due=X compares factors here)"
            )
    return lines


def _theory(model: EtaModel, result: BenchResult) -> str:
    from lab.bench import _demands

    c = result.config
    dialect: Dialect = "duckdb" if c.backend == "duckdb" else "postgres"
    demands = _demands(model, c.mix, dialect, c.tpch)
    weights = {f"Q{q}": w for q, w in c.mix.weights.items() if w > 0}
    rho = result.offered_load or 0.0
    if not 0 < rho < 1:
        return "M/G/1: no prediction (ρ ≥ 1)"
    ps, prio = mg1_predictions(demands, weights, rho)
    return (
        f"M/G/1 at ρ = {rho:g} from the model's D_r: processor sharing {ps:.3g} s, "
        f"non-preemptive shortest-expected-first {prio:.3g} s ({1 - prio / ps:.0%} lower)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        type=Path,
        required=True,
        help="the η model (admission train): its D_r set ρ and the policies' order",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="on a PostgreSQL cluster of its own (trains --model there if it does not exist)",
    )
    parser.add_argument(
        "--mix",
        default="1,2,6,9,11,13,14,18",
        help="a named mix or TPC-H queries, optionally weighted (6:4,18:1): 4 short, 4 long",
    )
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument(
        "--backend", default="duckdb", help="duckdb (embedded) or a postgresql:// URL"
    )
    parser.add_argument(
        "--loads", default="0.95,0.85", help="offered loads ρ of the open runs, comma-separated"
    )
    parser.add_argument(
        "--load-basis",
        choices=("model", "measured"),
        default="model",
        help="ρ of the model's D_r (as the targets define it), or of the capacity measured "
        "before each open run (admission bench --load-basis)",
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of arrivals per policy and repetition"
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=3,
        help="repetitions of every policy, interleaved in a balanced order (95 %% intervals)",
    )
    parser.add_argument(
        "--policies",
        default="none,fcfs@1,fcfs@2,fcfs@4,sept@2,min-q@2,min-a@2,latency@2",
        help="what the open runs compare: POLICY@MPL, none (no admission control); "
        "SETTING+again runs a listed one twice (an A/A control: the noise of one setting)",
    )
    parser.add_argument(
        "--recommended",
        default="latency@2",
        help="the contender judged against the best of none and the FCFS pools",
    )
    parser.add_argument("--burst", action="store_true", help="also: a 2× burst of 20 s at ρ=0.85")
    parser.add_argument(
        "--burst-policies", default="none,fcfs@2,latency@2", help="what the burst run compares"
    )
    parser.add_argument("--closed", action="store_true", help="also: the closed loop")
    parser.add_argument(
        "--closed-policies", default="none,fcfs@2,latency@2", help="what the closed run compares"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="of the arrivals and the order of the runs"
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("out/pays"),
        help="where each run's JSON and figures go",
    )
    args = parser.parse_args(argv)
    if args.postgres:
        from testing.pgcluster import start_cluster

        cluster = start_cluster(max_connections=300)
        try:
            args.backend = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
            if not args.model.exists():
                classes = ",".join(str(q) for q in mix_by_name(args.mix).queries)
                train = [
                    str(Path(sys.executable).with_name("admission")),
                    *("train", "--backend", args.backend, "--tpch", f"{args.tpch:g}"),
                    *("--classes", classes, "--out", str(args.model)),
                ]
                print("training:", " ".join(train[1:]), flush=True)
                subprocess.run(train, check=True)
            return _main(args)
        finally:
            cluster.stop()
    return _main(args)


def _main(args: argparse.Namespace) -> int:
    model = EtaModel.load(args.model)
    mix = mix_by_name(args.mix)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    base = BenchConfig(
        mix=mix,
        backend=args.backend,
        tpch=args.tpch,
        duration=args.duration,
        limits=Limits(mpl=2),
        policies=policies,
        repetitions=args.repetitions,
        seed=args.seed,
    )
    lines: list[str] = []

    def run(config: BenchConfig, label: str, stem: str) -> BenchResult:
        result = run_bench(config, model, _say)
        (args.out_dir / f"{stem}.json").write_text(json.dumps(result.json(), indent=1) + "\n")
        return result

    for rho in (float(x) for x in args.loads.split(",") if x.strip()):  # "": the burst only
        config = BenchConfig(
            **{**base.__dict__, "arrivals": "poisson", "load": rho, "load_basis": args.load_basis}
        )
        result = run(config, f"ρ {rho}", f"poisson-{rho:g}")
        label = (
            f"Poisson arrivals at ρ = {rho:g}"
            + (f" of the measured {result.capacity:.3g}/s" if result.capacity else "")
            + f" ({result.rate:.3g}/s), mix {mix.name}, SF "
            f"{args.tpch:g}, {args.repetitions} × {args.duration:g} s"
        )
        block = [*report(result, args.recommended, label), _theory(model, result)]
        print("\n".join(block), flush=True)
        lines += block
    if args.burst:
        bursts = Bursts(factor=2.0, every=60.0, length=20.0)
        config = BenchConfig(
            **{
                **base.__dict__,
                "arrivals": "bursty",
                "load": 0.85,
                "load_basis": args.load_basis,
                "bursts": bursts,
                "duration": max(args.duration, 120.0),
                "policies": tuple(args.burst_policies.split(",")),
            }
        )
        result = run(config, "burst", "bursty-0.85")
        block = report(
            result, args.recommended, "2× burst of 20 s at ρ = 0.85 (60–80 s)", targets=False
        )
        for name, o in result.open.items():
            back = ", ".join("not back" if r is None else f"{r:.1f} s" for r in o.recovery)
            errors = sum(o.errors_by_sqlstate.values())
            block.append(
                f"  {name}: queue back to its pre-burst level after {back}; errors {errors}"
            )
        print("\n".join(block), flush=True)
        lines += block
    if args.closed:
        config = BenchConfig(
            **{
                **base.__dict__,
                "arrivals": "closed",
                "clients": 8,
                "duration": min(args.duration, 30.0),
                "policies": tuple(args.closed_policies.split(",")),
            }
        )
        result = run(config, "closed", "closed")
        s = result.summaries
        block = ["== closed loop, 8 clients, no think time"]
        for name, summary in s.items():
            block.append(
                f"  {name}: X {summary.throughput} /s, mean R {summary.mean_response} s, "
                f"p99 {summary.p99_response} s"
            )
        print("\n".join(block), flush=True)
        lines += block
    (args.out_dir / "report.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
