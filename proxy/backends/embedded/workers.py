"""The threads DuckDB statements run in.

A statement's DuckDB call blocks its thread for the statement's whole run, so the event loop
hands it to one of these threads and gets its result back. ``Workers`` is an ``Executor``
(``loop.run_in_executor`` takes it, for the paths that run seldom) with a direct path for
the ones on every statement: ``await workers.run(fn, *args)`` puts the call on the threads'
queue with the event loop's own future, and the thread that runs it resolves that future
through ``call_soon_threadsafe`` — one wake-up each way. ``run_in_executor`` on a
``ThreadPoolExecutor`` chains two futures (a ``concurrent.futures.Future`` wrapped in an
asyncio one, each with a condition variable and callbacks); on a 2-core VM that took 40–50 µs
more per hop, and two hops are on every statement's path (``benchmarks/embedded_tpch``).

The threads are started with the pool and named ``duckdb_N``: the sampler
(``training.proc``) counts a thread of that name as DuckDB's. A call whose asyncio future was
cancelled before a thread took it is not run (as a ``ThreadPoolExecutor`` drops a cancelled
work item); one already running runs to its end — the caller decides what its connection is
worth then (``session``: pinned, never lent again)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# one call: (function, arguments, future, loop) — loop None: a concurrent.futures.Future
_Call = tuple[Callable[..., Any], tuple[Any, ...], Any, asyncio.AbstractEventLoop | None]


def _answer(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if future.done():  # (cancelled while the thread ran it)
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _cancel(future: asyncio.Future[Any]) -> None:
    future.cancel()


class Workers(concurrent.futures.Executor):
    """``size`` threads taking calls from one queue, in the order they came."""

    def __init__(self, size: int, name: str = "duckdb") -> None:
        if size < 1:
            raise ValueError("a worker pool needs at least one thread")
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # (shutdown against submit)
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def size(self) -> int:
        return len(self._threads)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in a worker thread: the future to await. (A future, not a coroutine:
        no frame of its own holds the future, whose exception's traceback would hold that
        frame — a cycle keeping the awaiting session for the garbage collector.)"""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((fn, args, future, loop))
        return future

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((call, () if kwargs else args, future, None))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; with ``cancel_futures`` the queued ones are dropped (their futures
        cancelled); with ``wait`` the running ones are waited for."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if cancel_futures:
                    self._drop_queued()
                for _ in self._threads:
                    self._queue.put(None)
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _drop_queued(self) -> None:
        while True:
            try:
                call = self._queue.get_nowait()
            except queue.Empty:
                return
            if call is None:
                continue
            _, _, future, loop = call
            if loop is None:
                future.cancel()
            else:
                with contextlib.suppress(RuntimeError):  # (its loop closed: nobody awaits it)
                    loop.call_soon_threadsafe(_cancel, future)

    def _work(self) -> None:
        get, one = self._queue.get, self._one
        while True:
            call = get()
            if call is None:
                return
            one(call)  # (in a call of its own, and let go of here: nothing of it — a session,
            del call  # a cursor in its arguments — is kept alive while the thread idles)

    @staticmethod
    def _one(call: _Call) -> None:
        fn, args, future, loop = call
        if loop is None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:
                    future.set_exception(e)
        elif not future.cancelled():  # (no lock: a cancel just after this is a running call's)
            result = error = None
            try:
                result = fn(*args)
            except BaseException as e:
                error = e
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody awaits it
                loop.call_soon_threadsafe(_answer, future, result, error)
            del result, error
        # an exception's traceback holds this frame, and the future holds the exception: the
        # frame must not hold the future (nor the call with it), or the caller's frames — a
        # session's — wait in that cycle for the garbage collector
        del call, fn, args, future, loop
