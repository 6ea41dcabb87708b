"""``--mpl auto``: the live proxy tunes its own MPL (``admission.mpl`` on the event loop).

Every ``TICK`` seconds ``AutoMpl`` tells the controller how long it has been; whether the gate
was saturated when the last tick looked (statements queued while the MPL's worth are in
service: the MPL is what holds them back) — at the start of the interval, not its end: a gate
still saturated at the end is one whose statements completed slowly, and capacity measured on
such intervals alone would read low; the work completed since the last tick (the model's D_r
of every statement that completed, read from the scheduler's ``finishes`` observer); and the
work that arrived (the D_r of the statements submitted, from the scheduler's per-class
counts); and the number of statements queued or in service (how much it varies tells a
closed loop from an open stream); and, where it can tell, the busy share of the database's
cores (``proxy.cpu.CpuMeter``: the process's CPU time for the embedded DuckDB, which runs in
it; the host's ``/proc/stat`` in front of a PostgreSQL on this host; nothing for one
elsewhere — this host's cores are not its). When the controller moves the MPL, the gate's limits
change (``set_limits``: the queue is dispatched at once if the MPL grew; statements in
service finish if it shrank). Reading a few counters every 0.1 s costs the loop next to nothing.

Throughput is counted in the model's D_r as each class was first seen here, kept while the
live model moves D_r, so that capacities measured at different MPLs stay comparable.

A limit set by hand (``PUT /limits`` with a number for ``mpl``) stops the tuning; ``"auto"``
starts it again from the MPL in force.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from admission.mpl import MplController
from admission.scheduler import Job, JobState
from proxy.cpu import CpuMeter
from proxy.gate import AdmissionGate

__all__ = ["TICK", "AutoMpl"]

log = logging.getLogger("admission.mpl")

TICK = 0.1  # seconds between looks at the gate


class AutoMpl:
    def __init__(
        self,
        gate: AdmissionGate,
        controller: MplController,
        tick: float = TICK,
        cpu: CpuMeter | None = None,
    ) -> None:
        self.gate = gate
        self.controller = controller
        self.tick = tick
        self.cpu = cpu
        self.enabled = True
        self._work = 0.0  # expected seconds of service completed since the last tick
        self._work2 = 0.0  # … the sum of each statement's squared
        self._done = 0  # statements completed since the last tick
        self._demands: dict[str, float] = {}  # class → the D_r its work is counted in
        self._arrivals: dict[str, int] = dict(gate.scheduler.arrivals_by_class())  # seen so far
        self._last = 0.0
        self._saturated = False  # the gate's state when the last tick looked
        self._timer: asyncio.TimerHandle | None = None
        gate.scheduler.observe(finishes=self._finished)

    def start(self) -> None:
        """Begin tuning from the controller's MPL (call on the proxy's loop)."""
        self._apply(self.controller.mpl)
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        self._timer = loop.call_later(self.tick, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def pause(self) -> None:
        """Stop tuning: the MPL stays where it is until someone sets it (or ``resume``)."""
        self.enabled = False

    def resume(self, start: int | None = None) -> None:
        """Tune again from ``start`` (default: the MPL in force), with what was measured
        forgotten: the MPL or the workload changed behind the controller's back."""
        old = self.controller
        mpl = start if start is not None else self.gate.scheduler.limits.mpl or old.mpl
        self.controller = MplController(
            mpl,
            low=old.low,
            high=old.high,
            tolerance=old.tolerance,
            utilization=old.utilization,
            window=old.window,
            min_completions=old.min_completions,
            quick_window=old.quick_window,
            quick_completions=old.quick_completions,
            samples=old.keep,
            min_samples=old.min_samples,
            stale=old.stale,
            demand_window=old.demand_window,
        )
        self.enabled = True
        self._work, self._work2, self._done = 0.0, 0.0, 0
        self._arrived()  # what arrived while it was not tuning is not this controller's
        self._apply(self.controller.mpl)

    def _demand(self, fingerprint: str) -> float:
        demand = self._demands.get(fingerprint)
        if demand is None:
            # a class's work is its D_r as first seen here, kept: capacities measured at
            # different MPLs stay in one unit while the live model moves D_r
            model = self.gate.scheduler.model
            index = model.index().get(fingerprint)
            d = model.classes[index].D if index is not None else 0.0
            demand = self._demands[fingerprint] = d if d > 0 else 1.0
        return demand

    def _finished(self, job: Job, _now: float) -> None:
        if job.state is not JobState.DONE or job.bypass:
            return
        demand = self._demand(job.klass.fingerprint)
        self._work += demand
        self._work2 += demand * demand
        self._done += 1

    def _arrived(self) -> float:
        """The work of the statements submitted since the last call."""
        work = 0.0
        seen = self._arrivals
        for fingerprint, n in self.gate.scheduler.arrivals_by_class().items():
            before = seen.get(fingerprint, 0)
            if n > before:
                work += (n - before) * self._demand(fingerprint)
                seen[fingerprint] = n
        return work

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        try:
            if self.enabled:
                scheduler = self.gate.scheduler
                busy = self.cpu() if self.cpu is not None else None
                moved = self.controller.observe(
                    now,
                    now - self._last,
                    self._saturated,
                    self._work,
                    self._done,
                    arrived=self._arrived(),
                    in_system=scheduler.queued + scheduler.running,
                    cpu=busy,
                    work_squared=self._work2,
                )
                if moved is not None:
                    log.info("MPL %d: %s", moved, self.controller.reason)
                    self._apply(moved)
            self._saturated = self._is_saturated()
        except Exception:  # the tuning must never stop the proxy
            log.exception("the adaptive MPL failed")
        self._work, self._work2, self._done = 0.0, 0.0, 0
        self._last = now
        self._timer = loop.call_later(self.tick, self._tick)

    def _is_saturated(self) -> bool:
        scheduler = self.gate.scheduler
        mpl = scheduler.limits.mpl
        counted = scheduler.running - scheduler.released_in_service  # (release_after)
        return mpl is not None and scheduler.queued > 0 and counted >= mpl

    def _apply(self, mpl: int) -> None:
        limits = self.gate.scheduler.limits
        if limits.mpl != mpl:
            self.gate.set_limits(dataclasses.replace(limits, mpl=mpl))
