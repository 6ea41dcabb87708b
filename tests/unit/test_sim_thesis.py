"""The thesis' Var-Service results (SPEC §6): the calibration table and the qualitative findings.

What the simulator reproduces, and how closely (benchmarks/thesis_calibration.py prints the full
comparison with confidence intervals):
- every priority rank of Table 5.3 for U_r, −A^c_r and −Q_r in all three mixes, and P_{r,c}'s
  ranks where its row sums are clearly apart from zero (Mix-III);
- Q_r and A_r within max(3 tasks, 10%) of the published values (the largest gap: Mix-I SC1's
  A_r, 50.5 against 46.5), U_r/ΣU within 0.035. The residual is
  systematic (the shortest class SC1 runs a little high, SC3 a little low) and far outside our
  own CIs, so it comes from a detail of the thesis' model that the text does not give.
"""

from __future__ import annotations

import pytest

from admission.sim import MIXES, SimConfig, synthetic
from admission.sim.study import Estimate, build_model, isolation_demands, rank_classes, replicate
from admission.sim.study import run_study as study
from admission.sim.thesis import TABLE_5_3

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mix", ["I", "II", "III"])
def test_var_service_calibration_table(mix: str) -> None:
    w = synthetic("var-service")
    cfg = SimConfig(mix=MIXES[mix], completions=10_000, warmup=1_000)
    runs = replicate(w, cfg, w.model(64, 100), "fcfs", 3, seed=1)
    model = build_model(w, cfg, runs, isolation_demands(w, cfg))
    for r, pub in enumerate(TABLE_5_3[mix]):
        q = Estimate.of([x.Q[r] for x in runs])
        a = Estimate.of([x.A[r] for x in runs])
        share = Estimate.of([x.U[r] / sum(x.U) for x in runs])
        published_share = pub.U / sum(p.U for p in TABLE_5_3[mix])
        assert q.covers(pub.Q, slack=max(3.0, 0.1 * pub.Q)), (mix, r, "Q", q, pub.Q)
        assert a.covers(pub.A, slack=max(3.0, 0.1 * pub.A)), (mix, r, "A", a, pub.A)
        assert share.covers(published_share, slack=0.035), (mix, r, "U share", share)
    ranks = {p: rank_classes(p, model) for p in ("max-u", "min-a", "min-q", "max-p")}
    assert ranks["max-u"] == [p.rank_u for p in TABLE_5_3[mix]]
    assert ranks["min-a"] == [p.rank_a for p in TABLE_5_3[mix]]
    assert ranks["min-q"] == [p.rank_q for p in TABLE_5_3[mix]]
    if mix == "III":
        assert ranks["max-p"] == [p.rank_p for p in TABLE_5_3[mix]]


@pytest.mark.parametrize("mix", ["II", "III"])
def test_var_service_qualitative_findings(mix: str) -> None:
    """−A^c_r and −Q_r: same priorities, better than FCFS; U_r and P_{r,c} do worst."""
    result = study(
        synthetic("var-service"),
        SimConfig(mix=MIXES[mix], completions=8_000, warmup=800),
        mix_name=mix,
        replications=2,
        seed=3,
    )
    rows = result.class_rows()
    assert [r["rank"]["min-a"] for r in rows] == [r["rank"]["min-q"] for r in rows]
    mean = {p: s.mean_response.mean for p, s in result.policies.items()}
    for worst in ("max-u", "max-p"):
        for better in ("fcfs", "sept", "min-q", "min-a"):
            assert mean[worst] > mean[better], (mix, worst, better, mean)
    assert mean["min-q"] < mean["fcfs"] and mean["min-a"] < mean["fcfs"], mean
    throughput = {p: s.throughput.mean for p, s in result.policies.items()}
    assert throughput["sept"] >= max(throughput.values()) * 0.99, throughput
