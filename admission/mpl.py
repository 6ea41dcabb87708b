"""Adaptive MPL: the lowest multiprogramming limit that keeps throughput near its best.

Why
---
Too high an MPL gives the database more statements than it has cores for: they slow each
other down and the admission order has nothing left to decide. Too low an MPL leaves cores
idle and caps the throughput. Where the line lies depends on the machine, the data and the mix
— how many threads each class forks, how much of a statement's time waits on memory — and moves
when they do. Schroeder et al. ("How to determine a good multi-programming level for external
scheduling", ICDE 2006) show that a low MPL loses little throughput once it covers the
resources the workload actually uses, and find it with a feedback loop on measured throughput.
``MplController`` is such a loop: it measures throughput at the MPL in force and moves the MPL
one step at a time toward **the lowest MPL whose throughput is within ``tolerance`` (5 %) of the
best throughput measured at any MPL**.

What it measures
----------------
Throughput at MPL m says something about m only while m is what limits it: while statements
are queued and m are in service (*saturated*). Unsaturated time — spare capacity, or the thread
budget rather than the MPL holding statements back — tells nothing about m and is not counted.
The driver reports, every few hundred milliseconds, the time elapsed, whether the gate was
saturated, and the *work* completed meanwhile: the expected service time (D_r) of every
statement that completed, so that a stretch with more long statements than usual does not read
as lower throughput. Saturated time is cut into windows of ``window`` seconds; each window's
work per second is one sample of the MPL's throughput, and each MPL keeps its last ``samples``
samples, dropped once older than ``stale`` seconds (the workload changes; the curve with it).

How it moves
------------
Once the MPL in force has ``min_samples`` samples, with best = the highest mean throughput of
any MPL that has that many:

- below (1 − tolerance) × best: one step toward the best MPL;
- else, if the next MPL down is not known to be worse (no fresh samples, or within tolerance of
  best): one step down — the lower MPL is what this controller is for;
- else, if the next MPL up has no fresh samples and this MPL is the best known: one step up, to
  look (the best may lie higher); a look that found nothing better is not repeated before
  ``stale`` seconds;
- else stay.

Between ``low`` and ``high``. Every move waits for fresh samples at the new MPL, so it moves at
most once per ``min_samples`` × ``window`` seconds of saturation. Nothing here reads a clock:
the driver passes the time.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["TOLERANCE", "LevelEstimate", "MplController"]

TOLERANCE = 0.05  # throughput given up for a lower MPL, at most
WINDOW = 2.0  # seconds of saturated time per throughput sample
SAMPLES = 8  # samples kept per MPL
MIN_SAMPLES = 4  # samples an MPL needs before it is judged
STALE = 300.0  # seconds after which a sample is forgotten


@dataclass(frozen=True, slots=True)
class LevelEstimate:
    """What is known of one MPL's throughput (work per second, saturated)."""

    mpl: int
    mean: float
    samples: int
    stderr: float  # standard error of the mean (nan with fewer than two samples)
    age: float  # seconds since its newest sample


class _Level:
    __slots__ = ("samples", "times")

    def __init__(self, keep: int) -> None:
        self.samples: deque[float] = deque(maxlen=keep)
        self.times: deque[float] = deque(maxlen=keep)

    def add(self, value: float, now: float) -> None:
        self.samples.append(value)
        self.times.append(now)

    def expire(self, before: float) -> None:
        while self.times and self.times[0] < before:
            self.times.popleft()
            self.samples.popleft()


class MplController:
    """The feedback loop of the module docstring; ``mpl`` is the MPL to use now."""

    def __init__(
        self,
        start: int,
        *,
        low: int = 1,
        high: int = 64,
        tolerance: float = TOLERANCE,
        window: float = WINDOW,
        samples: int = SAMPLES,
        min_samples: int = MIN_SAMPLES,
        stale: float = STALE,
    ) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 ≤ low ≤ high, not {low} and {high}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), not {tolerance}")
        if window <= 0 or stale <= 0:
            raise ValueError("window and stale must be positive")
        if not 1 <= min_samples <= samples:
            raise ValueError(f"need 1 ≤ min_samples ≤ samples, not {min_samples}, {samples}")
        self.low, self.high = low, high
        self.mpl = min(max(start, low), high)
        self.tolerance, self.window, self.stale = tolerance, window, stale
        self.keep, self.min_samples = samples, min_samples
        self.changes = 0  # MPL changes made
        self.reason = "starting"  # why the MPL is what it is, for people
        self._levels: dict[int, _Level] = {}
        self._work = 0.0  # work completed in the current window's saturated time
        self._filled = 0.0  # saturated seconds in the current window
        # saturated seconds still to let pass after a move before measuring: the statements
        # admitted under the old MPL are still in service for a while
        self._settle = 0.0
        self._looked_up: dict[int, float] = {}  # MPL → when it last looked one higher
        self._now = -math.inf

    def observe(self, now: float, elapsed: float, saturated: bool, work: float) -> int | None:
        """``elapsed`` seconds ending at ``now`` passed, saturated or not, and ``work``
        (seconds of expected service) completed in them. Returns the new MPL when it changes."""
        self._now = max(self._now, now)
        if not saturated or elapsed <= 0:
            return None
        if self._settle > 0:
            self._settle -= elapsed
            return None
        self._work += work
        self._filled += elapsed
        if self._filled < self.window:
            return None
        level = self._levels.get(self.mpl)
        if level is None:
            level = self._levels[self.mpl] = _Level(self.keep)
        level.add(self._work / self._filled, now)
        self._work = self._filled = 0.0
        return self._decide(now)

    def forget(self) -> None:
        """Drop every sample (the unit of work changed: a new model's D_r), keep the MPL."""
        self._levels.clear()
        self._looked_up.clear()
        self._work = self._filled = 0.0

    def estimates(self) -> list[LevelEstimate]:
        """Each MPL with fresh samples, lowest first."""
        out = []
        for mpl in sorted(self._levels):
            level = self._levels[mpl]
            level.expire(self._now - self.stale)
            if not level.samples:
                continue
            values = list(level.samples)
            n = len(values)
            stderr = statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
            out.append(
                LevelEstimate(mpl, statistics.fmean(values), n, stderr, self._now - level.times[-1])
            )
        return out

    def _decide(self, now: float) -> int | None:
        known = {e.mpl: e for e in self.estimates() if e.samples >= self.min_samples}
        here = known.get(self.mpl)
        if here is None:
            return None
        best = max(known.values(), key=lambda e: e.mean)
        floor = (1 - self.tolerance) * best.mean
        below, above = self.mpl - 1, self.mpl + 1
        if here.mean < floor:
            step = 1 if best.mpl > self.mpl else -1
            why = f"throughput {here.mean:.3g} below {1 - self.tolerance:.0%} of the best"
            return self._move(self.mpl + step, f"{why}, {best.mean:.3g} at MPL {best.mpl}")
        lower = known.get(below)
        if below >= self.low and (lower is None or lower.mean >= floor):
            return self._move(below, "throughput within tolerance of the best: trying lower")
        looked = self._looked_up.get(self.mpl, -math.inf)
        if (
            above <= self.high
            and above not in known
            and best.mpl == self.mpl
            and now - looked >= self.stale
        ):
            self._looked_up[self.mpl] = now
            return self._move(above, "best so far: looking one higher")
        self.reason = f"lowest MPL within {self.tolerance:.0%} of the best throughput"
        return None

    def _move(self, mpl: int, reason: str) -> int | None:
        mpl = min(max(mpl, self.low), self.high)
        self.reason = reason
        if mpl == self.mpl:
            return None
        self.mpl = mpl
        self.changes += 1
        self._work = self._filled = 0.0
        self._settle = self.window
        return mpl
