"""Learning while serving: each class's service demand D_r from its recent statements.

A trained model is a snapshot: a class never seen in training keeps the default profile, and a
class whose statements grow slower (its table grew, its plan changed) keeps the D_r it had.
``OnlineEstimator`` watches every statement that completes (the scheduler's ``finishes``
observer: its service time is admission to completion) and keeps, per class, the last
``window`` service times. From them ``refresh`` makes a new model when a class's estimate has
moved enough to matter:

- the estimate of a class is the median of its window (robust to the odd statement that waited
  on a lock or a slow client), with the 95 % order-statistics interval of that median;
- service times are measured at the MPL the proxy runs, under the contention of the other
  statements in service, where a trained D_r is measured alone. When the model holds trained
  classes with enough live samples, the live medians are put in the trained units: multiplied
  by the median, over those classes, of trained D_r / live median. That factor also absorbs a
  machine that became slower or faster as a whole; one class drifting does not move it (a
  median of at least three: with fewer trained classes it is 1, and every estimate is in live
  units);
- a class takes a live estimate once it has ``min_samples`` statements: at once if it never
  had a measured D_r (a class first seen live, or any class of a proxy started without a
  model), else only when the estimate differs from its D_r by more than ``change`` (so noise
  does not churn the model, and a drifted class follows within half a window). Until then a
  class never measured has the median of the measured classes' D_r (the default profile as it
  is now, not the arbitrary one of an empty model).

The classes it changes carry ``live`` (the samples behind the estimate) and the interval, so
the policies treat classes whose intervals overlap as tied, as they do trained ones. Nothing
here reads a clock: the driver passes the time and decides when to call ``refresh``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from admission.model import ClassProfile, EtaModel
from admission.scheduler import Job, JobState

__all__ = ["CHANGE", "MIN_SAMPLES", "WINDOW", "OnlineEstimator", "median_interval"]

WINDOW = 32  # service times kept per class: a drifted class's median follows in 17
MIN_SAMPLES = 5  # statements before a class's live estimate is used
CHANGE = 0.25  # relative change of an estimate that makes a new model
# trained classes with live samples needed to put live times in trained units: with fewer, one
# drifting class would move the scale with it (and with it every other class's estimate)
CALIBRATE_WITH = 3


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` and its distribution-free 95 % interval (order statistics
    n/2 ∓ 1.96·√n/2, clamped to the sample)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    low = ordered[max(0, math.floor(n / 2 - half))]
    high = ordered[min(n - 1, math.ceil(n / 2 + half) - 1)]
    return statistics.median(ordered), low, high


class OnlineEstimator:
    """Service times per class fingerprint, from the scheduler's ``finishes`` observer."""

    def __init__(
        self, window: int = WINDOW, min_samples: int = MIN_SAMPLES, change: float = CHANGE
    ) -> None:
        if not 1 <= min_samples <= window:
            raise ValueError(f"need 1 ≤ min_samples ≤ window, not {min_samples} and {window}")
        self.window, self.min_samples, self.change = window, min_samples, change
        self.enabled = True
        self.samples: dict[str, deque[float]] = {}
        self.seen: dict[str, int] = {}  # statements measured per class, all time
        self.refreshes = 0  # models made

    def finished(self, job: Job, now: float) -> None:
        """A statement left the scheduler: note its service time if it ran to the end."""
        if not self.enabled or job.state is not JobState.DONE or job.bypass:
            return
        admitted = job.admitted_at
        if admitted is None:
            return
        fingerprint = job.klass.fingerprint
        times = self.samples.get(fingerprint)
        if times is None:
            times = self.samples[fingerprint] = deque(maxlen=self.window)
        times.append(now - admitted)
        self.seen[fingerprint] = self.seen.get(fingerprint, 0) + 1

    def forget(self, fingerprint: str | None = None) -> None:
        """Drop the samples of one class, or of all."""
        if fingerprint is None:
            self.samples.clear()
            self.seen.clear()
        else:
            self.samples.pop(fingerprint, None)
            self.seen.pop(fingerprint, None)

    def scale(self, model: EtaModel) -> float:
        """Trained D_r per second of live service time (1 without trained classes to tell)."""
        ratios = []
        for c in model.classes:
            times = self.samples.get(c.fingerprint)
            if _trained(c) and times is not None and len(times) >= self.min_samples:
                live = statistics.median(times)
                if live > 0:
                    ratios.append(c.D / live)
        return statistics.median(ratios) if len(ratios) >= CALIBRATE_WITH else 1.0

    def refresh(self, model: EtaModel) -> EtaModel | None:
        """``model`` with the live estimates of the classes whose estimate moved enough (see
        the module docstring); None when none did."""
        scale = self.scale(model)
        classes = list(model.classes)
        changed = False
        for i, c in enumerate(classes):
            times = self.samples.get(c.fingerprint)
            if times is None or len(times) < self.min_samples:
                continue
            median, low, high = median_interval(list(times))
            estimate = scale * median
            measured = _trained(c) or c.live > 0
            if measured and abs(estimate - c.D) <= self.change * max(c.D, 1e-9):
                continue
            classes[i] = c.model_copy(
                update={
                    "D": estimate,
                    "D_low": scale * low,
                    "D_high": scale * high,
                    "live": self.seen.get(c.fingerprint, len(times)),
                    "converged": None,
                }
            )
            changed = True
        # classes not measured yet (too few statements) follow the default profile as it is
        # now — the median of the measured classes — not as it was when they were first seen
        # (on an empty model, an arbitrary 1 s)
        known = [c.D for c in classes if _trained(c) or c.live > 0]
        if known:
            default = statistics.median(known)
            for i, c in enumerate(classes):
                if _trained(c) or c.live > 0:
                    continue
                if abs(c.D - default) > self.change * default:
                    classes[i] = c.model_copy(update={"D": default, "D_low": None, "D_high": None})
                    changed = True
        if not changed:
            return None
        self.refreshes += 1
        return model.model_copy(update={"classes": tuple(classes), "eta": {}})


def _trained(c: ClassProfile) -> bool:
    """Whether D_r came from training (isolation runs or measured executions), not live."""
    return c.live == 0 and (c.D_runs > 0 or c.count > 0)
