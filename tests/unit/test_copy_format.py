"""COPY's statement options and PostgreSQL's text and CSV data formats as the embedded server
reads and writes them (``proxy.backends.embedded.copy``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.backends.embedded.copy import (
    CopyError,
    CopyOptions,
    copy_statement,
    csv_lines,
    read_rows,
    split_lines,
    write_lines,
)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("copy t from stdin", CopyOptions()),
        # pgbench -i
        ("copy pgbench_accounts from stdin with (freeze on)", CopyOptions()),
        (
            "COPY t (a, b) FROM STDIN WITH (FORMAT csv, HEADER true, DELIMITER ';', NULL 'n/a')",
            CopyOptions("csv", ";", "n/a", True),
        ),
        # the older form psql's \copy and old clients write
        ("copy t from stdin with csv header delimiter as '|'", CopyOptions("csv", "|", "", True)),
        ("copy t from stdin delimiter ',' null ''", CopyOptions("text", ",", "")),
        ("copy (select 1) to stdout (format csv)", CopyOptions("csv", ",", "")),
    ],
)
def test_options_read_as_postgresql_reads_them(sql: str, expected: CopyOptions) -> None:
    assert copy_statement(sql).options == expected


def test_the_statement_names_its_table_columns_or_query() -> None:
    inbound = copy_statement('copy s."My T" (a, "B") from stdin')
    assert (inbound.direction, inbound.table, inbound.columns) == ("in", 's."My T"', 'a, "B"')
    outbound = copy_statement("copy (select a, (b) from t) to stdout;")
    assert (outbound.direction, outbound.query) == ("out", "select a, (b) from t")


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("copy t from stdin (format binary)", "0A000"),
        ("copy t from stdin (format xml)", "22023"),
        ("copy t from stdin (header)", "0A000"),  # (text has no header, as in PostgreSQL)
        ("copy t from stdin (delimiter '::')", "22023"),
        ("copy t from stdin (colour red)", "42601"),
        ("copy (select 1) from stdin", "42601"),
        ("copy t from stdin with nonsense", "42601"),
    ],
)
def test_what_is_not_carried_out_says_why(sql: str, sqlstate: str) -> None:
    with pytest.raises(CopyError) as failed:
        copy_statement(sql)
    assert failed.value.sqlstate == sqlstate


def test_text_format_escapes_nulls_and_the_end_marker() -> None:
    text = CopyOptions()
    lines = ["1\ta\\tb\t\\N", "2\tback\\\\slash\\nnew\t\\101\\x42", "3\tdelim\\\ttab\t", "\\.", "9"]
    assert list(read_rows(lines, text, True)) == [
        ["1", "a\tb", None],
        ["2", "back\\slash\nnew", "AB"],
        ["3", "delim\ttab", ""],
    ]
    assert list(read_rows(["x\r"], text, True)) == [["x"]]  # (a CRLF line)


def test_csv_quotes_nulls_and_the_header() -> None:
    options = CopyOptions("csv", ",", "", True)
    data = 'a,b,c\n1,"x,y",\n2,"two\nlines","say ""hi"""\n'
    assert list(read_rows(csv_lines(data), options, True)) == [
        ["1", "x,y", None],
        ["2", "two\nlines", 'say "hi"'],
    ]
    with pytest.raises(CopyError):
        list(read_rows(['1,"open\n'], CopyOptions("csv", ",", "", False), True))


def test_lines_split_across_messages_are_joined() -> None:
    lines, rest = split_lines("", "1\tab")
    assert (lines, rest) == ([], "1\tab")
    lines, rest = split_lines(rest, "c\n2\tx\n3")
    assert (lines, rest) == (["1\tabc", "2\tx"], "3")


_VALUES = st.one_of(st.none(), st.text(st.characters(exclude_categories=("Cs",)), max_size=12))


@given(st.lists(st.lists(_VALUES, min_size=3, max_size=3), max_size=6))
def test_what_is_written_reads_back_the_same_in_text(rows: list[list[str | None]]) -> None:
    options = CopyOptions()
    encoded = [[None if v is None else v.encode() for v in row] for row in rows]
    lines = [line.decode() for line in write_lines(encoded, options)]
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    assert list(read_rows([line[:-1] for line in lines], options, True)) == rows


@given(st.lists(st.lists(_VALUES, min_size=2, max_size=2), max_size=6))
def test_what_is_written_reads_back_the_same_in_csv(rows: list[list[str | None]]) -> None:
    options = CopyOptions("csv", ",", "")
    encoded = [[None if v is None else v.encode() for v in row] for row in rows]
    data = b"".join(write_lines(encoded, options)).decode()
    # (csv reads a quoted empty string as NULL too: see the module's note)
    expected = [[None if v == "" else v for v in row] for row in rows]
    assert list(read_rows(csv_lines(data), options, True)) == expected
