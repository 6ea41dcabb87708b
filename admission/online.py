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
  does not churn the model, and a drifted class follows within half a window), or when its
  interval has become less than half as wide as the one it was adopted with (a first estimate
  rests on a few statements; its wide interval would tie the class with its neighbours);
- with each estimate goes the class's *tail* (``D_tail``: the service time 9 in 10 of its
  window end within, taken anew when it moved by more than half); the short lane counts a
  statement past twice it as one of the class's rare long ones;
- until then a class never measured starts from a *prior*. With the database's own cost
  estimate of its statements (``planned``: EXPLAIN's, which the driver asks for) and at least
  ``CALIBRATE_WITH`` measured classes with one too, the prior is its cost times the median,
  over those classes, of D_r per unit of cost — the planner's scale turned into seconds by what
  the known classes measured, kept within the measured classes' shortest and longest D_r.
  Otherwise it is the median of the measured classes' D_r (the default profile as it is now,
  not the arbitrary one of an empty model).

The classes it changes carry ``live`` (the samples behind the estimate) and the interval, so
the policies treat classes whose intervals overlap as tied, as they do trained ones. Nothing
here reads a clock: the driver passes the time and decides when to call ``refresh`` —
``on_ready`` tells it when a class has just reached ``min_samples`` statements, so that a
class first seen live need not wait a whole period to be told apart from the others.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from admission import stats
from admission.model import ClassProfile, EtaModel
from admission.scheduler import Job, JobState

__all__ = [
    "CHANGE",
    "MIN_SAMPLES",
    "WINDOW",
    "OnlineEstimator",
    "WindowProfile",
    "forget_learned",
    "median_interval",
    "merge_profile",
    "trained_demand",
]

WINDOW = 32  # service times kept per class: a drifted class's median follows in 17
MIN_SAMPLES = 5  # statements before a class's live estimate is used
CHANGE = 0.25  # relative change of an estimate that makes a new model
SHARP = 0.1  # an interval narrower than this (relative to its estimate) is not narrowed again
TAIL = 0.9  # D_tail: the service time this share of a class's window ends within …
TAIL_CHANGE = 1.5  # … taken anew when it moved more than this factor (its estimate kept)
# trained classes with live samples needed to put live times in trained units: with fewer, one
# drifting class would move the scale with it (and with it every other class's estimate)
CALIBRATE_WITH = 3


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` and its distribution-free 95 % interval
    (``admission.stats.median_interval``; [min, max] for fewer than 6 values, which covers
    less than 95 %)."""
    interval = stats.median_interval(values)
    low, high = interval if interval is not None else (min(values), max(values))
    return statistics.median(values), low, high


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
        self.costs: dict[str, float] = {}  # the planner's cost estimate per class
        self.units: dict[str, float] = {}  # … and its plan's work_mem units (PostgreSQL)
        self.refreshes = 0  # models made
        # called when a class has just reached ``min_samples`` statements (its first live
        # estimate can be adopted: the live model looks sooner than its period)
        self.on_ready: Callable[[], None] | None = None

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
        seen = self.seen[fingerprint] = self.seen.get(fingerprint, 0) + 1
        if seen == self.min_samples and self.on_ready is not None:
            self.on_ready()

    def planned(self, fingerprint: str, cost: float, work_mem_units: float | None = None) -> None:
        """The database's cost estimate of a statement of this class (see ``prior``) and, in
        front of PostgreSQL, its plan's work_mem units (a class training did not count gets
        them: what a work-memory grant is divided by)."""
        if cost > 0 and math.isfinite(cost):
            self.costs[fingerprint] = cost
        if work_mem_units is not None and work_mem_units >= 0 and math.isfinite(work_mem_units):
            self.units[fingerprint] = work_mem_units

    def prior(self, classes: list[ClassProfile]) -> dict[str, float]:
        """D_r of the classes never measured that have a cost estimate: cost times the median
        D_r per unit of cost of the measured classes with one (none with fewer than
        ``CALIBRATE_WITH`` of those)."""
        per_cost = []
        for c in classes:
            cost = self.costs.get(c.fingerprint, c.cost)
            if cost and _measured(c):
                per_cost.append(c.D / cost)
        if len(per_cost) < CALIBRATE_WITH:
            return {}
        scale = statistics.median(per_cost)
        # D_r per unit of a planner's cost differs by orders of magnitude between plan shapes:
        # a prior stays within what the measured classes took (one far too high could keep a
        # class from ever running often enough to be measured)
        measured = [c.D for c in classes if _measured(c)]
        low, high = min(measured), max(measured)
        out = {}
        for c in classes:
            cost = self.costs.get(c.fingerprint, c.cost)
            if cost and not _measured(c):
                out[c.fingerprint] = min(max(scale * cost, low), high)
        return out

    def forget(self, fingerprint: str | None = None) -> None:
        """Drop the samples of one class, or of all."""
        if fingerprint is None:
            self.samples.clear()
            self.seen.clear()
        else:
            self.samples.pop(fingerprint, None)
            self.seen.pop(fingerprint, None)

    def scale(self, model: EtaModel) -> float:
        """Trained D_r per second of live service time (1 without trained classes to tell).
        A class keeps the D_r training measured (``trained_demand``) when a live estimate
        replaces it, so the classes that calibrate are the same after every refresh."""
        ratios = []
        for c in model.classes:
            times = self.samples.get(c.fingerprint)
            trained = trained_demand(c)
            if trained is not None and times is not None and len(times) >= self.min_samples:
                live = statistics.median(times)
                if live > 0:
                    ratios.append(trained / live)
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
            ordered = sorted(times)
            median, low, high = median_interval(ordered)
            tail = scale * ordered[min(len(ordered) - 1, int(TAIL * len(ordered)))]
            estimate = scale * median
            moved = abs(estimate - c.D) > self.change * max(c.D, 1e-9)
            if _measured(c) and not moved and not _sharper(c, estimate, scale * low, scale * high):
                if c.D_tail is None or not c.D_tail / TAIL_CHANGE <= tail <= c.D_tail * TAIL_CHANGE:
                    classes[i] = c.model_copy(update={"D_tail": tail})
                    changed = True
                continue
            classes[i] = c.model_copy(
                update={
                    "D": estimate,
                    "D_low": scale * low,
                    "D_high": scale * high,
                    "D_tail": tail,
                    "live": self.seen.get(c.fingerprint, len(times)),
                    "converged": None,
                    "D_trained": trained_demand(c),
                }
            )
            changed = True
        # classes not measured yet (too few statements) start from their prior: what their
        # cost estimate says, or the default profile as it is now — the median of the
        # measured classes — not as it was when they were first seen (on an empty model, an
        # arbitrary 1 s)
        for i, c in enumerate(classes):
            cost = self.costs.get(c.fingerprint)
            if cost is not None and c.cost != cost:
                classes[i] = c = c.model_copy(update={"cost": cost})
                changed = True
            units = self.units.get(c.fingerprint)
            if units is not None and c.work_mem_units is None:
                classes[i] = c.model_copy(update={"work_mem_units": units})
                changed = True
        priors = self.prior(classes)
        known = [c.D for c in classes if _measured(c)]
        if known:
            default = statistics.median(known)
            for i, c in enumerate(classes):
                if _measured(c):
                    continue
                start = priors.get(c.fingerprint, default)
                if abs(c.D - start) > self.change * start:
                    classes[i] = c.model_copy(update={"D": start, "D_low": None, "D_high": None})
                    changed = True
        if not changed:
            return None
        self.refreshes += 1
        return model.model_copy(update={"classes": tuple(classes), "eta": {}})


def trained_demand(c: ClassProfile) -> float | None:
    """The D_r training measured for the class (isolation runs or measured executions), also
    once a live estimate replaced it; None for a class training never saw."""
    if c.D_trained is not None:
        return c.D_trained
    return c.D if c.live == 0 and (c.D_runs > 0 or c.count > 0) else None


def _sharper(c: ClassProfile, estimate: float, low: float, high: float) -> bool:
    """Whether a class's live estimate now has an interval less than half as wide (relative to
    the estimate) as the one it was adopted with: the first estimate of a class rests on a few
    statements and its wide interval ties it with its neighbours; as statements come the
    interval narrows and the policies may tell the classes apart (a few times a class at most:
    the width halves with about four times the samples, up to the window; not below
    ``SHARP``)."""
    if not c.live or c.D_low is None or c.D_high is None or c.D <= 0 or estimate <= 0:
        return False
    width = (c.D_high - c.D_low) / c.D
    return width > SHARP and (high - low) / estimate < 0.5 * width


def _measured(c: ClassProfile) -> bool:
    """Whether D_r was measured (in training or live), not a prior."""
    return c.live > 0 or trained_demand(c) is not None


def forget_learned(model: EtaModel) -> EtaModel:
    """``model`` as training left it: every class that took a live estimate goes back to its
    trained D_r, or, never trained, to the default profile of the trained classes."""
    clean = {"D_low": None, "D_high": None, "live": 0, "D_trained": None, "converged": None}
    classes = [
        c.model_copy(update={**clean, "D": c.D_trained})
        if c.live and c.D_trained is not None
        else c
        for c in model.classes
    ]
    default = EtaModel(classes=tuple(c for c in classes if c.live == 0)).default_profile()
    classes = [c.model_copy(update={**clean, "D": default.D}) if c.live else c for c in classes]
    # every tail is live (also a trained class's whose estimate held)
    classes = [
        c.model_copy(update={"D_tail": None}) if c.D_tail is not None else c for c in classes
    ]
    return model.model_copy(update={"classes": tuple(classes), "eta": {}})


@dataclass(frozen=True, slots=True)
class WindowProfile:
    """What the sampler measured of one class over a window while serving (training's
    quantities: U_r, Q_r, A_r; the statements completed in the window)."""

    U: float
    Q: float
    A: float
    completed: int


def merge_profile(
    model: EtaModel,
    window: Mapping[str, WindowProfile],
    a_matrix: Mapping[str, Mapping[str, float]],
    *,
    weight: float = 0.5,
    min_completed: int = MIN_SAMPLES,
) -> EtaModel | None:
    """``model`` with U_r, Q_r, A_r and A^c_r moved toward one window's measurements: each
    becomes (1 − ``weight``) × what the model held + ``weight`` × the window's, for the classes
    that completed at least ``min_completed`` statements in it (an estimate of two statements is
    noise), so a sustained change is followed within a few windows and one odd window moves
    little. A class the model holds only on the default profile takes the window's at once.
    ``a_matrix[c][r]``: A^c_r of the window, for the admitted classes c. None when no class had
    enough statements."""
    if not 0 < weight <= 1:
        raise ValueError(f"weight must be in (0, 1], not {weight}")
    index = model.index()
    enough = {fp for fp, w in window.items() if w.completed >= min_completed and fp in index}
    if not enough:
        return None

    def blend(old: float, new: float, fresh: bool) -> float:
        return new if fresh else (1 - weight) * old + weight * new

    classes = list(model.classes)
    fresh = {fp: not _measured_profile(classes[index[fp]]) for fp in enough}
    for fp in enough:
        c, w = classes[index[fp]], window[fp]
        classes[index[fp]] = c.model_copy(
            update={
                "U": blend(c.U, w.U, fresh[fp]),
                "Q": blend(c.Q, w.Q, fresh[fp]),
                "A": blend(c.A, w.A, fresh[fp]),
                "Q_low": None,
                "Q_high": None,
                "U_low": None,
                "U_high": None,
                "profiled": c.profiled + 1,
            }
        )
    rows = [list(row) for row in model.a_matrix()]
    for c_fp, seen in a_matrix.items():
        if c_fp not in enough:
            continue
        col = index[c_fp]
        for r_fp, r_index in index.items():
            new = seen.get(r_fp, 0.0)
            rows[r_index][col] = blend(rows[r_index][col], new, fresh[c_fp])
    return model.model_copy(
        update={
            "classes": tuple(classes),
            "A_matrix": tuple(tuple(row) for row in rows),
            # the blend moved A: training's intervals no longer bound it
            "A_low": (),
            "A_high": (),
            "eta": {},
            "orders": {},
        }
    )


def _measured_profile(c: ClassProfile) -> bool:
    """Whether U_r, Q_r and A_r were measured (in training, or by the live sampler)."""
    return c.profiled > 0 or c.count > 0  # (count: statements training's concurrent run saw)
