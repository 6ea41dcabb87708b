"""The sampler's own cost: CPU share of one core at Δ = 50 ms with 64 statements in flight.

PostgreSQL: a server started here, 64 connections each running ``pg_sleep`` (64 backends to
read from /proc every Δ, plus the postmaster's children list). DuckDB: the embedded database's
threads in this process, while 64 statements are registered in flight. The sampling thread's
CPU time (``time.thread_time``) over the wall time is printed for each; for PostgreSQL both as
training follows backends (``PostgresJobs``) and as ``serve``'s live profile does
(``PostgresTicks``: notes replayed each Δ, each backend read once per Δ).

    python -m benchmarks.sampler [--seconds 10] [--interval 0.05] [--statements 64]
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Sequence

import duckdb
import psycopg

from testing.pgcluster import start_cluster
from training.estimate import Estimator
from training.proc import ThreadProbe
from training.sampler import DuckDBJobs, Jobs, PostgresJobs, PostgresTicks, Recorder


def _measure(
    jobs: Jobs,
    ids: Sequence[tuple[int, int | None]],
    seconds: float,
    dt: float,
    deferred: bool = False,
) -> float:
    estimator = Estimator(cores=2, keep_jobs=not deferred)
    recorder = Recorder(estimator, jobs, lambda job: ("bench", None), dt, deferred=deferred)
    if deferred:
        recorder.start()
        for job, pid in ids:
            recorder.admitted(job, "bench", pid)
    else:
        for job, pid in ids:
            jobs.begin(job, "bench", pid)
            estimator.admit(job, "bench", time.monotonic())
        recorder.start()
    started = time.monotonic()
    time.sleep(seconds)
    recorder.stop()
    wall = time.monotonic() - started
    print(f"  {recorder.samples} samples in {wall:.1f} s")
    return recorder.sampler_cpu / wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--statements", type=int, default=64)
    args = parser.parse_args(argv)
    n = args.statements
    if n > 180:
        parser.error("--statements: the test cluster allows 200 connections")

    print(f"PostgreSQL: {n} backends in pg_sleep, Δ = {args.interval:g} s")
    cluster = start_cluster()
    try:
        conns = [psycopg.connect(cluster.dsn(), autocommit=True) for _ in range(n)]
        pids = [c.info.backend_pid for c in conns]

        def sleep(conn: psycopg.Connection) -> None:
            with contextlib.suppress(psycopg.errors.QueryCanceled):  # cancelled at the end
                conn.execute(f"select pg_sleep({args.seconds + 5})")

        sleepers = [threading.Thread(target=sleep, args=(c,)) for c in conns]
        for t in sleepers:
            t.start()
        time.sleep(0.5)
        pg_share = _measure(PostgresJobs(), list(enumerate(pids)), args.seconds, args.interval)
        print(f"  sampler CPU, as training follows them: {pg_share:.2%} of one core")
        ids = list(enumerate(pids))
        tick_share = _measure(PostgresTicks(), ids, args.seconds, args.interval, deferred=True)
        print(f"  sampler CPU, as serve's live profile does: {tick_share:.2%} of one core")
        for c in conns:
            c.cancel_safe()
        for t in sleepers:
            t.join()
        for c in conns:
            c.close()
    finally:
        cluster.stop()

    print(f"DuckDB: this process's threads, {n} statements registered, Δ = {args.interval:g} s")
    con = duckdb.connect()
    con.execute("select count(*) from range(1000)").fetchall()  # start DuckDB's threads
    jobs = DuckDBJobs(ThreadProbe(), {"bench": 1.0})
    duck_share = _measure(jobs, [(i, None) for i in range(n)], args.seconds, args.interval)
    print(f"  sampler CPU: {duck_share:.2%} of one core")


if __name__ == "__main__":
    main()
