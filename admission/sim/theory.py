"""Queueing-theory references the simulator is checked against.

- ``mm1_ps_response``: mean response time of an M/M/1 processor-sharing queue, 1/(μ − λ).
- ``mg1_priority_waits``: mean queueing waits of an M/G/1 queue with non-preemptive priority
  classes (Cobham's formula); with one class it is Pollaczek–Khinchine's M/G/1 FCFS wait. The
  simulator at MPL 1 on one core with single-task jobs is such a queue under SEPT (the latency
  policy with its aging off) and under FCFS.
- ``mmc_response``: mean response time of an M/M/c FCFS queue (Erlang C). The simulator with
  single-task jobs, least-loaded routing over 2·m cores, an MPL of m and statements released
  from it as soon as one waits (``Limits.release_after`` → 0) is such a queue with c = 2m.
- ``mva``: exact multiclass Mean Value Analysis of a closed product-form network of
  processor-sharing queues and one delay (think) station (Reiser & Lavenberg). The simulator's
  network with single-task jobs, uniform random routing over M cores, no thread budget and no
  MPL is such a network: each core is a PS queue with class-r demand D_r / M.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MvaResult", "mg1_priority_waits", "mm1_ps_response", "mmc_response", "mva"]


def mm1_ps_response(arrival_rate: float, service_rate: float) -> float:
    if not 0 <= arrival_rate < service_rate:
        raise ValueError("an M/M/1 queue is stable only for 0 ≤ λ < μ")
    return 1.0 / (service_rate - arrival_rate)


def mmc_response(arrival_rate: float, service_rate: float, servers: int) -> float:
    """Mean response time of an M/M/c FCFS queue: 1/μ + C(c, a) / (cμ − λ), a = λ/μ, with
    Erlang's C formula C = (a^c / c!) / ((1 − ρ) Σ_{k<c} a^k / k! + a^c / c!), ρ = a / c."""
    if servers < 1 or not 0 <= arrival_rate < servers * service_rate:
        raise ValueError("an M/M/c queue is stable only for c ≥ 1 and 0 ≤ λ < cμ")
    a = arrival_rate / service_rate
    rho = a / servers
    term, below = 1.0, 0.0  # a^k / k!
    for k in range(servers):
        below += term
        term *= a / (k + 1)
    wait_probability = term / ((1 - rho) * below + term)
    return 1 / service_rate + wait_probability / (servers * service_rate - arrival_rate)


def mg1_priority_waits(
    rates: Sequence[float], means: Sequence[float], second_moments: Sequence[float]
) -> list[float]:
    """Mean wait in queue per class, classes listed highest priority first (Cobham 1954):
    W_k = W_0 / ((1 − σ_{k−1})(1 − σ_k)), W_0 = Σ_i λ_i E[S_i²] / 2, σ_k = Σ_{i≤k} λ_i E[S_i]."""
    if not len(rates) == len(means) == len(second_moments):
        raise ValueError("one rate, mean and second moment per class")
    w0 = sum(lam * m2 for lam, m2 in zip(rates, second_moments, strict=True)) / 2
    waits, sigma = [], 0.0
    for lam, mean in zip(rates, means, strict=True):
        before = sigma
        sigma += lam * mean
        if sigma >= 1:
            raise ValueError("an M/G/1 priority queue is stable only for total load < 1")
        waits.append(w0 / ((1 - before) * (1 - sigma)))
    return waits


@dataclass(frozen=True)
class MvaResult:
    throughput: tuple[float, ...]  # X_r, jobs per unit time
    response: tuple[float, ...]  # R_r, time at the queueing stations (excludes think time)
    queue: tuple[tuple[float, ...], ...]  # queue[k][r]: mean class-r jobs at station k


def mva(
    populations: Sequence[int], demands: Sequence[Sequence[float]], think: Sequence[float]
) -> MvaResult:
    """Exact MVA. ``demands[k][r]``: class-r service demand at PS station k."""
    k_classes = len(populations)
    stations = len(demands)
    # queue lengths for every population vector n ≤ N, filled in order of total population
    queues: dict[tuple[int, ...], list[list[float]]] = {}
    zero = tuple([0] * k_classes)
    queues[zero] = [[0.0] * k_classes for _ in range(stations)]
    vectors = sorted(itertools.product(*(range(n + 1) for n in populations)), key=lambda v: sum(v))
    x_last: list[float] = [0.0] * k_classes
    r_last: list[float] = [0.0] * k_classes
    for n in vectors:
        if n == zero:
            continue
        res = [[0.0] * k_classes for _ in range(stations)]
        x = [0.0] * k_classes
        for r in range(k_classes):
            if n[r] == 0:
                continue
            less = list(n)
            less[r] -= 1
            q_less = queues[tuple(less)]
            for k in range(stations):
                res[k][r] = demands[k][r] * (1 + sum(q_less[k]))
            total = sum(res[k][r] for k in range(stations))
            x[r] = n[r] / (think[r] + total)
        queues[n] = [[x[r] * res[k][r] for r in range(k_classes)] for k in range(stations)]
        if n == tuple(populations):
            x_last = x
            r_last = [sum(res[k][r] for k in range(stations)) for r in range(k_classes)]
    q_final = queues[tuple(populations)]
    return MvaResult(tuple(x_last), tuple(r_last), tuple(tuple(row) for row in q_final))
