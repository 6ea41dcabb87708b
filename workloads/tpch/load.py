"""A closed TPC-H workload: N clients, each running one query at a time, with think time.

Every client is a thread with its own psycopg connection (libpq waits without the GIL) and its
own seeded random stream, so a run is repeatable up to timing. Each statement is recorded with
its query number, start and end (``time.monotonic``) and, if it failed, its SQLSTATE. The run
ends at ``duration``: clients finish the statement they are in, then stop (drain), so every
statement started is recorded.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg

from workloads.tpch.mixes import Mix
from workloads.tpch.queries import Dialect, draw_parameters, render_query

__all__ = ["LoadResult", "Statement", "run_closed"]


@dataclass(frozen=True, slots=True)
class Statement:
    query: int
    start: float
    end: float
    client: int
    sqlstate: str | None = None  # None: it succeeded

    @property
    def response(self) -> float:
        return self.end - self.start


@dataclass
class LoadResult:
    statements: list[Statement] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    @property
    def elapsed(self) -> float:
        return self.ended - self.started

    @property
    def ok(self) -> list[Statement]:
        return [s for s in self.statements if s.sqlstate is None]

    @property
    def failed(self) -> list[Statement]:
        return [s for s in self.statements if s.sqlstate is not None]


def _pick(rng: random.Random, queries: Sequence[int], weights: Sequence[float]) -> int:
    return rng.choices(queries, weights)[0]


def run_closed(
    conninfo: str,
    mix: Mix,
    *,
    clients: int,
    duration: float,
    think: float = 0.0,
    scale_factor: float = 1.0,
    dialect: Dialect = "postgres",
    seed: int = 0,
    on_statement: Callable[[Statement], None] | None = None,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Run ``clients`` closed-loop clients for ``duration`` seconds (or until ``stop``).

    Think times are exponential with mean ``think`` (0: none). A failed statement is recorded
    and the client goes on; a lost connection ends that client (recorded with its SQLSTATE).
    """
    queries = mix.queries
    weights = [mix.weights[q] for q in queries]
    result = LoadResult()
    lock = threading.Lock()
    stop = stop or threading.Event()
    errors: list[BaseException] = []

    def client(number: int) -> None:
        rng = random.Random(seed * 1_000_003 + number)
        try:
            conn = psycopg.connect(conninfo, autocommit=True)
        except psycopg.Error as e:
            errors.append(e)
            return
        with conn:
            while not stop.is_set():
                q = _pick(rng, queries, weights)
                sql = render_query(q, draw_parameters(q, rng, scale_factor), dialect)
                started = time.monotonic()
                sqlstate = None
                try:
                    conn.execute(sql).fetchall()
                except psycopg.OperationalError as e:
                    sqlstate = e.sqlstate or "08006"
                except psycopg.Error as e:
                    sqlstate = e.sqlstate or "XX000"
                record = Statement(q, started, time.monotonic(), number, sqlstate)
                with lock:
                    result.statements.append(record)
                if on_statement is not None:
                    on_statement(record)
                if conn.closed:
                    return
                if think > 0 and stop.wait(rng.expovariate(1 / think)):
                    return

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    result.started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(duration)
    stop.set()
    for t in threads:
        t.join()
    result.ended = time.monotonic()
    if errors and not result.statements:
        raise errors[0]
    return result
