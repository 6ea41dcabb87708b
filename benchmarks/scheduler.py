"""Scheduler throughput: admission decisions per second, K = 22 classes, every policy.

Two measurements per policy and queue length, taken side by side in one run:

* **decisions/s** — one decision is picking the next job (the policy's O(K) argmax over the
  non-empty classes, ties to the earliest arrival) and granting it (capacity and η·N updates).
  Measured by raising the MPL over a queue of n + B jobs, so B decisions run back to back while
  the queue never holds fewer than n jobs.
* **cycles/s** — a statement's whole life in the scheduler: a completion (release, a decision,
  a grant) and the submission that replaces it, in steady state at MPL 16 / 64 threads.

    python -m benchmarks.scheduler [--decisions N] [--queued 10,10000,100000]

The last line reads ``decisions per second: N`` for the slowest policy with 10,000 queued.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque

from admission import ClassProfile, EtaModel, Limits, Scheduler
from admission.policies import POLICIES

K = 22


def tpch_like_model(rng: random.Random) -> EtaModel:
    classes = tuple(
        ClassProfile(
            fingerprint=f"q{i + 1}",
            name=f"Q{i + 1}",
            D=rng.uniform(0.05, 5.0),
            f=rng.randint(1, 8),
            U=rng.uniform(0.01, 0.3),
            Q=rng.uniform(0.2, 10),
        )
        for i in range(K)
    )
    a = tuple(tuple(rng.uniform(0.2, 12) for _ in range(K)) for _ in range(K))
    return EtaModel(classes=classes, A_matrix=a)


def decisions_per_second(
    policy: str, queued: int, decisions: int, seed: int = 1, lane: float | None = None
) -> float:
    rng = random.Random(seed)
    model = tpch_like_model(rng)
    fps = [c.fingerprint for c in model.classes]
    batch = max(10, min(1000, queued))
    s = Scheduler(model, policy, Limits(mpl=1, short_lane=lane))
    running: list[object] = []
    next_id, now, done, elapsed = 0, 0.0, 0, 0.0
    while done < decisions:
        # untimed: back to one job in service and n + B queued
        s.set_limits(Limits(mpl=1, short_lane=lane), now)
        for job_id in running[:-1]:
            s.complete(job_id, now)
        running = [j.id for j in s._jobs.values() if j.state.value == "running"]
        while s.queued < queued + batch:
            running.extend(j.id for j in s.submit(next_id, fps[rng.randrange(K)], now))
            next_id += 1
        now += 1.0
        start = time.perf_counter()
        granted = s.set_limits(Limits(mpl=1 + batch, short_lane=lane), now)
        elapsed += time.perf_counter() - start
        assert len(granted) == batch and s.queued == queued
        running.extend(j.id for j in granted)
        done += batch
    return done / elapsed


def cycles_per_second(
    policy: str, queued: int, cycles: int, seed: int = 1, lane: float | None = None
) -> float:
    rng = random.Random(seed)
    model = tpch_like_model(rng)
    fps = [c.fingerprint for c in model.classes]
    s = Scheduler(model, policy, Limits(mpl=16, threads=64, short_lane=lane))
    running: deque[object] = deque()
    next_id = 0
    while s.queued < queued:
        running.extend(j.id for j in s.submit(next_id, fps[rng.randrange(K)], 0.0))
        next_id += 1
    draws = [fps[rng.randrange(K)] for _ in range(4096)]
    now, admitted = 0.0, 0
    start = time.perf_counter()
    while admitted < cycles:
        now += 0.001
        granted = s.complete(running.popleft(), now)
        running.extend(j.id for j in granted)
        admitted += len(granted)
        while s.queued < queued:  # keep the queue at its length
            for job in s.submit(next_id, draws[next_id & 4095], now):
                running.append(job.id)
                admitted += 1
            next_id += 1
    elapsed = time.perf_counter() - start
    assert s.queued == queued, (s.queued, queued)
    return admitted / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--queued", default="10,10000,100000")
    args = parser.parse_args()
    sizes = [int(x) for x in args.queued.split(",")]
    print(f"K = {K} classes; higher is better; one process, policies measured in turn")
    header = "".join(f"{f'{n:,} queued':>16}" for n in sizes)
    rows = []
    # (latency with its short lane, the default, and without: what the lane costs)
    for policy, lane in [(p, None) for p in POLICIES] + [("latency", 0.0)]:
        d = [decisions_per_second(policy, n, args.decisions, lane=lane) for n in sizes]
        c = [cycles_per_second(policy, n, args.decisions // 2, lane=lane) for n in sizes]
        rows.append((policy if lane is None else f"{policy} (no lane)", d, c))
    print(f"\ndecisions/s (pick + grant)\n{'policy':18}{header}")
    for policy, d, _ in rows:
        print(f"{policy:18}" + "".join(f"{x:16,.0f}" for x in d))
    print(f"\nstatement cycles/s (complete + decide + submit)\n{'policy':18}{header}")
    for policy, _, c in rows:
        print(f"{policy:18}" + "".join(f"{x:16,.0f}" for x in c))
    at = sizes.index(10_000) if 10_000 in sizes else 0
    print(f"\ndecisions per second: {min(d[at] for _, d, _ in rows):,.0f}")


if __name__ == "__main__":
    main()
