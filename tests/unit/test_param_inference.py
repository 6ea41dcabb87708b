"""The embedded server's parameter types (compat.infer_parameter_types): what it tells a client
whose Parse leaves a parameter untyped (pg8000 leaves every one so), as PostgreSQL would."""

from __future__ import annotations

import datetime

import pytest

from proxy.backends.embedded.compat import infer_parameter_types
from proxy.backends.embedded.params import decode_param

COLUMNS = {"items": [("id", "INTEGER"), ("name", "VARCHAR"), ("price", "DECIMAL(10,2)")]}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("select 1 + $1", ["INTEGER"]),
        ("select $1 * 2, $2 - 1.5", ["INTEGER", "DECIMAL(18,3)"]),
        ("select * from items where $1 >= 10", ["INTEGER"]),
        ("select * from items where id = $1 and name = $2", ["INTEGER", "VARCHAR"]),
        ("select * from items where name = $1 || 'x'", ["VARCHAR"]),
        ("select $1", [None]),  # (nothing to tell it by: text, which DuckDB casts)
        ("select $1 + $2", [None, None]),  # (PostgreSQL cannot choose either)
        ("select x1 + $1 from t", [None]),  # (a name, not a number)
        ("select $1 from t limit $2", [None, "BIGINT"]),
        # pgbench -M extended: a column beside it in arithmetic
        ("update items set price = price + $1 where id = $2", ["DECIMAL(10,2)", "INTEGER"]),
        ("select $1 * id from items", ["INTEGER"]),
    ],
)
def test_a_parameter_takes_the_type_of_what_it_meets(
    query: str, expected: list[str | None]
) -> None:
    assert infer_parameter_types(query, len(expected), COLUMNS) == expected


def test_a_column_says_more_than_a_number_beside_it() -> None:
    # price = $1 is DECIMAL(10,2) by the column, whatever follows
    assert infer_parameter_types("select * from items where price = $1", 1, COLUMNS) == [
        "DECIMAL(10,2)"
    ]


# -- serial columns (compat.serials) -----------------------------------------------------------


def test_serial_columns_become_sequences_named_as_postgresql_names_them() -> None:
    from proxy.backends.embedded.compat import serials

    out = serials("CREATE TABLE orm (\n\tid SERIAL NOT NULL, name VARCHAR, PRIMARY KEY (id))")
    assert out == (
        "create sequence if not exists orm_id_seq; CREATE TABLE orm (\n\tid INTEGER DEFAULT "
        "nextval('orm_id_seq') NOT NULL, name VARCHAR, PRIMARY KEY (id))"
    )
    out = serials('create temp table s."T" ("Id" bigserial primary key, serial text, n serial2)')
    assert out.startswith(
        "create temp sequence if not exists s.t_id_seq; "
        "create temp sequence if not exists s.t_n_seq; "
    )
    assert "\"Id\" BIGINT DEFAULT nextval('s.t_id_seq')" in out
    assert ", serial text," in out  # (a column named serial is not a serial column)
    assert "n SMALLINT DEFAULT nextval('s.t_n_seq')" in out


@pytest.mark.parametrize(
    "sql",
    ["create table t as select 1 as serial", "select serial from t", "create table t (a int)"],
)
def test_what_has_no_serial_column_is_left_alone(sql: str) -> None:
    from proxy.backends.embedded.compat import serials

    assert serials(sql) == sql


@pytest.mark.parametrize(
    "text", ["2020-01-31", "2020-01-31 +00", "2020-01-31 00:00:00+05:30", "2020-01-31T10:00:00Z"]
)
def test_a_date_parameter_reads_as_postgresql_s_date_input(text: str) -> None:
    # (pgjdbc sends setDate's value as '2020-01-31 +00'; PostgreSQL reads the date and drops
    # the rest)
    assert decode_param(text.encode(), 1082, False) == datetime.date(2020, 1, 31)


def test_a_date_parameter_that_is_not_one_is_refused() -> None:
    for text in ("2020-01-31 junk", "31/01/2020", "2020-13-01"):
        with pytest.raises(ValueError):
            decode_param(text.encode(), 1082, False)
