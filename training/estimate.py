"""Class profiles from samples (SPEC §3): pure bookkeeping, time passed in.

The estimator is told when each job is admitted and completes, and every Δ how many tasks each
job in flight has in execution (and, where the probe can tell, its CPU time so far). A sample
holds until the next one (sample and hold), so over a window of length T:

* Q_r = (1/T) Σ_k n_r(t_k) · (t_{k+1} − t_k), the time-averaged class-r tasks in execution;
* U_r = (CPU seconds of class-r jobs) / (T · M);
* A^c_r = the mean of N_r seen at the admissions of class-c jobs, counting the admitted job's
  own nominal fork size when r = c; A_r = the same over admissions of any class;
* each job's thread-seconds in execution, Σ_k n_j(t_k) · (t_{k+1} − t_k), so that Little's law
  Q_r = X_r · E[thread-seconds of a class-r job] can be checked;
* 95 % intervals of Q_r, U_r and A^c_r by batch means (``Estimator.q_intervals``,
  ``u_intervals``, ``a_intervals``).

For isolation runs the per-job series of task counts becomes the fork profile: ``phases``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from admission.stats import median_interval

__all__ = [
    "ClassEstimate",
    "Estimator",
    "attribute",
    "batch_means_interval",
    "engine_fork",
    "fork_quantile",
    "fork_runs_text",
    "interquartile_range",
    "median_interval",
    "phases_of",
    "pooled_phases",
]


@dataclass(slots=True)
class _Job:
    klass: str
    admitted: float
    tasks: float = 0.0  # at the last sample
    thread_seconds: float = 0.0
    cpu: float | None = None
    series: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class ClassEstimate:
    U: float
    Q: float
    A: float
    throughput: float  # completions per second
    response: float  # mean admission-to-completion time, seconds
    thread_seconds: float  # mean per job
    cpu: float  # mean CPU seconds per job
    count: int


@dataclass(frozen=True)
class Completed:
    job: Hashable
    klass: str
    admitted: float
    completed: float
    thread_seconds: float
    cpu: float | None
    series: tuple[tuple[float, float], ...]


class Estimator:
    def __init__(
        self,
        cores: int,
        fork: Mapping[str, int] | None = None,
        keep_series: bool = False,
        keep_jobs: bool = True,
    ) -> None:
        """``keep_jobs``: keep every completed job (``completed``) and the time series the Q_r
        intervals are made of; a sampler that runs for ever (``training.live``) keeps only the
        per-class sums ``estimates`` needs, so a window costs the same memory at any rate."""
        self.cores = cores
        self.fork = dict(fork or {})
        self.keep_series = keep_series
        self.keep_jobs = keep_jobs
        self.jobs: dict[Hashable, _Job] = {}
        self.completed: list[Completed] = []
        # per class: jobs completed, Σ response time, Σ thread-seconds, Σ CPU (measured or 0)
        self._done: dict[str, list[float]] = {}
        self.first: float | None = None
        self.last: float | None = None
        self._task_time: dict[str, float] = {}  # Σ n_r · dt
        self._cpu: dict[str, float] = {}
        self._a_sum: dict[str, dict[str, float]] = {}  # [c][r]: Σ N_r at class-c admissions
        self._admissions: dict[str, int] = {}
        # Σ tasks (at the last sample) of the jobs in flight, per class: what an admission sees,
        # kept as samples and completions change it (admissions cost O(classes), not O(jobs))
        self._held: dict[str, float] = {}
        self._classes: list[str] = []
        # (from, to, class-r tasks in execution) held over [from, to): for batch means
        self._segments: list[tuple[float, float, dict[str, float]]] = []
        # (when, class admitted, class-r tasks it saw): for A^c_r's batch means
        self._admission_log: list[tuple[float, str, dict[str, float]]] = []
        self._samples = 0

    def _known(self, klass: str) -> None:
        if klass not in self._task_time:
            self._classes.append(klass)
            self._task_time[klass] = 0.0
            self._cpu[klass] = 0.0
            self._a_sum[klass] = {}
            self._admissions[klass] = 0

    def take_over(self, other: Estimator) -> None:
        """The statements in flight in ``other`` (a window that closes) finish in this one:
        their tasks count here from now on; their admission counted there."""
        for j in other.jobs.values():
            self._known(j.klass)
            self._held[j.klass] = self._held.get(j.klass, 0.0) + j.tasks
        self.jobs, other.jobs = other.jobs, {}
        other._held = {}

    def in_flight(self) -> dict[Hashable, str]:
        return {job: j.klass for job, j in self.jobs.items()}

    def admit(self, job: Hashable, klass: str, now: float) -> None:
        if klass not in self._task_time:
            self._known(klass)
        row = self._a_sum[klass]
        if self.keep_jobs:
            seen = {r: n for r, n in self._held.items() if n}  # tasks of the jobs in flight
            seen[klass] = seen.get(klass, 0.0) + self.fork.get(klass, 1)
            for r, n in seen.items():
                row[r] = row.get(r, 0.0) + n
            self._admission_log.append((now, klass, seen))
        else:  # the same sums, without the record of what each admission saw
            get = row.get
            for r, n in self._held.items():
                if n:
                    row[r] = get(r, 0.0) + n
            row[klass] = get(klass, 0.0) + self.fork.get(klass, 1)
        self._admissions[klass] += 1
        self.jobs[job] = _Job(klass, now)

    def sample(
        self,
        now: float,
        tasks: Mapping[Hashable, float],
        forks: Mapping[Hashable, float] | None = None,
    ) -> None:
        """Tasks in execution of each job in flight at ``now`` (missing: 0). ``forks``: the
        tasks each job has, running or not, for the fork profile (default: ``tasks``)."""
        if self.last is not None:
            dt = now - self.last
            held: dict[str, float] = {}
            for j in self.jobs.values():
                j.thread_seconds += j.tasks * dt
                self._task_time[j.klass] += j.tasks * dt
                held[j.klass] = held.get(j.klass, 0.0) + j.tasks
            if dt > 0 and self.keep_jobs and any(held.values()):
                self._segments.append((self.last, now, held))
        else:
            self.first = now
        self.last = now
        self._samples += 1
        held = self._held
        for job, j in self.jobs.items():
            n = float(tasks.get(job, 0.0))
            held[j.klass] = held.get(j.klass, 0.0) + n - j.tasks
            j.tasks = n
            if self.keep_series:
                j.series.append((now, float(forks.get(job, 0.0)) if forks else j.tasks))

    def complete(self, job: Hashable, now: float, cpu: float | None = None) -> None:
        """The job ended at ``now``; ``cpu``: its CPU seconds, if measured."""
        j = self.jobs.pop(job, None)
        if j is None:
            return
        if j.tasks:
            self._held[j.klass] -= j.tasks
        if self.last is not None and now > self.last:  # hold the last sample until the end
            extra = j.tasks * (now - self.last)
            j.thread_seconds += extra
            self._task_time[j.klass] += extra
            if j.tasks and self.keep_jobs:
                self._segments.append((self.last, now, {j.klass: j.tasks}))
        if cpu is not None:
            j.cpu = cpu
            self._cpu[j.klass] += cpu
        sums = self._done.setdefault(j.klass, [0, 0.0, 0.0, 0.0, 0])
        sums[0] += 1
        sums[1] += now - j.admitted
        sums[2] += j.thread_seconds
        sums[3] += j.cpu or 0.0
        if j.cpu is None:
            sums[4] += 1  # its CPU is not known
        if self.keep_jobs:
            self.completed.append(
                Completed(job, j.klass, j.admitted, now, j.thread_seconds, j.cpu, tuple(j.series))
            )

    def add_cpu(self, klass: str, seconds: float) -> None:
        """CPU of class ``klass`` that no single job could be charged with."""
        self._known(klass)
        self._cpu[klass] += seconds

    def window(self, end: float | None = None) -> float:
        if self.first is None:
            return 0.0
        return max((end if end is not None else self.last or self.first) - self.first, 1e-9)

    def classes(self) -> list[str]:
        return list(self._classes)

    def estimates(self, end: float | None = None) -> dict[str, ClassEstimate]:
        """Per class, over the window from the first sample to ``end`` (default: last)."""
        t = self.window(end)
        total_adm = sum(self._admissions.values())
        out = {}
        for r in self._classes:
            n, response, thread_seconds, cpu, unknown = self._done.get(r, (0, 0.0, 0.0, 0.0, 0))
            measured = n - unknown
            # CPU known for some completions only (a live sampler's): the others took as much
            scale = n / measured if unknown and measured else 1.0
            a_any = sum(self._a_sum[c].get(r, 0.0) for c in self._classes)
            out[r] = ClassEstimate(
                U=self._cpu[r] * scale / (t * self.cores),
                Q=self._task_time[r] / t,
                A=a_any / total_adm if total_adm else 0.0,
                throughput=n / t,
                response=response / n if n else 0.0,
                thread_seconds=thread_seconds / n if n else 0.0,
                cpu=cpu / measured if measured else 0.0,
                count=int(n),
            )
        return out

    def batch_means(self, batches: int, end: float | None = None) -> dict[str, list[float]]:
        """Per class, Q_r of each of ``batches`` equal slices of the window (the time average
        of the class's tasks in execution within the slice); their mean is Q_r."""
        t = self.window(end)
        if self.first is None or batches < 1:
            return {}
        width = t / batches
        sums = {r: [0.0] * batches for r in self._classes}
        for a, b, held in self._segments:
            a, b = a - self.first, b - self.first
            first = max(0, min(int(a / width), batches - 1))
            for i in range(first, batches):
                lo, hi = i * width, (i + 1) * width if i < batches - 1 else math.inf
                if lo >= b:
                    break
                overlap = min(b, hi) - max(a, lo)
                if overlap > 0:
                    for r, n in held.items():
                        sums[r][i] += n * overlap
        return {r: [x / width for x in row] for r, row in sums.items()}

    def _batches(self, end: float | None, min_samples: int, batches: int) -> int:
        """How many batches the window is cut into for batch means: up to ``batches``, each
        spanning at least ``min_samples`` samples and the mean response time (the scale of
        the samples' correlation); below MIN_BATCHES there is no interval."""
        t = self.window(end)
        if self.first is None or self._samples < 2:
            return 0
        delta = t / self._samples
        responses = [c.completed - c.admitted for c in self.completed]
        span = max(min_samples * delta, statistics.fmean(responses) if responses else 0.0)
        return min(batches, int(t / span) if span > 0 else batches)

    def q_intervals(
        self, end: float | None = None, batches: int = 10, min_samples: int = 10
    ) -> dict[str, tuple[float, float] | None]:
        """Per class, a 95 % interval of Q_r by batch means, or None when the run is too short.

        The samples of one run are autocorrelated — a job holds its tasks over many Δ, so
        neighbouring samples repeat each other — and the standard error of their plain mean
        would be far too small. The means of long enough batches are nearly independent, so
        the window is cut into ``batches`` equal batches (fewer when the run is short: each
        batch spans at least ``min_samples`` samples and the mean response time, the scale of
        the correlation) and a t-interval is taken of their mean. Fewer than 4 batches give
        no interval."""
        b = self._batches(end, min_samples, batches)
        if b < MIN_BATCHES:
            return {r: None for r in self._classes}
        return {r: batch_means_interval(v) for r, v in self.batch_means(b, end).items()}

    def u_intervals(
        self, end: float | None = None, batches: int = 10, min_samples: int = 10
    ) -> dict[str, tuple[float, float] | None]:
        """Per class, a 95 % interval of U_r by batch means: the CPU of the class's statements
        that completed in each batch, over the batch's length and the cores (a statement's
        CPU is known when it completes; batches span at least the mean response time, so
        most of a statement falls in the batch it completes in). The interval is the batch
        means' relative half-width around U_r itself, which also counts CPU no statement
        could be charged with (``add_cpu``). None when the run is too short, or the class
        had no measured CPU."""
        b = self._batches(end, min_samples, batches)
        out: dict[str, tuple[float, float] | None] = {r: None for r in self._classes}
        if b < MIN_BATCHES or self.first is None:
            return out
        t = self.window(end)
        width = t / b
        sums = {r: [0.0] * b for r in self._classes}
        for c in self.completed:
            if c.cpu is None:
                continue
            i = max(0, min(int((c.completed - self.first) / width), b - 1))
            sums[c.klass][i] += c.cpu / (width * self.cores)
        point = self.estimates(end)
        for r, row in sums.items():
            interval = batch_means_interval(row)
            mean = statistics.fmean(row)
            if interval is None or mean <= 0:
                continue
            u = point[r].U
            out[r] = (max(0.0, u * interval[0] / mean), u * interval[1] / mean)
        return out

    def a_intervals(
        self,
        order: Sequence[str],
        end: float | None = None,
        batches: int = 10,
        min_samples: int = 10,
    ) -> tuple[list[list[float]], list[list[float]]] | None:
        """95 % intervals of A^c_r (in ``order``, as ``a_matrix``) by batch means: the mean
        class-r tasks seen at the class-c admissions of each batch, a t-interval over the
        batches that admitted class c (neighbouring admissions see the same jobs in flight,
        so they are correlated as the samples are), widened to hold the estimate itself. An
        entry without 4 such batches is the point itself (as a class without an interval is
        elsewhere). None when the run is too short."""
        b = self._batches(end, min_samples, batches)
        if b < MIN_BATCHES or self.first is None:
            return None
        width = self.window(end) / b
        # per column c, per batch: [admissions, Σ N_r per r]
        per: dict[str, list[tuple[int, dict[str, float]]]] = {}
        for when, c, seen in self._admission_log:
            i = max(0, min(int((when - self.first) / width), b - 1))
            cells = per.setdefault(c, [(0, {}) for _ in range(b)])
            count, sums = cells[i]
            for r, n in seen.items():
                sums[r] = sums.get(r, 0.0) + n
            cells[i] = (count + 1, sums)
        point = self.a_matrix(order)
        low = [list(row) for row in point]
        high = [list(row) for row in point]
        for ci, c in enumerate(order):
            cells = [(n, sums) for n, sums in per.get(c, []) if n]
            for ri, r in enumerate(order):
                interval = batch_means_interval([sums.get(r, 0.0) / n for n, sums in cells])
                a = point[ri][ci]
                if interval is not None:
                    low[ri][ci] = max(0.0, min(interval[0], a))
                    # (≥ 0: a point a hair below zero — tasks attributed by weight, summed in
                    # floating point — made a model the loader refuses)
                    high[ri][ci] = max(interval[1], a, 0.0)
        return low, high

    def a_matrix(self, order: Sequence[str]) -> list[list[float]]:
        """A[r][c] = A^c_r in ``order`` (0 where class c was never admitted)."""
        return [
            [
                self._a_sum.get(c, {}).get(r, 0.0) / self._admissions[c]
                if self._admissions.get(c)
                else 0.0
                for c in order
            ]
            for r in order
        ]


MIN_BATCHES = 4  # fewer batch means give no interval

# the 0.975 quantile of Student's t with n − 1 degrees of freedom, n = 2 … 31 (a table: scipy
# is not a dependency of training)
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def batch_means_interval(means: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % t-interval of the mean of ``means`` (one value per batch, taken as
    independent and roughly normal): mean ± t_{0.975, n−1} · s / √n; None below
    ``MIN_BATCHES`` values. Beyond 31 values the t quantile is taken as that of 30 degrees
    of freedom (slightly wide)."""
    n = len(means)
    if n < MIN_BATCHES:
        return None
    m = statistics.fmean(means)
    half = _T975[min(n - 1, len(_T975)) - 1] * statistics.stdev(means) / math.sqrt(n)
    return m - half, m + half


def attribute(total: float, weights: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Split ``total`` tasks among jobs in proportion to their weights (a probe that sees a
    pool of threads, not which job each serves)."""
    mass = sum(weights.values())
    if mass <= 0:
        share = total / len(weights) if weights else 0.0
        return {job: share for job in weights}
    return {job: total * w / mass for job, w in weights.items()}


def phases_of(series: Sequence[tuple[float, float]], end: float) -> list[tuple[int, float]]:
    """Run-length encode a job's (time, tasks) samples into (threads, duration) phases.

    Counts are rounded to whole threads and samples with none are dropped (a job in execution
    has at least one); a phase shorter than one sample between two equal neighbours is merged
    into them, so one noisy reading does not split a phase.
    """
    points = [(t, max(1, round(n))) for t, n in series]
    if not points:
        return []
    raw: list[list[float]] = []
    for i, (t, n) in enumerate(points):
        stop = points[i + 1][0] if i + 1 < len(points) else end
        if raw and raw[-1][0] == n:
            raw[-1][1] += stop - t
        else:
            raw.append([n, stop - t])
    merged: list[list[float]] = []
    for i, (count, d) in enumerate(raw):
        lone = 0 < i < len(raw) - 1 and raw[i - 1][0] == raw[i + 1][0]
        if merged and lone and d < raw[i - 1][1] and d < raw[i + 1][1]:
            merged[-1][1] += d
            continue
        if merged and merged[-1][0] == count:
            merged[-1][1] += d
        else:
            merged.append([count, d])
    return [(int(n), d) for n, d in merged if d > 0]


def pooled_phases(runs: Sequence[Completed], bins: int = 10) -> list[tuple[int, float]]:
    """The fork profile of a class from several isolation runs: each run's samples placed on
    its own relative time (0 at admission, 1 at completion), the median thread count in each
    of ``bins`` equal slices, then run-length encoded. Durations are in units of the mean run
    length, so one noisy sample of one run does not become a phase."""
    per_bin: list[list[float]] = [[] for _ in range(bins)]
    for run in runs:
        length = run.completed - run.admitted
        if length <= 0:
            continue
        for t, n in run.series:
            u = (t - run.admitted) / length
            if 0 <= u <= 1:
                per_bin[min(int(u * bins), bins - 1)].append(max(1.0, n))
    medians: list[float | None] = [statistics.median(b) if b else None for b in per_bin]
    known = [m for m in medians if m is not None]
    if not known:
        return []
    filled, last = [], known[0]
    for m in medians:  # an empty slice continues the one before it
        last = m if m is not None else last
        filled.append(max(1, round(last)))
    mean_length = statistics.fmean(r.completed - r.admitted for r in runs)
    phases: list[tuple[int, float]] = []
    for n in filled:
        if phases and phases[-1][0] == n:
            phases[-1] = (n, phases[-1][1] + mean_length / bins)
        else:
            phases.append((n, mean_length / bins))
    return phases


def interquartile_range(values: Sequence[float]) -> float:
    """Q3 − Q1 (0 for fewer than two values): the spread of the runs, robust to a stray one."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


SAFE_FORK = 0.9  # the share of runs whose fork size the nominal f_r must cover


def fork_quantile(counts: Mapping[int, int], share: float = SAFE_FORK) -> int:
    """The smallest value at or above which fall no more than ``1 − share`` of the counts: for
    fork sizes (value → runs), the threads that cover ``share`` of the runs.

    Why a high quantile and not the most common value: where a class forks 1 thread in about
    half its runs and 2 in the rest (a short query whose first tenth holds a sample or two),
    the most common value is a coin flip between trainings, and the thread budget then admits
    more than fits half the time. The 90th percentile reserves what nearly every run takes and
    is the same from one training to the next unless the distribution itself moved."""
    total = sum(counts.values())
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= share * total:
            return value
    return max(counts)


ENGINE_BUSY = 0.25  # a thread busy for less than this share of a run does not count


def engine_fork(parallelism: float, threads: int) -> int:
    """One run's fork size from what the database reports of it: its CPU time over its wall
    time (DuckDB's profiler) is the mean number of its threads busy, p; the run forked at
    least ⌈p⌉ threads, and counting a thread only when it was busy for more than a quarter
    of the run, ⌈p − 0.25⌉ (1.2 → 1: a short parallel stretch; 1.3 → 2), at most the
    database's ``threads``. Exact where the /proc samples of a 30 ms run are one or two."""
    return max(1, min(threads, math.ceil(parallelism - ENGINE_BUSY)))


def fork_runs_text(counts: Mapping[int, int]) -> str:
    """Runs by fork size as people read them: "1: 3, 2: 37"."""
    return ", ".join(f"{size}: {n}" for size, n in sorted(counts.items()))
