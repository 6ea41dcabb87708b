"""The sampler's two ways of hearing statements: at once, or noted and replayed each Δ; and the
per-tick CPU accounting of backends (``PostgresJobs(per_tick=True)``) on real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Hashable, Iterator, Sequence

import pytest

from training.estimate import Estimator
from training.proc import read_task
from training.sampler import Event, PostgresJobs, Recorder


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


def test_per_tick_charges_each_backend_to_the_statements_it_served(
    processes: tuple[int, int],
) -> None:
    busy, idle = processes
    jobs = PostgresJobs(per_tick=True)
    t0 = time.monotonic()
    begun: list[Event] = [(True, "a", "work", busy, t0), (True, "b", "rest", idle, t0)]
    jobs.settle(begun, t0)  # first readings: baselines; the window opens (its parent named)
    assert jobs.probe.postmaster is not None and jobs.reaped_at_start is not None
    for admitted, job, klass, pid, _at in begun:
        assert admitted
        jobs.begin(job, klass, pid)
    base = jobs.last_cpu[busy]
    time.sleep(0.3)
    t1 = time.monotonic()
    jobs.settle([(False, "a", "", None, t1)], t1)
    tasks, _ = jobs.sample()
    assert set(tasks) == {"a", "b"}  # both still held at the sample …
    a = jobs.end("a")  # … then "a"'s completion is replayed
    assert a == pytest.approx(jobs.last_cpu[busy] - base)  # the busy backend's whole CPU
    assert a is not None and a > 0.05
    assert a <= _cpu(busy) - base + 1e-9
    time.sleep(0.05)
    t2 = time.monotonic()
    jobs.settle([(False, "b", "", None, t2)], t2)
    b = jobs.end("b")
    assert b is not None and b < 0.01  # the sleeping backend used (almost) nothing


def test_per_tick_shares_a_backend_among_its_statements_by_time_held(
    processes: tuple[int, int],
) -> None:
    busy, _ = processes
    jobs = PostgresJobs(per_tick=True)
    t0 = time.monotonic()
    jobs.settle([(True, "z", "warm", busy, t0), (False, "z", "", None, t0)], t0)  # baseline
    jobs.begin("z", "warm", busy)
    assert jobs.end("z") == 0.0
    time.sleep(0.3)
    # one statement from t0 to t0 + 0.1, the next on the same backend from then to t0 + 0.3
    events: list[Event] = [
        (True, "c", "first", busy, t0),
        (False, "c", "", None, t0 + 0.1),
        (True, "d", "second", busy, t0 + 0.1),
    ]
    before = jobs.last_cpu[busy]
    jobs.settle(events, t0 + 0.3)
    used = jobs.last_cpu[busy] - before
    jobs.begin("c", "first", busy)
    c = jobs.end("c")
    jobs.begin("d", "second", busy)
    assert c == pytest.approx(used / 3)
    assert jobs.jobs["d"].charged == pytest.approx(2 * used / 3)
    # a backend first read now (no baseline) is charged to nobody this time
    fresh = PostgresJobs(per_tick=True)
    fresh.reaped_at_start = 0.0  # (its window is open without having read anyone)
    fresh.settle([(True, "e", "x", busy, t0)], t0 + 0.3)
    fresh.begin("e", "x", busy)
    assert fresh.jobs["e"].charged == 0.0 and busy in fresh.read_at
