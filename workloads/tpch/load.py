"""TPC-H workloads through a server: closed (N clients, each running one query at a time, with
think time) and open (statements arriving on a schedule, whether or not earlier ones finished).

Every client is a thread with its own psycopg connection (libpq waits without the GIL) and its
own seeded random stream, so a run is repeatable up to timing. Each statement is recorded with
its query number, start and end (``time.monotonic``) and, if it failed, its SQLSTATE. The run
ends at ``duration``: clients finish the statement they are in, then stop (drain), so every
statement started is recorded.

In an open run a statement's start is its *scheduled arrival*: if every connection is busy when
it arrives, another is opened (up to a cap), and the time it waits for one counts in its
response time, as it would for a user; how many were sent late is reported.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg

from workloads.tpch.mixes import Mix
from workloads.tpch.queries import Dialect, draw_parameters, render_query

__all__ = ["Arrival", "LoadResult", "Statement", "run_closed", "run_open", "tpch_arrivals"]

LATE = 0.010  # an open statement sent more than this after its arrival was sent late


@dataclass(frozen=True, slots=True)
class Statement:
    query: int  # TPC-H query number; 0 for a statement replayed from a trace
    start: float  # sent (closed) or arrived (open)
    end: float
    client: int
    sqlstate: str | None = None  # None: it succeeded
    name: str = ""  # the class reported ("Q6" by default)
    sent: float | None = None  # open runs: when a connection took it

    @property
    def response(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        return self.name or f"Q{self.query}"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One statement of an open run: when it arrives, what it is, and the SQL."""

    offset: float
    query: int
    name: str
    sql: str


@dataclass
class LoadResult:
    statements: list[Statement] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    arrived: int = 0  # open runs: statements scheduled inside the run
    connections: int = 0  # open runs: the most connections open at once
    late: int = 0  # open runs: statements sent more than LATE after they arrived
    unsent: int = 0  # open runs: statements never sent (no connection could be had)

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


def tpch_arrivals(
    offsets: Sequence[float],
    mix: Mix,
    *,
    scale_factor: float,
    dialect: Dialect,
    seed: int = 0,
) -> list[Arrival]:
    """A TPC-H statement from the mix (with the specification's random parameters) at each
    offset."""
    rng = random.Random(seed * 1_000_003 + 7)
    queries = mix.queries
    weights = [mix.weights[q] for q in queries]
    out = []
    for t in offsets:
        q = _pick(rng, queries, weights)
        out.append(
            Arrival(t, q, f"Q{q}", render_query(q, draw_parameters(q, rng, scale_factor), dialect))
        )
    return out


def run_open(
    conninfo: str,
    arrivals: Sequence[Arrival],
    *,
    duration: float,
    connections: int = 16,
    max_connections: int = 256,
    drain: float | None = None,
    on_statement: Callable[[Statement], None] | None = None,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Send each arrival at its offset (those before ``duration``), on whichever connection is
    free; open another when none is (at most ``max_connections``). ``connections`` are opened
    before the clock starts. After the last arrival the run drains: statements still queued or
    running get ``drain`` more seconds (default: ``duration``), then are cancelled (recorded
    with SQLSTATE 57014) so that a policy that starves a class cannot hold the run forever.
    """
    if connections < 1 or max_connections < connections:
        raise ValueError("need 1 ≤ connections ≤ max_connections")
    result = LoadResult()
    lock = threading.Lock()
    stop = stop or threading.Event()
    work: queue.Queue[Arrival | None] = queue.Queue()
    errors: list[BaseException] = []
    busy: dict[int, psycopg.Connection[tuple[object, ...]]] = {}
    idle = [0]  # connected workers waiting for a statement
    pending = [0]  # workers still connecting
    over = threading.Event()  # the drain is over: statements not yet sent are dropped
    workers: list[threading.Thread] = []
    ready = threading.Semaphore(0)
    origin = [0.0]

    def worker(number: int) -> None:
        try:
            conn = psycopg.connect(conninfo, autocommit=True)
        except psycopg.Error as e:
            with lock:
                pending[0] -= 1
                errors.append(e)
            ready.release()
            return
        with lock:
            pending[0] -= 1
            idle[0] += 1
        ready.release()
        with conn:
            while True:
                item = work.get()
                if item is None:
                    return
                if over.is_set():
                    with lock:
                        result.unsent += 1
                    continue
                with lock:
                    idle[0] -= 1
                    busy[number] = conn
                arrived = origin[0] + item.offset
                sent = time.monotonic()
                sqlstate = None
                try:
                    conn.execute(item.sql).fetchall()
                except psycopg.OperationalError as e:
                    sqlstate = e.sqlstate or "08006"
                except psycopg.Error as e:
                    sqlstate = e.sqlstate or "XX000"
                record = Statement(
                    item.query, arrived, time.monotonic(), number, sqlstate, item.name, sent
                )
                with lock:
                    del busy[number]
                    result.statements.append(record)
                    if sent - arrived > LATE:
                        result.late += 1
                if on_statement is not None:
                    on_statement(record)
                if conn.closed:
                    return
                with lock:
                    idle[0] += 1

    def spawn() -> None:
        with lock:
            pending[0] += 1
        t = threading.Thread(target=worker, args=(len(workers),), daemon=True)
        workers.append(t)
        t.start()

    for _ in range(connections):
        spawn()
    for _ in range(connections):
        ready.acquire()
    if errors and len(errors) == connections:
        raise errors[0]
    result.connections = connections - len(errors)
    origin[0] = result.started = time.monotonic()
    for item in arrivals:
        if item.offset >= duration:
            break
        delay = origin[0] + item.offset - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        result.arrived += 1
        with lock:
            starved = idle[0] + pending[0] - work.qsize() <= 0
        if starved and len(workers) < max_connections:
            spawn()  # connects while the statement waits in the queue: counted in its R
        work.put(item)
    with lock:
        result.connections = max(result.connections, len(workers) - len(errors))
    for _ in workers:
        work.put(None)
    deadline = time.monotonic() + (duration if drain is None else drain)
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    over.set()
    with lock:
        stuck = list(busy.values())
    for conn in stuck:
        with contextlib.suppress(psycopg.Error, OSError):
            conn.cancel_safe(timeout=5.0)
    for t in workers:
        t.join()
    while True:  # statements no connection ever took (every connection failed)
        try:
            left = work.get_nowait()
        except queue.Empty:
            break
        if left is not None:
            result.unsent += 1
    result.ended = time.monotonic()
    return result
