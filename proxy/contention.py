"""Data contention control on the event loop: the pure ``admission.contention`` with futures
(or callbacks, for the relay) for the transactions that wait for a place and a timer for its
deadlines (a holder gone idle or running long, the limit forgotten, a wait past the queue
timeout). Sessions call ``acquire`` (``request``) before a writing transaction's first
statement runs, ``touch`` around each of its statements, ``finish`` at its end and ``forget``
when their client goes away.

A wait for a place is bounded by the queue timeout in force (``serve --queue-timeout``, read
from ``timeout`` when the wait starts), as a wait for admission is: past it the statement is
refused with 57014 and its turn goes to the next (a place granted meanwhile is given back).
The proxy-wide timeout only: a workload class's own ``queue_timeout`` bounds its statements'
wait for admission, not this one (the place is taken before the class's statement is queued)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Any

from admission.contention import ContentionConfig, ContentionControl

__all__ = ["ContentionGate", "ContentionWaitCancelled", "ContentionWaitTimedOut"]

TIMER_SLACK = 0.001  # s after a deadline (the loop's clock may count whole milliseconds)


class ContentionWaitCancelled(Exception):
    """A transaction's wait for a place was cancelled (its client's CancelRequest)."""


class ContentionWaitTimedOut(Exception):
    """A transaction waited longer than the queue timeout for a place."""

    def __init__(self, waited: float, timeout: float) -> None:
        super().__init__(
            f"canceling statement due to queue timeout: it waited {waited:.1f} s for a place "
            f"among the transactions that write (limit {timeout:g} s)"
        )


def _no_timeout() -> float | None:
    return None


class ContentionGate:
    def __init__(
        self,
        config: ContentionConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout: Callable[[], float | None] = _no_timeout,
    ) -> None:
        self.control = ContentionControl(config)
        self._clock = clock
        self._timeout = timeout  # the queue timeout in force (None: waits are unbounded)
        self._futures: dict[Hashable, asyncio.Future[None]] = {}
        # the relay's waiters: what to call once placed, and since when they wait
        self._callbacks: dict[Hashable, tuple[Callable[[], None], float]] = {}
        # and, with a queue timeout, when each gives up and what to call then
        self._deadlines: dict[Hashable, tuple[float, Callable[[Exception], None]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.waited_seconds = 0.0  # all waits for a place, summed
        self.timed_out = 0  # waits refused at the queue timeout

    async def acquire(self, tx: Hashable, *, at_once: bool = False) -> None:
        """Return once ``tx`` holds a place (at once unless the limit is reached, or with
        ``at_once`` whatever the limit)."""
        started = self._clock()
        if self.control.request(tx, started, at_once=at_once):
            return
        future = asyncio.get_running_loop().create_future()
        self._futures[tx] = future
        self._arm()
        timeout = self._timeout()
        try:
            if timeout is None:
                await future
            else:  # (a place granted as the time runs out is taken: wait_for returns it)
                await asyncio.wait_for(future, timeout)
        except TimeoutError:
            assert timeout is not None  # (only wait_for raises it here)
            self.timed_out += 1
            self._wake(self.control.withdraw(tx, self._clock()))
            raise ContentionWaitTimedOut(self._clock() - started, timeout) from None
        except BaseException:
            self._wake(self.control.withdraw(tx, self._clock()))
            raise
        finally:
            self._futures.pop(tx, None)
            self.waited_seconds += self._clock() - started

    def request(
        self,
        tx: Hashable,
        granted: Callable[[], None],
        expired: Callable[[Exception], None] | None = None,
    ) -> bool:
        """``acquire`` for callers without a task (the relay): True if ``tx`` holds a place
        now; else ``granted`` is called, soon after the loop's current callback, once it does
        (not if ``forget`` comes first) — or ``expired``, with a ``ContentionWaitTimedOut``,
        once it has waited the queue timeout (its wait is withdrawn then)."""
        now = self._clock()
        if self.control.request(tx, now):
            return True
        self._callbacks[tx] = (granted, now)
        timeout = self._timeout()
        if timeout is not None and expired is not None:
            self._deadlines[tx] = (now + timeout, expired)
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
        self._deadlines.pop(tx, None)
        if tx in self.control.holders or tx in self.control.waiting:
            self._wake(self.control.withdraw(tx, self._clock()))

    def status(self) -> dict[str, Any]:
        return {
            **self.control.status(self._clock()),
            "waited_s": round(self.waited_seconds, 3),
            "timed_out": self.timed_out,
        }

    def _wake(self, admitted: list[Hashable]) -> None:
        pending = list(admitted)
        while pending:
            tx = pending.pop()
            future = self._futures.get(tx)
            callback = self._callbacks.pop(tx, None)
            self._deadlines.pop(tx, None)
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
        if self._deadlines:
            first = min(when for when, _ in self._deadlines.values())
            deadline = first if deadline is None else min(deadline, first)
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
        now = self._clock()
        # places freed by now go first: a waiter whose deadline passes at the same time as
        # a holder went idle (the timer late by its slack, or the loop) takes the place
        self._wake(self.control.tick(now))
        freed: list[Hashable] = []
        for tx, (when, expired) in list(self._deadlines.items()):
            if when > now:
                continue
            del self._deadlines[tx]
            _, since = self._callbacks.pop(tx, (None, now))
            self.timed_out += 1
            self.waited_seconds += now - since
            freed += self.control.withdraw(tx, now)
            timeout = when - since
            error = ContentionWaitTimedOut(now - since, timeout)
            asyncio.get_running_loop().call_soon(expired, error)
        if freed:
            self._wake(freed)
