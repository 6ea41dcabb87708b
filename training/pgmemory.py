"""What PostgreSQL reports of a statement's memory and spill (training on PostgreSQL).

PostgreSQL keeps the memory of a statement's sorts, hash tables and caches within ``work_mem``
(times ``hash_mem_multiplier`` for hashing) per operator and per process, and spills the rest to
temporary files. ``EXPLAIN (ANALYZE, BUFFERS)`` reports what each operator took: a sort's space
(in memory, or on disk after it filled ``work_mem``), a hash table's, a hashed aggregate's or a
memoize cache's peak, per parallel worker too, and the temporary blocks written. A statement's
memory M is the sum over its operators and workers (they hold their memory at the same time in a
pipelined plan, so the sum bounds the peak from above); its spill is the temporary bytes written.

A statement's **work_mem units** W: how many times over ``work_mem`` its memory may grow, from
its plan — each sort, materialization and window once, each hash table (hash join, hashed
aggregate or set operation, memoize) ``hash_mem_multiplier`` times, and each of them once per
process that runs it (a parallel section's launched workers and its leader;
``admission.grants.work_mem_units``). PostgreSQL keeps
each within its limit and spills the rest, so a statement run with ``work_mem = w`` takes at most
about W·w: what lets the proxy give a statement a share of a memory budget as its work_mem
(``admission.grants``).

The process's own memory besides (catalog caches, the executor's state: a few MB a backend) is
not counted: a memory budget is about what statements add to the server, and that part is there
whether a statement runs or waits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from admission.grants import top_plan, work_mem_units

__all__ = ["PlanMemory", "explain_memory", "plan_memory", "plan_processes", "work_mem_units"]

KIB = 1024
# operator fields that give memory in kB (each a node's own, or a worker's within "Workers")
_PEAK_FIELDS = ("Peak Memory Usage",)  # Hash, hashed Aggregate, Memoize
_INCREMENTAL = ("Full-sort Groups", "Pre-sorted Groups")  # Incremental Sort


def _own_memory(node: Mapping[str, Any], work_mem: float) -> float:
    """Bytes one operator (or one worker's share of it) reports holding at its peak."""
    total = 0.0
    for name in _PEAK_FIELDS:
        value = node.get(name)
        if isinstance(value, int | float):
            total += value * KIB
    used = node.get("Sort Space Used")
    if isinstance(used, int | float):
        # on disk: the sort filled work_mem before it spilled (the space reported is the disk's)
        total += used * KIB if node.get("Sort Space Type") == "Memory" else work_mem
    for groups in _INCREMENTAL:
        sorts = node.get(groups)
        if isinstance(sorts, Mapping):
            space = sorts.get("Sort Space Memory")
            if isinstance(space, Mapping) and isinstance(space.get("Peak Sort Space Used"), int):
                total += space["Peak Sort Space Used"] * KIB
    return total


def _nodes(plan: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()) or ():
        if isinstance(child, Mapping):
            yield from _nodes(child)


def plan_memory(explained: Any, work_mem: float, block_size: int) -> tuple[float, float]:
    """(memory, spill) in bytes from the output of ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)``
    (the list PostgreSQL returns); ``work_mem`` in bytes, ``block_size`` the server's."""
    plan = top_plan(explained)
    memory = 0.0
    for node in _nodes(plan):
        memory += _own_memory(node, work_mem)
        for worker in node.get("Workers", ()) or ():
            if isinstance(worker, Mapping):
                memory += _own_memory(worker, work_mem)
    written = plan.get("Temp Written Blocks", 0)
    spill = float(written) * block_size if isinstance(written, int | float) else 0.0
    return memory, spill


class PlanMemory(NamedTuple):
    memory: float  # bytes, the operators' peaks summed
    spill: float  # bytes written to temporary files
    units: float  # work_mem units (see the module docstring)
    processes: int = 1  # the leader and the most parallel workers launched at one Gather


def plan_processes(explained: Any) -> int:
    """The processes a statement ran in: its leader and, at the Gather (Merge) that launched
    the most, its parallel workers (one Gather runs at a time in the plans PostgreSQL makes)."""
    launched = [
        node.get("Workers Launched", 0)
        for node in _nodes(top_plan(explained))
        if isinstance(node.get("Workers Launched", 0), int)
    ]
    return 1 + max(launched, default=0)


def explain_memory(conn: Any, sql: str) -> PlanMemory:
    """Run ``sql`` once under ``EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)`` on the psycopg
    connection ``conn`` (straight to the server): its memory, spill and work_mem units."""
    row = conn.execute(
        "select pg_size_bytes(current_setting('work_mem')), current_setting('block_size')::int,"
        " coalesce(current_setting('hash_mem_multiplier', true), '1')::float8"
    ).fetchone()
    work_mem, block_size, hash_mem = float(row[0]), int(row[1]), float(row[2])
    result = conn.execute(
        "explain (analyze, buffers, timing off, summary off, format json) " + sql
    ).fetchone()
    explained = result[0]
    if isinstance(explained, str):
        explained = json.loads(explained)
    memory, spill = plan_memory(explained, work_mem, block_size)
    return PlanMemory(memory, spill, work_mem_units(explained, hash_mem), plan_processes(explained))
