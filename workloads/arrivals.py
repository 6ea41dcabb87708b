"""When statements arrive in an open workload: Poisson, bursty (on/off modulated Poisson), or
replayed from a trace.

An open workload's statements arrive on their own schedule, whether or not earlier ones have
finished — unlike a closed loop, where a client waits for its answer before sending the next, so
that the load adapts to the server (N = X·R) and no policy can change the mean response time.
These are the schedules; ``workloads.tpch.load.run_open`` sends statements on them.

Every schedule is a sorted list of offsets in seconds from the start of the run, drawn from a
seeded generator, so a run is repeatable up to timing.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Bursts", "TraceRow", "bursty", "poisson", "rate_at", "read_trace"]


def poisson(rate: float, duration: float, rng: random.Random) -> list[float]:
    """Arrival offsets of a Poisson process of ``rate`` per second over [0, duration)."""
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"the arrival rate must be positive and finite, not {rate}")
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass(frozen=True)
class Bursts:
    """On/off modulation: every ``every`` seconds (first at ``every``) the rate is multiplied by
    ``factor`` for ``length`` seconds."""

    factor: float = 2.0
    every: float = 60.0
    length: float = 20.0

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"the burst factor must be positive, not {self.factor}")
        if not 0 < self.length <= self.every:
            raise ValueError(
                f"a burst lasts more than 0 s and at most its period ({self.every:g} s), "
                f"not {self.length:g} s"
            )

    def windows(self, duration: float) -> list[tuple[float, float]]:
        """The bursts inside [0, duration), as (start, end)."""
        out = []
        start = self.every
        while start < duration:
            out.append((start, min(start + self.length, duration)))
            start += self.every
        return out


def rate_at(t: float, rate: float, bursts: Bursts | None) -> float:
    """The arrival rate at offset ``t``."""
    if bursts is None or t < bursts.every:
        return rate
    return rate * bursts.factor if (t % bursts.every) < bursts.length else rate


def bursty(rate: float, duration: float, bursts: Bursts, rng: random.Random) -> list[float]:
    """A Poisson process whose rate is ``rate``, times ``bursts.factor`` inside the bursts
    (drawn by thinning a process at the highest rate, so the two parts are exact)."""
    peak = rate * max(1.0, bursts.factor)
    return [
        t for t in poisson(peak, duration, rng) if rng.random() * peak < rate_at(t, rate, bursts)
    ]


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset: float
    sql: str


def read_trace(path: Path) -> list[TraceRow]:
    """A CSV of ``offset,sql`` rows (offset in seconds from the start; a header row whose first
    field is not a number is skipped), sorted by offset. Errors name the file and line."""
    rows: list[TraceRow] = []
    try:
        with path.open(newline="") as f:
            for line, record in enumerate(csv.reader(f), start=1):
                if not record or not "".join(record).strip():
                    continue
                if len(record) < 2:
                    raise ValueError(f"{path}:{line}: expected offset,sql")
                try:
                    offset = float(record[0])
                except ValueError:
                    if line == 1:
                        continue  # a header
                    raise ValueError(
                        f"{path}:{line}: {record[0]!r} is not an offset in seconds"
                    ) from None
                if not offset >= 0 or math.isinf(offset):
                    raise ValueError(f"{path}:{line}: the offset must be ≥ 0 s, not {record[0]}")
                sql = ",".join(record[1:]).strip()
                if not sql:
                    raise ValueError(f"{path}:{line}: the SQL is empty")
                rows.append(TraceRow(offset, sql))
    except OSError as e:
        raise ValueError(f"cannot read the trace {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path} is not a CSV trace: {e}") from None
    if not rows:
        raise ValueError(f"{path}: the trace has no statements")
    rows.sort(key=lambda r: r.offset)
    return rows


def observed_rate(offsets: Sequence[float], duration: float) -> float:
    """Arrivals per second over the run."""
    return len(offsets) / duration if duration > 0 else float("nan")
