"""Simulator speed: simulated task completions per second of wall-clock time.

    python -m benchmarks.simulator [--completions N]

Prints Var-Service Mix-I under FCFS and min-a (thesis parameters), then how the cost grows with
the number of cores M and of jobs N, and what a full study (4 workloads × 3 mixes × 6 policies
× 5 replications) costs. Single process; the CLI runs replications on every core.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from admission.sim import MIXES, SimConfig, simulate, synthetic
from admission.sim.study import build_model, replicate


def rate(policy: str, completions: int, **kw: object) -> tuple[float, int]:
    w = synthetic("var-service")
    cfg = SimConfig(
        **{
            "mix": MIXES["I"],
            "completions": completions,  # type: ignore[arg-type]
            "warmup": completions // 10,
            **kw,
        }
    )
    base = w.model(cfg.cores, cfg.fcr)
    model = build_model(w, cfg, replicate(w, cfg, base, "fcfs", 1, 9), [2.0, 5.0, 10.0])
    start = time.perf_counter()
    run = simulate(w, cfg, model, policy, np.random.default_rng(1))
    elapsed = time.perf_counter() - start
    total_tasks = run.task_completions * (cfg.warmup + cfg.completions) // cfg.completions
    return total_tasks / elapsed, run.task_completions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--completions", type=int, default=20_000)
    args = parser.parse_args()
    n = args.completions
    print(f"Var-Service Mix-I, N=30 M=64 N_fcr=100, {n:,} job completions per run")
    results = {}
    for policy in ("fcfs", "min-a"):
        r, tasks = rate(policy, n)
        results[policy] = r
        print(f"  {policy:6} {r:12,.0f} task completions/s   ({tasks:,} tasks measured)")
    print("\ncost as M grows (N_fcr = 100·M/64, N = 30·M/64, FCFS), task completions/s:")
    for m in (16, 64, 256):
        r, _ = rate("fcfs", n // 2, cores=m, fcr=max(25, 100 * m // 64), jobs=max(8, 30 * m // 64))
        print(f"  M={m:4}  {r:12,.0f}")
    print("\ncost as N grows (M = 64, N_fcr = 100, FCFS), task completions/s:")
    for jobs in (30, 120, 480):
        r, _ = rate("fcfs", n // 2, jobs=jobs)
        print(f"  N={jobs:4}  {r:12,.0f}")
    slowest = min(results.values())
    runs = 4 * 3 * 6 * 5
    tasks_per_run = (n + n // 10) * 10
    print(
        f"\nfull study (4 workloads × 3 mixes × 6 policies × 5 replications = {runs} runs of "
        f"{n:,} completions): ≈ {runs * tasks_per_run / slowest / 60:.1f} min on one core"
    )
    print(f"task completions per second: {slowest:,.0f}")


if __name__ == "__main__":
    main()
