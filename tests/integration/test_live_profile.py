"""Training's sampler while serving (``training.live``): real statements through the proxy, real
threads and processes read from /proc, windows of estimates blended into the live model.

On the embedded DuckDB and in front of a PostgreSQL on this machine: after two windows of
load, every class that ran has U_r, Q_r and A_r above 0 and a row and column of A^c_r, the model
says it was profiled live, and the sampler took a small share of a core. Statements whose
backends hardly run (they sleep) show almost no task in execution, and the sampler says it
stopped.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psycopg
import pytest

from admission import Limits
from admission.model import EtaModel
from admission.scheduler import Job
from proxy.app import BackgroundProxy, ProxyConfig
from proxy.server import BackendAddress, Listener, Tuner
from testing.pgcluster import Cluster
from training.estimate import Estimator
from training.live import LiveProfile
from training.sampler import PostgresJobs, Recorder

WINDOW = 1.5  # seconds (60 when serving): two windows in a few seconds of load


def _profile(embedded: bool) -> Callable[[Listener], Tuner | None]:
    def extend(listener: Listener) -> Tuner | None:
        assert listener.learning is not None
        make = LiveProfile.for_embedded if embedded else LiveProfile.for_postgresql
        return make(listener.learning, 2, interval=0.05, window=WINDOW)

    return extend


@contextmanager
def _proxy(backend: BackendAddress | None, mpl: int = 2) -> Iterator[BackgroundProxy]:
    config = ProxyConfig(
        backend=backend,
        listen_port=0,
        learn=True,
        limits=Limits(mpl=mpl),
        extend=_profile(backend is None),
    )
    proxy = BackgroundProxy(config)
    try:
        yield proxy
    finally:
        proxy.close()


def _load(
    conninfo: str, statements: list[str], seconds: float, clients: int = 4, blocks: bool = False
) -> int:
    """``clients`` connections each running one of ``statements`` at random, one after the
    other, for ``seconds``; how many ran. (At random, not in turn: clients alternating two
    statements under MPL 2 can lock into a phase where one class is only ever admitted beside
    itself.) ``blocks``: one time in three the statement runs inside a transaction block
    instead (so it passes admission)."""
    done = [0] * clients
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        pick = random.Random(i).choice
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                while time.monotonic() < stop:
                    sql = pick(statements)
                    if blocks and pick((False, False, True)):
                        with conn.transaction():
                            conn.execute(sql)
                    else:
                        conn.execute(sql)
                    done[i] += 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    assert not errors, errors
    return sum(done)


def _profiled(proxy: BackgroundProxy, statements: list[str]) -> tuple[EtaModel, dict[str, int]]:
    model: EtaModel = proxy.call(lambda: proxy.gate.scheduler.model)
    by_sql = {c.sample_sql: c for c in model.classes}
    assert all(sql in by_sql for sql in statements), list(by_sql)
    index = model.index()
    return model, {sql: index[by_sql[sql].fingerprint] for sql in statements}


def _check(proxy: BackgroundProxy, statements: list[str]) -> None:
    model, at = _profiled(proxy, statements)
    a = model.a_matrix()
    for sql, i in at.items():
        c = model.classes[i]
        assert c.profiled >= 1 and c.U > 0 and c.Q > 0 and c.A > 0, c
        assert all(a[r][i] > 0 for r in at.values()), (sql, a)  # each saw the others admitted
    learning = proxy.server.learning
    assert learning is not None and learning.profile_status is not None
    status = proxy.call(learning.profile_status)
    assert status["windows"] >= 2 and status["windows_merged"] >= 1, status
    assert status["stopped_because"] is None
    assert 0 < status["sampler_cpu_share"] < 0.25, status  # Δ = 50 ms here, 200 ms in serve


def test_embedded_profiles_each_class_while_serving() -> None:
    statements = [
        "select sum(i) from range(3000000) t(i)",
        "select count(*) from range(2000000) t(i) where i % 3 = 0",
    ]
    with _proxy(None) as proxy:
        assert _load(proxy.conninfo("app", "app"), statements, 2.5 * WINDOW) > 10
        _check(proxy, statements)


def test_postgresql_profiles_each_class_while_serving(pg: Cluster) -> None:
    statements = [
        "select count(*) from generate_series(1, 400000)",
        "select sum(x) from generate_series(1, 200000) as x",
    ]
    with _proxy(BackendAddress("127.0.0.1", pg.port)) as proxy:
        assert _load(proxy.conninfo("postgres", "postgres"), statements, 2.5 * WINDOW) > 10
        _check(proxy, statements)


def test_per_tick_cpu_agrees_with_reads_at_every_statement(pg: Cluster) -> None:
    """The live profile reads each backend once per Δ and shares its CPU among the statements
    it served by time held; training reads it at each admission and completion. Both hear the
    same statements here (the second recorder on the same scheduler), a third of them inside
    transaction blocks on the same backends (they pass admission: neither learns them): per
    class, the CPU per statement agrees, the heavy class stays ~8× the light one."""
    exact: list[Recorder] = []

    def extend(listener: Listener) -> Tuner | None:
        assert listener.learning is not None
        profile = LiveProfile.for_postgresql(listener.learning, 2, interval=0.05, window=60)
        record = Recorder(Estimator(2, keep_jobs=False), PostgresJobs(), profile._describe, 0.05)
        exact.append(record)

        def granted(job: Job, _tasks: Sequence[int]) -> None:
            if record.recording and not job.bypass:
                record.admitted(job.id, job.klass.fingerprint, profile._pid(job.id))

        def finished(job: Job, _now: float) -> None:
            if record.recording and not job.bypass:
                record.released(job.id)

        listener.learning.gate.scheduler.observe(grants=granted, finishes=finished)
        record.start()
        return profile

    statements = [
        "select count(*) from generate_series(1, 800000)",
        "select sum(x) from generate_series(1, 100000) as x",
    ]
    config = ProxyConfig(
        backend=BackendAddress("127.0.0.1", pg.port),
        listen_port=0,
        learn=True,
        limits=Limits(mpl=2),
        extend=extend,
    )
    proxy = BackgroundProxy(config)
    try:
        assert _load(proxy.conninfo("postgres", "postgres"), statements, 4.0, blocks=True) > 40
        profile = next(t for t in proxy.server.tuners() if isinstance(t, LiveProfile))
        proxy.call(exact[0].stop)
        proxy.call(profile.recorder.stop)  # its last sample replays every note
        model, at = _profiled(proxy, statements)
        by_fp = {model.classes[i].fingerprint: sql for sql, i in at.items()}
        ticks = {by_fp[k]: e for k, e in profile.recorder.estimator.estimates().items()}
        reads = {by_fp[k]: e for k, e in exact[0].estimator.estimates().items()}
    finally:
        proxy.close()
    heavy, light = statements
    for sql in statements:
        assert reads[sql].count >= 10 and ticks[sql].count == reads[sql].count, (sql, reads, ticks)
        assert ticks[sql].cpu == pytest.approx(reads[sql].cpu, rel=0.1), (sql, reads, ticks)
    assert ticks[heavy].cpu > 4 * ticks[light].cpu


def test_statements_never_seen_running_stop_the_sampler(pg: Cluster) -> None:
    # three windows in a row with statements completed (30 a window) and their backends seen
    # running a small share of the time they were admitted (parse, plan, wake-up: ~1%)
    with _proxy(BackendAddress("127.0.0.1", pg.port), mpl=4) as proxy:
        _load(proxy.conninfo("postgres", "postgres"), ["select pg_sleep(0.2)"], 3.5 * WINDOW)
        learning = proxy.server.learning
        assert learning is not None and learning.profile_status is not None
        deadline = time.monotonic() + 2 * WINDOW
        status = proxy.call(learning.profile_status)
        while status["stopped_because"] is None and time.monotonic() < deadline:
            time.sleep(0.1)
            status = proxy.call(learning.profile_status)
        assert "no task of theirs" in (status["stopped_because"] or ""), status


def test_a_backend_pid_that_is_no_local_postgres_is_told() -> None:
    import os

    from training.live import _not_local_postgres

    assert "not the server's backend" in (_not_local_postgres(os.getpid()) or "")
    assert "no process of this machine" in (_not_local_postgres(2**22 + 12345) or "")
