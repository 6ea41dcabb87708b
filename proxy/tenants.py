"""The feedback signal that throttles background work: the machine's CPU utilisation.

Background statements (a workload class of priority ``background``) are admitted only while
the foreground is idle and, when the workload config sets ``[background] pressure_bound``,
while this signal is at most that bound (after Lu et al.'s feedback throttling of batch work
on a shared multicore). The signal is the busy share of all CPUs from ``/proc/stat`` over the
last interval: on the machine of the embedded DuckDB it is the database's own; in front of a
PostgreSQL on the same host it is that server's. A proxy on another host than its database
measures its own host (documented: set no bound there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from proxy.gate import AdmissionGate

__all__ = ["CpuPressure", "cpu_times"]

log = logging.getLogger("admission.tenants")


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


class CpuPressure:
    """Feeds the gate the CPU's busy share every ``interval`` seconds (a ``Tuner``)."""

    def __init__(self, gate: AdmissionGate, interval: float = 0.5) -> None:
        self.gate, self.interval = gate, interval
        self.value = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if cpu_times() is None:
            log.warning("no /proc/stat here: background work is not throttled by CPU pressure")
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        last = cpu_times()
        while True:
            await asyncio.sleep(self.interval)
            now = cpu_times()
            if now is None or last is None:
                continue
            busy, total = now[0] - last[0], now[1] - last[1]
            last = now
            if total > 0:
                self.value = busy / total
                with contextlib.suppress(Exception):  # a throttle must never stop the proxy
                    self.gate.set_pressure(self.value)
