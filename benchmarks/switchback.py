"""Policies compared in one open run that switches between them every few seconds (switchback).

    python -m benchmarks.switchback --model MODEL.json [--settings fcfs@2,latency@2]
        [--load 0.85 | --rate 13] [--mix 1,2,6,9,11,13,14,18] [--tpch 1]
        [--duration 600] [--segment 30] [--washout S] [--cut-end 1] [--seed 0] [--out FILE]

On a shared machine one setting run twice a few minutes apart has differed by 2× (slow
stretches of minutes), far more than the 15–30 % a policy is asked for; runs of 60 s each,
interleaved, still put each setting in a different stretch. Here one stream of Poisson
arrivals (``--load`` ρ of the model's D_r, or ``--rate``) runs through one proxy for
``--duration`` seconds while the proxy's policy and limits change every ``--segment`` seconds:
the settings take turns in blocks, each block every setting once, in an order balanced for the
setting before (``lab.bench.run_order``, a Williams design). Each statement counts for the
setting in force when it arrived; those arriving in the first ``--washout`` seconds of a
segment (the queue the previous setting left; by default the time a queue at this load takes
to forget its past, ``relaxation``: ~11 s at ρ 0.85, ~100 s at 0.95, where turns must be
minutes long and ``admission_pays``' runs of a minute or more are the better design) or its
last ``--cut-end`` seconds (served mostly by the next one) are not counted. A slow stretch
then falls on every setting of a block alike, and the comparison is paired by block.

The first setting is the baseline. Printed per setting: statements counted, mean R, p99 R
(pooled over its segments), errors; and for each other setting its mean R and p99 R as ratios
to the baseline's, each with a 95 % interval from resampling whole blocks (a block's turns
stay together, so the pairing is kept), and the mean of the per-block changes of mean R with
a t-interval over blocks (each block weighs the same there, however many statements it
has). A setting listed as ``SETTING+again`` repeats one already listed (an A/A control: how
far one setting differs from itself under this design). Settings that carry state across
segments — learning (``+learn``) or a tuned MPL (``@auto``) — cannot take turns and are
refused.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import math
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

from admission.model import EtaModel
from admission.scheduler import Limits
from admission.sim.study import Estimate
from lab.bench import (
    BenchConfig,
    apply_setting,
    budgeted,
    learns,
    open_arrivals,
    parse_policy,
    run_order,
    tunes_mpl,
)
from lab.target import open_target
from workloads.tpch.load import LoadResult, run_open
from workloads.tpch.mixes import mix_by_name

__all__ = ["Segments", "compare", "main", "relaxation"]

CONNECTIONS = 64  # opened before the clock starts, as lab.bench's open runs do
BOOTSTRAP = 2000  # resamples of blocks for the p99 ratio's interval


def relaxation(rho: float, service: float) -> float:
    """How long a queue at load ``rho`` takes to forget its state, seconds: the M/M/1
    relaxation time S / (1 − √ρ)² (Morse), ``service`` the mean service time S; infinite at
    ρ ≥ 1. A rule of thumb for the washout a turn needs, not a bound."""
    return service / (1 - math.sqrt(rho)) ** 2 if rho < 1 else math.inf


class Segments:
    """Which setting was in force when: segment k from ``starts[k]`` to ``starts[k + 1]``."""

    def __init__(self, starts: list[float], end: float, settings: list[str], blocks: int):
        self.starts, self.end, self.settings, self.blocks = starts, end, settings, blocks

    def of(self, arrival: float, washout: float, cut_end: float) -> int | None:
        """The segment ``arrival`` counts for, or None (before, after, or cut)."""
        k = bisect.bisect_right(self.starts, arrival) - 1
        if k < 0:
            return None
        end = self.starts[k + 1] if k + 1 < len(self.starts) else self.end
        if not self.starts[k] + washout <= arrival < end - cut_end:
            return None
        return k


def compare(
    load: LoadResult,
    segments: Segments,
    names: list[str],
    washout: float,
    cut_end: float,
    rng: random.Random,
) -> dict[str, object]:
    """Per setting: counted statements, pooled mean and p99, errors, per-block means; and each
    setting against ``names[0]`` paired by block."""
    per_segment: dict[int, list[float]] = {}
    errors = dict.fromkeys(names, 0)
    for st in load.statements:
        k = segments.of(st.start, washout, cut_end)
        if k is None:
            continue
        if st.sqlstate is not None:
            errors[segments.settings[k]] += 1
            continue
        per_segment.setdefault(k, []).append(st.response)
    width = len(names)
    by_block: dict[str, list[list[float]]] = {n: [] for n in names}  # block → its responses
    for b in range(segments.blocks):
        for k in range(b * width, (b + 1) * width):
            by_block[segments.settings[k]].append(per_segment.get(k, []))
    out: dict[str, object] = {}
    base = names[0]
    for name in names:
        pooled = np.array([r for rs in by_block[name] for r in rs])
        row: dict[str, object] = {
            "counted": len(pooled),
            "mean": float(pooled.mean()) if len(pooled) else float("nan"),
            "p99": float(np.percentile(pooled, 99)) if len(pooled) else float("nan"),
            "errors": errors[name],
            "block_means": [float(np.mean(rs)) if rs else float("nan") for rs in by_block[name]],
        }
        if name != base:
            pairs = [
                (rs, bs) for rs, bs in zip(by_block[name], by_block[base], strict=True) if rs and bs
            ]
            if len(pairs) >= 2:
                change = Estimate.of([float(np.mean(rs) / np.mean(bs)) - 1 for rs, bs in pairs])
                row["mean_change"], row["mean_change_ci"] = change.mean, change.ci
                means, p99s = [], []
                for _ in range(BOOTSTRAP):
                    pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
                    mine = np.concatenate([np.asarray(rs) for rs, _ in pick])
                    theirs = np.concatenate([np.asarray(bs) for _, bs in pick])
                    means.append(mine.mean() / theirs.mean())
                    p99s.append(np.percentile(mine, 99) / np.percentile(theirs, 99))
                for key, ratios in (("mean_ratio_interval", means), ("p99_ratio_interval", p99s)):
                    row[key] = [
                        float(np.percentile(ratios, 2.5)),
                        float(np.percentile(ratios, 97.5)),
                    ]
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the trained model (for ρ and D_r)")
    ap.add_argument("--settings", default="fcfs@2,latency@2", help="the first is the baseline")
    ap.add_argument("--mix", default="1,2,6,9,11,13,14,18")
    ap.add_argument("--tpch", type=float, default=1.0)
    ap.add_argument("--backend", default="duckdb", help="duckdb, or postgresql://…")
    load = ap.add_mutually_exclusive_group()
    load.add_argument("--load", type=float, help="offered load ρ by the model's D_r (0.85)")
    load.add_argument("--rate", type=float, help="statements per second")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds in all")
    ap.add_argument("--segment", type=float, default=30.0, help="seconds per turn")
    ap.add_argument(
        "--washout",
        type=float,
        help="seconds not counted at the start of each turn (default: the relaxation time)",
    )
    ap.add_argument("--cut-end", type=float, default=1.0, help="last seconds not counted")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the numbers as JSON here")
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.settings.split(",") if s.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        ap.error("--settings: two or more settings, each once (SETTING+again repeats one)")
    for name in names:
        try:
            parse_policy(name)
        except ValueError as e:
            ap.error(f"--settings: {e}")
        if budgeted(name):
            ap.error(f"--settings: {name} manages memory; a turn here has no memory budget")
        if learns(name) or tunes_mpl(name):
            ap.error(
                f"--settings: {name} carries state from one turn to the next (learning or a "
                "tuned MPL); compare it with benchmarks.admission_pays instead"
            )
    if (a.washout is not None and not a.washout >= 0) or not a.cut_end >= 0:
        ap.error("--washout and --cut-end are seconds, at least 0")
    blocks = max(2, round(a.duration / (a.segment * len(names))))
    total = blocks * len(names) * a.segment
    config = BenchConfig(
        mix=mix_by_name(a.mix),
        backend=a.backend,
        tpch=a.tpch,
        duration=total,
        limits=Limits(mpl=2),
        policies=tuple(names),
        repetitions=1,
        seed=a.seed,
        arrivals="poisson",
        load=(a.load if a.load is not None else 0.85) if a.rate is None else None,
        rate=a.rate,
    )
    model = EtaModel.load(a.model)
    rate, rho, arrivals = open_arrivals(config, model)
    order = [s for b in range(blocks) for s in run_order(names, a.seed, b)]
    relax = relaxation(rho, rho / rate)
    if a.washout is None:
        a.washout = math.ceil(relax) if relax < math.inf else a.segment
    if a.washout + a.cut_end >= a.segment:
        ap.error(
            f"--washout {a.washout:g} s + --cut-end {a.cut_end:g} s leave nothing of a "
            f"{a.segment:g} s turn (at ρ = {rho:.2f} a queue forgets its past in about "
            f"{relax:.0f} s): a longer --segment, or benchmarks.admission_pays"
        )
    print(
        f"{len(arrivals)} Poisson arrivals at {rate:.3g}/s (ρ = {rho:.2f} by the model's D_r), "
        f"{total:g} s; {blocks} blocks × {len(names)} turns of {a.segment:g} s "
        f"(first {a.washout:g} s and last {a.cut_end:g} s of each not counted)",
        flush=True,
    )
    if relax > a.washout:
        print(
            f"warning: at ρ = {rho:.2f} a queue forgets its past in about {relax:.0f} s (M/M/1: "
            f"S / (1 − √ρ)², S = {rho / rate * 1e3:.0f} ms), longer than the {a.washout:g} s "
            "washout: each turn inherits the previous setting's queue, and the comparison "
            "understates the difference (longer --segment and --washout, or admission_pays)",
            flush=True,
        )
    target = open_target(a.backend, a.tpch, model=model, progress=lambda m: print(m, flush=True))
    proxy, gate = target.proxy, target.proxy.gate
    starts: list[float] = []
    stop = threading.Event()

    def switcher() -> None:
        t0 = time.monotonic()
        for k, setting in enumerate(order):
            if k and stop.wait(max(0.0, t0 + k * a.segment - time.monotonic())):
                return
            proxy.call(functools.partial(apply_setting, gate, config, setting))
            starts.append(time.monotonic())
            if k % len(names) == 0:
                print(f"block {k // len(names) + 1}/{blocks}", flush=True)

    try:
        proxy.call(functools.partial(apply_setting, gate, config, order[0]))
        thread = threading.Thread(target=switcher, daemon=True)
        thread.start()
        result = run_open(
            target.conninfo, arrivals, duration=total, connections=CONNECTIONS, max_connections=256
        )
        stop.set()
        thread.join(timeout=30)
    finally:
        target.close()
    if len(starts) != len(order):
        raise SystemExit(f"only {len(starts)} of {len(order)} turns were switched to")
    starts[0] = min(starts[0], result.started)
    segments = Segments(starts, result.started + total, order, blocks)
    numbers = compare(result, segments, names, a.washout, a.cut_end, random.Random(a.seed))
    print(
        f"\n{'setting':>24}  {'counted':>7}  {'mean R s':>8}  {'p99 R s':>7}  errors  "
        f"{'mean ratio (95 %)':>19}  {'p99 ratio (95 %)':>19}  per-block change (t, 95 %)"
    )
    base = numbers[names[0]]
    assert isinstance(base, dict)
    for name in names:
        row = numbers[name]
        assert isinstance(row, dict)
        change = mean = p99 = ""
        if "mean_change" in row:
            ci = row["mean_change_ci"]
            change = f"{row['mean_change']:+.1%}" + (f" ± {ci:.1%}" if ci is not None else "")
            lo, hi = row["mean_ratio_interval"]
            mean = f"{row['mean'] / base['mean']:.3f} [{lo:.2f}, {hi:.2f}]"
            lo, hi = row["p99_ratio_interval"]
            p99 = f"{row['p99'] / base['p99']:.3f} [{lo:.2f}, {hi:.2f}]"
        print(
            f"{name:>24}  {row['counted']:>7}  {row['mean']:>8.3f}  {row['p99']:>7.3f}  "
            f"{row['errors']:>6}  {mean:>19}  {p99:>19}  {change}"
        )
    print(
        f"late (sent > 10 ms after arriving): {result.late}, unsent: {result.unsent}, "
        f"connections: {result.connections}"
    )
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            json.dumps(
                {
                    "rate": rate,
                    "offered_load": rho,
                    "segment": a.segment,
                    "washout": a.washout,
                    "cut_end": a.cut_end,
                    "blocks": blocks,
                    "order": order,
                    "settings": numbers,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
