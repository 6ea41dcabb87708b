"""Training's sampler while serving: U_r, Q_r, A_r and A^c_r kept current (``serve``).

``admission train`` measures a class's profile once, in a concurrent run it drives itself.
``LiveProfile`` runs the very same measurement on whatever the clients send: a ``Recorder``
(``training.sampler``) hears the scheduler's admissions and completions and samples, every
``interval`` seconds from a thread of its own, how many tasks each statement in flight has in
execution (the embedded DuckDB's threads, or a local PostgreSQL's backends and parallel
workers, from /proc). Every ``window`` seconds the window's ``Estimator`` is closed — the
statements in flight carry over into the next — and its U_r, Q_r, A_r and A^c_r are blended
into the live model (``admission.online.merge_profile``: halfway toward each window's values,
for the classes that completed enough statements in it), which the gate swaps in like any
learned model. D_r is learned from service times (``proxy.learning``); f_r stays training's.

Only what runs on this machine can be sampled: in front of a PostgreSQL elsewhere the probe
sees no process, and the first window that completed statements but saw no task in execution
stops the sampler (logged, and shown in ``/status``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any

from admission.online import WindowProfile, merge_profile
from admission.scheduler import Job
from proxy.learning import LiveModel
from training.estimate import Estimator
from training.proc import ThreadProbe, read_task
from training.sampler import DuckDBJobs, Jobs, PostgresJobs, PostgresTicks, Recorder

__all__ = ["INTERVAL", "WINDOW", "LiveProfile"]

log = logging.getLogger("admission.profile")

INTERVAL = 0.2  # seconds between samples (the thesis' Δ; training's default is 50 ms)
WINDOW = 60.0  # seconds per window of estimates
BLIND_AFTER = 20  # statements completed in a window …
BLIND_SHARE = 0.05  # … their tasks seen in execution under this share of their admitted time …
BLIND_WINDOWS = 3  # … and so many such windows in a row stop the sampler


class LiveProfile:
    def __init__(
        self,
        learning: LiveModel,
        jobs: Jobs,
        cores: int,
        *,
        interval: float = INTERVAL,
        window: float = WINDOW,
    ) -> None:
        if interval <= 0 or window <= interval:
            raise ValueError(f"need 0 < interval < window, not {interval} and {window}")
        self.learning = learning
        self.gate = learning.gate
        self.cores, self.interval, self.window = cores, interval, window
        # deferred: the loop only notes admissions and completions; the sampling thread
        # replays them each Δ (no lock and no /proc read per statement on the proxy's loop)
        self.recorder = Recorder(self._estimator(), jobs, self._describe, interval, deferred=True)
        # the scheduler's grant and finish observers hand over the job itself: no event
        # objects, no lookups (what every statement pays for the profile: benchmarks.online_cost)
        # statements that pass admission share a backend's time (PostgreSQL only)
        self.shares_backends = isinstance(jobs, PostgresTicks)
        self.gate.scheduler.observe(grants=self._granted, finishes=self._finished)
        self.windows = 0  # windows closed
        self.merged = 0  # of them, the ones that moved the model
        self.stopped_because: str | None = None
        self.blind = 0  # windows in a row that completed statements and saw no task running
        self.check_pids = False
        self._started = 0.0
        self._timer: asyncio.TimerHandle | None = None
        learning.profile_status = self.status

    @classmethod
    def for_embedded(cls, learning: LiveModel, cores: int, **kwargs: Any) -> LiveProfile:
        model = learning.gate.scheduler.model
        weights = {c.fingerprint: float(c.f) for c in model.classes}
        return cls(learning, DuckDBJobs(ThreadProbe(), weights), cores, **kwargs)

    @classmethod
    def for_postgresql(cls, learning: LiveModel, cores: int, **kwargs: Any) -> LiveProfile:
        profile = cls(learning, PostgresTicks(), cores, **kwargs)
        profile.check_pids = True  # the first backend pid says whether the server is here
        return profile

    def _estimator(self) -> Estimator:
        model = self.gate.scheduler.model
        fork = {c.fingerprint: c.f for c in model.classes}
        return Estimator(self.cores, fork, keep_jobs=False)  # sums only: bounded at any rate

    def _describe(self, job: Hashable) -> tuple[str, int | None]:
        record = self.gate.scheduler.job(job)
        return (record.fingerprint if record is not None else "?"), self._pid(job)

    def _pid(self, job: Hashable) -> int | None:
        client = self.gate.client(job)  # type: ignore[arg-type]
        return client.backend_pid if client is not None else None

    def _granted(self, job: Job, _tasks: Sequence[int]) -> None:
        if not self.recorder.recording:
            return
        if job.bypass:
            if self.shares_backends:
                self.recorder.passed(job.id, self._pid(job.id))
        else:
            pid = self._pid(job.id)
            if self.check_pids and pid is not None:
                self.check_pids = False
                why = _not_local_postgres(pid)
                if why is not None:
                    self.stop(why)
                    return
            self.recorder.admitted(job.id, job.klass.fingerprint, pid)

    def _finished(self, job: Job, _now: float) -> None:
        if not self.recorder.recording:
            return
        if not job.bypass:
            self.recorder.released(job.id)
        elif self.shares_backends:
            self.recorder.passed_done(job.id)

    def start(self) -> None:
        """Start sampling (call on the proxy's loop)."""
        self._started = time.monotonic()
        self.recorder.start()
        self._timer = asyncio.get_running_loop().call_later(self.window, self._roll)

    def stop(self, why: str | None = None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.recorder.stop()  # (also a sampler that stopped recording by itself: its thread)
        if why is not None:
            self.stopped_because = why
            log.warning("live profile stopped: %s", why)

    def sampler_share(self) -> float:
        """CPU the sampling thread has used, as a share of one core since it started."""
        tid = self.recorder.sampler_tid
        elapsed = time.monotonic() - self._started
        if tid is None or elapsed <= 0:
            return 0.0
        reading = read_task(f"/proc/self/task/{tid}")
        cpu = reading.cpu if reading is not None else self.recorder.sampler_cpu
        return cpu / elapsed

    def status(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "window": self.window,
            "windows": self.windows,
            "windows_merged": self.merged,
            "sampler_cpu_share": self.sampler_share(),
            "stopped_because": self.stopped_because,
        }

    def _roll(self) -> None:
        """Close the window: its estimates into the model, a new window for what follows."""
        self._timer = asyncio.get_running_loop().call_later(self.window, self._roll)
        try:
            self._close_window()
        except Exception:  # the profile must never stop the proxy
            log.exception("the live profile failed to close a window")

    def _close_window(self) -> None:
        recorder = self.recorder
        recorder.flush()  # what was noted up to now counts in this window (the loop notes)
        if recorder.failure is not None:
            self.stop(f"the sampler failed: {recorder.failure}")
            return
        with recorder.lock:
            old = recorder.estimator
            new = self._estimator()
            new.take_over(old)  # statements in flight finish in the next window
            recorder.estimator = new
            jobs = recorder.jobs
            if isinstance(jobs, PostgresJobs):
                jobs.prune()
        self.windows += 1
        estimates = old.estimates()
        done = sum(e.count for e in estimates.values())
        # tasks seen in execution per statement admitted (Σ Q_r over Little's Σ X_r·R_r): about
        # f_r for statements that compute, near 0 for pids that are not theirs (or that sleep)
        admitted = sum(e.throughput * e.response for e in estimates.values())
        running = sum(e.Q for e in estimates.values())
        if done >= BLIND_AFTER and running < BLIND_SHARE * admitted:
            self.blind += 1  # (one window may miss: short statements slip between samples)
            if self.blind >= BLIND_WINDOWS:
                self.stop(
                    f"{BLIND_WINDOWS} windows in a row completed statements but saw their tasks "
                    f"in execution {running / admitted:.1%} of the time they were admitted: no "
                    "task of theirs to learn from (is the database on another machine?)"
                )
                return
        else:
            self.blind = 0
        order = old.classes()
        matrix = old.a_matrix(order)
        seen = {c: {r: matrix[i][j] for i, r in enumerate(order)} for j, c in enumerate(order)}
        window = {fp: WindowProfile(e.U, e.Q, e.A, e.count) for fp, e in estimates.items()}
        merged = merge_profile(self.gate.scheduler.model, window, seen)
        if merged is not None:
            self.merged += 1
            self.learning.swap(merged)


def _not_local_postgres(pid: int) -> str | None:
    """Why the PostgreSQL backend ``pid`` (from its BackendKeyData) is not a process of this
    machine the sampler can follow, or None. A server elsewhere (or in a container) has pids
    that here name nothing, or another program."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return f"the server's backend {pid} is no process of this machine (a server elsewhere?)"
    if b"postgres" not in cmdline:
        return (
            f"process {pid} of this machine is not the server's backend (a server elsewhere, "
            "or in a container?)"
        )
    return None
