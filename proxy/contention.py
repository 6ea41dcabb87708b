"""Data contention control on the event loop: the pure ``admission.contention`` with futures
(or callbacks, for the relay) for the transactions that wait for a place and a timer for its
deadlines (a holder gone idle or running long, the limit forgotten). Sessions call ``acquire``
(``request``) before a writing transaction's first statement runs, ``touch`` around each of
its statements, ``finish`` at its end and ``forget`` when their client goes away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Any

from admission.contention import ContentionConfig, ContentionControl

__all__ = ["ContentionGate", "ContentionWaitCancelled"]

TIMER_SLACK = 0.001  # s after a deadline (the loop's clock may count whole milliseconds)


class ContentionWaitCancelled(Exception):
    """A transaction's wait for a place was cancelled (its client's CancelRequest)."""


class ContentionGate:
    def __init__(
        self,
        config: ContentionConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = ContentionControl(config)
        self._clock = clock
        self._futures: dict[Hashable, asyncio.Future[None]] = {}
        # the relay's waiters: what to call once placed, and since when they wait
        self._callbacks: dict[Hashable, tuple[Callable[[], None], float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.waited_seconds = 0.0  # all waits for a place, summed

    async def acquire(self, tx: Hashable, *, at_once: bool = False) -> None:
        """Return once ``tx`` holds a place (at once unless the limit is reached, or with
        ``at_once`` whatever the limit)."""
        started = self._clock()
        if self.control.request(tx, started, at_once=at_once):
            return
        future = asyncio.get_running_loop().create_future()
        self._futures[tx] = future
        self._arm()
        try:
            await future
        except BaseException:
            self._wake(self.control.withdraw(tx, self._clock()))
            raise
        finally:
            self._futures.pop(tx, None)
            self.waited_seconds += self._clock() - started

    def request(self, tx: Hashable, granted: Callable[[], None]) -> bool:
        """``acquire`` for callers without a task (the relay): True if ``tx`` holds a place
        now; else ``granted`` is called, soon after the loop's current callback, once it does
        (not if ``forget`` comes first)."""
        now = self._clock()
        if self.control.request(tx, now):
            return True
        self._callbacks[tx] = (granted, now)
        self._arm()
        return False

    def waiting(self, tx: Hashable) -> bool:
        return tx in self._futures or tx in self._callbacks

    def cancel(self, tx: Hashable) -> bool:
        """Fail ``tx``'s wait for a place (a CancelRequest); False if it is not waiting."""
        future = self._futures.get(tx)
        if future is None or future.done():
            return False
        future.set_exception(ContentionWaitCancelled())
        return True

    def holds(self, tx: Hashable) -> bool:
        return tx in self.control.holders

    def touch(self, tx: Hashable, running: bool) -> None:
        self.control.touch(tx, self._clock(), running)
        if not running and self.control.waiting:
            self._arm()  # (it may go idle long enough to let a waiter in)

    def statement_ended(self, tx: Hashable, transaction_over: bool, aborted: bool) -> None:
        """A statement of ``tx``'s ended (the sessions' common step): its transaction too
        when ``transaction_over`` — the place's turn ends, on a conflict (``aborted``) or not
        — else the holder goes idle."""
        if tx not in self.control.holders:
            return
        if transaction_over:
            self.finish(tx, aborted)
        else:
            self.touch(tx, running=False)

    def finish(self, tx: Hashable, aborted: bool) -> None:
        self._wake(self.control.finish(tx, self._clock(), aborted))

    def forget(self, tx: Hashable) -> None:
        self._callbacks.pop(tx, None)
        if tx in self.control.holders or tx in self.control.waiting:
            self._wake(self.control.withdraw(tx, self._clock()))

    def status(self) -> dict[str, Any]:
        return {
            **self.control.status(self._clock()),
            "waited_s": round(self.waited_seconds, 3),
        }

    def _wake(self, admitted: list[Hashable]) -> None:
        pending = list(admitted)
        while pending:
            tx = pending.pop()
            future = self._futures.get(tx)
            callback = self._callbacks.pop(tx, None)
            if future is not None and not future.done():
                future.set_result(None)
            elif callback is not None:  # (not nested in whatever freed the place)
                asyncio.get_running_loop().call_soon(callback[0])
                self.waited_seconds += self._clock() - callback[1]
            else:  # nobody waits for it any more: the place goes on
                pending += self.control.withdraw(tx, self._clock())
        self._arm()

    def _arm(self) -> None:
        deadline = self.control.next_deadline(self._clock())
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            delay = max(deadline - self._clock(), 0.0) + TIMER_SLACK
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._wake(self.control.tick(self._clock()))
