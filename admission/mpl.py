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
``MplController`` is such a loop: it measures the throughput of the MPL in force and moves the
MPL one step at a time toward **the lowest MPL whose capacity is within ``tolerance`` (5 %) of
the best measured at any MPL — and, under load, high enough for what arrives**.

What it measures
----------------
Throughput at MPL m says something about m only while m is what limits it: while statements
are queued and m are in service (*saturated*). Unsaturated time — spare capacity, or the thread
budget rather than the MPL holding statements back — says nothing about m's capacity. The
*demand* is the work *arriving* per second, averaged over the last ``demand_window`` seconds:
with open arrivals it does not depend on the MPL, so it says what a lower MPL would have to
carry even while this one is saturated. The driver reports, every few hundred milliseconds, the
time elapsed, whether the gate was saturated, the statements completed and their *work* — each
one's expected service time (D_r), so that a stretch with more long statements than usual does
not read as lower throughput — and the work of the statements that arrived. A *sample* of the
MPL's capacity (work per second) closes once ``window`` seconds of saturated time and
``min_completions`` completions have gathered (long statements get longer samples), with the
share of the time at the MPL it took that was saturated; each MPL keeps its last ``samples``.
Many completions close it sooner: ``quick_completions`` (250) over at least ``quick_window``
(0.5 s) count as a sample — wherever more than 125 statements a second complete while
saturated, i.e. statements shorter on average than 8 ms × the MPL — since a count that large is
as exact as the window's count of longer statements (±6 %, against ±16 % for some 40
statements of 50 ms in 2 s); the settling after a move ends as soon too. Where the driver
tells the sum of the squared work (``work_squared``), the count is the *effective* one,
(Σw)²/Σw²: a few long statements among many short ones carry most of the work, and a sample
is as exact as their number. Point lookups at 1,500/s have the MPL's first move after ~4 s,
not ~14 s (a quarter of their throughput was lost meanwhile at the start MPL).
A sample counts as *fresh* for ``stale`` seconds.

How it moves
------------
After a move it lets the statements admitted under the old MPL finish (a window, or a quick
sample's time and count, and as many completions as there were statements in service) and then
judges the new MPL only on ``min_samples`` samples of its own. With best = the MPL whose
capacity is surely highest (its mean less one standard error; fresh, or the last measured if it
went stale, so that re-measuring nearby levels cannot compound the tolerance step by step) and
floor = (1 − tolerance) × best, raised toward best while the demand would load the lower MPL
beyond ``utilization`` (waiting grows steeply as a server fills; giving up capacity is only
cheap while there is some to spare):

1. below the floor (see *Doubt* below): one step toward the best MPL;
2. else look one higher (where the MPL above has no fresh samples) — when this MPL is the
   best known and gained significantly more than half the tolerance over the MPL below (the
   curve is still climbing: keep climbing), or when it had settled here and last looked
   ``stale`` seconds ago (the workload may have changed) — unless the database's cores were
   so busy while this MPL was saturated that no higher one can beat it by the tolerance: more
   statements at once use no less CPU each, so a busy share b leaves at most 1/b − 1 to gain,
   and below the tolerance this MPL stays the choice whatever the one above would measure,
   while the look costs a dozen seconds at a lower capacity — a backlog under an open load
   (the driver tells the busy share where it can; where it cannot, it looks);
3. else one step down when the MPL below is not known to be worse (no fresh samples — once
   ``demand_window`` has passed since the start, so that the demand is known — not
   below the floor, or — unless an open demand raised the floor — found so on fewer samples
   than a level keeps and a quarter of ``stale`` ago) — the lower MPL is what this
   controller is for;
4. else stay.

One exception to the one step at a time: on a *plateau* — the best MPL known, with no look
one higher due (the MPL above no better, or the curve not climbing), statements waiting for
it nearly all its time, and the cores idle enough that a higher MPL could gain far more than
the tolerance (``PLATEAU_ROOM``) — it looks once at twice the MPL (within ``high``), since a
curve with a dip or a flat step can rise again beyond it; rule 3 then brings it down to the
lowest MPL within the floor, and a look that found less goes straight back. Where the cores
are that idle the looks above (this one and rule 2's) do not wait for the demand window: a
higher MPL can only add throughput the cores have to give, and at the start the demand is not
needed to see that.

Doubt
-----
Samples are noisy (a 2 s sample of statements of 50 ms counts some 40 of them: ±16 %). While the
floor is the tolerance's, "within the tolerance" means "not shown to be below it" (one-sided
95 %, from the standard errors of its samples and of the best's): differences smaller than the
noise of a few samples are not told apart, and the lower MPL gets the benefit of the doubt — a
wrong guess costs at most a few per cent of capacity the load does not need. Where the *demand*
raised the floor, and it is demand that arrives whatever the MPL — the best MPL was unsaturated
more than 2 % of its time, the demand differs from that MPL's capacity significantly and by more
than the tolerance, or the number of statements in the system varies as an open stream's does
(``loop``: a backlog that keeps an open stream's MPL saturated, completing what arrives, looks
like a closed loop by the first two) — a wrong guess overloads the lower MPL, and waiting at a
server loaded near 100 % grows without bound. There an MPL is *chosen* on its estimate (to step
down to it; after any other move, on its own samples until they meet the floor) and *kept* on
the benefit of the doubt, until the demand grows more than the tolerance beyond what it was when
it last met the floor: judged on its estimate at every sample, a level as good as the best would
be left now and then for nothing. A lower MPL found below such a floor is looked at again only
once its samples are stale. On its estimate the floor is taken from the best's estimate, not
less its error: where the demand would load even the best beyond ``utilization``, a lower MPL
must measure at least as much as the best: waiting grows as 1/(1 − ρ), so a few per cent of
capacity the noise hides outweighs what a lower MPL gives the policy; and a lower MPL not
measured is not tried at all: one that does not measure the best's capacity builds, in the dozen
seconds it takes to tell, a backlog that takes minutes to drain. The price: among MPLs of the
same capacity it wanders (each looks best now and then) rather than settling on the lowest. A
closed loop's demand is whatever its MPL completes, and it saturates it all the time, so its
floor is the best, with the benefit of the doubt: it settles on the lowest MPL whose capacity is
not shown below the best's (one that completes less than the best by more than the tolerance and
its noise is judged on its estimate, as an open demand would be: it is below the floor either
way).

Between ``low`` and ``high``. Nothing here reads a clock: the driver passes the time.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["TOLERANCE", "LevelEstimate", "MplController"]

TOLERANCE = 0.05  # capacity given up for a lower MPL, at most
UTILIZATION = 0.8  # the most of a lower MPL's capacity the demand may take for it to be chosen
WINDOW = 2.0  # seconds of saturated time per capacity sample, at least
MIN_COMPLETIONS = 10  # completions per capacity sample, at least
QUICK_WINDOW = 0.5  # seconds of saturated time a sample of QUICK_COMPLETIONS needs, at least
QUICK_COMPLETIONS = 250  # completions that close a sample before WINDOW (short statements)
SAMPLES = 8  # samples kept per MPL
MIN_SAMPLES = 6  # samples an MPL needs, taken since it was last moved to, before it is judged
STALE = 600.0  # seconds a sample counts as fresh (and how often it looks again around)
DEMAND_WINDOW = 60.0  # seconds over which the demand (work arriving per second) is averaged
Z = 1.645  # one-sided 95 %: how many standard errors apart two capacities must be to differ
EPSILON = 1e-9  # equal capacities summed in another order are equal
CLOSED = 0.98  # saturated this share of the time at the best MPL: the demand is what it completes
DISPERSED = 0.5  # variance / mean of the number in the system above this: not a closed loop
PLATEAU_ROOM = 0.15  # 1/busy − 1 at least: cores idle enough to look past a plateau (see _decide)


@dataclass(frozen=True, slots=True)
class LevelEstimate:
    """What is known of one MPL's capacity (work per second, saturated)."""

    mpl: int
    mean: float
    samples: int
    stderr: float  # standard error of the mean (nan with fewer than two samples)
    age: float  # seconds since its newest sample
    fresh: bool  # its newest sample is younger than ``stale``
    saturated: float = 1.0  # share of the time at this MPL its samples took that was saturated
    cpu: float = math.nan  # the cores' busy share while saturated here (nan: not measured)


def _se(level: LevelEstimate) -> float:
    return 0.0 if math.isnan(level.stderr) else level.stderr


class _Level:
    __slots__ = ("cpus", "samples", "shares", "times")

    def __init__(self, keep: int) -> None:
        self.samples: deque[float] = deque(maxlen=keep)
        self.shares: deque[float] = deque(maxlen=keep)  # each sample's saturated share
        self.cpus: deque[float] = deque(maxlen=keep)  # each sample's busy share (nan: unknown)
        self.times: deque[float] = deque(maxlen=keep)

    def add(self, value: float, share: float, cpu: float, now: float, stale: float) -> None:
        if self.times and now - self.times[-1] >= stale:  # measured anew: the old is history
            self.samples.clear()
            self.shares.clear()
            self.cpus.clear()
            self.times.clear()
        self.samples.append(value)
        self.shares.append(share)
        self.cpus.append(cpu)
        self.times.append(now)


class MplController:
    """The feedback loop of the module docstring; ``mpl`` is the MPL to use now."""

    def __init__(
        self,
        start: int,
        *,
        low: int = 1,
        high: int = 64,
        tolerance: float = TOLERANCE,
        utilization: float = UTILIZATION,
        window: float = WINDOW,
        min_completions: int = MIN_COMPLETIONS,
        quick_window: float = QUICK_WINDOW,
        quick_completions: int = QUICK_COMPLETIONS,
        samples: int = SAMPLES,
        min_samples: int = MIN_SAMPLES,
        stale: float = STALE,
        demand_window: float = DEMAND_WINDOW,
    ) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 ≤ low ≤ high, not {low} and {high}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), not {tolerance}")
        if not 0 < utilization <= 1:
            raise ValueError(f"utilization must be in (0, 1], not {utilization}")
        if window <= 0 or stale <= 0 or demand_window <= 0 or quick_window <= 0:
            raise ValueError("window, quick_window, stale and demand_window must be positive")
        if quick_completions < max(1, min_completions):
            raise ValueError(
                f"quick_completions ({quick_completions}) must be at least min_completions "
                f"({min_completions}) and 1"
            )
        if not 1 <= min_samples <= samples:
            raise ValueError(f"need 1 ≤ min_samples ≤ samples, not {min_samples}, {samples}")
        self.low, self.high = low, high
        self.mpl = min(max(start, low), high)
        self.tolerance, self.utilization = tolerance, utilization
        self.window, self.min_completions, self.stale = window, max(0, min_completions), stale
        self.quick_window, self.quick_completions = min(quick_window, window), quick_completions
        self.keep, self.min_samples, self.demand_window = samples, min_samples, demand_window
        self.changes = 0  # MPL changes made
        self.reason = "starting"  # why the MPL is what it is, for people
        self._arrived = 0.0  # work arriving per second, a moving average over demand_window
        self._weight = 0.0  # the share of that average that is not the start's zero
        self._observed = 0.0  # seconds observed since the start (or ``forget``)
        self._levels: dict[int, _Level] = {}
        self._work = 0.0  # work completed in the current sample's saturated time
        self._work2 = 0.0  # … the sum of its squares, per statement (nan: not told)
        self._done = 0  # completions in it
        self._filled = 0.0  # saturated seconds in it
        self._spent = 0.0  # seconds at this MPL, saturated or not, while it was gathered
        self._busy = 0.0  # busy core-share × seconds in it (where the driver measures the CPU)
        self._timed = 0.0  # saturated seconds in it with the CPU measured
        self._taken = 0  # samples taken at the current MPL since it was moved to
        # after a move: saturated seconds and completions let pass before measuring (the
        # statements admitted under the old MPL are still in service for a while), and the
        # completions that must pass at least (as many as were in service)
        self._settle, self._settle_done = 0.0, 0
        self._settle_work = self._settle_work2 = 0.0
        self._settle_least = self.mpl  # (at the start too: what is in service came before)
        self._looked_up: dict[int, float] = {}  # MPL → when it last looked one higher
        self._settled = False  # the last decision was to stay (looks up start only from there)
        self._earned: float | None = None  # the demand when this MPL last met a raised floor
        self._probed_from: int | None = None  # the MPL a look past a plateau came from
        # the number in the system at each report, and its square: moving averages over
        # demand_window, from zero (``loop``)
        self._n = 0.0
        self._n2 = 0.0
        self._now = -math.inf

    # -- what the driver tells -----------------------------------------------------------

    def observe(
        self,
        now: float,
        elapsed: float,
        saturated: bool,
        work: float,
        completed: int = 0,
        *,
        arrived: float,
        in_system: int,
        cpu: float | None = None,
        work_squared: float | None = None,
    ) -> int | None:
        """``elapsed`` seconds ending at ``now`` passed, saturated or not, in which
        ``completed`` statements completed with ``work`` seconds of expected service in all,
        and statements with ``arrived`` seconds of it arrived; ``in_system`` statements are
        queued or in service now; the database's cores were busy ``cpu`` of the time (0–1;
        None where the driver cannot tell); ``work_squared``: the sum over the completed
        statements of their work squared (None: not told — then every completion counts as
        one toward a quick sample). Returns the new MPL when it changes."""
        self._now = max(self._now, now)
        if elapsed <= 0:
            return None
        share = min(1.0, elapsed / self.demand_window)
        self._arrived += share * (arrived / elapsed - self._arrived)
        self._weight += share * (1.0 - self._weight)
        self._observed += elapsed
        self._n += share * (in_system - self._n)
        self._n2 += share * (in_system * in_system - self._n2)
        settling = self._settle_least >= 0
        if not saturated:
            if not settling:
                self._spent += elapsed
            return None
        squares = math.nan if work_squared is None else work_squared
        if settling:
            self._settle += elapsed
            self._settle_done += completed
            self._settle_work += work
            self._settle_work2 += squares
            quick = self._quick(
                self._settle, self._settle_done, self._settle_work, self._settle_work2
            )
            if self._settle_done >= self._settle_least and (self._settle >= self.window or quick):
                self._settle_least = -1  # settled: measured from the next report
            return None
        self._work += work
        self._work2 += squares
        self._done += completed
        self._filled += elapsed
        self._spent += elapsed
        if cpu is not None:
            self._busy += min(max(cpu, 0.0), 1.0) * elapsed
            self._timed += elapsed
        if not self._enough(self._filled, self._done):
            return None
        level = self._levels.get(self.mpl)
        if level is None:
            level = self._levels[self.mpl] = _Level(self.keep)
        busy = self._busy / self._timed if self._timed > 0 else math.nan
        level.add(self._work / self._filled, self._filled / self._spent, busy, now, self.stale)
        self._work, self._done, self._filled, self._spent = 0.0, 0, 0.0, 0.0
        self._busy = self._timed = self._work2 = 0.0
        self._taken += 1
        if self._taken < self.min_samples:
            return None
        return self._decide(now)

    def _enough(self, seconds: float, completions: int) -> bool:
        """A sample of ``seconds`` saturated and ``completions`` is long enough: the window
        and a few completions, or many completions in less."""
        if seconds >= self.window and completions >= self.min_completions:
            return True
        return self._quick(seconds, completions, self._work, self._work2)

    def _quick(self, seconds: float, completions: int, work: float, squares: float) -> bool:
        """``completions`` with ``work`` in all (``squares``: its squares summed; nan: not
        told) over ``seconds`` make a quick sample: the quick window, and as many completions
        — effective ones, (Σw)²/Σw², where the squares are told."""
        if seconds < self.quick_window or completions < self.quick_completions:
            return False
        if math.isnan(squares) or squares <= 0:
            return True  # (not told the squares: a completion counts as one)
        return work * work / squares >= self.quick_completions

    @property
    def loop(self) -> bool:
        """The number in the system hardly varies: a closed loop, whose demand is what its MPL
        completes.

        Each client of a closed loop sends its next statement as its last one completes, so
        the number queued or in service stays at the number of clients, less the few between
        a result and their next statement: its variance is a small part of its mean. An open
        stream's varies at least as a Poisson count's (variance = mean) and, near saturation
        or while a backlog builds or drains, many times more — however long or short its
        statements are. A loop whose think time is long against its response time varies
        as a binomial count, its variance near its mean, and its demand barely depends on its
        MPL: it reads as open, rightly. With nothing in the system yet it is a loop (nothing
        says open)."""
        mean = self._n / self._weight if self._weight > 0 else 0.0
        if mean <= 0:
            return True
        variance = max(0.0, self._n2 / self._weight - mean * mean)
        return variance < DISPERSED * mean

    @property
    def demand(self) -> float:
        """Work arriving per second, averaged over the last ``demand_window`` seconds (over
        all seen so far, at the start: an average from zero would read as no demand)."""
        return self._arrived / self._weight if self._weight > 0 else 0.0

    def forget(self) -> None:
        """Drop every sample and the demand (the unit of work changed), keep the MPL."""
        self._arrived = self._weight = self._observed = 0.0
        self._n = self._n2 = 0.0
        self._earned = None
        self._levels.clear()
        self._looked_up.clear()
        self._work, self._done, self._filled, self._taken = 0.0, 0, 0.0, 0
        self._spent = self._busy = self._timed = self._work2 = 0.0

    # -- what it knows ---------------------------------------------------------------------

    def estimates(self) -> list[LevelEstimate]:
        """Each MPL measured, lowest first (stale ones too, marked)."""
        out = []
        for mpl in sorted(self._levels):
            level = self._levels[mpl]
            if not level.samples:
                continue
            values = list(level.samples)
            n = len(values)
            stderr = statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
            age = self._now - level.times[-1]
            mean, share = statistics.fmean(values), statistics.fmean(level.shares)
            cpus = [c for c in level.cpus if not math.isnan(c)]
            cpu = statistics.fmean(cpus) if cpus else math.nan
            out.append(LevelEstimate(mpl, mean, n, stderr, age, age < self.stale, share, cpu))
        return out

    def floor(self, best: float) -> float:
        """The least capacity an MPL may have to be chosen: within tolerance of the best, and
        not loaded beyond ``utilization`` by the demand (never above the best itself)."""
        return min(best, max((1 - self.tolerance) * best, self.demand / self.utilization))

    # -- how it moves ----------------------------------------------------------------------

    def _decide(self, now: float) -> int | None:
        every = {e.mpl: e for e in self.estimates()}
        here = every[self.mpl]  # fresh: just sampled
        # the highest of several noisy means is high by luck (the winner's curse): the best
        # is the MPL whose capacity is surely highest — the highest mean less one standard
        # error — and the floor is taken from there
        best = max(every.values(), key=lambda e: e.mean - _se(e))
        surely = max(best.mean - _se(best), 0.0)
        floor = self.floor(surely)
        strict = self.floor(best.mean)  # the floor on an estimate (see ``acceptable``)
        lower = every.get(self.mpl - 1)
        upper = every.get(self.mpl + 1)

        # the benefit of the doubt is for the tolerance alone: a floor raised by a demand
        # that arrives whatever the MPL — the best MPL left spare time, or the demand differs
        # significantly from what it completes — is one an MPL must reach on its estimate
        # (*Doubt* in the module's docstring)
        raised = floor > (1 - self.tolerance) * surely
        gap = abs(self.demand - best.mean) - self.tolerance * best.mean
        open_demand = best.saturated < CLOSED or gap > Z * _se(best) or not self.loop
        enter = 0.0 if raised and open_demand else Z
        # an MPL is chosen on ``enter`` (to step down to it; after any other move, on its own
        # samples until they meet the floor) and kept on the benefit of the doubt once it met
        # the floor on its estimate — judged on every sample, an estimate would leave a level
        # of the same capacity as the best for no reason now and then — until the demand grows
        # beyond the tolerance over what it was then (or it was chosen under the tolerance's)
        earned = self._earned is not None and self.demand <= (1 + self.tolerance) * self._earned
        doubt = Z if enter > 0 or earned else 0.0

        def acceptable(level: LevelEstimate, doubt: float) -> bool:
            """Not below the floor by more than ``doubt`` standard errors (one-sided, the
            best's noise too). With none (0), on the estimate, against a floor taken from the
            best's estimate too: near saturation waiting grows as 1/(1 − ρ), and a few per
            cent of capacity the noise hides is worth more than a lower MPL."""
            if level.mpl == best.mpl:
                return True
            if doubt == 0:
                return level.mean >= strict * (1 - EPSILON)
            scale = floor / best.mean if best.mean > 0 else 1.0
            noise = math.hypot(_se(level), scale * _se(best))
            return level.mean >= floor * (1 - EPSILON) - doubt * noise

        if doubt == 0 and acceptable(here, 0.0):
            self._earned = self.demand
        if not acceptable(here, doubt):
            step = 1 if best.mpl > self.mpl else -1
            limit = floor if doubt > 0 else strict
            why = f"capacity {here.mean:.3g} below the floor {limit:.3g}"
            if self._probed_from is not None:  # a look past a plateau that did not pay: back
                return self._move(self._probed_from, f"{why}: back from the look")
            return self._move(self.mpl + step, f"{why} (best {best.mean:.3g} at MPL {best.mpl})")
        gain = 1 + self.tolerance / 2
        climbing = (
            best.mpl == self.mpl
            and lower is not None
            and lower.fresh
            and here.mean - gain * lower.mean > Z * math.hypot(_se(here), gain * _se(lower))
        )
        # an MPL not measured is tried (above when due, below) only once the demand is
        # known: a minute's average, and whether it is open, read from this MPL's samples
        # after whatever backlog the start brought (a queue built at the start saturates any
        # MPL, as a closed loop does) — above sooner where the cores are idle (``spare``)
        steady = self._observed >= self.demand_window
        looked = self._looked_up.get(self.mpl, -math.inf)
        # cores so busy while this MPL is saturated that a higher one could gain at most
        # 1/busy − 1, less than the tolerance: this MPL would stay the choice whatever the one
        # above measured, and the look, a dozen seconds at a lower capacity (a backlog under
        # an open load), cannot pay. Looked at again once they are not (the workload
        # changed, and now waits on something else)
        # (nor does a curve that climbed to here: the step above is what the cores bound)
        busy = here.cpu * (1 + self.tolerance) >= 1  # (False when not measured: nan)
        # cores idle enough that a higher MPL could gain far more than the tolerance: the MPL
        # is what holds the throughput back, not the cores, so looking above costs nothing the
        # cores would have given — from the start: the demand need not be known to look up
        # (a queue built at the start saturates any MPL, and a higher one drains it sooner).
        # A minute at the start MPL cost point lookups a fifth of their throughput
        spare = here.cpu * (1 + PLATEAU_ROOM) <= 1  # (False when not measured: nan)
        due = (steady or spare) and self._settled and now - looked >= self.stale
        above_unknown = upper is None or not upper.fresh
        if self.mpl < self.high and above_unknown and (climbing or due) and not busy:
            self._looked_up[self.mpl] = now
            why = "still climbing" if climbing else "nothing fresh above"
            if not math.isnan(here.cpu):
                why += f" (cores {here.cpu:.0%} busy)"
            return self._move(self.mpl + 1, f"{why}: looking one higher")
        # a plateau: the best MPL known, where the look one higher is not due (the MPL above
        # was measured and is no better, or the curve stopped climbing), statements waited for
        # it nearly all its time, and the cores had far more to give than the tolerance
        # (1/busy − 1 ≥ PLATEAU_ROOM) — what holds the throughput back is the MPL's own pace,
        # not the cores. A local search stops at a dip or on a flat step of a curve that rises
        # again further up (point lookups through the embedded server, a closed loop of 8:
        # +14 % from MPL 2 to 3, 4 measured lower than 3, +15 % from 4 to 8, the cores 64–70 %
        # busy). One look at twice this MPL (within ``high``), measured there once; from there
        # it steps down to the lowest MPL within the floor as always, or goes straight back
        # if the look found less
        target = min(self.high, 2 * self.mpl)
        far = every.get(target)
        if (
            target > self.mpl + 1
            and best.mpl == self.mpl
            and here.saturated >= CLOSED
            and spare
            and (far is None or not far.fresh)
        ):
            self._looked_up[self.mpl] = now
            came = self.mpl
            moved = self._move(
                target, f"a plateau with the cores {here.cpu:.0%} busy: looking at MPL {target}"
            )
            self._probed_from = came
            return moved
        # a lower MPL found worse on thin evidence (fewer samples than a level keeps) is
        # looked at again sooner: one unlucky measurement must not hold for the whole stale
        thin = (
            enter > 0
            and lower is not None
            and lower.samples < self.keep
            and lower.age >= self.stale / 4
        )
        known = lower.fresh and not thin if lower is not None else False
        # where an open demand would load even the best beyond ``utilization``, a lower MPL
        # would have to measure the best's capacity to be kept, and trying one that does not
        # builds a backlog that takes minutes to drain: none is tried unmeasured
        hot = enter == 0 and self.demand >= self.utilization * surely
        if self.mpl > self.low and (
            (not known and steady and not hot)
            or (lower is not None and known and acceptable(lower, enter))
        ):
            moved = self._move(self.mpl - 1, "capacity within the floor: trying lower")
            if known and enter == 0:
                self._earned = self.demand  # chosen on its estimate: kept on the doubt
            return moved
        self._settled = True
        limit = floor if enter > 0 else strict
        cores = "" if math.isnan(here.cpu) else f", cores {here.cpu:.0%} busy"
        self.reason = (
            f"the lowest MPL with capacity ≥ {limit:.3g} (best {best.mean:.3g} at MPL "
            f"{best.mpl}, demand {self.demand:.3g}{cores})"
        )
        return None

    def _move(self, mpl: int, reason: str) -> int | None:
        mpl = min(max(mpl, self.low), self.high)
        self.reason = reason
        if mpl == self.mpl:
            return None
        old, self.mpl = self.mpl, mpl
        self.changes += 1
        self._settled, self._earned, self._probed_from = False, None, None
        self._work, self._done, self._filled, self._taken = 0.0, 0, 0.0, 0
        self._spent = self._busy = self._timed = self._work2 = 0.0
        self._settle, self._settle_done, self._settle_least = 0.0, 0, old
        self._settle_work = self._settle_work2 = 0.0
        return mpl
