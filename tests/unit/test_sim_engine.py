"""Simulator behaviour: determinism, capacity, multi-phase jobs, errors, speed-independent facts."""

from __future__ import annotations

import numpy as np
import pytest

from admission import Event, Limits, Scheduler
from admission.sim import MIXES, SimClass, SimConfig, Workload, simulate, synthetic
from admission.sim.engine import _Engine
from admission.sim.workload import populations


def _run(policy: str = "fcfs", seed: int = 1, **kw):  # type: ignore[no-untyped-def]
    w = synthetic("var-service")
    cfg = SimConfig(**{"completions": 2_000, "warmup": 200, **kw})
    return simulate(w, cfg, w.model(cfg.cores, cfg.fcr), policy, np.random.default_rng(seed))


def test_same_seed_same_result_other_seed_other_result() -> None:
    a, b, c = _run(seed=3), _run(seed=3), _run(seed=4)
    assert a.Q == b.Q and a.completions == b.completions
    assert a.Q != c.Q


def test_populations_sum_exactly() -> None:
    assert populations(30, MIXES["I"]) == [18, 6, 6]
    assert populations(7, (1, 1, 1)) == [3, 2, 2]
    assert sum(populations(200, (0.6, 0.2, 0.2))) == 200
    with pytest.raises(ValueError):
        populations(5, (0, 0))


def test_thread_budget_and_mpl_are_never_exceeded() -> None:
    """Watch every grant the simulator's scheduler makes."""
    w = synthetic("var-para")
    cfg = SimConfig(completions=1_500, warmup=100, fcr=40, mpl=3, mix=MIXES["III"])
    engine = _Engine(w, cfg, w.model(64, 40), "sept", np.random.default_rng(0))
    peaks = {"threads": 0, "jobs": 0}

    def watch(e: Event) -> None:
        if e.kind == "grant":
            peaks["threads"] = max(peaks["threads"], engine.scheduler.threads_in_use)
            peaks["jobs"] = max(peaks["jobs"], engine.scheduler.in_service)

    engine.scheduler.observe(events=watch)
    engine.run()
    assert 0 < peaks["threads"] <= 40 and peaks["jobs"] == 3


def test_multi_phase_jobs_run_their_phases() -> None:
    """A job of phases (2 tasks × 1.0, 4 tasks × 0.5) alone on 8 cores takes 1.5 (no sharing)."""
    w = Workload("phases", (SimClass("P", ((2, 1.0), (4, 0.5))),))
    cfg = SimConfig(
        cores=8,
        jobs=1,
        mix=(1.0,),
        think=0.0,
        fcr=None,
        routing="least-loaded",
        completions=50,
        warmup=5,
    )
    run = simulate(w, cfg, w.model(8, None), "fcfs", np.random.default_rng(0))
    assert run.response_times[0] == pytest.approx(1.5)
    assert run.task_completions == 50 * 6
    assert run.U[0] == pytest.approx((2 * 1.0 + 4 * 0.5) / (1.5 * 8))


def test_processor_sharing_slows_tasks_on_a_shared_core() -> None:
    """Two single-task jobs of demand 1 on one core both finish at 2 under PS."""
    w = Workload("ps", (SimClass("T", ((1, 1.0),)),))
    cfg = SimConfig(cores=1, jobs=2, mix=(1.0,), think=0.0, fcr=None, completions=20, warmup=2)
    run = simulate(w, cfg, w.model(1, None), "fcfs", np.random.default_rng(0))
    assert np.allclose(run.response_times[0], 2.0)


def test_capacity_frees_task_by_task() -> None:
    """N_fcr = 10 and jobs of 10 tasks with demands 1 and 3 on one core each... the second job
    is admitted as soon as the first job's tasks finish, before the first job itself ends."""
    w = Workload("fcr", (SimClass("A", ((2, 1.0),)),))
    cfg = SimConfig(
        cores=2,
        jobs=2,
        mix=(1.0,),
        think=0.0,
        fcr=3,
        routing="round-robin",
        completions=20,
        warmup=2,
    )
    run = simulate(w, cfg, w.model(2, 3), "fcfs", np.random.default_rng(0))
    # one job of 2 tasks fits (3 units); the other waits until one task frees one unit.
    assert run.completions[0] == 20
    assert run.waits[0] > 0


def test_aging_and_timeouts_fire_and_are_reported() -> None:
    run = _run("sept", mix=MIXES["III"], mpl=2, max_wait=40.0)
    assert run.aged > 0
    run = _run("sept", mix=MIXES["III"], mpl=1, queue_timeout=30.0)
    assert run.timed_out > 0


def test_open_and_closed_configs_validate() -> None:
    with pytest.raises(ValueError, match="routing"):
        SimConfig(routing="sideways")
    with pytest.raises(ValueError, match="service"):
        SimConfig(service="gamma")
    with pytest.raises(ValueError, match="arrival rate"):
        SimConfig(arrival_rate=-1)
    w = synthetic("var-service")
    with pytest.raises(ValueError, match="mix has"):
        simulate(w, SimConfig(mix=(1.0, 1.0)), w.model(64, 100), "fcfs", np.random.default_rng())
    with pytest.raises(ValueError, match="unknown workload"):
        synthetic("var-everything")


def test_the_simulator_drives_the_proxys_scheduler_class() -> None:
    """One implementation: the engine's scheduler is admission.Scheduler itself."""
    w = synthetic("var-service")
    engine = _Engine(w, SimConfig(), w.model(64, 100), "min-a", np.random.default_rng(0))
    assert type(engine.scheduler) is Scheduler
    assert engine.scheduler.limits == Limits(threads=100)


def test_the_memory_budget_holds_in_the_simulator() -> None:
    """The simulator admits through the same scheduler: with every class's M_r set, the
    memory in service never passes the budget, and it binds (fewer jobs at once than without)."""
    w = synthetic("var-para")
    base = w.model(64, 40)
    model = base.model_copy(
        update={"classes": tuple(c.model_copy(update={"M": 100.0}) for c in base.classes)}
    )
    peaks = {}
    for memory in (None, 250):
        cfg = SimConfig(completions=1_500, warmup=100, fcr=None, memory=memory)
        engine = _Engine(w, cfg, model, "fcfs", np.random.default_rng(0))
        seen = {"memory": 0, "jobs": 0}

        def watch(e: Event, engine: _Engine = engine, seen: dict[str, int] = seen) -> None:
            if e.kind == "grant":
                seen["memory"] = max(seen["memory"], engine.scheduler.memory_in_use)
                seen["jobs"] = max(seen["jobs"], engine.scheduler.in_service)

        engine.scheduler.observe(events=watch)
        engine.run()
        peaks[memory] = seen
    assert peaks[250]["memory"] == 200 and peaks[250]["jobs"] == 2
    assert peaks[None]["memory"] == 0 and peaks[None]["jobs"] > 2
