"""The embedded server's worker threads (proxy.backends.embedded.workers)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from proxy.backends.embedded.workers import Workers


def test_a_call_runs_in_a_named_worker_thread_and_its_result_comes_back() -> None:
    workers = Workers(2)

    async def main() -> tuple[str, int]:
        name = await workers.run(lambda: threading.current_thread().name)
        total = await workers.run(sum, [1, 2, 3])
        return name, total

    try:
        name, total = asyncio.run(main())
    finally:
        workers.shutdown()
    assert name.startswith("duckdb_")  # (training.proc counts these as DuckDB's threads)
    assert total == 6


def test_an_exception_reaches_the_awaiting_task() -> None:
    workers = Workers(1)

    def fail() -> None:
        raise ValueError("no such table")

    async def main() -> None:
        with pytest.raises(ValueError, match="no such table"):
            await workers.run(fail)
        assert await workers.run(lambda: 7) == 7  # the thread lives on

    try:
        asyncio.run(main())
    finally:
        workers.shutdown()


def test_a_call_cancelled_before_a_thread_took_it_never_runs() -> None:
    workers = Workers(1)
    ran: list[str] = []
    gate = threading.Event()

    async def main() -> None:
        blocker = asyncio.ensure_future(workers.run(gate.wait))
        queued = asyncio.ensure_future(workers.run(ran.append, "queued"))
        await asyncio.sleep(0.05)
        queued.cancel()
        await asyncio.sleep(0)
        gate.set()
        await blocker
        await workers.run(ran.append, "after")
        with pytest.raises(asyncio.CancelledError):
            await queued

    try:
        asyncio.run(main())
    finally:
        workers.shutdown()
    assert ran == ["after"]


def test_a_running_call_cancelled_runs_to_its_end_and_its_answer_is_dropped() -> None:
    workers = Workers(1)
    done = threading.Event()

    def slow() -> int:
        time.sleep(0.1)
        done.set()
        return 1

    async def main() -> None:
        task = asyncio.ensure_future(workers.run(slow))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await workers.run(lambda: 2) == 2  # queued behind it: it ran to its end first
        assert done.is_set()

    try:
        asyncio.run(main())
    finally:
        workers.shutdown()


def test_run_in_executor_and_submit_work_too() -> None:
    workers = Workers(2)

    async def main() -> int:
        return await asyncio.get_running_loop().run_in_executor(workers, pow, 2, 10)

    try:
        assert asyncio.run(main()) == 1024
        assert workers.submit(pow, 3, 2).result(timeout=5) == 9
        assert workers.submit(lambda *, x: x + 1, x=1).result(timeout=5) == 2
    finally:
        workers.shutdown()


def test_shutdown_drops_what_waits_waits_for_what_runs_and_refuses_new_calls() -> None:
    workers = Workers(1)
    gate = threading.Event()
    finished: list[str] = []

    def running() -> None:
        gate.wait()
        time.sleep(0.05)
        finished.append("running")

    first = workers.submit(running)
    queued = workers.submit(finished.append, "queued")
    time.sleep(0.05)
    threading.Timer(0.05, gate.set).start()
    workers.shutdown(wait=True, cancel_futures=True)
    assert first.done() and first.exception() is None
    assert queued.cancelled()
    assert finished == ["running"]
    with pytest.raises(RuntimeError, match="after shutdown"):
        workers.submit(pow, 2, 2)

    async def main() -> None:
        await workers.run(pow, 2, 2)

    with pytest.raises(RuntimeError, match="after shutdown"):
        asyncio.run(main())


def test_a_loop_closed_before_the_answer_does_not_kill_the_thread() -> None:
    workers = Workers(1)
    gate = threading.Event()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.sleep(0))

        async def waiting() -> bool:
            return await workers.run(gate.wait)

        task = loop.create_task(waiting())
        loop.run_until_complete(asyncio.sleep(0.02))
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        loop.close()
    gate.set()  # its answer goes to a closed loop: dropped
    assert workers.submit(pow, 2, 3).result(timeout=5) == 8
    workers.shutdown()


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError):
        Workers(0)
