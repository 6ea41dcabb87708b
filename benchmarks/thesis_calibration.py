"""The Var-Service calibration table (SPEC §6 / thesis Table 5.3), simulated beside the published
values, for every routing. U is reported raw and as a share of ΣU.

    python -m benchmarks.thesis_calibration [--replications R] [--completions N]
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

from admission.sim import MIXES, ROUTINGS, SimConfig, synthetic
from admission.sim.study import Estimate, p_row_sums, replicate
from admission.sim.thesis import TABLE_5_3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replications", type=int, default=5)
    parser.add_argument("--completions", type=int, default=20_000)
    parser.add_argument("--routing", default=",".join(ROUTINGS))
    args = parser.parse_args()
    w = synthetic("var-service")
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        for routing in args.routing.split(","):
            print(
                f"\n== routing {routing}: {args.replications} replications × "
                f"{args.completions:,} completions, FCFS, deterministic demands; ± = 95% CI"
            )
            print(
                f"{'mix':4}{'class':6}{'Q sim':>14} {'pub':>5} {'A sim':>13} {'pub':>5} "
                f"{'U share sim':>16} {'pub':>5} {'U sim':>15} {'pub':>5} {'ΣP sim':>14} {'pub':>5}"
            )
            gaps = []
            for mix, published in TABLE_5_3.items():
                cfg = SimConfig(
                    mix=MIXES[mix],
                    routing=routing,
                    completions=args.completions,
                    warmup=args.completions // 10,
                )
                runs = replicate(w, cfg, w.model(64, 100), "fcfs", args.replications, 1, pool.map)
                pub_total = sum(p.U for p in published)
                p_sums = [p_row_sums(w.model(64, 100), x) for x in runs]
                for r, pub in enumerate(published):
                    q = Estimate.of([x.Q[r] for x in runs])
                    a = Estimate.of([x.A[r] for x in runs])
                    share = Estimate.of([x.U[r] / sum(x.U) for x in runs])
                    u = Estimate.of([x.U[r] for x in runs])
                    p = Estimate.of([s[r] for s in p_sums])
                    gaps += [abs(q.mean - pub.Q), abs(a.mean - pub.A)]
                    print(
                        f"{mix:4}SC{r + 1:<4}{q!s:>14} {pub.Q:5.1f} {a!s:>13} {pub.A:5.1f} "
                        f"{share!s:>16} {pub.U / pub_total:5.3f} {u!s:>15} {pub.U:5.2f} "
                        f"{p!s:>14} {pub.p_row_sum:5.2f}"
                    )
            print(f"mean |Q − Q_pub|, |A − A_pub|: {sum(gaps) / len(gaps):.2f} tasks")


if __name__ == "__main__":
    main()
