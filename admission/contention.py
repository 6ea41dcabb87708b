"""Data contention control: how many writing transactions may be in progress at once.

An engine with optimistic concurrency (DuckDB) runs two transactions that write the same row
side by side and fails the second writer with a serialization failure (SQLSTATE 40001) — where
PostgreSQL would have made it wait on the row's lock. Clients retry (pgbench ``--max-tries``,
ORMs' retry loops) and the retries meet the same rows again: eight clients running pgbench's
TPC-B-like script on the embedded DuckDB lost 88 % of their transactions this way, and
committed a quarter of what one client alone commits. That is data-contention thrashing, the
reason multiprogramming limits were first put in front of transaction systems (Carey,
Krishnamurthi & Livny 1990; Heiss & Wagner 1991, "Adaptive load control in transaction
processing systems"; Mönkeberg & Weikum 1992): past some number of concurrent writers, each
one more lowers the throughput.

The MPL does not help there: a transaction's statements pass the MPL at once (queueing them
would hold what the transaction has done behind other clients' work), and the contention is
between whole transactions. So this is a second limit, on *holders* — transactions that write
(or an autocommit statement that does) — from their first statement to their end:

* **Who holds.** A transaction takes a place before its first statement if that statement
  writes, or if transactions starting with the same statement shape have written before (the
  engine's snapshot starts with the first statement, so a transaction that reads and then
  writes must be held back before its read); else before its first write. Read-only
  transactions and autocommit reads never take one.
* **Counted while busy.** A holder counts while one of its statements runs — for
  ``run_after`` seconds of it at most: a long bulk write holds the other writers back no
  longer than that, as the MPL's release does for long statements — and for ``idle_after``
  seconds after each; a client that sits idle inside its transaction does not hold the others
  back longer than that.
* **The limit adapts (AIMD)**, with no limit at all until transactions abort in earnest. The
  outcomes of holders that began after the limit last changed are counted in windows of
  ``window`` outcomes over ``window_seconds`` at least; when a whole window has more than
  ``abort_share`` of them aborted on a conflict (40001, 40P01) — or at once, before the window
  is whole, when ``early_aborts`` have and they are more than twice that share of the outcomes
  so far (one hot row) — the limit is halved, from the holders counted then, if fewer (and the
  first time). Judged on part of a window, a few aborts that happen to come first would cut
  where aborts are rare: the decision waits for a whole one unless they overwhelm. When aborts
  are at most half that share, ``limit`` of them committed, ``backoff`` seconds have passed
  since the last cut and the limit holds someone back, it grows by one. A raise that the next
  cut takes back doubles the backoff (up to ``max_backoff``); two raises in a row halve it.
  Aborts are a price worth paying up to a point — a transaction in five lost, to run eight at
  once rather than one — so an abort now and then does not cut: on one hot row (every pair
  conflicts) the limit settles at one; on writers that rarely meet it stays off. With no abort
  for ``forget_after`` seconds the limit is lifted: workloads that stop contending run free.
* **Waiting is FIFO**, outside the admission scheduler's queue (a transaction waiting for a
  place holds no MPL slot); the shell wakes the waiters this module returns.

Pure: the caller passes the time in. ``proxy.contention`` is the asyncio shell.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["CONFLICT_STATES", "WRITE_KINDS", "ContentionConfig", "ContentionControl"]

# what an abort of contending transactions is answered with
CONFLICT_STATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
# statement kinds that write (the embedded server's; DuckDB's catalog conflicts too)
WRITE_KINDS = frozenset(
    {"INSERT", "UPDATE", "DELETE", "MERGE", "MERGE_INTO", "COPY", "CREATE", "DROP", "ALTER"}
)


@dataclass(frozen=True, slots=True)
class ContentionConfig:
    idle_after: float = 1.0  # s: a holder idle inside its transaction stops counting
    run_after: float = 5.0  # s: … and one whose statement has run this long
    min_backoff: float = 0.5  # s from a cut to the next raise, at least
    max_backoff: float = 5.0  # … and at most (how soon a changed workload is tried higher)
    forget_after: float = 60.0  # s without an abort: the limit is lifted
    abort_share: float = 0.2  # aborts above this share of a whole window's outcomes cut
    window: int = 32  # outcomes judged together, at least (then the count starts again)
    window_seconds: float = 0.5  # … over this long at least (many outcomes at high rates)
    early_aborts: int = 4  # this many, over twice abort_share of the outcomes so far: cut now
    max_starters: int = 4096  # statement shapes remembered as starting writing transactions

    def __post_init__(self) -> None:
        if self.idle_after <= 0 or self.run_after <= 0 or self.forget_after <= 0:
            raise ValueError("idle_after, run_after and forget_after must be positive")
        if not 0 < self.min_backoff <= self.max_backoff:
            raise ValueError("backoffs must satisfy 0 < min_backoff <= max_backoff")
        if self.window_seconds < 0:
            raise ValueError("window_seconds must not be negative")
        if not 0 < self.abort_share < 1 or self.window < 2 or self.early_aborts < 1:
            raise ValueError(
                "abort_share must be in (0, 1), window at least 2 and early_aborts at least 1"
            )


@dataclass(slots=True)
class _Holder:
    seq: int  # the order it took its place in
    running: bool
    since: float  # its last statement's end (or when it took its place)


class ContentionControl:
    def __init__(self, config: ContentionConfig | None = None) -> None:
        self.config = config or ContentionConfig()
        self.limit: int | None = None  # None: as many as come
        self.backoff = self.config.min_backoff
        self.holders: dict[Hashable, _Holder] = {}
        self.waiting: OrderedDict[Hashable, None] = OrderedDict()
        self.starters: OrderedDict[str, None] = OrderedDict()  # shapes that began writers
        self._seq = 0
        self._change_seq = 0  # the last place given before the limit last changed
        self._raised = False  # the last change was a raise
        # outcomes and aborts of holders that began after the last change, in this window;
        # when it began, and whether it is whole (judged: the next outcome starts another)
        self._outcomes = 0
        self._aborted = 0
        self._since = 0.0
        self._whole = False
        self._last_cut = float("-inf")
        self._last_abort = float("-inf")
        self.aborts = 0  # holders that ended on a conflict
        self.commits = 0  # holders that ended otherwise
        self.cuts = 0
        self.raises = 0
        self.waited = 0  # transactions that had to wait for a place

    # -- who writes -------------------------------------------------------------------------

    def starts_writer(self, starter: str) -> bool:
        """Whether transactions beginning with statement shape ``starter`` have written."""
        if starter in self.starters:
            self.starters.move_to_end(starter)
            return True
        return False

    def learn_starter(self, starter: str) -> None:
        self.starters[starter] = None
        self.starters.move_to_end(starter)
        while len(self.starters) > self.config.max_starters:
            self.starters.popitem(last=False)

    # -- places -----------------------------------------------------------------------------

    def request(self, tx: Hashable, now: float, *, at_once: bool = False) -> bool:
        """``tx`` is about to write: True if it holds a place now; False if it waits (first
        come, first served) until a call returns it. ``at_once``: a place now whatever the
        limit (for a statement whose waiting could hold up the holders: see the embedded
        session's ``_take_place``)."""
        if tx in self.holders:
            return True
        self._forget(now)
        if at_once or (not self.waiting and self._room(now)):
            self._hold(tx, now)
            return True
        self.waiting[tx] = None
        self.waited += 1
        return False

    def touch(self, tx: Hashable, now: float, running: bool) -> None:
        """A statement of holder ``tx`` starts (``running``) or ends."""
        holder = self.holders.get(tx)
        if holder is not None:
            holder.running = running
            holder.since = now

    def finish(self, tx: Hashable, now: float, aborted: bool) -> list[Hashable]:
        """Holder ``tx`` ended — on a conflict (``aborted``) or not. Returns the waiters that
        hold a place now."""
        holder = self.holders.pop(tx, None)
        if holder is None:
            return self.withdraw(tx, now)
        self._outcome(holder, now, aborted)
        return self._admit(now)

    def withdraw(self, tx: Hashable, now: float) -> list[Hashable]:
        """``tx`` leaves without telling anything (its client went away): its place or its
        turn is given up. Returns the waiters that hold a place now."""
        self.waiting.pop(tx, None)
        self.holders.pop(tx, None)
        return self._admit(now)

    def tick(self, now: float) -> list[Hashable]:
        """A deadline passed (a holder idle long enough, the limit forgotten): the waiters
        that hold a place now."""
        self._forget(now)
        return self._admit(now)

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` may admit someone with nothing else happening; None: only an end
        will. ``now`` when someone waits though there is room (the limit lifted, or a holder
        gone idle, since the last admission)."""
        if not self.waiting:
            return None
        if self.limit is None or self._forgotten(now) or self._room(now):
            return now
        idle_after, run_after = self.config.idle_after, self.config.run_after
        times = [
            h.since + (run_after if h.running else idle_after)
            for h in self.holders.values()
            if h.since + (run_after if h.running else idle_after) > now
        ]
        times.append(self._last_abort + self.config.forget_after)
        return max(min(times), now)

    def counted(self, now: float) -> int:
        """Holders that count against the limit now."""
        idle_after, run_after = self.config.idle_after, self.config.run_after
        return sum(
            1
            for h in self.holders.values()
            if now - h.since < (run_after if h.running else idle_after)
        )

    def status(self, now: float) -> dict[str, Any]:
        return {
            "limit": None if self._forgotten(now) else self.limit,
            "holders": len(self.holders),
            "counted": self.counted(now),
            "waiting": len(self.waiting),
            "backoff_s": round(self.backoff, 3),
            "aborts": self.aborts,
            "commits": self.commits,
            "cuts": self.cuts,
            "raises": self.raises,
            "waited": self.waited,
            "writing_starters": len(self.starters),
        }

    # -- internals --------------------------------------------------------------------------

    def _room(self, now: float) -> bool:
        return self.limit is None or self.counted(now) < self.limit

    def _hold(self, tx: Hashable, now: float) -> None:
        self._seq += 1
        self.holders[tx] = _Holder(self._seq, False, now)

    def _admit(self, now: float) -> list[Hashable]:
        admitted: list[Hashable] = []
        while self.waiting and self._room(now):
            tx, _ = self.waiting.popitem(last=False)
            self._hold(tx, now)
            admitted.append(tx)
        return admitted

    def _outcome(self, holder: _Holder, now: float, aborted: bool) -> None:
        if aborted:
            self.aborts += 1
            self._last_abort = now
        else:
            self.commits += 1
        if self.limit is not None and holder.seq <= self._change_seq:
            return  # it began before the last change: that change is not judged by it
        config = self.config
        if self._whole:
            self._outcomes = self._aborted = 0
            self._whole = False
        if not self._outcomes:
            self._since = now
        self._outcomes += 1
        self._aborted += aborted
        n, k = self._outcomes, self._aborted
        # judged on a whole window — ``window`` outcomes over ``window_seconds`` at least —
        # or at once where aborts are overwhelming (one hot row: nearly every pair conflicts).
        # Judged at every abort on the outcomes so far, as it once was, a few aborts early in
        # a window cut often where one in twenty abort: writers of rows chosen under a skewed
        # (Zipf) law were held to one or two at once, for 14 % fewer commits than no limit;
        # and 32 outcomes at 400 a second, with one in ten aborting, cut every few seconds on
        # noise (seven or more in a window: 4 % of them)
        self._whole = n >= config.window and now - self._since >= config.window_seconds
        if (aborted and k >= config.early_aborts and k > 2 * config.abort_share * n) or (
            self._whole and k >= 2 and k > config.abort_share * n
        ):
            self._cut(now)
            return
        if aborted:
            return
        limit = self.limit
        if (
            limit is not None
            and self._outcomes - self._aborted >= limit
            and self._aborted <= config.abort_share / 2 * self._outcomes
            and now - self._last_cut >= self.backoff
            and (self.waiting or self.counted(now) + 1 >= limit)  # (it holds someone back)
        ):
            if self._raised:
                self.backoff = max(config.min_backoff, self.backoff / 2)
            self.limit = limit + 1
            self.raises += 1
            self._changed(raised=True)

    def _cut(self, now: float) -> None:
        counted = self.counted(now) + 1  # (the holder just ended, with them)
        base = counted if self.limit is None else min(self.limit, counted)
        cut = max(1, base // 2)
        if self.limit is not None and cut >= self.limit:
            return  # (at 1 already)
        if self._raised:  # the raise before this is what the cut takes back
            self.backoff = min(self.config.max_backoff, self.backoff * 2)
        self.limit = cut
        self.cuts += 1
        self._changed(raised=False)
        self._last_cut = now

    def _changed(self, raised: bool) -> None:
        self._raised = raised
        self._change_seq = self._seq
        self._outcomes = self._aborted = 0
        self._whole = False

    def _forgotten(self, now: float) -> bool:
        return self.limit is not None and now - self._last_abort >= self.config.forget_after

    def _forget(self, now: float) -> None:
        if self._forgotten(now):
            self.limit = None
            self.backoff = self.config.min_backoff
            self._changed(raised=False)
