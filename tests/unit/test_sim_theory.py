"""The simulator checked against queueing theory, with tolerances from replication CIs.

A small slack (2% of the reference) is added to each 95% interval: with a handful of such
checks one interval in twenty is expected to miss by chance, and the slack keeps a correct
simulator from failing on a bad draw while a wrong one (a 5% error) still fails.
"""

from __future__ import annotations

import pytest

from admission.policies.interference import interference_matrix
from admission.sim import SimClass, SimConfig, Workload
from admission.sim.study import Estimate, model_of_run, replicate
from admission.sim.theory import mg1_priority_waits, mm1_ps_response, mmc_response, mva

SLACK = 0.02


def _close(est: Estimate, ref: float) -> bool:
    return est.covers(ref, slack=SLACK * abs(ref))


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_mm1_processor_sharing_mean_response(rho: float) -> None:
    w = Workload("mm1", (SimClass("J", ((1, 1.0),)),))
    cfg = SimConfig(
        cores=1,
        arrival_rate=rho,
        service="exponential",
        fcr=None,
        mix=(1.0,),
        completions=20_000,
        warmup=2_000,
    )
    runs = replicate(w, cfg, w.model(1, None), "fcfs", 5, seed=11)
    measured = Estimate.of([r.mean_response() for r in runs])
    assert _close(measured, mm1_ps_response(rho, 1.0)), (measured, mm1_ps_response(rho, 1.0))


# a class of mostly short statements with rare long ones: 1 in 10 runs 10× the others
_TAIL = (0.1, 10.0)
_SHORT, _LONG = 1 / (0.9 + 0.1 * 10), 10 / (0.9 + 0.1 * 10)  # its two lengths, mean 1


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_processor_sharing_is_insensitive_to_a_heavy_tail(rho: float) -> None:
    """M/G/1-PS: the mean response time is D/(1 − ρ) whatever the distribution of the service
    time, so a class whose runs are 0.53 or 5.3 (second moment 3.0, an exponential's 2) on one
    core without admission control has the M/M/1-PS mean."""
    w = Workload("tail", (SimClass("J", ((1, 1.0),)),))
    cfg = SimConfig(
        cores=1, arrival_rate=rho, fcr=None, mix=(1.0,), tails=(_TAIL,), completions=40_000
    )
    runs = replicate(w, cfg, w.model(1, None), "fcfs", 5, seed=13)
    measured = Estimate.of([r.mean_response() for r in runs])
    assert _close(measured, mm1_ps_response(rho, 1.0)), (measured, mm1_ps_response(rho, 1.0))
    services = sorted(x for r in runs for x in r.service_times[0][:2000])
    assert services[0] >= _SHORT * 0.999 and services[-1] >= _LONG  # (both lengths ran)


def test_fcfs_at_mpl_1_with_a_heavy_tail_is_pollaczek_khinchine() -> None:
    """M/G/1-FCFS (MPL 1 on one core): the mean wait is λE[S²]/(2(1 − ρ)), so the tail's
    second moment (3.0, not the deterministic 1) sets it: 6× a deterministic queue's."""
    rho = 0.7
    w = Workload("tail", (SimClass("J", ((1, 1.0),)),))
    cfg = SimConfig(
        cores=1,
        arrival_rate=rho,
        fcr=None,
        mpl=1,
        mix=(1.0,),
        tails=(_TAIL,),
        completions=40_000,
    )
    runs = replicate(w, cfg, w.model(1, None), "fcfs", 5, seed=14)
    second = 0.9 * _SHORT**2 + 0.1 * _LONG**2
    pk = mg1_priority_waits([rho], [1.0], [second])[0]
    measured = Estimate.of([r.waits[0] for r in runs])
    assert measured.covers(pk, slack=0.05 * pk), (measured, pk)


def test_mmc_response_by_hand() -> None:
    # c = 1 is M/M/1; c = 2, λ = 1.5, μ = 1: C = 0.6428…, R = 1 + C / 0.5
    assert mmc_response(0.5, 1.0, 1) == pytest.approx(mm1_ps_response(0.5, 1.0))
    assert mmc_response(1.5, 1.0, 2) == pytest.approx(1 + (9 / 14) / 0.5)


@pytest.mark.parametrize(("mpl", "rate"), [(1, 1.5), (2, 3.0)])
def test_statements_released_from_the_mpl_make_an_m_m_2m_queue(mpl: int, rate: float) -> None:
    """MPL m, and a statement gives its slot back as soon as another waits (release_after
    tiny), at most m of them: up to 2m in service, each on a core of its own (least-loaded
    routing over 2m cores) — an M/M/2m queue, Erlang C. Without the release the same load
    (ρ = 0.75 of 2m servers) is 1.5× what m servers can take: the queue would grow forever."""
    w = Workload("mmc", (SimClass("J", ((1, 1.0),)),))
    cfg = SimConfig(
        cores=2 * mpl,
        arrival_rate=rate,
        service="exponential",
        fcr=None,
        mix=(1.0,),
        mpl=mpl,
        routing="least-loaded",
        release_after=1e-9,
        completions=20_000,
        warmup=2_000,
    )
    runs = replicate(w, cfg, w.model(2 * mpl, None), "fcfs", 5, seed=17)
    measured = Estimate.of([r.mean_response() for r in runs])
    reference = mmc_response(rate, 1.0, 2 * mpl)
    assert _close(measured, reference), (measured, reference)


def _product_form_runs(seed: int):  # type: ignore[no-untyped-def]
    w = Workload("pf", (SimClass("A", ((1, 0.5),)), SimClass("B", ((1, 1.0),))))
    cfg = SimConfig(
        cores=4,
        jobs=5,
        mix=(3, 2),
        think=1.0,
        service="exponential",
        fcr=None,
        completions=20_000,
        warmup=2_000,
    )
    return w, replicate(w, cfg, w.model(4, None), "fcfs", 5, seed=seed)


def test_closed_network_matches_exact_mva() -> None:
    _, runs = _product_form_runs(seed=4)
    ref = mva([3, 2], [[0.5 / 4, 1.0 / 4]] * 4, [1.0, 1.0])
    for r in range(2):
        x = Estimate.of([run.class_throughput()[r] for run in runs])
        resp = Estimate.of([float(run.response_times[r].mean()) for run in runs])
        assert _close(x, ref.throughput[r]), (r, x, ref.throughput[r])
        assert _close(resp, ref.response[r]), (r, resp, ref.response[r])
        # utilization law: U_r = X_r · D_r / M
        u = Estimate.of([run.U[r] for run in runs])
        assert _close(u, ref.throughput[r] * (0.5, 1.0)[r] / 4)


def test_no_interference_identity_holds_in_product_form_network() -> None:
    """Theorem 1: U_r/U_c = A^c_r/A^r_c, i.e. P_{r,c} = 0, without forking or thread limits."""
    w, runs = _product_form_runs(seed=5)
    base = w.model(4, None)
    p = [interference_matrix(model_of_run(base, run)) for run in runs]
    for r, c in ((0, 1), (1, 0)):
        est = Estimate.of([m[r][c] for m in p])
        assert est.covers(0.0, slack=0.02), (r, c, est)
    u_ratio = Estimate.of([run.U[0] / run.U[1] for run in runs])
    a_ratio = Estimate.of([run.A_matrix[0][1] / run.A_matrix[1][0] for run in runs])
    assert abs(u_ratio.mean - a_ratio.mean) < 0.03


def test_littles_law_on_every_run() -> None:
    from admission.sim import MIXES, synthetic

    for workload in ("var-service", "var-para", "inv-increase", "lin-increase"):
        w = synthetic(workload)
        for policy in ("fcfs", "sept", "min-a"):
            cfg = SimConfig(mix=MIXES["II"], completions=3_000, warmup=300, mpl=8, max_wait=60)
            (run,) = replicate(w, cfg, w.model(64, 100), policy, 1, seed=2)
            littles = run.throughput * run.mean_response()
            assert abs(run.jobs_in_system - littles) / run.jobs_in_system < 0.01, (
                workload,
                policy,
                run.jobs_in_system,
                littles,
            )


@pytest.mark.parametrize(("fork", "start"), [(1, 1), (1, 10), (2, 6)])
def test_adaptive_mpl_finds_the_knee_of_a_closed_network(fork: int, start: int) -> None:
    """M = 4 processor-sharing cores, 12 jobs with no think time, each forking ``fork`` tasks
    of demand 1 routed to the least-loaded core: at MPL m the cores run min(m·fork, 4) tasks
    and X(m) = min(m·fork, 4)/fork exactly, so the lowest MPL within 5 % of the best
    throughput is 4/fork. The controller (``admission.mpl``) must hold about that MPL and lose
    no throughput for it."""
    w = Workload("knee", (SimClass("J", ((fork, 1.0),)),))
    cfg = SimConfig(
        cores=4,
        jobs=12,
        mix=(1.0,),
        think=0.0,
        fcr=None,
        mpl=start,
        mpl_auto=True,
        routing="least-loaded",
        completions=20_000,
        warmup=2_000,
    )
    (run,) = replicate(w, cfg, w.model(4, None), "fcfs", 1, seed=3)
    knee = 4 // fork
    assert run.mpl_mean is not None and abs(run.mpl_mean - knee) < 0.35, run.mpl_mean
    assert run.throughput > 0.95 * 4 / fork, run.throughput
