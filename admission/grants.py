"""Work-memory grants: each admitted statement's share of a memory budget, as its work_mem.

PostgreSQL bounds a statement's memory per operator (``work_mem``; hash tables
``hash_mem_multiplier`` times that) and per process, and spills what does not fit to temporary
files. A server's work_mem is set for the worst case — every connection running its largest
plan at once — so it is small, and analytical statements spill. Admission bounds what runs at
once, which makes a larger work_mem safe: with at most MPL statements running, each may take
``budget / MPL`` (with a thread budget T instead, ``budget · threads held / T``); the statement's
plan spreads that over its work_mem units W (``training.pgmemory``), so it runs with
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
from collections.abc import Iterable

from admission.scheduler import Limits

__all__ = ["DEFAULT_UNITS", "MIN_WORK_MEM", "default_units", "grant_setting", "work_mem_grant"]

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
