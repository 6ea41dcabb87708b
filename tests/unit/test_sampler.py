"""The sampler's two ways of hearing statements: at once, or noted and replayed each Δ; and the
per-sample CPU accounting of backends (``PostgresTicks``) on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Hashable, Iterator, Sequence

import pytest

from training.estimate import Estimator
from training.proc import read_task
from training.sampler import Event, PostgresTicks, Recorder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counted:
    """Jobs whose tasks in execution are given by the test (the replay is what is tested)."""

    exact_cpu = True

    def __init__(self) -> None:
        self.klass: dict[Hashable, str] = {}
        self.settled: list[int] = []

    def begin(self, job: Hashable, klass: str, pid: int | None) -> None:
        self.klass[job] = klass

    def sample(self) -> tuple[dict[Hashable, float], dict[Hashable, float] | None]:
        return {job: 2.0 if k == "long" else 1.0 for job, k in self.klass.items()}, None

    def end(self, job: Hashable) -> float | None:
        return 0.01 if self.klass.pop(job) == "long" else 0.002

    def settle(self, events: Sequence[Event], now: float) -> None:
        self.settled.append(len(events))


def _drive(recorder: Recorder, clock: Clock) -> None:
    """Admissions and completions of two classes between samples every 0.05 s."""
    in_flight: list[tuple[int, str]] = []
    for step in range(400):
        clock.now = step * 0.0125
        if step % 4 == 0:
            recorder.sample_now()
        if len(in_flight) > 3 or (in_flight and step % 3 == 0):
            done, _ = in_flight.pop(0 if step % 2 else -1)
            recorder.released(done)
        klass = "long" if step % 5 == 0 else "short"
        recorder.admitted(step, klass, None)
        in_flight.append((step, klass))
    clock.now += 0.05
    recorder.sample_now()


def test_deferred_events_give_the_estimates_of_immediate_ones() -> None:
    at_once, at_once_clock = Recorder(Estimator(2), Counted(), lambda _: ("?", None)), Clock()
    at_once.clock = at_once_clock
    jobs = Counted()
    later = Recorder(Estimator(2), jobs, lambda _: ("?", None), deferred=True)
    later_clock = Clock()
    later.clock = later_clock
    _drive(at_once, at_once_clock)
    _drive(later, later_clock)
    assert not later.events and sum(jobs.settled) == 2 * 400 - 4  # every note replayed once
    assert at_once.estimator.estimates() == later.estimator.estimates()
    order = at_once.estimator.classes()
    assert order == later.estimator.classes()
    assert at_once.estimator.a_matrix(order) == later.estimator.a_matrix(order)


@pytest.fixture
def processes() -> Iterator[tuple[int, int]]:
    """A process that computes without pause and one that sleeps: two "backends"."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.1)
        yield busy.pid, idle.pid
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def _cpu(pid: int) -> float:
    reading = read_task(f"/proc/{pid}")
    assert reading is not None
    return reading.cpu


def _warmed(busy: int, idle: int) -> tuple[PostgresTicks, float]:
    """Ticks that have sampled once: the first statements are unmeasured (no baseline yet),
    every backend then has one; returns the time of the last sample."""
    jobs = PostgresTicks()
    t0 = time.monotonic()
    jobs.settle([(True, "w", "warm", busy, t0), (True, "v", "warm", idle, t0)], t0)
    jobs.begin("w", "warm", busy)
    jobs.begin("v", "warm", idle)
    assert jobs.probe.postmaster == os.getpid() and jobs.reaped_at_start is not None
    jobs.sample()  # lists this process's children: a baseline for each
    assert busy in jobs.started and idle in jobs.started
    t1 = time.monotonic()
    jobs.settle([(False, "w", None, None, t1), (False, "v", None, None, t1)], t1)
    jobs.sample()
    assert jobs.end("w") is None and jobs.end("v") is None  # (no baseline at their start)
    return jobs, t1


@pytest.mark.serial  # busy processes whose CPU it reads: alone
def test_ticks_charge_each_backend_to_the_statements_it_served(
    processes: tuple[int, int],
) -> None:
    busy, idle = processes
    jobs, t0 = _warmed(busy, idle)
    begun: list[Event] = [(True, "a", "work", busy, t0), (True, "b", "rest", idle, t0)]
    base = jobs.last_cpu[busy]  # (read at the last sample, at t0: "a" starts from it)
    jobs.settle(begun, t0)
    for _admitted, job, klass, pid, _at in begun:
        jobs.begin(job, klass or "", pid)
    time.sleep(0.3)
    t1 = time.monotonic()
    jobs.settle([(False, "a", "", None, t1)], t1)
    tasks, _ = jobs.sample()
    assert set(tasks) == {"a", "b"}  # both still held at the sample …
    a = jobs.end("a")  # … then "a"'s completion is replayed
    assert a == pytest.approx(jobs.last_cpu[busy] - base)  # the busy backend's whole CPU
    assert a is not None and 0 < a <= _cpu(busy) - base + 1e-9
    time.sleep(0.05)
    t2 = time.monotonic()
    jobs.settle([(False, "b", "", None, t2)], t2)
    b = jobs.end("b")
    assert b is not None and b < 0.01  # the sleeping backend used (almost) nothing


@pytest.mark.serial  # busy processes whose CPU it reads: alone
def test_ticks_share_a_backend_by_time_held_and_drop_bypass_shares(
    processes: tuple[int, int],
) -> None:
    busy, idle = processes
    jobs, t0 = _warmed(busy, idle)
    time.sleep(0.3)
    # on one backend: a statement from t0 to +0.1, one that passed admission (a statement in a
    # transaction block: never learned) to +0.2, then the next admitted one to +0.3
    events: list[Event] = [
        (True, "c", "first", busy, t0),
        (False, "c", "", None, t0 + 0.1),
        (True, "p", None, busy, t0 + 0.1),
        (False, "p", None, None, t0 + 0.2),
        (True, "d", "second", busy, t0 + 0.2),
    ]
    before = jobs.last_cpu[busy]
    jobs.settle(events, t0 + 0.3)
    used = jobs.last_cpu[busy] - before
    assert used > 0
    jobs.begin("c", "first", busy)
    c = jobs.end("c")
    jobs.begin("d", "second", busy)
    assert c == pytest.approx(used / 3)
    assert jobs.jobs["d"].charged == pytest.approx(used / 3)
    assert not jobs.passing and not jobs.owed


@pytest.mark.serial  # busy processes whose CPU it reads: alone
def test_ticks_leave_a_backend_newer_than_the_last_sample_or_gone_unmeasured(
    processes: tuple[int, int],
) -> None:
    busy, idle = processes
    jobs, t0 = _warmed(busy, idle)
    new = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    gone = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        jobs.sample()  # lists both: a baseline each
        assert gone.pid in jobs.started
        newer = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)
        gone.kill()
        gone.wait()
        t1 = time.monotonic()
        events: list[Event] = [
            (True, "n", "work", new.pid, t0),
            (True, "g", "work", gone.pid, t0),
            (True, "m", "work", newer.pid, t0),
        ]
        jobs.settle([*events, *((False, job, "", None, t1) for _, job, _, _, _ in events)], t1)
        for _, job, klass, pid, _ in events:
            jobs.begin(job, klass or "", pid)
        n = jobs.end("n")
        assert n is not None and n > 0  # listed at the last sample: measured from there
        assert jobs.end("g") is None  # its backend gone by this sample: CPU unknown
        assert jobs.end("m") is None  # newer than the last sample: its setup not told apart
        assert not jobs.unmeasured and not jobs.owed
        newer.kill()
        newer.wait()
        jobs.sample()
        assert gone.pid not in jobs.started and newer.pid not in jobs.started
    finally:
        for p in (new, gone):
            p.kill()
            p.wait()
