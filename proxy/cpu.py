"""The busy share of the database's cores: what ``--mpl auto`` and background throttling read.

``cpu_times`` reads all of this host's CPUs from ``/proc/stat``; ``CpuMeter`` turns a running
(busy, total) count into the busy share since its last call — of the host's cores (a
PostgreSQL on this host) or of this process's (the embedded DuckDB, whose threads run here).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["CpuMeter", "cpu_times"]


def cpu_times(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot; None where /proc/stat is not there."""
    try:
        with stat.open() as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(x) for x in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # (guest time is already counted in user)
    return total - idle, total


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


class CpuMeter:
    """The busy share of the database's cores since the last call (0–1; None when unknown).

    ``CpuMeter.process()``: this process's CPU time over its cores' time — the embedded
    DuckDB's worker threads run here (the proxy's own work counts too: it is on those
    cores). ``CpuMeter.host()``: all of this host's cores from ``/proc/stat`` — a PostgreSQL
    on the same host (and whatever else runs there, which leaves no more to a higher MPL
    either)."""

    def __init__(self, read: Callable[[], tuple[float, float] | None]) -> None:
        self._read = read  # (busy, total) time so far, in one unit
        self._last = read()

    @classmethod
    def process(cls) -> CpuMeter:
        cores = _cores()
        return cls(lambda: (time.process_time(), time.monotonic() * cores))

    @classmethod
    def host(cls) -> CpuMeter | None:
        """None where there is no ``/proc/stat`` (not Linux)."""
        return cls(cpu_times) if cpu_times() is not None else None

    def __call__(self) -> float | None:
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return min(max((now[0] - last[0]) / (now[1] - last[1]), 0.0), 1.0)
