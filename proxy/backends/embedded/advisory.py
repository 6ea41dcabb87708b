"""PostgreSQL's advisory locks on the embedded server: ``pg_advisory_lock(key)`` and its kin,
which migration tools take before they migrate (Prisma, Rails, kysely's Migrator, Flyway,
golang-migrate). DuckDB has none; the server holds them, one table for all sessions.

A lock is on a key — one bigint, or two integers — exclusive or shared, held by a session
until it unlocks it or ends (a transaction-level one, ``…_xact_…``, until its transaction
ends). A session may take a lock it holds again (it counts). ``pg_advisory_lock`` waits while
another session holds the key; a CancelRequest or the client's going ends the wait (57014).

Only a statement that is one call with constant (or parameter) keys is taken here —
``SELECT pg_advisory_lock(72707369)``, ``SELECT pg_try_advisory_lock($1, $2) AS ok`` —
which is how tools call them; one that computes its key (``hashtext(…)``) gets DuckDB's
error. Such a statement takes no admission slot: a waiting lock must not hold capacity the
holder needs to finish and unlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["AdvisoryCall", "AdvisoryLocks", "advisory_call"]

Key = tuple[int, ...]

_CALL = re.compile(
    r"\s*select\s+(?:pg_catalog\s*\.\s*)?(?P<function>pg_(?:try_)?advisory_(?:xact_)?lock"
    r"(?:_shared)?|pg_advisory_unlock(?:_shared)?|pg_advisory_unlock_all)\s*\(\s*"
    r"(?P<arguments>[^()]*?)\s*\)\s*(?:as\s+(?P<alias>\"(?:[^\"]|\"\")+\"|[A-Za-z_]\w*))?"
    r"\s*;?\s*$",
    re.I,
)
_ARGUMENT = re.compile(r"(?:(?P<number>[-+]?\d+)|\$(?P<parameter>\d+))(?:\s*::\s*\w+)?")


@dataclass(frozen=True, slots=True)
class AdvisoryCall:
    function: str  # pg_advisory_lock, pg_try_advisory_xact_lock_shared, …
    arguments: tuple[str, ...]  # each a number or "$n"
    column: str  # the result column's name

    @property
    def returns_bool(self) -> bool:
        """A try_ or an unlock says whether it did; the others return void."""
        return "try_" in self.function or self.function in (
            "pg_advisory_unlock",
            "pg_advisory_unlock_shared",
        )

    def key(self, params: Sequence[object]) -> Key:
        values = []
        for argument in self.arguments:
            if argument.startswith("$"):
                index = int(argument[1:]) - 1
                if not 0 <= index < len(params):
                    raise ValueError(f"there is no parameter {argument}")
                values.append(int(str(params[index])))
            else:
                values.append(int(argument))
        if len(values) not in (1, 2):
            raise ValueError(f"function {self.function} takes one bigint or two integers")
        return tuple(values)


def advisory_call(sql: str) -> AdvisoryCall | None:
    """The advisory-lock call a statement is (see the module docstring), or None."""
    found = _CALL.match(sql)
    if found is None:
        return None
    function = found.group("function").lower()
    text = found.group("arguments")
    arguments: list[str] = []
    if text:
        for item in text.split(","):
            argument = _ARGUMENT.fullmatch(item.strip())
            if argument is None:
                return None  # (a computed key: DuckDB answers, with its error)
            arguments.append(argument.group("number") or "$" + argument.group("parameter"))
    if (function == "pg_advisory_unlock_all") != (not arguments):
        return None
    alias = found.group("alias")
    column = alias.strip('"').replace('""', '"') if alias else function
    return AdvisoryCall(function, tuple(arguments), column)


class AdvisoryLocks:
    """Every session's advisory locks: the server's one table of them."""

    def __init__(self) -> None:
        self.exclusive: dict[Key, tuple[object, int]] = {}  # key → (holder, times taken)
        self.shared: dict[Key, Counter[object]] = {}  # key → holders and their counts
        self._released: asyncio.Event | None = None

    def try_take(self, owner: object, key: Key, shared: bool) -> bool:
        holder = self.exclusive.get(key)
        if holder is not None and holder[0] is not owner:
            return False
        if shared:
            self.shared.setdefault(key, Counter())[owner] += 1
            return True
        others = self.shared.get(key)
        if others and any(h is not owner for h in others):
            return False
        self.exclusive[key] = (owner, (holder[1] if holder else 0) + 1)
        return True

    async def take(
        self, owner: object, key: Key, shared: bool, cancelled: Callable[[], bool]
    ) -> None:
        """Take the lock, waiting while another holds it; CancelledError-free: raises
        TimeoutError when ``cancelled()`` turns true while it waits."""
        while not self.try_take(owner, key, shared):
            if cancelled():
                raise TimeoutError
            if self._released is None:
                self._released = asyncio.Event()
            released = self._released
            with contextlib.suppress(TimeoutError):  # (a cancel is checked every 50 ms)
                await asyncio.wait_for(released.wait(), timeout=0.05)

    def give(self, owner: object, key: Key, shared: bool) -> bool:
        """Give back one taking of the lock; False if ``owner`` holds none."""
        if shared:
            holders = self.shared.get(key)
            if not holders or holders[owner] <= 0:
                return False
            holders[owner] -= 1
            if holders[owner] <= 0:
                del holders[owner]
            if not holders:
                del self.shared[key]
        else:
            holder = self.exclusive.get(key)
            if holder is None or holder[0] is not owner:
                return False
            if holder[1] > 1:
                self.exclusive[key] = (owner, holder[1] - 1)
            else:
                del self.exclusive[key]
        self._wake()
        return True

    def give_all(self, owner: object) -> None:
        """Every lock ``owner`` holds, given back (its unlock_all, or its session's end)."""
        for key in [k for k, (h, _) in self.exclusive.items() if h is owner]:
            del self.exclusive[key]
        for key in list(self.shared):
            self.shared[key].pop(owner, None)
            if not self.shared[key]:
                del self.shared[key]
        self._wake()

    def _wake(self) -> None:
        if self._released is not None:
            self._released.set()
            self._released = None
