"""The short lane in the simulator: which factor, and what it costs the tail.

    python -m benchmarks.short_lane [--workload pair|five|MODEL.json] [--factors 0,8,4,2,1]
                                    [--loads 0.6,0.85,0.95] [--completions 15000] [--tails]

The latency policy at MPL 2 with a short lane of each factor (0: none; a statement passes a
full MPL when its class's D_r is at most 1/factor of the least expected remaining time of
those in service, see ``Limits.short_lane``) against no admission control and FCFS pools of 2
and 4, open Poisson arrivals at each load ρ = λ·Σ p_r D_r, M = 2 cores (the machine of
``benchmarks.open_policies``), 3 replications on the same arrivals. "vs best" is the mean (and
p99) over the best baseline's by mean, paired by replication.

Workloads: ``pair`` is open_policies' synthetic short/long pair (2 tasks × 30 ms and 2 × 250 ms,
shares 0.75/0.25: every job uses both cores); ``five`` has the shape of
``benchmarks.unseen_mix`` (0.3 ms, 1 ms, 3 ms single-threaded; 6.5 ms and 62.5 ms on both
cores; shares 40/20/15/20/5 %), where most statements are far shorter than the few long ones;
a model file gives its trained classes in equal shares.

Measured (3 × 15 000 completions, seed 1; about 25 s a workload); mean/p99 as a fraction of
no admission control, the best baseline in every row:

- ``five``, ρ = 0.6: no lane 1.45/0.68, factor 8 1.24/0.69, 4 1.21/0.70, 2 1.19/0.71, 1 1.20/0.73;
  ρ = 0.85: 1.36/0.64, 1.10/0.65, 1.07/0.66, 1.06/0.66, 1.09/0.68;
  ρ = 0.95: 1.17/0.62, 0.95/0.63, 0.92/0.63, 0.91/0.63, 1.01/0.71.
  Processor sharing (no admission) is the ideal for a mix spanning 200× with no cost of its own;
  the lane takes back half to two thirds of what the MPL costs the short classes, factor 8
  most of what 4 and 2 do, factor 1 starts to cost the tail. (The study's first version, whose
  lane compared D_r floored at 1 ms, measured the same within 0.03.)
- ``pair``: ρ = 0.6 no lane 0.931/0.702, factor 8 0.931/0.702 (it never passes: 30 ms is not an
  eighth of a 250 ms statement's remaining time for long), 4 0.908/0.709, 2 0.891/0.713, 1
  0.883/0.713; ρ = 0.85: 0.711/0.565, 0.710/0.566, 0.683/0.569, 0.668/0.570, 0.660/0.570;
  ρ = 0.95: 0.589/0.524, 0.588/0.524, 0.568/0.528, 0.554/0.531, 0.548/0.533.
- ``--tails`` (factor 8, each class's D_tail set from the run without: what the live learning
  would set): the demo's TPC-H model at ρ 0.85 and 0.95 the same to the digit; ``five`` mean
  and p99 within 1.6 %. (Counting a statement past the tail itself, not twice it, as having
  as long to go as it ran cost TPC-H 2–5 % of mean and p99.)
- The live runs (``benchmarks.unseen_mix``, ``benchmarks.admission_pays``; README) decided the
  factor: 4 lost mean and tail on TPC-H's mix, where its "short" queries are 10–19 ms on both
  cores beside 61–107 ms ones and running them beside the MPL made DuckDB share the cores
  four ways; 8 keeps the lane to statements an order of magnitude shorter.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from admission.model import EtaModel
from admission.sim import SimClass, Workload
from admission.sim.engine import RunResult
from admission.sim.study import Estimate, isolation_demands, replicate, with_tails
from benchmarks.open_policies import CORES, open_config

PAIR = Workload("pair", (SimClass("short", ((2, 0.03),)), SimClass("long", ((2, 0.25),))))
FIVE = Workload(
    "five",
    (
        SimClass("point", ((1, 0.0003),)),
        SimClass("nation", ((1, 0.001),)),
        SimClass("brand", ((1, 0.003),)),
        SimClass("window", ((2, 0.0065),)),
        SimClass("distinct", ((2, 0.0625),)),
    ),
)
# the shape of ``benchmarks.pgbench_mix --long tail``: point lookups, and range queries one in
# 20 of which covers the whole table (40× the others)
# (4 ms and 160 ms, 11.8 ms on average)
TAILED = Workload("tail", (SimClass("lookup", ((1, 0.0015),)), SimClass("range", ((2, 0.0118),))))
WORKLOADS = {"pair": PAIR, "five": FIVE, "tail": TAILED}
SHARES = {"pair": (0.75, 0.25), "five": (0.40, 0.20, 0.15, 0.20, 0.05), "tail": (0.5, 0.5)}
TAILS = {"tail": (None, (0.05, 40.0))}


def _p99(run: RunResult) -> float:
    return float(np.percentile(np.concatenate(run.response_times), 99))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="five", help="pair, five, tail, or a model file")
    parser.add_argument("--factors", default="0,8,4,2,1", help="short lane factors (0: none)")
    parser.add_argument("--loads", default="0.6,0.85,0.95", help="offered loads ρ")
    parser.add_argument("--completions", type=int, default=15_000)
    parser.add_argument("--replications", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--tails",
        action="store_true",
        help="also each lane with the classes' tails (D_tail) the live learning would set: "
        "what 9 in 10 of a class's statements took from admission to completion in the run "
        "without, in the model's units",
    )
    args = parser.parse_args(argv)
    config = replace(open_config(args.completions), tails=TAILS.get(args.workload))
    if args.workload in SHARES:
        work, shares = WORKLOADS[args.workload], SHARES[args.workload]
        demands = isolation_demands(work, replace(config, mix=shares))
        if args.workload in TAILS:  # (its mean, not 200 runs' with a tenth of them long)
            demands = [c.work for c in work.classes]
    else:
        trained = EtaModel.load(Path(args.workload))
        trained = trained.model_copy(
            update={
                "classes": tuple(
                    c.model_copy(update={"fingerprint": c.name}) for c in trained.classes
                )
            }
        )
        work = Workload.from_model(trained, Path(args.workload).stem)
        shares = (1.0,) * len(work.classes)
        demands = [c.D for c in trained.classes]
    model = work.model(CORES, None, demands)
    mean_d = sum(p * d for p, d in zip(shares, demands, strict=True)) / sum(shares)
    names = [c.name for c in work.classes]
    print(
        f"{work.name}: D_r "
        + ", ".join(f"{n} {d:.3g} s" for n, d in zip(names, demands, strict=True))
    )
    for rho in (float(x) for x in args.loads.split(",")):
        cfg = replace(config, mix=shares, arrival_rate=rho / mean_d)
        settings: list[tuple[str, str, int | None, float | None]] = [("none", "fcfs", None, None)]
        settings += [(f"fcfs@{m}", "fcfs", m, None) for m in (2, 4)]
        settings += [
            (f"latency@2 lane {f:g}", "latency", 2, f)
            for f in (float(x) for x in args.factors.split(","))
        ]
        rows: dict[str, list[RunResult]] = {
            label: replicate(
                work,
                replace(cfg, mpl=mpl, short_lane=lane),
                model,
                policy,
                args.replications,
                args.seed,
            )
            for label, policy, mpl, lane in settings
        }
        if args.tails:
            for label, policy, mpl, lane in settings:
                if lane:
                    rows[f"{label} +tail"] = replicate(
                        work,
                        replace(cfg, mpl=mpl, short_lane=lane),
                        with_tails(model, rows[label]),
                        policy,
                        args.replications,
                        args.seed,
                    )
        baselines = [k for k in rows if k == "none" or k.startswith("fcfs")]
        best = min(baselines, key=lambda k: np.mean([r.mean_response() for r in rows[k]]))
        ref_mean = [r.mean_response() for r in rows[best]]
        ref_p99 = [_p99(r) for r in rows[best]]
        print(f"ρ = {rho}: λ = {rho / mean_d:.4g}/s, best baseline {best}")
        print(
            f"  {'setting':20} {'mean R':>9} {'p99 R':>8} {'mean vs best':>15} "
            f"{'p99 vs best':>15}   " + " ".join(f"R {n}" for n in names)
        )
        for label, runs in rows.items():
            means = [r.mean_response() for r in runs]
            p99s = [_p99(r) for r in runs]
            per_class = " ".join(
                f"{np.mean([float(r.response_times[i].mean()) for r in runs]):.3g}"
                for i in range(len(names))
            )
            vs_mean = Estimate.of([a / b for a, b in zip(means, ref_mean, strict=True)])
            vs_p99 = Estimate.of([a / b for a, b in zip(p99s, ref_p99, strict=True)])
            print(
                f"  {label:20} {np.mean(means):9.4g} {np.mean(p99s):8.4g} {vs_mean!s:>15} "
                f"{vs_p99!s:>15}   {per_class}"
            )


if __name__ == "__main__":
    main()
