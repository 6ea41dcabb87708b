"""Overload: what a bounded queue and a queue timeout buy when more arrives than the server can do.

    python -m benchmarks.overload [--tpch 1] [--mix 1,2,6,9,11,13,14,18] [--mpl 2]
        [--max-queue 4] [--queue-timeout 0.5] [--factor 3] [--overload 60] [--after 0.5]
        [--recovery 30] [--baseline 30] [--capacity-seconds 15] [--interval 5] [--seed 0]
        [--orders fifo,lifo] [--rounds 1] [--tables]

Open arrivals do not slow down when the server falls behind: past capacity an unbounded queue
grows for as long as the overload lasts, and every statement — the ones that will be answered
too — waits behind all of it. With ``max_queue`` the proxy turns away what does not fit
(SQLSTATE 53300) and with ``queue_timeout`` what waited too long (57014), so the statements it
does admit should keep a response time near what they get at a sustainable load, and the queue
should empty soon after the overload ends. Two queue orders are compared:

- ``fifo``: the oldest first. Under a standing queue every admitted statement has waited
  nearly as long as the queue timeout allows;
- ``lifo``: adaptive LIFO (``lifo_after`` = the queue timeout, ``admission serve``'s default
  when a queue timeout is set): once the queue has not been empty for that long, the newest
  statement is admitted first and a full queue sheds its oldest with 53300 to make room; the
  queue emptying ends it.

Measured on the embedded DuckDB with TPC-H, in ``rounds`` rounds, each:

1. capacity: a closed loop of MPL + ``max_queue`` clients over the mix — the gate always has
   work waiting, however long a client takes between statements, and never more than it may
   queue — whose throughput after a 20 % warm-up is the capacity μ in statements per second;
2. baseline: open Poisson arrivals at ``after`` × μ (0.5 by default) — the admitted statements'
   mean and p99 response time at a sustainable load;
3. per order (their turn alternating between rounds, the same arrivals for each): Poisson
   arrivals at ``factor`` × μ for ``overload`` seconds, then at ``after`` × μ for ``recovery``
   seconds, the gate's queue sampled every 0.1 s.

Printed per run: the admitted statements' response time during the overload against the
round's baseline, split (from the scheduler's own books) into waiting in the queue — which
the queue timeout bounds — and service, slower when both MPL slots are always busy; the shares
shed and the throughput kept; how long after the overload ended the queue was first back to
0. With ``--tables`` also per ``interval``: statements offered (arrived), completed, shed with
53300 and with 57014 and failed otherwise (the last three counted when the client was
answered), the most statements queued, and, for the statements admitted and completed, by
when they arrived: the longest queue wait and the mean and p99 response time (arrival to
answer, the wait included). Then per order over the rounds: each figure's mean with a 95 %
interval, and in how many runs the admitted statements kept the baseline's response time
(mean and p99 within ×1.5).

SF 1 by default: at SF 0.1 these queries take about 25 ms at MPL 2, so 3× capacity is some 250
statements a second, more than the load generator — Python threads in the process that also
runs the proxy — sends on time; at SF 1 (up to 15 a second at capacity here) the database is
what is overloaded. The phases run minutes apart: on a machine shared with other work the
capacity moves between them, so compare the numbers of a run on a quiet machine (the load
generator's count of statements sent late is a symptom).

The statements and their arrivals are the ones ``admission bench`` sends
(``workloads.tpch.load.run_open``, ``workloads.arrivals.poisson``); the proxy is
``lab.target``'s.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from admission.scheduler import Job, JobState, Limits
from lab.target import Target, open_target
from workloads.arrivals import poisson
from workloads.tpch.load import Statement, run_closed, run_open, tpch_arrivals
from workloads.tpch.mixes import Mix, mix_by_name

__all__ = ["main"]

SAMPLE_EVERY = 0.1  # seconds between samples of the gate's queue
TOO_MANY, CANCELED = "53300", "57014"
KEPT = 1.5  # admitted statements keep their response time: mean and p99 within this × baseline


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Config:
    tpch: float
    mix: Mix
    mpl: int
    max_queue: int
    queue_timeout: float
    factor: float
    overload: float
    after: float
    recovery: float
    baseline: float
    capacity_seconds: float
    interval: float
    seed: int


class QueueSampler:
    """The gate's queue length every SAMPLE_EVERY seconds, read on the proxy's own loop."""

    def __init__(self, target: Target) -> None:
        self.samples: list[tuple[float, int]] = []  # (time.monotonic(), queued)
        self._target = target
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        gate = self._target.proxy.gate
        while not self._done.wait(SAMPLE_EVERY):
            queued = self._target.proxy.call(lambda: gate.scheduler.queued)
            self.samples.append((time.monotonic(), queued))

    def stop(self) -> list[tuple[float, int]]:
        self._done.set()
        self._thread.join()
        return self.samples


@dataclass(frozen=True, slots=True)
class Served:
    """One admitted statement as the gate saw it, on ``time.monotonic``'s clock."""

    arrival: float
    wait: float  # in the queue
    service: float  # admission to the end of its reply


class ServedLog:
    """Every admitted statement's queue wait and service time, from the scheduler's
    ``finishes`` observer: a response time alone cannot tell waiting from running slower."""

    def __init__(self, target: Target) -> None:
        self.served: list[Served] = []
        proxy = target.proxy

        # (the gate's clock is ``time.monotonic``: arrivals need no translation)
        proxy.call(lambda: proxy.gate.scheduler.observe(finishes=self._finished))

    def _finished(self, job: Job, now: float) -> None:
        if job.state is JobState.DONE and job.admitted_at is not None and not job.bypass:
            self.served.append(
                Served(job.arrival, job.admitted_at - job.arrival, now - job.admitted_at)
            )

    def between(self, start: float, end: float) -> list[Served]:
        """Statements that arrived in [start, end) (``time.monotonic``)."""
        return [s for s in list(self.served) if start <= s.arrival < end]


def _stats(times: Sequence[float]) -> tuple[float, float]:
    """Mean and 99th percentile (NaN for none)."""
    if not times:
        return float("nan"), float("nan")
    return float(np.mean(times)), float(np.percentile(times, 99))


def measure_capacity(conninfo: str, config: Config) -> float:
    """Statements per second a closed loop that keeps the gate busy completes."""
    load = run_closed(
        conninfo,
        config.mix,
        clients=config.mpl + config.max_queue,
        duration=config.capacity_seconds,
        scale_factor=config.tpch,
        dialect="duckdb",
        seed=config.seed,
    )
    start = load.started + 0.2 * config.capacity_seconds
    done = [s for s in load.ok if start <= s.end <= load.started + config.capacity_seconds]
    if not done:
        raise RuntimeError(f"no statement completed in the capacity run: {load.failed[:3]}")
    return len(done) / (0.8 * config.capacity_seconds)


def run_phase(
    conninfo: str, config: Config, rates: Sequence[tuple[float, float]], seed: int
) -> tuple[list[Statement], float, int, int]:
    """Poisson arrivals at each (rate, seconds) in turn; the statements, the run's start
    (``time.monotonic``), how many were sent late and how many never sent."""
    rng = random.Random(seed)
    offsets: list[float] = []
    at = 0.0
    for rate, seconds in rates:
        offsets.extend(at + t for t in poisson(rate, seconds, rng))
        at += seconds
    arrivals = tpch_arrivals(
        offsets, config.mix, scale_factor=config.tpch, dialect="duckdb", seed=seed
    )
    load = run_open(
        conninfo,
        arrivals,
        duration=at,
        connections=64,
        max_connections=256,
        drain=max(30.0, 3 * config.queue_timeout),
    )
    return load.statements, load.started, load.late, load.unsent


def interval_table(
    statements: Sequence[Statement],
    origin: float,
    samples: Sequence[tuple[float, int]],
    log: ServedLog,
    config: Config,
) -> list[str]:
    """One line per interval of the overload run (see the module docstring)."""
    length = config.overload + config.recovery
    n = int(np.ceil(length / config.interval))
    header = (
        f"{'interval s':<11} {'offered':>7} {'done':>5} {'53300':>5} {'57014':>5} "
        f"{'other':>5} {'queue≤':>6} {'wait≤ s':>7} {'mean R s':>8} {'p99 R s':>8}"
    )
    lines = [header]
    for i in range(n):
        a, b = i * config.interval, min((i + 1) * config.interval, length)

        def inside(t: float, a: float = a, b: float = b) -> bool:
            return a <= t - origin < b

        offered = sum(1 for s in statements if inside(s.start))
        answered = [s for s in statements if inside(s.end)]
        done = sum(1 for s in answered if s.sqlstate is None)
        too_many = sum(1 for s in answered if s.sqlstate == TOO_MANY)
        canceled = sum(1 for s in answered if s.sqlstate == CANCELED)
        other = len(answered) - done - too_many - canceled
        queued = max((q for t, q in samples if inside(t)), default=0)
        wait = max((x.wait for x in log.between(origin + a, origin + b)), default=0.0)
        mean, p99 = _stats(
            [s.response for s in statements if s.sqlstate is None and inside(s.start)]
        )
        phase = "*" if b <= config.overload else " "
        lines.append(
            f"{a:4.0f}–{b:<4.0f}{phase}  {offered:7d} {done:5d} {too_many:5d} {canceled:5d} "
            f"{other:5d} {queued:6d} {wait:7.3f} {mean:8.3f} {p99:8.3f}"
        )
    lines.append(f"(* overload at {config.factor:g}× capacity; then {config.after:g}×)")
    return lines


@dataclass(frozen=True)
class Verdict:
    """One overload run against its round's baseline."""

    order: str
    mean_ratio: float  # admitted mean R during the overload / the baseline's
    p99_ratio: float
    wait: float  # admitted mean queue wait during the overload, s
    wait_added: float  # … minus the baseline's
    service_added: float  # mean service during the overload minus the baseline's, s
    longest_wait: float
    shed_share: float  # of the statements offered, answered 53300 or 57014
    throughput_share: float  # completed per second / capacity
    recovery: float | None  # seconds after the overload until the queue was first empty
    after_ratio: float  # mean R after the overload / the baseline's


def summary(
    baseline: Sequence[Statement],
    baseline_origin: float,
    statements: Sequence[Statement],
    origin: float,
    samples: Sequence[tuple[float, int]],
    log: ServedLog,
    capacity: float,
    config: Config,
    order: str,
) -> tuple[Verdict, list[str]]:
    """The verdict: response time kept (and why not: waiting, or running slower), throughput
    kept, the queue's recovery."""
    base_mean, base_p99 = _stats([s.response for s in baseline if s.sqlstate is None])
    base_served = log.between(baseline_origin, baseline_origin + config.baseline)
    settle = config.interval  # the first interval fills the queue: not the steady overload
    during = [s for s in statements if settle <= s.start - origin < config.overload]
    admitted = [s.response for s in during if s.sqlstate is None]
    mean, p99 = _stats(admitted)
    served = log.between(origin + settle, origin + config.overload)
    too_many = sum(1 for s in during if s.sqlstate == TOO_MANY)
    canceled = sum(1 for s in during if s.sqlstate == CANCELED)
    completed = sum(
        1 for s in statements if s.sqlstate is None and settle <= s.end - origin < config.overload
    )
    throughput = completed / (config.overload - settle)
    end = origin + config.overload
    back = next((t - end for t, q in samples if t >= end and q == 0), None)
    after = [
        s.response
        for s in statements
        if s.sqlstate is None and config.overload + config.interval <= s.start - origin
    ]
    after_mean, after_p99 = _stats(after)
    base_service = float(np.mean([x.service for x in base_served])) if base_served else 0.0
    service = float(np.mean([x.service for x in served])) if served else 0.0
    base_wait = float(np.mean([x.wait for x in base_served])) if base_served else 0.0
    wait = float(np.mean([x.wait for x in served])) if served else 0.0
    longest = max((x.wait for x in served), default=0.0)
    verdict = Verdict(
        order=order,
        mean_ratio=mean / base_mean,
        p99_ratio=p99 / base_p99,
        wait=wait,
        wait_added=wait - base_wait,
        service_added=service - base_service,
        longest_wait=longest,
        shed_share=(too_many + canceled) / max(len(during), 1),
        throughput_share=throughput / capacity,
        recovery=back,
        after_ratio=after_mean / base_mean,
    )
    lines = [
        f"baseline at {config.after:g}× (admitted): mean R {base_mean:.3f} s, p99 "
        f"{base_p99:.3f} s; of it, mean wait {base_wait:.3f} s and mean service "
        f"{base_service:.3f} s",
        f"overload at {config.factor:g}×, {order} (arrived {settle:g}–{config.overload:g} s): "
        f"{len(admitted)} admitted, {too_many} shed with 53300 and {canceled} with 57014 "
        f"({verdict.shed_share:.0%} of {len(during)} offered); admitted mean R {mean:.3f} s "
        f"(×{verdict.mean_ratio:.2f} the baseline), p99 {p99:.3f} s "
        f"(×{verdict.p99_ratio:.2f}); of it, mean wait {wait:.3f} s (longest {longest:.3f} s, "
        f"queue_timeout {config.queue_timeout:g} s) and mean service {service:.3f} s "
        f"(×{service / base_service:.2f}, every MPL slot busy)",
        f"throughput during the overload {throughput:.2f}/s = {verdict.throughput_share:.0%} "
        "of capacity",
        f"after the overload (arrived from {config.overload + config.interval:g} s): mean R "
        f"{after_mean:.3f} s (×{verdict.after_ratio:.2f} the baseline), p99 {after_p99:.3f} s",
        "queue: not back to 0 before the end of the run"
        if back is None
        else f"queue: back to 0 {back:.1f} s after the overload ended",
    ]
    return verdict, lines


def _interval(values: Sequence[float]) -> str:
    """Mean and a 95 % t interval over the rounds (just the value for one round)."""
    xs = [v for v in values if v == v]  # (NaN: a round without the figure)
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    m = float(np.mean(xs))
    half = T95.get(len(xs) - 1, 1.96) * float(np.std(xs, ddof=1)) / len(xs) ** 0.5
    return f"{m:.2f} ± {half:.2f}"


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def comparison(verdicts: Sequence[Verdict], config: Config) -> list[str]:
    """Per order over the rounds: the ratios with their 95 % intervals, and the verdict."""
    lines = [
        f"{'order':<6} {'runs':>4} {'mean R ×':>13} {'p99 R ×':>13} {'wait s':>13} "
        f"{'service +s':>13} {'shed':>13} {'throughput':>13} {'after ×':>13}"
    ]
    for order in dict.fromkeys(v.order for v in verdicts):
        mine = [v for v in verdicts if v.order == order]
        cells = [
            _interval([v.mean_ratio for v in mine]),
            _interval([v.p99_ratio for v in mine]),
            _interval([v.wait for v in mine]),
            _interval([v.service_added for v in mine]),
            _interval([v.shed_share for v in mine]),
            _interval([v.throughput_share for v in mine]),
            _interval([v.after_ratio for v in mine]),
        ]
        lines.append(f"{order:<6} {len(mine):>4} " + " ".join(f"{c:>13}" for c in cells))
        kept = sum(1 for v in mine if v.mean_ratio <= KEPT and v.p99_ratio <= KEPT)
        bounded = all(v.longest_wait <= config.queue_timeout + 0.05 for v in mine)
        recovered = [v.recovery for v in mine if v.recovery is not None]
        lines.append(
            f"       {order}: admitted statements kept the baseline's response time (mean and "
            f"p99 within ×{KEPT:g}) in {kept} of {len(mine)} runs; queue wait "
            f"{'bounded' if bounded else 'NOT bounded'} by queue_timeout; queue back to 0 "
            + (
                f"within {max(recovered):.1f} s of the overload's end"
                if len(recovered) == len(mine)
                else f"in only {len(recovered)} of {len(mine)} runs"
            )
        )
    lines.append(
        "(ratios are to each round's own baseline; ± is a 95 % t interval over the rounds; "
        "shed and throughput are shares of the offered statements and of the capacity)"
    )
    return lines


ORDERS = {"fifo": None, "lifo": "queue_timeout"}  # lifo_after: never, or the queue timeout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--mix", default="1,2,6,9,11,13,14,18", help="TPC-H queries (weights)")
    parser.add_argument("--mpl", type=int, default=2, help="statements in service at once")
    parser.add_argument("--max-queue", type=int, default=4, help="statements waiting at most")
    parser.add_argument(
        "--queue-timeout", type=float, default=0.5, help="seconds a statement may wait"
    )
    parser.add_argument("--factor", type=float, default=3.0, help="overload, × capacity")
    parser.add_argument("--overload", type=float, default=60.0, help="seconds of overload")
    parser.add_argument("--after", type=float, default=0.5, help="load after it, × capacity")
    parser.add_argument("--recovery", type=float, default=30.0, help="seconds after it")
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds of baseline")
    parser.add_argument("--capacity-seconds", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds per table row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--orders",
        default="fifo,lifo",
        help="queue orders under overload to compare: fifo (oldest first, the queue timeout "
        "sheds) and lifo (adaptive LIFO: newest first once the queue stood for the queue "
        "timeout; a full queue sheds its oldest)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds; each measures capacity, the baseline "
        "and every order once, the orders' turn alternating between rounds",
    )
    parser.add_argument("--tables", action="store_true", help="print every run's interval table")
    args = parser.parse_args(argv)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    if not orders or any(o not in ORDERS for o in orders):
        parser.error(f"--orders: choose from {', '.join(ORDERS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    config = Config(
        tpch=args.tpch,
        mix=mix_by_name(args.mix),
        mpl=args.mpl,
        max_queue=args.max_queue,
        queue_timeout=args.queue_timeout,
        factor=args.factor,
        overload=args.overload,
        after=args.after,
        recovery=args.recovery,
        baseline=args.baseline,
        capacity_seconds=args.capacity_seconds,
        interval=args.interval,
        seed=args.seed,
    )

    def limits(order: str) -> Limits:
        lifo = config.queue_timeout if ORDERS[order] else None
        return Limits(mpl=config.mpl, queue_timeout=config.queue_timeout, lifo_after=lifo)

    _say(f"TPC-H SF {config.tpch:g} on the embedded DuckDB: generating (cached) and loading…")
    target = open_target("duckdb", config.tpch, limits=limits(orders[0]), progress=_say)
    gate = target.proxy.gate
    target.proxy.call(lambda: setattr(gate, "max_queue", config.max_queue))
    log = ServedLog(target)
    print(
        f"overload on the embedded DuckDB, TPC-H SF {config.tpch:g}, mix {config.mix.name}: "
        f"FCFS, MPL {config.mpl}, max_queue {config.max_queue}, queue_timeout "
        f"{config.queue_timeout:g} s; {args.rounds} round(s) of {', '.join(orders)}"
    )
    verdicts: list[Verdict] = []
    try:
        for r in range(args.rounds):
            seed = config.seed + 100 * r
            turn = orders if r % 2 == 0 else orders[::-1]
            target.proxy.call(partial(gate.set_limits, limits("fifo")))
            _say(f"round {r + 1}: capacity, closed loop for {config.capacity_seconds:g} s")
            capacity = measure_capacity(target.conninfo, config)
            _say(
                f"round {r + 1}: capacity μ = {capacity:.2f}/s; baseline at {config.after:g}× "
                f"for {config.baseline:g} s"
            )
            baseline, baseline_origin, _, _ = run_phase(
                target.conninfo, config, [(config.after * capacity, config.baseline)], seed
            )
            for order in turn:
                _say(
                    f"round {r + 1}, {order}: overload at {config.factor:g}× for "
                    f"{config.overload:g} s, then {config.after:g}× for {config.recovery:g} s"
                )
                target.proxy.call(partial(gate.set_limits, limits(order)))
                sampler = QueueSampler(target)
                try:
                    statements, origin, late, unsent = run_phase(
                        target.conninfo,
                        config,
                        [
                            (config.factor * capacity, config.overload),
                            (config.after * capacity, config.recovery),
                        ],
                        seed + 1,  # the same arrivals for every order of a round
                    )
                finally:
                    samples = sampler.stop()
                verdict, lines = summary(
                    baseline,
                    baseline_origin,
                    statements,
                    origin,
                    samples,
                    log,
                    capacity,
                    config,
                    order,
                )
                verdicts.append(verdict)
                print(f"\nround {r + 1}, {order}: capacity μ = {capacity:.2f} statements/s")
                if args.tables:
                    for line in interval_table(statements, origin, samples, log, config):
                        print(line)
                for line in lines:
                    print(line)
                if late or unsent:
                    print(f"(load generator: {late} statements sent late, {unsent} never sent)")
    finally:
        target.close()
    print()
    for line in comparison(verdicts, config):
        print(line)


if __name__ == "__main__":
    main()
