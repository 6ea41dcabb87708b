"""The benchmark scripts' own workloads run as the figures they print say (no timing here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.path_instructions import run_statements
from benchmarks.proxy_overhead import logic_cost, on_event_loop, statement_cycle


@pytest.mark.parametrize("mode", ["simple", "prepared"])
def test_the_measured_statements_all_pass_the_gate(mode: str) -> None:
    run_statements(mode, 300, 400)  # raises unless all 300 were admitted and released
    assert logic_cost(mode, 300) > 0


def test_simple_statements_carry_their_own_numbers_and_share_a_class() -> None:
    def check() -> float:
        conn, statements, reply = statement_cycle("simple", 50)
        assert len(set(statements)) == 50  # pgbench's texts: the literal-key path, not a cache
        for statement in statements:
            conn.data_received(statement)
            conn.from_server(reply)
        scheduler = conn.server.gate.scheduler
        assert scheduler.stats.completed == 50 and len(scheduler.class_names) == 1
        return 0.0

    on_event_loop(check)


def test_training_repeatability_report_compares_runs() -> None:
    from admission import ClassProfile, EtaModel
    from benchmarks.training_repeatability import report

    def model(d6: float, d9: float, f9: dict[int, int]) -> EtaModel:
        return EtaModel(
            classes=(
                ClassProfile(
                    fingerprint="a", name="Q6", D=d6, f=1, Q=0.2, A=0.3, D_runs=8, f_runs={1: 8}
                ),
                ClassProfile(
                    fingerprint="b",
                    name="Q9",
                    D=d9,
                    D_low=d9 * 0.9,
                    D_high=d9 * 1.1,
                    D_runs=8,
                    f=max(f9, key=lambda s: (f9[s], s)),
                    f_runs=f9,
                    converged=False,
                    Q=1.0,
                    A=0.1,
                ),
            )
        )

    text = report([model(0.1, 0.2, {2: 8}), model(0.3, 0.25, {1: 5, 2: 3})], [10.0, 12.5])
    assert "run 1 10.0 s, run 2 12.5 s" in text
    assert "0.25 [0.225, 0.275] (8) ~" in text and "1 (1: 5, 2: 3)" in text
    q6 = next(line for line in text.splitlines() if line.startswith("Q6 ") and "0.1 (8)" in line)
    assert "3.000" in q6  # max/min of D_r
    sept = next(line for line in text.splitlines() if line.startswith("SEPT"))
    assert "Q6 < Q9" in sept and "Q9 < Q6" in sept and sept.rstrip().endswith("NO")
    admitted = next(line for line in text.splitlines() if line.startswith("SEPT as admitted"))
    assert admitted.rstrip().endswith("NO")  # 0.3 lies above Q9's interval in run 2
    # Q6 inside Q9's interval in one run: tied there, which no other run contradicts
    tied = report([model(0.1, 0.2, {2: 8}), model(0.24, 0.25, {2: 8})], [1.0, 1.0])
    row = next(line for line in tied.splitlines() if line.startswith("SEPT as admitted"))
    assert "Q6 < Q9" in row and "Q6 ≈ Q9" in row and row.rstrip().endswith("compatible")
    min_q = next(line for line in text.splitlines() if line.startswith("MIN-Q"))
    assert min_q.rstrip().endswith("yes")
    by_q = next(line for line in text.splitlines() if line.startswith("MIN-Q as admitted"))
    assert "Q6 < Q9" in by_q and by_q.rstrip().endswith("yes")
    assert "run 1: Q9; run 2: Q9" in text


def test_mg1_predictions_match_the_formulas_worked_by_hand() -> None:
    from benchmarks.admission_pays import mg1_predictions

    # two classes, D = 0.03 s (80 %) and 0.25 s (20 %), ρ = 0.95: E[D] = 0.074 s, λ = 12.84/s
    ps, prio = mg1_predictions({"s": 0.03, "l": 0.25}, {"s": 0.8, "l": 0.2}, 0.95)
    assert ps == pytest.approx(0.074 / 0.05)
    lam = 0.95 / 0.074
    w0 = lam * (0.8 * 0.03**2 + 0.2 * 0.25**2) / 2
    sigma_s = lam * 0.8 * 0.03
    expected = 0.8 * (w0 / (1 - sigma_s) + 0.03) + 0.2 * (w0 / ((1 - sigma_s) * 0.05) + 0.25)
    assert prio == pytest.approx(expected)
    assert 0.60 < prio < 0.70  # ≈ 55 % below processor sharing


def test_pg_spill_pairs_each_granted_run_with_nones_of_its_repetition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from admission import ClassProfile, EtaModel
    from benchmarks.pg_spill import report

    def reps(spill: list[float], x: list[float]) -> list[dict[str, float]]:
        return [
            {
                "repetition": i,
                "spill_bytes": s * 2**20,
                "throughput": t,
                "mean_response": 0.2,
                "p99_response": 0.5,
                "errors": 0,
            }
            for i, (s, t) in enumerate(zip(spill, x, strict=True))
        ]

    result = {
        "offered_load": 0.85,
        "rate": 8.0,
        "policies": {
            "none": {"repetitions": reps([400, 200, 300], [8.0, 8.0, 8.0])},
            "fcfs@2+grant": {"repetitions": reps([100, 50, 75], [8.0, 8.0, 8.0])},
            "fcfs@4+grant": {"repetitions": reps([300, 150, 225], [8.0, 8.0, 8.0])},
        },
    }
    model = EtaModel(
        classes=(ClassProfile(fingerprint="a", name="Q9", D=0.1, f=1, work_mem_units=21.0),)
    )
    args = argparse.Namespace(
        sf=0.1,
        work_mem="256kB",
        mix="9",
        repetitions=3,
        duration=30.0,
        grant="32MiB",
        load=0.85,
        closed=None,
    )
    report(result, args, model, 200, 256 * 1024)
    out = capsys.readouterr().out
    assert "200 × 21 units × work_mem 256 kB = 1050 MiB" in out
    # each run is a quarter, or three quarters, of none's in the same repetition
    assert "fcfs@2+grant: temp bytes 0.250 ± 0 of none's (paired by repetition: halved)" in out
    assert "fcfs@4+grant: temp bytes 0.750 ± 0 of none's (paired by repetition: not halved)" in out


def test_tail_frontier_mixes_are_reproducible_and_summaries_count_both_halves() -> None:
    from benchmarks.tail_frontier import Cell, draw_mixes, summary

    names = [f"Q{q}" for q in range(1, 23)]
    mixes = draw_mixes(names, 5, seed=7)
    assert mixes == draw_mixes(names, 5, seed=7) and mixes != draw_mixes(names, 5, seed=8)
    assert [m[0] for m in mixes[:2]] == ["eight", "all 22"] and len(mixes) == 7
    assert sum(mixes[0][1]) == 8 and mixes[0][1][names.index("Q18")] == 1.0
    for _, shares in mixes[2:]:
        used = [p for p in shares if p > 0]
        assert 3 <= len(used) <= 11 and abs(sum(used) - 1) < 1e-9
    assert draw_mixes(["a", "b"], 1, 0)[0][0] == "all 2"  # no eight-query mix without its classes
    cells = [Cell([0.8, 0.8], [1.0, 1.0]), Cell([0.7, 0.7], [1.3, 1.1]), Cell([1.0], [0.9])]
    median_mean, worst_mean, median_p99, worst_p99, tail_ok, mean_ok, both = summary(cells, 0.15)
    assert median_mean == pytest.approx(0.8) and worst_mean == 1.0
    assert median_p99 == 1.0 and worst_p99 == pytest.approx(1.2)
    assert tail_ok == 2 and mean_ok == 2 and both == 1  # only the first has both


def test_switchback_counts_each_statement_for_the_setting_it_arrived_under() -> None:
    import random

    from benchmarks.switchback import Segments, compare
    from workloads.tpch.load import LoadResult, Statement

    # two blocks of two 10 s turns: A, B, then B, A; A's statements take 0.2 s, B's 0.1 s
    order = ["A", "B", "B", "A"]
    segments = Segments([0.0, 10.0, 20.0, 30.0], 40.0, order, blocks=2)
    statements = []
    for k, setting in enumerate(order):
        for i in range(20):  # one every 0.5 s of the turn
            at = 10.0 * k + 0.5 * i
            took = 0.2 if setting == "A" else 0.1
            if i < 4:  # inside the washout: the other setting's queue, not counted
                took = 5.0
            statements.append(Statement(6, at, at + took, client=0))
    statements.append(Statement(6, 12.0, 12.1, client=0, sqlstate="57014"))
    load = LoadResult(statements=statements, started=0.0, ended=40.0)
    numbers = compare(load, segments, ["A", "B"], 2.0, 1.0, random.Random(0))
    a, b = numbers["A"], numbers["B"]
    assert isinstance(a, dict) and isinstance(b, dict)
    # counted: arrivals in [start + 2, end - 1): 2.0 … 8.5 s of each turn, 14 a turn
    assert a["counted"] == b["counted"] == 28
    assert a["mean"] == pytest.approx(0.2) and b["mean"] == pytest.approx(0.1)
    assert b["mean_change"] == pytest.approx(-0.5) and b["mean_change_ci"] == pytest.approx(0.0)
    assert b["p99_ratio_interval"] == pytest.approx([0.5, 0.5])
    assert b["mean_ratio_interval"] == pytest.approx([0.5, 0.5])
    assert b["errors"] == 1 and a["errors"] == 0
    assert segments.of(-1.0, 0, 0) is None and segments.of(39.5, 0, 1.0) is None


def test_pgbench_mix_reads_latencies_by_script_from_pgbench_logs(tmp_path: Path) -> None:
    from benchmarks.pgbench_mix import quantile, read_logs, settings_args

    # pgbench -l: client txn time(µs) script epoch µs [lag]; failed ones say so in place of time
    (tmp_path / "pgbench_log.123").write_text(
        "0 0 1500 1 1764442000 10 20\n0 1 152000 0 1764442000 200 35\n0 2 failed 1 1764442001 5 0\n"
    )
    (tmp_path / "pgbench_log.123.1").write_text("1 0 2500 1 1764442000 30 40\n")
    (tmp_path / "other.txt").write_text("9 9 9 9 9 9\n")
    found = sorted(read_logs(tmp_path), key=lambda t: (t.script, t.latency))
    assert [(t.script, t.latency) for t in found] == [(0, 0.152), (1, 0.0015), (1, 0.0025)]
    # the start: the end (epoch s + µs) less the latency
    assert found[0].start == pytest.approx(1764442000.0002 - 0.152)
    assert found[2].start == pytest.approx(1764442000.00003 - 0.0025)
    assert quantile([3.0, 1.0, 2.0], 0.99) == 3.0 and quantile([1.0, 2.0], 0.0) == 1.0
    assert settings_args("fcfs@2")[-2:] == ["--mpl", "2"] and settings_args("default") == []
    for bad in ("fcfs@0", "fcfs@x", "latency"):
        with pytest.raises(SystemExit):
            settings_args(bad)
