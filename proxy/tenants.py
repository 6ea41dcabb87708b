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

from proxy.cpu import CpuMeter
from proxy.gate import AdmissionGate

__all__ = ["CpuPressure"]

log = logging.getLogger("admission.tenants")


class CpuPressure:
    """Feeds the gate the CPU's busy share every ``interval`` seconds (a ``Tuner``)."""

    def __init__(self, gate: AdmissionGate, interval: float = 0.5) -> None:
        self.gate, self.interval = gate, interval
        self.value = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        meter = CpuMeter.host()
        if meter is None:
            log.warning("no /proc/stat here: background work is not throttled by CPU pressure")
            return
        self._task = asyncio.get_running_loop().create_task(self._run(meter))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, meter: CpuMeter) -> None:
        while True:
            await asyncio.sleep(self.interval)
            share = meter()
            if share is not None:
                self.value = share
                with contextlib.suppress(Exception):  # a throttle must never stop the proxy
                    self.gate.set_pressure(self.value)
