"""``--mpl auto`` against every static MPL: does the tuned MPL get the best static one's mean R?

    python -m benchmarks.auto_mpl --model MODEL.json [--mix 1,2,6,9,11,13,14,18] [--tpch 1]
        [--policy latency] [--mpls 1,2,3,4] [--scenarios closed,open] [--load 0.95]
        [--clients 8] [--duration 120] [--warmup 40] [--repetitions 3] [--seed 0]
        [--load-basis model|measured] [--capacity-seconds 10] [--why] [--control MPL]

Per scenario, one ``lab.bench`` run (what ``admission bench`` runs) on the embedded DuckDB with
TPC-H: ``POLICY@m`` for every static MPL m and ``POLICY@auto`` — started from the cores of
this machine, with nothing measured — interleaved in a balanced order over repetitions, the open
runs on the same arrivals:

- ``closed``: ``--clients`` clients with no think time, where the mean response time is
  N / X: the MPL that keeps throughput is the one that keeps R;
- ``open``: Poisson arrivals at offered load ``--load`` (ρ from the model's D_r, or with
  ``--load-basis measured`` of the capacity a closed loop with no admission control measures
  just before the runs, as ``admission bench --load-basis`` does).

Only the time after ``--warmup`` seconds counts, so the tuned run is judged after that much
time to find its MPL. Printed per scenario: each contender's throughput, mean and p99 response
time; the best static MPL (lowest mean R); the tuned run's mean R against it, paired by
repetition with a 95 % interval (target: no more than 10 % higher); and the MPL the tuned runs
held after the warm-up, with where each went. With ``--control M``, ``POLICY@M`` runs twice
per repetition (``POLICY@M+again``), and how far the two differed is printed: the size of a
difference this machine makes between identical settings, beside the tuned run's.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from admission.model import EtaModel
from admission.scheduler import Limits
from benchmarks.options import add_load_basis, check_load_basis
from lab.bench import (
    BenchConfig,
    BenchResult,
    aa_line,
    paired_change,
    paired_changes,
    run_bench,
)
from workloads.tpch.mixes import mix_by_name

__all__ = ["main"]

TARGET = 0.10  # the tuned MPL's mean R at most this much above the best static MPL's


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _scenario(args: argparse.Namespace, model: EtaModel, arrivals: str) -> BenchResult:
    policies = (*(f"{args.policy}@{m}" for m in args.mpls), f"{args.policy}@auto")
    if args.control is not None:
        policies += (f"{args.policy}@{args.control}+again",)
    config = BenchConfig(
        mix=mix_by_name(args.mix),
        tpch=args.tpch,
        clients=args.clients,
        duration=args.duration,
        warmup=args.warmup,
        limits=Limits(),  # every contender sets its own MPL; auto starts from the cores
        policies=policies,
        repetitions=args.repetitions,
        seed=args.seed,
        arrivals=arrivals,
        load=args.load if arrivals != "closed" and args.rate is None else None,
        rate=args.rate if arrivals != "closed" else None,
        load_basis=args.load_basis if arrivals != "closed" else "model",
        capacity_seconds=args.capacity_seconds,
    )
    return run_bench(config, model, _say)


def _report(name: str, result: BenchResult, args: argparse.Namespace) -> bool:
    auto = f"{args.policy}@auto"
    statics = [f"{args.policy}@{m}" for m in args.mpls]
    s = result.summaries
    what = (
        f"closed loop, {args.clients} clients, no think time"
        if name == "closed"
        else f"Poisson arrivals at {result.rate:.3g}/s (ρ = {result.offered_load:.3g} from D_r)"
        if result.capacity is None
        else f"Poisson arrivals at {result.rate:.3g}/s (ρ = {result.config.load:g} of the "
        f"measured capacity {result.capacity:.3g}/s, {result.offered_load:.3g} from D_r)"
    )
    print(
        f"\n{name}: {what}; mix {args.mix}, SF {args.tpch:g}, {args.repetitions} × "
        f"{args.duration:g} s, the first {args.warmup:g} s of each run not measured"
    )
    for policy in (*statics, auto):
        print(
            f"  {policy:<16} {s[policy].throughput}/s   mean R {s[policy].mean_response} s   "
            f"p99 {s[policy].p99_response} s"
        )
    best = min(statics, key=lambda p: s[p].mean_response.mean)
    change = paired_change(result, auto, best)
    per = paired_changes(result, auto, best)
    higher = -change.mean
    ok = higher <= TARGET
    print(
        f"  best static MPL: {best}. {auto}'s mean R is {higher:+.1%} against it (paired, "
        f"95 % interval ±{change.ci or float('nan'):.1%}; per repetition "
        f"{', '.join(f'{-x:+.1%}' for x in per)}): target ≤ +{TARGET:.0%} "
        f"{'met' if ok else 'NOT met'}"
    )
    if args.control is not None:
        print("  " + aa_line(result, f"{args.policy}@{args.control}+again"))
    runs = result.json()["policies"][auto]["repetitions"]
    held = ", ".join(f"{r['mpl_mean']:.2f}" for r in runs)
    print(f"  MPL {auto} held after the warm-up, per repetition: {held}")
    for r in runs:
        path = " → ".join(f"{m}@{t:g}s" for t, m in r["mpl_path"])
        print(f"    repetition {r['repetition'] + 1}: {path}")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a trained model")
    parser.add_argument(
        "--mix", default="1,2,6,9,11,13,14,18", help="a named mix or TPC-H queries (6:4,18:1)"
    )
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument(
        "--policy", default="latency", help="the policy every contender runs, at its MPL"
    )
    parser.add_argument(
        "--mpls",
        default="1,2,3,4",
        type=lambda v: [int(x) for x in v.split(",") if x.strip()],
        help="the static MPLs the tuned one is judged against",
    )
    parser.add_argument(
        "--control",
        type=int,
        help="also run POLICY@CONTROL (one of --mpls) a second time: an A/A control that "
        "shows how far two runs of one setting differ here",
    )
    parser.add_argument("--scenarios", default="closed,open", help="closed, open or both")
    parser.add_argument("--load", type=float, default=0.95, help="offered load ρ (open)")
    parser.add_argument(
        "--rate", type=float, help="open arrivals at this many statements/s instead of --load"
    )
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds not measured")
    parser.add_argument(
        "--repetitions", type=int, default=3, help="of each contender, in a balanced order"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="of the arrivals and the order of the runs"
    )
    parser.add_argument("--json", type=Path, help="write each scenario's bench JSON here")
    parser.add_argument(
        "--why", action="store_true", help="print every move of the tuned MPL and its reason"
    )
    add_load_basis(parser, "the model's D_r (open runs)")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.duration:
        parser.error("--warmup must be at least 0 and shorter than --duration")
    check_load_basis(parser, args)
    if args.control is not None and args.control not in args.mpls:
        parser.error(f"--control {args.control} is not among --mpls {args.mpls}")
    scenarios = [x.strip() for x in args.scenarios.split(",") if x.strip()]
    if not scenarios or any(x not in ("closed", "open") for x in scenarios):
        parser.error("--scenarios takes closed, open or both")
    if args.why:  # the proxy logs each move of the adaptive MPL (admission.mpl) at INFO
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(relativeCreated)9.1f ms  %(message)s"))
        mpl_log = logging.getLogger("admission.mpl")
        mpl_log.addHandler(handler)
        mpl_log.setLevel(logging.INFO)
    model = EtaModel.load(args.model)
    met = True
    out = {}
    for name in scenarios:
        result = _scenario(args, model, "closed" if name == "closed" else "poisson")
        met &= _report(name, result, args)
        out[name] = result.json()
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
