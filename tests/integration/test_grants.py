"""Work-memory grants through the relay on a real PostgreSQL (``serve --grant-work-mem``): each
admitted statement runs with its share of the budget as its work_mem, its clients hear nothing
of the proxy's own statement, sessions that set work_mem keep theirs, and drivers that keep an
unnamed statement across Syncs (asyncpg without a statement cache) or pipeline are unaffected."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import httpx
import psycopg
import pytest

from admission import ClassProfile, EtaModel, Limits
from admission.classify import classify_sql
from testing.proxyharness import ProxyHarness

MiB = 2**20
SETTING = "select current_setting('work_mem')"
SORT = "select count(*) from (select g from generate_series(1, 300000) g order by g desc) s"


def _model(units: float) -> EtaModel:
    return EtaModel(
        classes=(
            ClassProfile(
                fingerprint=classify_sql(SETTING).fingerprint,
                name="setting",
                D=0.01,
                f=1,
                work_mem_units=units,
            ),
        )
    )


def _dsn(proxy: ProxyHarness) -> str:
    return proxy.dsn_base + " user=postgres dbname=postgres"


def test_each_statement_runs_with_its_share_and_the_client_hears_only_its_own(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    # 64 MiB among MPL 2: 32 MiB a statement, over the class's 4 units: 8 MB
    proxy = make_proxy(model=_model(4.0), limits=Limits(mpl=2), work_mem_grant=64 * MiB, admin=True)
    notices: list[str] = []
    with psycopg.connect(_dsn(proxy), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        assert conn.execute("show work_mem").fetchone() != ("8MB",)  # bypasses: no grant yet
        for _ in range(3):
            assert conn.execute(SETTING).fetchone() == ("8MB",)
        # extended protocol (psycopg prepares after a few runs) and a result of many rows
        for _ in range(6):
            assert conn.execute(SETTING + " where %s", (True,)).fetchone() == ("8MB",)
        rows = conn.execute("select g from generate_series(1, 5000) g").fetchall()
        assert rows == [(g,) for g in range(1, 5001)]
        # an error of the client's own is its own, and the next statement is granted again
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1 / 0")
        assert conn.execute(SETTING).fetchone() == ("8MB",)
        # inside a transaction block statements bypass admission and keep the last grant
        with conn.transaction():
            assert conn.execute(SETTING).fetchone() == ("8MB",)
    assert notices == []
    proxy.wait_idle()
    status = httpx.get(f"{proxy.admin_url}/status").json()
    assert status["work_mem_grant"] == 64 * MiB
    classes = httpx.get(f"{proxy.admin_url}/classes").json()
    assert [c["profile"]["work_mem_units"] for c in classes if c["name"] == "setting"] == [4.0]


def test_a_class_of_unknown_units_gets_the_default_and_the_grant_follows_the_mpl(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(limits=Limits(mpl=4), work_mem_grant=64 * MiB)
    with psycopg.connect(_dsn(proxy), autocommit=True) as conn:
        assert conn.execute(SETTING).fetchone() == ("4MB",)  # 64 MiB / 4 / 4 units
        proxy.call(lambda: proxy.gate.set_limits(Limits(mpl=1)))
        assert conn.execute(SETTING).fetchone() == ("16MB",)
        proxy.call(lambda: setattr(proxy.server, "work_mem_grant", None))  # grants off
        conn.execute("discard all")  # (back to the server's own)
        assert conn.execute(SETTING).fetchone() == ("4MB",)  # the cluster's work_mem
    proxy.wait_idle()


def test_a_session_that_sets_work_mem_itself_keeps_it(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(model=_model(1.0), limits=Limits(mpl=1), work_mem_grant=64 * MiB)
    with (
        psycopg.connect(_dsn(proxy), autocommit=True) as mine,
        psycopg.connect(_dsn(proxy), autocommit=True) as other,
    ):
        assert mine.execute(SETTING).fetchone() == ("64MB",)
        mine.execute("set work_mem = '3MB'")
        for _ in range(3):
            assert mine.execute(SETTING).fetchone() == ("3MB",)
        assert other.execute(SETTING).fetchone() == ("64MB",)
    proxy.wait_idle()


def test_a_granted_statement_spills_less_than_at_the_servers_work_mem(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    """The point of it: a sort larger than the server's work_mem spills to temporary files at
    that work_mem, and not at the statement's share of the budget."""

    def temp_bytes(conn: psycopg.Connection) -> int:
        conn.execute("set log_temp_files = -1")
        plan = conn.execute("explain (analyze, buffers, format json) " + SORT).fetchone()
        assert plan is not None
        return int(plan[0][0]["Plan"].get("Temp Written Blocks", 0)) + sum(
            int(p.get("Temp Written Blocks", 0)) for p in plan[0][0]["Plan"].get("Plans", [])
        )

    proxy = make_proxy(limits=Limits(mpl=1), work_mem_grant=256 * MiB)
    with psycopg.connect(_dsn(proxy), autocommit=True) as conn:
        spilled = temp_bytes(conn)
        assert conn.execute(SETTING).fetchone() == ("64MB",)
    with psycopg.connect(_dsn(proxy), autocommit=True) as conn:
        conn.execute("set work_mem = '1MB'")  # the session keeps its own: it spills
        spilled_small = temp_bytes(conn)
    assert spilled == 0 and spilled_small > 0, (spilled, spilled_small)
    proxy.wait_idle()


def test_asyncpg_without_a_statement_cache_and_pipelines_are_unaffected(
    make_proxy: Callable[..., ProxyHarness],
) -> None:
    proxy = make_proxy(model=_model(2.0), limits=Limits(mpl=2), work_mem_grant=64 * MiB)

    async def run(cache: int) -> None:
        # asyncpg prepares with Parse, Describe and Flush, then Binds, and sends Execute and
        # Sync: that Execute continues an implicit transaction, and gets no grant of its own;
        # without a statement cache (statement_cache_size=0) every statement runs that way,
        # on the unnamed statement and portal
        conn = await asyncpg.connect(
            host="127.0.0.1",
            port=proxy.port,
            user="postgres",
            database="postgres",
            statement_cache_size=cache,
        )
        try:
            for i in range(5):
                assert await conn.fetchval("select $1::int * 2", i) == 2 * i
            # a simple Query is granted; a statement after it runs with the session's grant
            await conn.execute("select 1")
            for _ in range(3):
                assert await conn.fetchval(SETTING) == "16MB"
            records = await conn.fetch("select g, g::text from generate_series(1, 50) g")
            assert [tuple(r) for r in records][-1] == (50, "50")
        finally:
            await conn.close()

    asyncio.run(run(0))
    asyncio.run(run(100))
    with psycopg.connect(_dsn(proxy), autocommit=True) as conn, conn.pipeline():
        cursors = [conn.execute("select %s::int + 1", (i,)) for i in range(20)]
        settings = [conn.execute(SETTING) for _ in range(3)]
        conn.execute("select 1").fetchone()
        assert [c.fetchone() for c in cursors] == [(i + 1,) for i in range(20)]
        assert [c.fetchone() for c in settings] == [("16MB",)] * 3
    proxy.wait_idle()
