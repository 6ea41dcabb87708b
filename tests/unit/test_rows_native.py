"""The embedded server's DataRow encoding in C (``_rows``) against the Python reference: the
same bytes for every row hypothesis draws, in text and binary, and the same errors."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.native import native
from proxy.backends.embedded import executor
from proxy.backends.pgtypes import encode_text, pg_type, text_encoder

rows_c = native("proxy.backends.embedded._rows")
pytestmark = pytest.mark.skipif(rows_c is None, reason="the C encoder was not built")

COLUMNS = {
    "INTEGER": st.integers(-(2**31), 2**31 - 1),
    "BIGINT": st.integers(-(2**63), 2**63 - 1),
    "SMALLINT": st.integers(-(2**15), 2**15 - 1),
    "VARCHAR": st.text(),
    "DOUBLE": st.floats(allow_nan=True, allow_infinity=True),
    "BOOLEAN": st.booleans(),
    "DATE": st.dates(),
    "DECIMAL(18,3)": st.decimals(places=3, min_value=-(10**14), max_value=10**14),
    "TIMESTAMP": st.datetimes(),
}


@st.composite
def tables(draw: Any) -> tuple[list[str], list[tuple[Any, ...]], list[int]]:
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=6))
    rows = draw(
        st.lists(st.tuples(*(st.none() | COLUMNS[name] for name in names)), min_size=0, max_size=20)
    )
    formats = draw(st.lists(st.integers(0, 1), min_size=len(names), max_size=len(names)))
    return names, rows, formats


def _both(names: list[str], rows: list[tuple[Any, ...]], formats: list[int]) -> None:
    types = [pg_type(name) for name in names]
    encoders = [executor._encoder(t, f) for t, f in zip(types, formats, strict=True)]
    assert executor.data_rows(rows, types, formats) == executor.python_data_rows(rows, encoders)


@settings(max_examples=300, deadline=None)
@given(tables())
def test_the_c_encoder_writes_what_python_writes(
    table: tuple[list[str], list[tuple[Any, ...]], list[int]],
) -> None:
    _both(*table)


def test_integers_beyond_64_bits_and_values_of_other_types() -> None:
    # an integer column may hold what DuckDB's HUGEINT gives, a string column a subclass of
    # str or a value of another type: the C side hands those to the Python encoder
    class Name(str):
        pass

    _both(
        ["BIGINT", "VARCHAR", "VARCHAR", "INTEGER"],
        [(2**70, Name("x"), 12, True), (-(2**64), "é\u2603", Decimal("1.5"), None)],
        [0, 0, 0, 0],
    )
    _both(["DOUBLE"], [(math.nan,), (-0.0,), (1e300,)], [0])
    _both(["DATE"], [(datetime.date(1, 1, 1),)], [1])


def test_an_encoder_error_is_the_same_error() -> None:
    types = [pg_type("INTEGER")]
    with pytest.raises(Exception) as python:
        executor.python_data_rows([(2**40,)], [executor._encoder(types[0], 1)])
    with pytest.raises(type(python.value)):
        executor.data_rows([(2**40,)], types, [1])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_columns_text_encoder_is_encode_text(data: Any) -> None:
    name = data.draw(st.sampled_from([*sorted(COLUMNS), "INTEGER[]", "VARCHAR[]"]))
    t = pg_type(name)
    if name.endswith("[]"):
        value = data.draw(st.lists(st.none() | COLUMNS[name[:-2]], max_size=5))
    else:
        value = data.draw(COLUMNS[name])
    assert text_encoder(t)(value) == encode_text(value, t)


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.dates())
def test_the_quick_float_and_date_forms_are_postgresql_s(x: float, d: datetime.date) -> None:
    from proxy.backends import pgtypes

    assert pgtypes._float8(x) == (pgtypes._special(x) or pgtypes._shortest(repr(x), 15))
    assert pgtypes._date(d) == f"{d.year:04d}-{d.month:02d}-{d.day:02d}"


def test_the_quick_float_form_at_its_bounds() -> None:
    from proxy.backends import pgtypes

    for x in (1e15, 9.999999999999998e14, 1e-4, 9.999999999999999e-5, 1e16, 0.1, 2.5, -3.0):
        for value in (x, -x):
            reference = pgtypes._special(value) or pgtypes._shortest(repr(value), 15)
            assert pgtypes._float8(value) == reference, value


# -- the columnar path: DataRows written from DuckDB's Arrow batches ---------------------------

COLUMNAR = {
    **{k: v for k, v in COLUMNS.items() if k != "DATE"},
    "DATE": st.dates(),  # (the years Python has: what the row path can carry)
    "TINYINT": st.integers(-(2**7), 2**7 - 1),
    "UTINYINT": st.integers(0, 2**8 - 1),
    "USMALLINT": st.integers(0, 2**16 - 1),
    "UINTEGER": st.integers(0, 2**32 - 1),
    "HUGEINT": st.integers(-(2**127) + 1, 2**127 - 1),
    "DECIMAL(4,2)": st.decimals(places=2, min_value=-99, max_value=99),
    "DECIMAL(38,10)": st.decimals(places=10, min_value=-(10**27), max_value=10**27),
    # (numeric without a precision: written without the trailing zeros)
    "DECIMAL(38,9)": st.decimals(places=9, min_value=-(10**28), max_value=10**28),
    "TIMESTAMP WITH TIME ZONE": st.datetimes(timezones=st.just(datetime.UTC)),
    "VARCHAR": st.text(st.characters(codec="utf-8")),
}


def _columnar_and_rows(
    con: Any, names: list[str], rows: list[tuple[Any, ...]]
) -> tuple[list[bytes], list[bytes]]:
    con.execute("drop table if exists t")
    con.execute(f"create table t ({', '.join(f'c{i} {n}' for i, n in enumerate(names))})")
    if rows:
        con.executemany(f"insert into t values ({', '.join('?' for _ in names)})", rows)
    sql = "select * from t order by rowid"
    result = executor._columnar(con, sql, ())
    assert result is not None, names
    columnar = list(result.rows)
    while result.more is not None and (chunk := result.more()):
        columnar += chunk
    relation = con.execute(sql)
    types = [pg_type(str(d[1])) for d in relation.description]
    return columnar, executor.data_rows(relation.fetchall(), types, [0] * len(types))


columnar_only = pytest.mark.skipif(not executor.columnar(), reason="no columnar path here")


@columnar_only
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_columnar_path_writes_what_the_row_path_writes(data: Any) -> None:
    import duckdb

    names = data.draw(st.lists(st.sampled_from(sorted(COLUMNAR)), min_size=1, max_size=6))
    rows = data.draw(
        st.lists(st.tuples(*(st.none() | COLUMNAR[n] for n in names)), min_size=0, max_size=25)
    )
    con = duckdb.connect()
    con.execute("set TimeZone = 'UTC'")
    columnar, reference = _columnar_and_rows(con, names, rows)
    assert columnar == reference


@columnar_only
def test_the_columnar_path_in_chunks_across_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import duckdb

    monkeypatch.setattr(executor, "CHUNK_ROWS", 7)  # batches of 7 rows, fetched 7 at a time
    con = duckdb.connect()
    rows = [(i, f"r{i}" if i % 3 else None, i / 8) for i in range(100)]
    columnar, reference = _columnar_and_rows(con, ["BIGINT", "VARCHAR", "DOUBLE"], rows)
    assert columnar == reference and len(columnar) == 100


@columnar_only
def test_the_row_path_takes_what_the_columnar_path_does_not_write() -> None:
    import duckdb

    con = duckdb.connect()
    con.execute("create sequence s")
    sql = "select interval 1 day as i, 1 as n"
    assert executor.columnar_candidate(sql)
    assert executor._columnar(con, sql, ()) is None
    assert not executor.columnar_candidate(sql)  # next time, straight to the row path
    result = executor.execute(con, sql, (), "SELECT")
    assert result.rows and result.columns[0][1].name == "interval"
    # a statement whose running has effects is run once, by the row path
    assert not executor.columnar_candidate("select nextval('s')")
    executor.execute(con, "select nextval('s')", (), "SELECT")
    assert con.execute("select currval('s')").fetchone() == (1,)


@columnar_only
def test_a_profiled_select_takes_the_columnar_path_and_is_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampled statement (the profiler on) gets the same rows as one run unprofiled, from the
    columnar path, with DuckDB's CPU time and memory once its result is whole; a result longer
    than a chunk is not measured (DuckDB is not done at its first chunk). The memory base read
    before it leaves no open result behind (``_submit`` would refuse to run)."""
    import duckdb

    con = duckdb.connect()
    con.execute("create table t as select i, i % 97 as k from range(300000) t(i)")
    sql = "select k, count(*) as n, sum(i) as s from t group by k order by k"
    plain = executor.execute(con, sql, (), "SELECT")
    columnar_runs: list[str] = []
    real = executor._columnar
    monkeypatch.setattr(
        executor, "_columnar", lambda c, q, p, t: columnar_runs.append(q) or real(c, q, p, t)
    )
    # a live sample (the base read at most a second ago) takes the columnar path; an observer
    # of every statement (training: the base read now) the row path
    for base in (executor.MemoryBase(), None):
        result = executor.execute(con, sql, (), "SELECT", (), True, base, True)
        assert result.rows == plain.rows and result.tag == plain.tag == "SELECT 97"
        assert result.cpu_time is not None and result.cpu_time > 0
        assert result.memory is not None and result.spilled == 0
    assert columnar_runs == [sql]
    monkeypatch.setattr(executor, "CHUNK_ROWS", 7)
    long = executor.execute(con, sql, (), "SELECT", (), True, executor.MemoryBase())
    assert long.more is not None and long.cpu_time is None
    rows = long.rows
    while chunk := long.more():
        rows += chunk
    assert rows == plain.rows
    executor.set_profiling(con, False)
    assert executor.execute(con, sql, (), "SELECT").cpu_time is None


@columnar_only
def test_a_failure_while_streaming_is_the_row_paths_error() -> None:
    import duckdb

    con = duckdb.connect()
    sql = "select case when range < 70000 then range::varchar else 'x' end::int from range(80000)"
    from proxy.backends.errors import sqlstate_for

    with pytest.raises(duckdb.Error) as row_path:
        con.execute(sql).fetchall()
    with pytest.raises(executor.QueryError) as failed:
        result = executor._columnar(con, sql, ())
        assert result is not None
        while result.more is not None and result.more():
            pass
    assert failed.value.sqlstate == sqlstate_for(row_path.value) == "22P02"
    assert str(failed.value) == executor.first_line(row_path.value)
    assert con.execute("select 42").fetchone() == (42,)  # the cursor is free again


@columnar_only
def test_a_close_while_a_fetch_runs_waits_for_it() -> None:
    """A client gone while DuckDB makes the next batch (the fetch without the GIL, in a worker
    thread): close() from the event loop's thread is done when that fetch returns."""
    import threading

    import duckdb

    con = duckdb.connect()
    sql = "select sum(a.range * b.range) from range(3000) a, range(3000) b group by a.range % 7"
    result = executor._columnar(con, "select 1 as x", ())
    assert result is not None and result.more is None  # (short: closed at once)
    submitted = con._submit(sql, None, "stream", 100)
    encoders = (executor._encoder(pg_type("HUGEINT"), 0),)
    stream = rows_c.ArrowRows(submitted.arrow_capsule(), encoders)
    got: list[object] = []
    started = threading.Event()

    def fetch() -> None:
        started.set()
        got.append(stream.fetch(1))

    worker = threading.Thread(target=fetch)
    worker.start()
    # (not a spin on is_alive(): a fetch done before the first look left it spinning for ever)
    assert started.wait(30)
    stream.close()  # meanwhile
    worker.join(60)
    assert got and not worker.is_alive()
    assert stream.done and stream.fetch(10) == []
    assert con.execute("select 42").fetchone() == (42,)  # the cursor is free again
