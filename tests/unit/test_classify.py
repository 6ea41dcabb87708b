"""The classifier: one stable class per SQL skeleton, whatever the constants and formatting."""

from __future__ import annotations

import os
import random
import re
import shutil

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from admission import classify, classify_sql
from admission.classify import normalize_sql
from workloads.tpch.queries import DIALECTS, QUERY_NUMBERS, random_query


def _reformat(sql: str, rng: random.Random) -> str:
    """The same statement as a different client might send it: case, spacing, comments."""
    words = sql.split()
    out = []
    for w in words:
        if "'" not in w and rng.random() < 0.3:
            w = w.upper()
        out.append(w)
        out.append(rng.choice([" ", "  ", "\n", "\n\t", " -- note\n", " /* c */ "]))
    return "/* from app */ " + "".join(out) + rng.choice(["", ";", " ;\n"])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tpch_queries_give_exactly_22_stable_classes(dialect: str) -> None:
    rng = random.Random(42)
    classes: dict[int, set[str]] = {}
    for q in QUERY_NUMBERS:
        for draw in range(6):
            sql = random_query(q, rng, dialect)  # type: ignore[arg-type]
            if draw % 2:
                sql = _reformat(sql, rng)
            classes.setdefault(q, set()).add(classify_sql(sql).fingerprint)
    assert all(len(fps) == 1 for fps in classes.values()), {
        q: fps for q, fps in classes.items() if len(fps) != 1
    }
    assert len({next(iter(f)) for f in classes.values()}) == 22


def test_parameters_actually_vary() -> None:
    """Guard against a test that cannot fail: the draws do produce different texts."""
    rng = random.Random(1)
    for q in QUERY_NUMBERS:
        texts = {random_query(q, rng) for _ in range(8)}
        assert len(texts) > 1, f"Q{q} drew the same parameters 8 times"


def test_postgres_dialect_uses_libpg_query_and_duckdb_intervals_fall_back() -> None:
    rng = random.Random(3)
    assert classify_sql(random_query(4, rng, "postgres")).fingerprint.startswith("pg:")
    assert classify_sql(random_query(4, rng, "duckdb")).fingerprint.startswith("sk:")
    # a query without intervals is the same text in both dialects, hence the same class
    assert classify_sql(random_query(9, random.Random(5), "duckdb")) == classify_sql(
        random_query(9, random.Random(5), "postgres")
    )


def test_fingerprints_are_stable_across_releases() -> None:
    """A model file names classes by fingerprint: the values must not drift."""
    assert (
        classify_sql("select * from t where a = 1").fingerprint
        == classify_sql("SELECT *\nFROM t WHERE a = 42").fingerprint
    )
    assert re.fullmatch(r"pg:[0-9a-f]{16}", classify_sql("select 1").fingerprint)
    assert classify_sql("frobnicate 1").fingerprint == classify_sql("FROBNICATE   7").fingerprint


def test_hint_overrides_everything() -> None:
    a = classify_sql("/* admission:class=reports */ select * from a")
    b = classify_sql("select * from b /* admission:class=reports */")
    assert a.fingerprint == b.fingerprint == "hint:reports"
    assert a.name == "reports"


def test_different_shapes_are_different_classes() -> None:
    assert (
        classify_sql("select a from t").fingerprint != classify_sql("select b from t").fingerprint
    )
    assert (
        classify_sql("select a from t where x in (1, 2)").fingerprint
        == classify_sql("select a from t where x in (5, 6, 7, 8)").fingerprint
    )


def test_fallback_folds_literals_lists_values_and_comments() -> None:
    assert normalize_sql("SELECT  'x''y', 3.5e2 -- c\n FROM t WHERE a IN (1,2,3)") == (
        "select ?,? from t where a in(?)"
    )
    assert normalize_sql("insert into t values (1, 'a'), (2, 'b'), (3, 'c')") == (
        "insert into t values(?)"
    )
    assert normalize_sql("select $$dollar 'quoted'$$, $tag$x$tag$ from t") == "select ?,? from t"


@pytest.mark.parametrize(
    ("sql", "control"),
    [
        ("SET search_path = public", True),
        ("show server_version", True),
        ("BEGIN", True),
        ("begin isolation level serializable", True),
        ("COMMIT", True),
        ("rollback", True),
        ("DISCARD ALL", True),
        ("LISTEN chan", True),
        ("DEALLOCATE pdo_stmt_1", True),
        ("", True),
        ("  ;  ", True),
        ("-- only a comment", True),
        ("select 1", False),
        ("with x as (select 1) select * from x", False),
        ("set_config_table_scan", False),
    ],
)
def test_session_control_statements_bypass(sql: str, control: bool) -> None:
    assert classify_sql(sql).control is control


def test_multi_statement_strings_get_one_class() -> None:
    a = classify_sql("select 1; select 2 from t")
    b = classify_sql("select 7; select 9 from t")
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint != classify_sql("select 1").fingerprint


@given(st.text(max_size=300))
def test_never_raises(text: str) -> None:
    cls = classify_sql(text)
    assert cls.fingerprint and cls.name


@given(st.binary(max_size=200))
def test_never_raises_on_decoded_garbage(data: bytes) -> None:
    cls = classify_sql(data.decode("latin-1"))
    assert cls.fingerprint


@pytest.mark.parametrize(
    ("sql", "control"),
    [
        ("BEGIN; SET x = 1; COMMIT", True),
        ("BEGIN;", True),
        ("BEGIN; select * from big; COMMIT", False),
        ("select 1; SET x = 1", False),
    ],
)
def test_multi_statement_texts_are_control_only_if_every_statement_is(
    sql: str, control: bool
) -> None:
    assert classify_sql(sql).control is control


# -- the cache for texts that differ only in their numbers ---------------------------------


def _full_classifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every text that is parsed in full (the cache's misses)."""
    import admission.classify as classify

    seen: list[str] = []
    full = classify._classify

    def spy(text: str) -> classify.QueryClass:
        seen.append(text)
        return full(text)

    monkeypatch.setattr(classify, "_classify", spy)
    classify._BY_KEY.clear()  # emptied, not replaced: the C classifier holds these dicts
    classify._TEXTS.clear()
    return seen


def test_texts_differing_in_numbers_are_parsed_only_until_their_key_is_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _full_classifications(monkeypatch)
    texts = [f"SELECT abalance FROM pgbench_accounts WHERE aid = {n};" for n in range(1, 50)]
    classes = {classify_sql(t) for t in texts}
    assert len(classes) == 1
    assert len(seen) == 3  # the checks; the other 46 came from the key
    assert classes == {classify_sql("select abalance from pgbench_accounts where aid = 7")}


def test_a_key_whose_texts_disagree_is_never_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    import admission.classify as classify

    seen = _full_classifications(monkeypatch)
    spy = classify._classify

    def disagreeing(text: str) -> classify.QueryClass:
        found = spy(text)
        # pretend the number decides the shape, as it would for a non-constant number
        return classify.QueryClass(found.fingerprint + text[-1], found.name)

    monkeypatch.setattr(classify, "_classify", disagreeing)
    texts = [f"select a from t where b = {n}" for n in range(1, 20)]
    assert [classify_sql(t).fingerprint[-1] for t in texts] == [t[-1] for t in texts]
    assert len(seen) == len(texts)


@pytest.mark.parametrize(
    "text",
    [
        'select "col 1" from t',  # a number inside a quoted name
        "select 1; select 2",  # several statements
        "create sequence s increment 5",  # not DML: numbers there need not be constants
        "/* admission:class=7 */ select 1",
    ],
)
def test_texts_where_numbers_may_matter_get_no_literal_key(text: str) -> None:
    from admission.classify import literal_key

    assert literal_key(text) is None


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=2, max_size=2))
def test_literal_keys_never_join_what_the_fingerprint_separates(numbers: list[int]) -> None:
    from pglast import parser

    from admission.classify import literal_key

    shapes = [
        "select a{0} from t{1} where b = {0} and c < {1}.5",
        "select a from t order by {0} limit {1} offset {0}",
        "select x::numeric({0}, {1}), y[{0}:{1}] from t",
        "select $1 + {0} from t where k in ({0}, {1}, {0})",
        "select a - {0}, a + {1}, 1e{0} from t",
        "select €{0}, a from t where b = {1}",  # names: any non-ASCII character continues one
        "select a from t where b = ٣{0} and c = {1}",  # a non-ASCII digit is not a digit
    ]
    for shape in shapes:
        texts = [shape.format(*numbers), shape.format(*reversed(numbers))]
        keys = [literal_key(t) for t in texts]
        if keys[0] == keys[1]:
            assert parser.fingerprint(texts[0]) == parser.fingerprint(texts[1]), texts


@given(st.text(alphabet="0123456789.$_eE+- ta(),é€٣", max_size=40))
def test_the_literal_pattern_matches_the_plain_one(text: str) -> None:
    """The literal pattern, written for speed, blanks exactly the numbers this reads as:
    ASCII digits (with a dot, or a dot and digits) not right after a name's character (ASCII
    letter, digit, _, $, any non-ASCII character) or a dot."""
    import re

    from admission.classify import _NUMERIC_LITERAL

    plain = re.compile(
        r"(?<![A-Za-z0-9_$.\x80-\U0010FFFF])(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
    )
    assert _NUMERIC_LITERAL.sub("0", text) == plain.sub("0", text)


_KEY_STARTS = [
    "",
    "select ",
    "SELECT a",
    " \t\n\v\fSeLeCt\n",
    "with x as (",
    "insert into t values (",
    "update t set a = ",
    "delete from t where a = ",
    "values (",
    "table",
    "ſelect ",  # a long s is not an s to the lexer
    "selecté ",  # a name, not the keyword
    "select$1 ",
    "select_1 ",
    "\u00a0select ",  # not whitespace to the lexer
    "/* admission:class=x */ select ",
    "create sequence s increment ",
]
_KEY_TEXT = st.text(alphabet='0123456789.$_eE+- \t\n\v\f\r\u00a0\u2003ta(),;"é€٣𝟙ſK', max_size=60)


@pytest.mark.skipif(
    classify._c_literal is None,
    reason="the C literal key is not built, or ADMISSION_PURE_PYTHON is set",
)
@given(st.sampled_from(_KEY_STARTS), _KEY_TEXT, st.integers(min_value=0, max_value=3))
@example("select ", "1", 0).via("the shortest number")
@example("select ", "a1.5e+3 .5e 1.e5 1..2 5e-", 0).via("glued, exponents, dots")
@example("SELECT ", "x FROM t WHERE aid = 42; \v\n", 0).via("one statement, then blanks")
@example("select ", "1;\u00a0", 0).via("a second statement the lexer reads as a name")
@example("select ", "x from t where b = 7 and c = 8", 30).via("longer than the stack buffer")
def test_the_c_literal_key_is_the_python_one(start: str, rest: str, repeat: int) -> None:
    text = start + rest * (repeat * 5 if repeat else 1)
    assert classify._c_literal is not None
    assert classify._c_literal.literal_key(text) == classify.literal_key(text), text


def test_the_c_literal_key_is_used_where_built() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python literal key is used")
    if os.environ.get("ADMISSION_PURE_PYTHON"):
        assert classify._literal_key is classify.literal_key
        assert classify.classify_sql is classify.classify_sql_py
    else:
        assert classify._c_literal is not None
        assert classify._literal_key is classify._c_literal.literal_key
        assert classify.classify_sql is classify._c_literal.classify_sql


_CLASSIFY_TEMPLATES = [
    "select a from t where b = {n}",
    "SELECT a\nFROM t WHERE b = {n}",
    "select {n}",
    "select a from t where b = {n} and c = {n}.5",
    "with x as (select {n}) select * from x",
    "select 'x{n}' from t",  # a string: its own key for each text
    'select "c{n}" from t',  # a quoted name: no key
    "set work_mem = {n}",  # not DML: no key
    "select {n}; select 2",  # several statements: no key
    "/* admission:class=hinted */ select {n}",
    "select a from t where b = {n} limit {n}",
    "frobnicate {n}",  # not SQL pglast parses
]


def _classify_run(classify_sql: object, texts: list[str]) -> tuple[object, ...]:
    classify._TEXTS.clear()
    classify._BY_KEY.clear()
    out = [classify_sql(t) for t in texts]  # type: ignore[operator]
    return out, dict(classify._BY_KEY), dict(classify._TEXTS)


@pytest.mark.skipif(
    classify._c_literal is None,
    reason="the C classifier cache is not built, or ADMISSION_PURE_PYTHON is set",
)
@given(
    st.lists(
        st.tuples(st.sampled_from(_CLASSIFY_TEMPLATES), st.integers(min_value=0, max_value=4)),
        max_size=40,
    )
)
def test_the_c_classify_sql_is_the_python_one(texts: list[tuple[str, int]]) -> None:
    """Same classes, and the same caches after, for any sequence of texts (the same literal
    key seen 0, 1, 3 or more times, texts repeated, texts with no key)."""
    assert classify._c_literal is not None
    sequence = [template.format(n=n) for template, n in texts]
    assert _classify_run(classify._c_literal.classify_sql, sequence) == _classify_run(
        classify.classify_sql_py, sequence
    )


@pytest.mark.skipif(
    classify._c_literal is None,
    reason="the C classifier cache is not built, or ADMISSION_PURE_PYTHON is set",
)
def test_the_c_classify_sql_trusts_a_key_only_as_the_python_one_does() -> None:
    assert classify._c_literal is not None
    text = "select a from t where b = 7"
    key = classify.literal_key(text)
    assert key is not None
    other = classify.QueryClass("pg:other", "other", False)
    for entry, expected in (
        ((other, classify._CHECKS), other),  # enough texts agreed: the key's class
        ((other, classify._CHECKS - 1), None),  # not yet: classified in full
        ((None, 5), None),  # the key was seen to join different classes: never trusted
    ):
        results = []
        for version in (classify._c_literal.classify_sql, classify.classify_sql_py):
            classify._TEXTS.clear()
            classify._BY_KEY.clear()
            classify._BY_KEY[key] = entry
            results.append(version(text))
        assert results[0] == results[1]
        assert results[0] == (expected or classify._classify(text))
    classify._BY_KEY.clear()
    with pytest.raises(TypeError):
        classify._c_literal.classify_sql(b"select 1")


def test_the_literal_key_reads_keywords_and_blanks_as_the_lexer_does() -> None:
    assert classify.literal_key("\v SELECT a from t where b = 1.5e3") == (
        "\v SELECT a from t where b = 0"
    )
    for text in ("ſelect 1", "selecté 1", "select$1", "\u00a0select 1", "select 1;\u00a0"):
        assert classify.literal_key(text) is None, text
