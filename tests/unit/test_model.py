"""The η model file: round trip, clear errors naming the file and the field, unknown classes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from admission import ClassProfile, EtaModel, ModelError, Phase, Profile
from admission.model import Speed
from admission.policies import POLICIES
from admission.policies.interference import interference_matrix


def _model() -> EtaModel:
    return EtaModel(
        backend="duckdb",
        dataset="tpch-sf0.1",
        cores=2,
        mpl=4,
        fcr=8,
        classes=(
            ClassProfile(
                fingerprint="pg:a",
                name="q1",
                D=0.5,
                f=2,
                U=0.4,
                Q=1.8,
                A=2.0,
                phases=(Phase(threads=2, duration=0.3), Phase(threads=1, duration=0.2)),
                count=40,
                sample_sql="select 1",
                D_low=0.48,
                D_high=0.53,
                D_runs=12,
                f_runs={2: 9, 1: 3},
                converged=True,
            ),
            ClassProfile(fingerprint="pg:b", name="q9", D=2.0, f=1, U=0.2, Q=0.9, A=1.1),
        ),
        A_matrix=((2.0, 1.5), (0.7, 1.1)),
        speed=Speed(before=1.0e6, after=0.95e6, unit="probe iterations/s"),
    )


def test_round_trip_writes_every_policys_eta(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _model().save(path)
    raw = json.loads(path.read_text())
    assert set(raw["eta"]) == set(POLICIES)
    assert raw["version"] == 2 and raw["format"] == "admission-eta-model"
    loaded = EtaModel.load(path)
    assert loaded.classes == _model().classes
    assert loaded.A_matrix == _model().A_matrix
    first = loaded.classes[0]  # the intervals survive JSON (fork sizes as keys come back ints)
    assert first.D_low is not None and first.D_high is not None
    assert first.D_low <= first.D <= first.D_high
    assert first.f_runs == {2: 9, 1: 3} and first.D_runs == 12 and first.converged is True
    assert first.f_varies and not loaded.classes[1].f_varies
    assert loaded.speed == _model().speed and loaded.speed is not None
    assert loaded.speed.change == pytest.approx(-0.05)


def test_files_without_intervals_still_load(tmp_path: Path) -> None:
    raw = json.loads(_model().to_json())
    for c in raw["classes"]:
        for key in ("D_low", "D_high", "D_runs", "f_runs", "converged"):
            c.pop(key)
    raw.pop("speed")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    old = EtaModel.load(path)
    assert old.version == 2 and old.speed is None
    assert all(c.D_low is None and c.D_high is None and c.converged is None for c in old.classes)
    assert all(c.D_runs == 0 and c.f_runs == {} for c in old.classes)


def test_interference_matrix_by_hand() -> None:
    p = interference_matrix(_model())
    # P[0][1] = U0/U1 − A[0][1]/A[1][0] = 2 − 1.5/0.7
    assert p[0][1] == pytest.approx(2 - 1.5 / 0.7)
    assert p[1][0] == pytest.approx(0.5 - 0.7 / 1.5)
    assert p[0][0] == p[1][1] == 0


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda m: m["classes"][1].update(D="slow"), "classes.1.D"),
        (lambda m: m["classes"][0].update(f=0), "classes.0.f"),
        (lambda m: m["classes"][0].pop("fingerprint"), "classes.0.fingerprint"),
        (lambda m: m.update(A_matrix=[[1.0, 2.0]]), "A_matrix must be 2×2"),
        (lambda m: m.update(version=99), "version 99 is not supported"),
        (lambda m: m.update(format="something-else"), "format is 'something-else'"),
        (lambda m: m["eta"]["min-q"][0].__setitem__(1, 123.0), "eta.min-q[0][1] is 123.0"),
        (lambda m: m["eta"].update(bogus=[[0, 0], [0, 0]]), "eta.bogus: unknown policy"),
        (lambda m: m["classes"][0].update(f=3), "first phase has 2 threads"),
        (lambda m: m.update(surprise=1), "surprise"),
        (lambda m: m["classes"][0].update(D_low=0.6), "D_low 0.6 is above D 0.5"),
        (lambda m: m["classes"][0].update(D_high=0.4), "D_high 0.4 is below D 0.5"),
        (lambda m: m["classes"][0].update(f_runs={"1": 12}), "f is 2 but no isolation run"),
        (lambda m: m["classes"][0].update(f_runs={"2": 9}), "f_runs counts 9 runs but D_runs"),
        (lambda m: m["classes"][0].update(f_runs={"0": 3, "2": 9}), "fork sizes ≥ 1"),
        (lambda m: m["speed"].update(after=0), "speed.after"),
        (lambda m: m["classes"][0].update(U_low=0.5), "U_low 0.5 is above U 0.4"),
        (lambda m: m["classes"][0].update(U_high=0.3), "U_high 0.3 is below U 0.4"),
        (lambda m: m.update(A_low=[[2.5, 1.0], [0.5, 1.0]]), "A_low[0][0] is 2.5, above"),
        (lambda m: m.update(A_high=[[2.5, 1.0], [0.5, 1.0]]), "A_high[0][1] is 1.0, below"),
        (lambda m: m.update(A_low=[[1.0]]), "A_low must be 2×2"),
        (lambda m: m.update(A_low=[[-1.0, 1.0], [0.5, 1.0]]), "A_low[0][0] is negative"),
    ],
)
def test_broken_file_names_file_and_field(tmp_path: Path, mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads(_model().to_json())
    mutate(raw)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelError) as err:
        EtaModel.load(path)
    assert str(path) in str(err.value)
    assert field in str(err.value)


def test_unreadable_and_non_json_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot read"):
        EtaModel.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"classes": [')
    with pytest.raises(ModelError, match="not valid JSON"):
        EtaModel.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ModelError, match="JSON object"):
        EtaModel.load(bad)


def test_save_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    _model().save(path)
    before = path.read_text()
    broken = _model().model_copy(update={"A_matrix": ((float("nan"), 0.0), (0.0, 0.0))})
    with pytest.raises(ValueError):
        broken.save(path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.json"]


def test_unknown_class_gets_default_profile_and_pasta_a() -> None:
    m = _model().with_class("pg:new", "new")
    new = m.classes[-1]
    assert (new.D, new.f) == (1.25, 2)  # medians of D (0.5, 2.0) and f (2, 1) rounded
    assert m.A_matrix[2] == (new.Q, new.Q, new.Q)
    assert [row[2] for row in m.A_matrix[:2]] == [1.8, 0.9]  # A^new_r ≈ Q_r
    configured = _model().model_copy(update={"default": Profile(D=9, f=4, Q=3)})
    assert configured.with_class("x", "x").classes[-1].f == 4


def _classes(*spec: tuple[str, float, float | None, float | None]) -> tuple[ClassProfile, ...]:
    return tuple(
        ClassProfile(fingerprint=f"fp:{n}", name=n, D=d, f=1, D_low=lo, D_high=hi)
        for n, d, lo, hi in spec
    )


def test_sept_ties_classes_whose_demand_intervals_overlap() -> None:
    """Q6 and Q14 overlap (so do Q14 and Q9: a chain), Q18 stands apart: two groups, one
    score each, so arrival order decides inside a group and D_r between groups."""
    from admission.policies.sept import demand_groups

    classes = _classes(
        ("Q18", 0.50, 0.47, 0.54),
        ("Q6", 0.040, 0.038, 0.046),
        ("Q14", 0.050, 0.045, 0.055),
        ("Q9", 0.060, 0.054, 0.070),
    )
    assert demand_groups(classes) == [1, 0, 0, 0]
    bias = POLICIES["sept"].build(EtaModel(classes=classes)).bias
    assert bias[1] == bias[2] == bias[3] == -0.040 and bias[0] == -0.50


def test_sept_orders_by_demand_alone_without_intervals() -> None:
    classes = _classes(("a", 0.3, None, None), ("b", 0.1, None, None), ("c", 0.2, 0.15, 0.25))
    assert POLICIES["sept"].build(EtaModel(classes=classes)).bias == (-0.3, -0.1, -0.2)


def test_sept_with_tied_classes_admits_in_arrival_order() -> None:
    """Through the scheduler: with the MPL full, the queued short-but-tied class does not
    jump the earlier arrival of the other class of its group; a longer group still waits."""
    from admission import Limits, Scheduler

    classes = _classes(("fast", 0.040, 0.035, 0.05), ("close", 0.045, 0.04, 0.06))
    classes += _classes(("slow", 0.5, 0.45, 0.55))
    s = Scheduler(EtaModel(classes=classes), "sept", Limits(mpl=1))
    s.submit("running", "fp:slow", 0.0)
    s.submit("slow-1", "fp:slow", 1.0)
    s.submit("close-1", "fp:close", 2.0)
    s.submit("fast-1", "fp:fast", 3.0)
    order = []
    for t, done in enumerate(["running", "close-1", "fast-1"], start=4):
        order += [j.id for j in s.complete(done, float(t))]
    assert order == ["close-1", "fast-1", "slow-1"]


def _backlog(*spec: tuple[str, float, float | None, float | None]) -> tuple[ClassProfile, ...]:
    return tuple(
        ClassProfile(fingerprint=f"fp:{n}", name=n, D=0.1, f=1, Q=q, Q_low=lo, Q_high=hi)
        for n, q, lo, hi in spec
    )


def test_sept_and_min_q_group_by_one_rule() -> None:
    """The same numbers as D_r intervals or as Q_r intervals give the same groups."""
    from admission.policies.base import overlap_groups
    from admission.policies.queue_length import backlog_groups, backlog_order
    from admission.policies.sept import demand_groups, demand_order

    spec = (("Q18", 0.50, 0.47, 0.54), ("Q6", 0.04, 0.038, 0.046), ("Q14", 0.05, 0.045, 0.055))
    spec += (("Q9", 0.06, 0.054, 0.07), ("Q1", 0.3, None, None))
    expected = overlap_groups([s[1] for s in spec], [s[2] for s in spec], [s[3] for s in spec])
    assert expected == [2, 0, 0, 0, 1]
    assert demand_groups(_classes(*spec)) == backlog_groups(_backlog(*spec)) == expected
    order = [["Q6", "Q14", "Q9"], ["Q1"], ["Q18"]]
    assert demand_order(_classes(*spec)) == backlog_order(_backlog(*spec)) == order
    assert overlap_groups([2.0, 1.0, 2.0], [None] * 3, [None] * 3) == [1, 0, 1]  # equal: tied


def test_min_q_ties_classes_whose_backlog_intervals_overlap() -> None:
    classes = _backlog(("a", 2.0, 1.5, 2.5), ("b", 1.8, 1.2, 2.1), ("c", 4.0, 3.5, 4.5))
    eta = POLICIES["min-q"].build(EtaModel(classes=classes)).eta
    assert eta == ((-1.8,) * 3, (-1.8,) * 3, (-4.0,) * 3)
    plain = _backlog(("a", 2.0, None, None), ("b", 1.8, None, None), ("c", 4.0, None, None))
    assert POLICIES["min-q"].build(EtaModel(classes=plain)).eta == (
        (-2.0,) * 3,
        (-1.8,) * 3,
        (-4.0,) * 3,
    )


def test_min_q_with_tied_classes_admits_in_arrival_order() -> None:
    """Through the scheduler, with work in service (else −Q_r scores are all 0): the queued
    class of least Q_r does not jump the earlier arrival of a class tied with it; the class
    of a larger backlog still waits. Without intervals the least Q_r would go first."""
    from admission import Limits, Scheduler

    spec = [("fast", 1.0, 0.8, 1.3), ("close", 1.2, 1.1, 1.5), ("slow", 4.0, 3.5, 4.5)]

    def run(classes: tuple[ClassProfile, ...]) -> list[str]:
        s = Scheduler(EtaModel(classes=classes), "min-q", Limits(mpl=2))
        s.submit("running-1", "fp:slow", 0.0)
        s.submit("running-2", "fp:slow", 0.5)
        s.submit("slow-1", "fp:slow", 1.0)
        s.submit("close-1", "fp:close", 2.0)
        s.submit("fast-1", "fp:fast", 3.0)
        order = []
        for t, done in enumerate(["running-1", "running-2", "close-1", "fast-1"], start=4):
            order += [j.id for j in s.complete(done, float(t))]
        return order

    assert run(_backlog(*spec)) == ["close-1", "fast-1", "slow-1"]
    assert run(_backlog(*((n, q, None, None) for n, q, _, _ in spec))) == [
        "fast-1",
        "close-1",
        "slow-1",
    ]


def test_q_interval_is_saved_checked_and_optional(tmp_path: Path) -> None:
    classes = _backlog(("a", 2.0, 1.5, 2.5), ("b", 1.8, 1.2, 2.1), ("c", 4.0, None, None))
    m = EtaModel(classes=classes)
    path = tmp_path / "m.json"
    m.save(path)  # the η of −Q_r written with the ties, and recomputed the same on load
    back = EtaModel.load(path)
    assert back.classes == classes and back.eta["min-q"][0] == (-1.8,) * 3
    raw = json.loads(path.read_text())
    for c in raw["classes"]:  # a file from before Q intervals: no such fields, η untied
        del c["Q_low"], c["Q_high"]
    raw["eta"]["min-q"] = [[-2.0] * 3, [-1.8] * 3, [-4.0] * 3]
    old = EtaModel.from_json(json.dumps(raw))
    assert old.classes[0].Q_low is None
    raw["eta"]["min-q"] = [[-1.8] * 3, [-1.8] * 3, [-4.0] * 3]  # ties its profiles do not give
    with pytest.raises(ModelError, match=r"eta\.min-q\[0\]\[0\]"):
        EtaModel.from_json(json.dumps(raw))
    with pytest.raises(ValueError, match=r"Q_low 2\.1 is above Q 2\.0"):
        ClassProfile(fingerprint="x", name="x", D=1, f=1, Q=2.0, Q_low=2.1)
    with pytest.raises(ValueError, match=r"Q_high 1\.9 is below Q 2\.0"):
        ClassProfile(fingerprint="x", name="x", D=1, f=1, Q=2.0, Q_high=1.9)


def test_a_version_1_file_loads_with_memory_unknown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = json.loads(_model().to_json())
    raw["version"] = 1
    for c in raw["classes"]:
        c.pop("M", None)
        c.pop("spill", None)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(raw))
    with caplog.at_level("WARNING", logger="admission.model"):
        old = EtaModel.load(path)
    assert old.version == 1 and not old.memory_known
    assert all(c.M is None for c in old.classes) and old.default_profile().M is None
    assert "no memory measured" in caplog.text
    old.save(path)  # written back in the current format
    assert json.loads(path.read_text())["version"] == 2
    raw["version"] = 3
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelError, match="version 3 is not supported"):
        EtaModel.load(path)


@pytest.mark.parametrize(
    ("memory", "why"), [(-1.0, "greater than or equal to 0"), (1e30, "less than or equal")]
)
def test_a_negative_or_absurd_memory_is_refused_naming_the_class(
    tmp_path: Path, memory: float, why: str
) -> None:
    raw = json.loads(_model().to_json())
    raw["classes"][1]["M"] = memory
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelError, match=rf"classes\.1\.M \(class q9\): Input should be {why}"):
        EtaModel.load(path)


def _mix_model(
    u: list[tuple[float, float | None, float | None]],
    a: list[list[float]],
    a_low: list[list[float]] | None = None,
    a_high: list[list[float]] | None = None,
) -> EtaModel:
    classes = tuple(
        ClassProfile(fingerprint=f"fp:{n}", name=n, D=0.1, f=1, U=x, U_low=lo, U_high=hi)
        for n, (x, lo, hi) in zip("abc", u, strict=False)
    )
    bounds = {} if a_low is None else {"A_low": a_low, "A_high": a_high}
    return EtaModel.model_validate({"classes": classes, "A_matrix": a, **bounds})


def test_min_a_ties_rows_whose_intervals_overlap_column_by_column() -> None:
    """Column c (class c in service): a and b overlap, c stands apart → a and b take the
    column's smallest; without intervals the three stay apart."""
    a = [[1.0, 2.0, 0.5], [1.2, 1.0, 3.0], [4.0, 4.0, 1.0]]
    low = [[0.8, 1.5, 0.4], [1.1, 0.9, 2.0], [3.5, 3.5, 0.9]]
    high = [[1.3, 2.5, 0.6], [1.5, 1.1, 3.5], [4.5, 4.5, 1.1]]
    u = [(0.2, None, None)] * 3
    eta = POLICIES["min-a"].build(_mix_model(u, a, low, high)).eta
    assert eta[0][0] == eta[1][0] == -1.0 and eta[2][0] == -4.0  # a ≈ b with a in service
    assert eta[0][1] == -2.0 and eta[1][1] == -1.0  # column b: apart
    assert eta[2][2] == -1.0 and eta[0][2] == -0.5 and eta[1][2] == -3.0
    plain = POLICIES["min-a"].build(_mix_model(u, a)).eta
    assert plain[0][0] == -1.0 and plain[1][0] == -1.2
    orders = _mix_model(u, a, low, high).with_eta().orders["min-a"]
    assert orders == {  # the order depends on what is in service: one per class
        "a": [["a", "b"], ["c"]],
        "b": [["b"], ["a"], ["c"]],
        "c": [["a"], ["c"], ["b"]],
    }


def test_min_a_with_tied_classes_admits_in_arrival_order() -> None:
    from admission import Limits, Scheduler

    a = [[1.0, 1.0], [1.2, 1.2]]
    u = [(0.2, None, None)] * 2

    def run(model: EtaModel) -> list[str]:  # decided with one class-a statement in service
        s = Scheduler(model, "min-a", Limits(mpl=2))
        s.submit("running-1", "fp:a", 0.0)
        s.submit("running-2", "fp:a", 0.5)
        s.submit("b-1", "fp:b", 1.0)
        s.submit("a-1", "fp:a", 2.0)
        return [j.id for j in s.complete("running-1", 3.0)]

    tied = _mix_model(u, a, [[0.8, 0.8], [1.0, 1.0]], [[1.3, 1.3], [1.5, 1.5]])
    assert run(tied) == ["b-1"]  # tied: the earlier arrival
    assert run(_mix_model(u, a)) == ["a-1"]  # apart: the least backlog


def test_max_u_ties_overlapping_utilizations() -> None:
    u = [(0.30, 0.25, 0.36), (0.34, 0.31, 0.40), (0.10, 0.08, 0.12)]
    a = [[1.0] * 3] * 3
    eta = POLICIES["max-u"].build(_mix_model(u, a)).eta
    assert eta[0] == eta[1] == (0.30,) * 3 and eta[2] == (0.10,) * 3
    assert _mix_model(u, a).with_eta().orders["max-u"] == [["a", "b"], ["c"]]
    plain = [(x, None, None) for x, _, _ in u]
    assert _mix_model(plain, a).with_eta().orders["max-u"] == [["b"], ["a"], ["c"]]


def test_max_p_ties_entries_whose_interval_arithmetic_overlaps() -> None:
    """P[b][a] = U_b/U_a − A[b][a]/A[a][b]; with wide U intervals the P entries of column a
    reach P[a][a] = 0 and tie, with narrow ones they stay apart."""
    a = [[1.0, 2.0], [3.0, 1.0]]
    wide = [(0.3, 0.1, 0.5), (0.35, 0.1, 0.6)]
    narrow = [(0.3, 0.299, 0.301), (0.35, 0.349, 0.351)]
    p_wide = POLICIES["max-p"].build(_mix_model(wide, a, a, a)).eta
    p_narrow = POLICIES["max-p"].build(_mix_model(narrow, a, a, a)).eta
    exact = interference_matrix(_mix_model(narrow, a))
    assert p_narrow == exact and exact[1][0] == pytest.approx(0.35 / 0.3 - 1.5)
    assert p_wide[0][0] == p_wide[1][0] == pytest.approx(exact[1][0])  # tied at the floor


def test_a_intervals_round_trip_extend_for_new_classes_and_drop_when_learned(
    tmp_path: Path,
) -> None:
    from admission.online import WindowProfile, merge_profile

    low, high = [[1.5, 1.0], [0.5, 0.9]], [[2.5, 2.0], [0.9, 1.3]]
    m = EtaModel.model_validate({**_model().model_dump(), "A_low": low, "A_high": high})
    path = tmp_path / "m.json"
    m.save(path)
    back = EtaModel.load(path)
    assert back.a_bounds() == (((1.5, 1.0), (0.5, 0.9)), ((2.5, 2.0), (0.9, 1.3)))
    assert json.loads(path.read_text())["orders"]["sept"] == [["q1"], ["q9"]]
    grown = back.with_class("pg:new", "new")
    g_low, g_high = grown.a_bounds()
    assert g_low is not None and g_high is not None and len(g_low) == 3
    assert g_low[2] == g_high[2] == grown.A_matrix[2]  # the new class: points
    assert EtaModel.model_validate(grown.model_dump()).a_bounds()[0] == g_low
    window = {"pg:a": WindowProfile(U=0.5, Q=2.0, A=2.0, completed=20)}
    learned = merge_profile(back, window, {"pg:a": {"pg:a": 3.0}})
    assert learned is not None and learned.a_bounds() == (None, None)
    assert learned.classes[0].U_low is None


def test_orders_are_written_for_people_and_not_read(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    _model().save(path)
    raw = json.loads(path.read_text())
    assert set(raw["orders"]) == set(POLICIES) and raw["orders"]["fcfs"] == [["q1", "q9"]]
    raw["orders"]["sept"] = [["q9"], ["q1"]]  # edited: recomputed on the next save
    model = EtaModel.from_json(json.dumps(raw))
    assert json.loads(model.to_json())["orders"]["sept"] == [["q1"], ["q9"]]
