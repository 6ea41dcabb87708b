"""Work-memory grants: each admitted statement's share of a memory budget, as its work_mem.

PostgreSQL bounds a statement's memory per operator (``work_mem``; hash tables
``hash_mem_multiplier`` times that) and per process, and spills what does not fit to temporary
files. A server's work_mem is set for the worst case — every connection running its largest
plan at once — so it is small, and analytical statements spill. Admission bounds what runs at
once, which makes a larger work_mem safe: with at most MPL statements running, each may take
``budget / MPL`` (with a thread budget T instead, ``budget · threads held / T``); the statement's
plan spreads that over its work_mem units W (``work_mem_units``, counted from EXPLAIN by
training and by the live planner), so it runs with
``work_mem = budget / MPL / W``. The statements running then hold at most the budget between
them, whatever their classes — the way a workload manager gives each query slot its memory
(Amazon Redshift's WLM: a queue's memory divided among its slots).

The grant is a share, not a reservation of what a statement needs: a class that needs less
takes less, a class that needs more spills what does not fit its share. The statements that run
beside admission (inside a transaction block, session control) keep the last grant their
session had.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from admission.scheduler import Limits

__all__ = [
    "DEFAULT_UNITS",
    "MIN_WORK_MEM",
    "default_units",
    "grant_setting",
    "top_plan",
    "work_mem_grant",
    "work_mem_units",
]

MIN_WORK_MEM = 64 * 1024  # PostgreSQL's least work_mem
# the work_mem units of a class whose plan was not counted and no class's was: a sort and a
# hash join (a hash table at hash_mem_multiplier 2) and a little more
DEFAULT_UNITS = 4.0


def default_units(known: Iterable[float | None]) -> float:
    """The work_mem units of a class training did not count: the counted classes' median, or
    DEFAULT_UNITS without one."""
    counted = [u for u in known if u is not None and u > 0]
    return statistics.median(counted) if counted else DEFAULT_UNITS


def work_mem_grant(budget: int, limits: Limits, threads_held: int, units: float) -> int | None:
    """The work_mem (bytes, whole kB, at least MIN_WORK_MEM) of one admitted statement: its
    share of ``budget`` (1/MPL of it, or under a thread budget without an MPL the share of its
    threads held) divided by its ``units``. None when nothing bounds what runs at once (no MPL,
    no thread budget): no share is safe then."""
    if limits.mpl is not None:
        share = budget / max(1, limits.mpl)
        if limits.threads is not None and threads_held > 0:
            share = min(share, budget * threads_held / max(1, limits.threads))
    elif limits.threads is not None and threads_held > 0:
        share = budget * threads_held / max(1, limits.threads)
    else:
        return None
    per_unit = share / max(1.0, units)
    return max(MIN_WORK_MEM, int(per_unit) // 1024 * 1024)


def grant_setting(work_mem: int) -> bytes:
    """The statement that gives a session ``work_mem`` bytes."""
    return b"SET work_mem = '%dkB'" % (work_mem // 1024)


# operators that hold up to work_mem each (tuple sorts and stores) …
_SORTING = frozenset(("Sort", "Incremental Sort", "Material", "WindowAgg", "Recursive Union"))
# … and up to work_mem × hash_mem_multiplier (hash tables)
_HASHING = frozenset(("Hash", "Memoize"))
_HASHED_STRATEGIES = frozenset(("Hashed", "Mixed"))  # of an Aggregate or a SetOp
_GATHERS = frozenset(("Gather", "Gather Merge"))


def _units(plan: Mapping[str, Any], processes: int, hash_mem: float) -> float:
    kind = plan.get("Node Type")
    own = 0.0
    if kind in _SORTING:
        own = 1.0
    elif kind in _HASHING or (
        kind in ("Aggregate", "SetOp") and plan.get("Strategy") in _HASHED_STRATEGIES
    ):
        own = hash_mem
    if kind in _GATHERS:
        launched = plan.get("Workers Launched", plan.get("Workers Planned", 0))
        workers = int(launched) if isinstance(launched, int | float) else 0
        # (a leader that runs no part of the plan itself makes this one too many: the bound
        # stays a bound)
        processes = max(1, workers + 1)
    total = own * processes
    for child in plan.get("Plans", ()) or ():
        if isinstance(child, Mapping):
            total += _units(child, processes, hash_mem)
    return total


def work_mem_units(explained: Any, hash_mem_multiplier: float = 2.0) -> float:
    """A statement's work_mem units — how many times over ``work_mem`` it may grow: each sort,
    materialization and window once, each hash table (hash join, hashed aggregate or set
    operation, memoize) ``hash_mem_multiplier`` times, each of them once per process that runs
    it (a parallel section's launched workers, or planned ones, and its leader) — from the
    output of PostgreSQL's ``EXPLAIN (FORMAT JSON)``, with or without ANALYZE."""
    return _units(top_plan(explained), 1, hash_mem_multiplier)


def top_plan(explained: Any) -> Mapping[str, Any]:
    """The top plan node of PostgreSQL's ``EXPLAIN (FORMAT JSON)`` output (the list it
    returns, or its one element); ValueError for anything else."""
    top = explained[0] if isinstance(explained, list) and explained else explained
    if not isinstance(top, Mapping) or not isinstance(top.get("Plan"), Mapping):
        raise ValueError("not the output of EXPLAIN (FORMAT JSON)")
    return top["Plan"]  # type: ignore[no-any-return]
