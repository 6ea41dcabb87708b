"""A machine-speed reference: a short, fixed CPU probe taken before and after training.

The probe is a deterministic pure-Python loop (integer arithmetic, a hash-table update and a
list index per iteration; the same work on every machine and every Python run), timed a few
times; the speed is the best try's iterations per second, so a try that another process
interrupted does not count against the machine. It takes about 0.4 s.

``measure`` runs it in a process of its own: in the training process the proxy's event loop,
the sampler and DuckDB's Python-side pool share one interpreter lock with it, so a probe taken
there right after the load measured that contention (half the speed, seen), not the machine.

Training takes it before the isolation runs and after the concurrent run, stores both in the
model (``speed: {before, after, unit}``) and warns when they differ by more than 10 %: the
machine's speed changed while it measured (another load started, the CPU's clock was lowered),
and the D_r, U_r and Q_r of the model rest on a machine that was not the same throughout.

Rescaling a model to another machine (not done anywhere yet): service demands scale inversely
with speed, so a D_r measured where the probe gave ``speed_there`` becomes, on a machine where
it gives ``speed_here``, ``D_r × speed_there / speed_here`` — equivalently, with the index of
the machine a model was trained on in the denominator, D_here = D_there × (speed_there /
speed_here). A model trained on a machine twice as fast (speed_there = 2 · speed_here) predicts
twice the D_r here. This assumes the queries are CPU-bound and the machines alike in cores and
memory; fork sizes f_r and the A^c_r counts do not rescale.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["UNIT", "SpeedReading", "measure", "probe"]

UNIT = "probe iterations/s (best of 5)"
_ITERATIONS = 60_000  # one try: ~0.05–0.1 s on a current core


@dataclass(frozen=True)
class SpeedReading:
    speed: float  # iterations per second, the best try
    tries: tuple[float, ...]  # every try's iterations per second


def _work(n: int) -> int:
    """The fixed work: the same result on every machine (checked, so it cannot be skipped)."""
    x = 12345
    table: dict[int, int] = {}
    ring = list(range(64))
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        key = x & 1023
        table[key] = table.get(key, 0) + (x >> 16)
        ring[i & 63] ^= key
    return x ^ sum(table.values()) ^ sum(ring)


_EXPECTED = _work(_ITERATIONS)


def probe(tries: int = 5, clock: Callable[[], float] = time.perf_counter) -> SpeedReading:
    """Run the fixed work ``tries`` times; the best try's iterations per second."""
    rates = []
    for _ in range(tries):
        started = clock()
        result = _work(_ITERATIONS)
        elapsed = max(clock() - started, 1e-9)
        if result != _EXPECTED:  # pragma: no cover - the interpreter is broken
            raise RuntimeError("the speed probe gave a different result")
        rates.append(_ITERATIONS / elapsed)
    return SpeedReading(max(rates), tuple(rates))


def measure(tries: int = 5) -> SpeedReading:
    """``probe`` in a fresh Python process (see the module docstring); in this process if that
    one cannot be started."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "training.speed", str(tries)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        rates = tuple(float(word) for word in done.stdout.split())
        if len(rates) == tries:
            return SpeedReading(max(rates), rates)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return probe(tries)


if __name__ == "__main__":  # what ``measure`` runs: every try's rate on one line
    print(*probe(int(sys.argv[1]) if len(sys.argv) > 1 else 5).tries)
