"""Learning while serving against a trained model: does a proxy started with no model find the
gain that training gives?

    python -m benchmarks.online_learning --model MODEL.json [--mix 1,2,6,9,11,13,14,18]
        [--tpch 1] [--load 0.95] [--duration 120] [--warmup 60] [--repetitions 3]
        [--policy latency@2] [--baseline fcfs@2] [--load-basis model|measured]
        [--capacity-seconds 10]

Open Poisson arrivals at offered load ``--load`` (ρ from the trained model's D_r) of a TPC-H
mix on the embedded DuckDB, through ``lab.bench`` (what ``admission bench`` runs): per
repetition, interleaved in a new order and on the same arrivals,

- the baseline (FCFS at the same MPL),
- the policy with the trained model, fixed,
- the same policy started from *no model* (``POLICY+learn``): every class begins on the
  default profile and the proxy learns D_r from its statements as they complete
  (``admission.online``, ``proxy.learning``, what ``admission serve`` does by default).

ρ is computed as one server would see it: at MPL 2 on two cores the embedded DuckDB completes
more than 1/Σ p_r D_r statements a second (``benchmarks.overload`` measured 14.7–15.6/s for
this mix at SF 1, against 8.3/s for ρ = 1), so a ``--load`` above 1 is how to get near
saturation, where admission has something to decide.

With ``--load-basis measured`` ρ is a share of the capacity a closed loop with no admission
control measures just before the runs (``admission bench --load-basis``), not of the trained
D_r: the same ``--load`` then means the same on the machine whatever the training run gave.

Only statements that arrive after ``--warmup`` seconds are measured, so the learning run is
judged after that much load. Printed: each contender's mean and p99 response time; the
reduction of the mean against the baseline, paired by repetition, for the trained model and
for the learning run, and the share of the trained model's reduction the learning run reaches
(target ≥ 90 % after 60 s of load) — as the ratio of the mean reductions and, paired by
repetition, as the interval of (learning's reduction − 90 % of the trained model's): the target
is shown when that interval lies above 0; and the D_r the learning run ended with beside the trained
ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from admission.model import EtaModel
from admission.scheduler import Limits
from admission.sim.study import Estimate
from benchmarks.options import add_load_basis, check_load_basis
from lab.bench import BenchConfig, paired_change, paired_changes, repetition_means, run_bench
from workloads.tpch.mixes import mix_by_name

__all__ = ["main"]

TARGET = 0.90


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the trained model")
    parser.add_argument("--mix", default="1,2,6,9,11,13,14,18")
    parser.add_argument("--tpch", type=float, default=1.0)
    parser.add_argument("--load", type=float, default=0.95, help="offered load ρ")
    parser.add_argument(
        "--rate", type=float, help="arrivals at this many statements/s instead of --load"
    )
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds not measured")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--policy", default="latency@2")
    parser.add_argument("--baseline", default="fcfs@2")
    parser.add_argument("--seed", type=int, default=0)
    add_load_basis(parser, "the trained model's D_r")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.duration:
        parser.error("--warmup must be at least 0 and shorter than --duration")
    check_load_basis(parser, args)
    model = EtaModel.load(args.model)
    learning = f"{args.policy}+learn"
    config = BenchConfig(
        mix=mix_by_name(args.mix),
        tpch=args.tpch,
        duration=args.duration,
        warmup=args.warmup,
        limits=Limits(mpl=2),
        policies=(args.baseline, args.policy, learning),
        repetitions=args.repetitions,
        seed=args.seed,
        arrivals="poisson",
        load=args.load if args.rate is None else None,
        rate=args.rate,
        load_basis=args.load_basis,
        capacity_seconds=args.capacity_seconds,
    )
    learned: list[EtaModel] = []
    result = run_bench(config, model, _say, learned=learned)
    s = result.summaries
    basis = (
        f"ρ = {config.load:g} of the measured capacity {result.capacity:.3g}/s, "
        f"{result.offered_load:.3g} by the trained D_r"
        if result.capacity is not None
        else f"ρ = {result.offered_load:.3g} from D_r"
    )
    print(
        f"Poisson arrivals at {result.rate:.3g}/s ({basis}), "
        f"mix {config.mix.name}, "
        f"SF {args.tpch:g}, {args.repetitions} × {args.duration:g} s, the first "
        f"{args.warmup:g} s of each run not measured"
    )
    for name in config.policies:
        label = {
            args.policy: f"{args.policy} (trained model)",
            learning: f"{learning} (no model, learning)",
        }.get(name, name)
        print(
            f"  {label:<36} mean R {s[name].mean_response} s   p99 {s[name].p99_response} s   "
            f"{s[name].throughput}/s"
        )
    trained = paired_change(result, args.policy, args.baseline)
    online = paired_change(result, learning, args.baseline)
    per_trained = paired_changes(result, args.policy, args.baseline)
    per_online = paired_changes(result, learning, args.baseline)
    print("mean R (s) of each repetition:")
    for name in config.policies:
        means = ", ".join(f"{x:.3f}" for x in repetition_means(result, name))
        print(f"  {name:<24} {means}")
    print(f"mean R lower than {args.baseline}, paired by repetition:")
    print(f"  trained model: {trained}   ({', '.join(f'{x:.1%}' for x in per_trained)})")
    print(f"  learning:      {online}   ({', '.join(f'{x:.1%}' for x in per_online)})")
    if trained.mean > 0:
        share = online.mean / trained.mean
        print(
            f"the learning run reaches {share:.0%} of the trained model's reduction (target "
            f"≥ {TARGET:.0%}): {'met' if share >= TARGET else 'NOT met'}"
        )
        margin = Estimate.of([o - TARGET * t for o, t in zip(per_online, per_trained, strict=True)])
        if margin.ci is None:
            verdict = "one repetition: no interval"
        elif margin.mean - margin.ci > 0:
            verdict = "its 95 % interval above 0: shown"
        else:
            verdict = "its 95 % interval reaches 0: not shown"
        print(
            f"  paired: learning's reduction − {TARGET:.0%} of the trained model's = {margin} "
            f"({verdict})"
        )
    else:
        print("the trained model does not lower the mean here: no share to compute")
    if learned:
        last = learned[-1]
        trained_by = {c.fingerprint: c for c in model.classes}
        print("D_r the last learning run ended with, and the trained D_r:")
        ratios = []
        for c in sorted(last.classes, key=lambda c: c.D):
            ref = trained_by.get(c.fingerprint)
            name = ref.name if ref is not None else c.name[:24]
            line = f"  {name:<24} {c.D:.4f} s from {c.live} statements"
            if ref is not None and ref.D > 0:
                line += f"   trained {ref.D:.4f} s (×{c.D / ref.D:.2f})"
                if c.live:
                    ratios.append(c.D / ref.D)
            print(line)
        if ratios:
            print(f"  median learned/trained ×{statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
