"""The memory budget on real servers: a statement whose class takes more than the whole
budget runs alone and its client is told so in a NOTICE (embedded DuckDB and PostgreSQL
through the relay), and the embedded DuckDB's spill limit makes memory a hard limit."""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import psycopg
import pytest

from admission import ClassProfile, EtaModel, Limits
from admission.classify import classify_sql
from proxy.backends.embedded import DuckDBBackend
from testing.embeddedharness import Embedded
from testing.proxyharness import ProxyHarness

BIG = "select count(*) from generate_series(1, 200000) t(i) where i % 7 = 0"
SMALL = "select 41 + 1"
MiB = 2**20


def _model() -> EtaModel:
    return EtaModel(
        classes=(
            ClassProfile(
                fingerprint=classify_sql(BIG).fingerprint, name="big", D=0.05, f=1, M=300 * MiB
            ),
            ClassProfile(
                fingerprint=classify_sql(SMALL).fingerprint, name="small", D=0.01, f=1, M=MiB
            ),
        )
    )


def _check(connect: Callable[[], psycopg.Connection], memory_in_use: Callable[[], int]) -> None:
    notices: list[str] = []
    with connect() as big, connect() as small:
        big.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        small.add_notice_handler(lambda d: notices.append("small: " + (d.message_primary or "")))
        assert small.execute(SMALL).fetchone() == (42,)
        assert big.execute(BIG).fetchone() == (28571,)
        assert big.execute(BIG).fetchone() == (28571,)  # told every time
        assert small.execute(SMALL).fetchone() == (42,)
        with big.transaction():  # inside a transaction statements are not held back
            assert big.execute(BIG).fetchone() == (28571,)
    assert len(notices) == 2, notices
    assert all(n.startswith("statements of class big take 300 MiB") for n in notices)
    assert all("budget (100 MiB)" in n and "runs alone" in n for n in notices)
    assert memory_in_use() == 0


def test_embedded_tells_a_statement_larger_than_the_budget_that_it_runs_alone() -> None:
    e = Embedded(Limits(mpl=4, memory=100 * MiB))
    try:
        e.call(lambda: e.server.gate.set_model(_model()))
        _check(e.connect, lambda: e.call(lambda: e.scheduler.memory_in_use))
    finally:
        e.close()


def test_the_relay_tells_a_statement_larger_than_the_budget_that_it_runs_alone(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(model=_model(), limits=Limits(mpl=4, memory=100 * MiB))
    dsn = proxy.dsn_base + " user=postgres dbname=postgres"
    _check(
        lambda: psycopg.connect(dsn, autocommit=True),
        lambda: proxy.call(lambda: proxy.scheduler.memory_in_use),
    )


def test_without_spilling_duckdb_fails_what_outgrows_its_memory_limit() -> None:
    """``--max-temp-size 0``: what DuckDB cannot hold fails with out of memory instead of
    spilling to disk — the scenario where the memory budget keeps statements from failing."""
    heavy = "select i % 3000000 k, count(*) from range(6000000) t(i) group by k order by k"
    strict = DuckDBBackend(workers=1, memory_limit=64 * MiB, max_temp_size=0)
    spilling = DuckDBBackend(workers=1, memory_limit=64 * MiB)
    try:
        with pytest.raises(duckdb.OutOfMemoryException):
            strict.connection.cursor().execute(heavy).fetchall()
        assert len(spilling.connection.cursor().execute(heavy).fetchall()) == 3_000_000
    finally:
        strict.close()
        spilling.close()
