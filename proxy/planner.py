"""The database's own cost estimate of a statement, for the prior of a class not yet measured.

The embedded DuckDB answers from EXPLAIN's estimated cardinalities
(``DuckDBBackend.plan_cost``). In front of PostgreSQL the proxy holds no connection of its own
— clients authenticate with the server themselves — so ``PostgresPlanner`` needs one given
(``serve --explain-dsn``): it runs ``EXPLAIN (FORMAT JSON)`` there (the plan's Total Cost,
nothing executed), one statement at a time, with a short statement timeout. From the same plan
it counts the statement's work_mem units (``admission.grants.work_mem_units``, the planned
workers in place of the launched ones), what a work-memory grant is divided by, so a class
learned live gets a grant sized by its own plan.

Only one read-only statement without parameters is asked about — a sample holding several
(``select 1; drop table t``) or anything but a SELECT is not: EXPLAIN of it would run the rest,
with the proxy's rights rather than the client's. PostgreSQL's text is parsed with PostgreSQL's
own parser (pglast), DuckDB's with DuckDB's (``DuckDBBackend.plan_cost``). ``$1`` has no value
to plan with.
"""

from __future__ import annotations

import logging
import re
from typing import Any, NamedTuple

import pglast

from admission.grants import work_mem_units

__all__ = ["PARAM", "PLANNABLE_HEAD", "PlanEstimate", "PostgresPlanner", "plannable"]

log = logging.getLogger("admission.planner")

# (a first look, before any parser: a statement that cannot be a SELECT is not parsed at all)
PLANNABLE_HEAD = re.compile(r"\s*(?:\(\s*)*(?:select|with|from|values|table)\b", re.I)
PARAM = re.compile(r"\$\d")
TIMEOUT_MS = 2000  # EXPLAIN does not run the statement; planning it takes no longer than this
CONNECT_TIMEOUT = 5  # seconds


def plannable(sql: str) -> bool:
    """Whether ``sql`` is one SELECT without parameters, by PostgreSQL's parser: what may be
    EXPLAINed to estimate its cost."""
    if not PLANNABLE_HEAD.match(sql) or PARAM.search(sql):
        return False
    try:
        statements = pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        return False
    return len(statements) == 1 and isinstance(statements[0].stmt, pglast.ast.SelectStmt)


class PlanEstimate(NamedTuple):
    """What the database's planner says of a statement."""

    cost: float  # its estimate, in the planner's own units
    work_mem_units: float | None = None  # PostgreSQL: how many times over work_mem it may take


class PostgresPlanner:
    """``plan_cost(sql)`` over a connection of its own to ``dsn``, opened at first use and
    again after it broke; a server that cannot be reached is logged once and gives no cost."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: Any = None  # psycopg.AsyncConnection, once open
        self._warned = False
        self._hash_mem = 2.0  # the server's hash_mem_multiplier (read at connect)

    async def _connection(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT
            )
            await self._conn.execute(f"set statement_timeout = {TIMEOUT_MS}")
            cursor = await self._conn.execute(
                "select coalesce(current_setting('hash_mem_multiplier', true), '1')::float8"
            )
            row = await cursor.fetchone()
            self._hash_mem = float(row[0]) if row else 1.0
        return self._conn

    async def plan_cost(self, sql: str) -> PlanEstimate | None:
        """The plan's Total Cost and its work_mem units; None for a statement that is not
        one SELECT without parameters, or that PostgreSQL cannot plan here."""
        if not plannable(sql):
            return None
        import psycopg

        try:
            conn = await self._connection()
            cursor = await conn.execute(f"EXPLAIN (FORMAT JSON) {sql}")
            row = await cursor.fetchone()
        except psycopg.OperationalError as e:
            if not self._warned:
                log.warning("cannot EXPLAIN on %s: %s (no cost priors)", self.dsn, e)
                self._warned = True
            return None
        except psycopg.Error:
            return None  # a statement PostgreSQL cannot plan here: no prior for it
        try:
            cost = float(row[0][0]["Plan"]["Total Cost"])
            units = work_mem_units(row[0], self._hash_mem)
        except (TypeError, KeyError, IndexError, ValueError):
            return None
        return PlanEstimate(cost, units) if cost else None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
