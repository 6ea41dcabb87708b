"""The live proxy keeps its model current: ``admission.online`` on the event loop.

``LiveModel`` registers an ``OnlineEstimator`` as an observer of the scheduler, and every
``every`` seconds — and within ``READY_WITHIN`` of a class reaching the statements its first
estimate needs — asks it for a model that follows what the statements measured; when there is
one, the gate swaps it in (``set_model``: queued statements keep their place, the policy's
scores are rebuilt, nothing pauses). With a ``planner`` (the embedded DuckDB has one: EXPLAIN's
estimated cardinalities) it also asks the database what each class's sample statement costs,
one class at a time off the event loop, so that a class never measured starts from a prior
scaled from what the measured classes cost and took. With a model file it saves the model
there atomically every ``save_every`` seconds when it changed, and once more on shutdown, so a
restart resumes from what was learned.

On the embedded DuckDB it also follows each class's memory (M_r, what a memory budget reserves):
the first ``MEMORY_FIRST`` statements of a class and then one in ``MEMORY_EVERY`` — at most
one a ``MEMORY_GAP`` per class, so a class of tiny statements does not pay the profiler's
switch a few hundred times a second — run with DuckDB's profiler on (``memory_wanted``), and
a statement that took more than its class's M_r raises it to what it took at the next look
(``memory_measured``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from admission.model import EtaModel
from admission.online import OnlineEstimator
from proxy.gate import AdmissionGate
from proxy.planner import PlanEstimate

__all__ = ["REFRESH_EVERY", "SAVE_EVERY", "LiveModel", "Planner"]

log = logging.getLogger("admission.learning")

REFRESH_EVERY = 2.0  # seconds between looks at the estimates
# … but no later than this after a class reached the statements its first estimate needs: a
# fresh server knows nothing, and until a look makes its short classes "measured" they cannot
# take the short lane (point lookups waited up to 0.4 s behind scans in the first 2 s)
READY_WITHIN = 0.1
PLAN_AT_ONCE = 16  # classes asked about per look
# The database's cost estimate of a statement (a sample of a class), or None when it has none;
# PostgreSQL's also counts the plan's work_mem units (proxy.planner.PlanEstimate).
Planner = Callable[[str], Awaitable["float | PlanEstimate | None"]]
SAVE_EVERY = 300.0  # seconds between saves of a changed model to its file
MEMORY_FIRST = 8  # statements of a class whose memory is measured first …
MEMORY_EVERY = 32  # … then one in this many …
# … and no sooner than this many seconds after the last (a profiled statement costs 0.5-1 ms
# more: 1 in 32 `SELECT 1`s cost 10 % of the embedded server's throughput)
MEMORY_GAP = 1.0
_MEMORY_KEEP = 4096  # classes followed at most (fingerprints beyond the scheduler's: dropped)


class LiveModel:
    def __init__(
        self,
        gate: AdmissionGate,
        path: Path | None = None,
        *,
        every: float = REFRESH_EVERY,
        save_every: float = SAVE_EVERY,
        estimator: OnlineEstimator | None = None,
        planner: Planner | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gate = gate
        self.clock = clock
        self.planner = planner
        # what the sampler measuring U_r, Q_r and A^c_r says of itself (training.live), if one
        self.profile_status: Callable[[], dict[str, Any]] | None = None
        self.changed_at: dict[str, float] = {}  # class → when its D_r last changed (Unix time)
        self._planned: set[str] = set()  # classes whose cost was asked for
        self._planning: asyncio.Task[None] | None = None
        self.path = path
        self.every, self.save_every = every, save_every
        self.estimator = estimator or OnlineEstimator()
        gate.scheduler.observe(finishes=self.estimator.finished)
        self.estimator.on_ready = self._soon
        self.updates = 0  # models swapped in
        self._dirty = False
        self._saved_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._memory_seen: dict[str, int] = {}  # class → statements seen by memory_wanted
        self._memory_last: dict[str, tuple[int, float]] = {}  # class → (seen, when) last taken
        self._memory_taken: dict[str, float] = {}  # class → the most a statement took

    @property
    def enabled(self) -> bool:
        return self.estimator.enabled

    def start(self) -> None:
        """Begin looking every ``every`` seconds (on the running loop)."""
        loop = asyncio.get_running_loop()
        self._saved_at = loop.time()
        self._timer = loop.call_later(self.every, self._tick)

    def _soon(self) -> None:
        """A class can take its first live estimate: look within ``READY_WITHIN`` seconds
        (the timer is moved earlier, never later; before ``start`` nothing is armed)."""
        timer = self._timer
        if timer is None:
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + min(READY_WITHIN, self.every)
        if timer.when() > at:
            timer.cancel()
            self._timer = loop.call_at(at, self._tick)

    def stop(self) -> None:
        """Stop looking; save once more if the model changed since the last save."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._planning is not None:
            self._planning.cancel()
            self._planning = None
        self.save()

    def plan(self) -> asyncio.Task[None] | None:
        """Ask the planner for the cost of the classes not asked about yet (a task on the
        loop, one statement at a time; one already running is left to finish). Returns the
        task at work, if any."""
        if self.planner is None or (self._planning is not None and not self._planning.done()):
            return self._planning
        todo = [
            (c.fingerprint, c.sample_sql)
            for c in self.gate.scheduler.model.classes
            if c.fingerprint not in self._planned and c.cost is None and c.sample_sql
        ]
        if todo:
            self._planning = asyncio.get_running_loop().create_task(self._plan(todo))
        return self._planning

    async def _plan(self, todo: list[tuple[str, str]]) -> None:
        assert self.planner is not None
        for fingerprint, sql in todo[:PLAN_AT_ONCE]:
            self._planned.add(fingerprint)
            try:
                cost = await self.planner(sql)
            except Exception:  # a statement the planner cannot take has no prior, that is all
                log.debug("no cost estimate for %s", fingerprint, exc_info=True)
                continue
            if isinstance(cost, PlanEstimate):
                self.estimator.planned(fingerprint, cost.cost, cost.work_mem_units)
            elif cost is not None:
                self.estimator.planned(fingerprint, cost)

    def memory_wanted(self, fingerprint: str) -> bool:
        """Whether this statement of class ``fingerprint`` has its memory measured."""
        if not self.estimator.enabled or not fingerprint:
            return False
        seen = self._memory_seen.get(fingerprint, 0) + 1
        if len(self._memory_seen) >= _MEMORY_KEEP and fingerprint not in self._memory_seen:
            self._memory_seen.clear()
            self._memory_last.clear()
        self._memory_seen[fingerprint] = seen
        if seen > MEMORY_FIRST:
            count, at = self._memory_last.get(fingerprint, (0, -math.inf))
            if seen - count < MEMORY_EVERY:
                return False
            now = self.clock()
            if now - at < MEMORY_GAP:
                return False
        else:
            now = self.clock()
        self._memory_last[fingerprint] = (seen, now)
        return True

    def memory_measured(self, measured: Any) -> None:
        """A ``Measurement`` of the embedded server: its memory, if more than seen yet."""
        memory, fingerprint = measured.memory, measured.fingerprint
        if memory is None or not fingerprint:
            return
        if len(self._memory_taken) >= _MEMORY_KEEP and fingerprint not in self._memory_taken:
            self._memory_taken.clear()
        if memory > self._memory_taken.get(fingerprint, -1.0):
            self._memory_taken[fingerprint] = memory

    def _with_memory(self, model: EtaModel) -> EtaModel:
        """``model`` with the M_r of every class a statement took more than it says."""
        if not self._memory_taken:
            return model
        classes = list(model.classes)
        changed = False
        for i, c in enumerate(classes):
            taken = self._memory_taken.get(c.fingerprint)
            if taken is not None and taken > (c.M or 0.0):
                classes[i] = c.model_copy(update={"M": taken})
                changed = True
        if not changed:
            return model
        return model.model_copy(update={"classes": tuple(classes), "eta": {}})

    def refresh(self) -> bool:
        """Swap in a model that follows the estimates if any moved enough, or whose memory
        grew; True if one was."""
        if not self.estimator.enabled:
            return False
        old = self.gate.scheduler.model
        moved = self.estimator.refresh(old)
        model = self._with_memory(moved or old)
        if moved is None and model is old:
            return False
        before = {c.fingerprint: c.D for c in old.classes}
        now = time.time()
        for c in model.classes:
            if before.get(c.fingerprint) != c.D:
                self.changed_at[c.fingerprint] = now
        self.gate.set_model(model)
        self.updates += 1
        self._dirty = True
        return True

    def reset(self, model: EtaModel | None = None) -> None:
        """Start over: forget every sample, serve ``model`` (an empty one by default), learn."""
        self.estimator.forget()
        self.estimator.enabled = True
        self.changed_at.clear()
        self.gate.set_model(model if model is not None else EtaModel(), base=True)
        self._dirty = True

    def swap(self, model: EtaModel) -> None:
        """Serve ``model`` from now on, and save it like anything learned."""
        self.gate.set_model(model)
        self.updates += 1
        self._dirty = True

    def keep(self, model: EtaModel) -> None:
        """Serve ``model`` as it is: stop learning (``reset`` starts again)."""
        self.estimator.enabled = False
        self.estimator.forget()
        self.changed_at.clear()
        self.gate.set_model(model, base=True)

    def save(self) -> None:
        """Write the model to its file (atomically) if it changed since the last save."""
        if self.path is None or not self._dirty:
            return
        try:
            self.gate.scheduler.model.save(self.path)
        except OSError as e:
            log.warning("could not save the learned model to %s: %s", self.path, e)
            return
        self._dirty = False
        log.info("learned model saved to %s", self.path)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.plan()
            self.refresh()
            if loop.time() - self._saved_at >= self.save_every:
                self._saved_at = loop.time()
                self.save()
        except Exception:  # a bad estimate must not stop the proxy, nor the learning
            log.exception("learning from live statements failed")
        self._timer = loop.call_later(self.every, self._tick)
