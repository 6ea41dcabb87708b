"""Reading a statement's memory and spill from PostgreSQL's EXPLAIN (ANALYZE, BUFFERS) output
(the shapes PostgreSQL writes in FORMAT JSON; a real server's output: the training tests)."""

from __future__ import annotations

import pytest

from training.pgmemory import plan_memory

KB = 1024
WORK_MEM = 4 * 1024 * KB


def _explained(plan: dict[str, object]) -> list[dict[str, object]]:
    return [{"Plan": plan, "Planning": {}, "Triggers": []}]


def test_memory_is_every_operators_and_workers_peak_and_spill_the_temp_blocks() -> None:
    plan = {
        "Node Type": "Sort",
        "Sort Space Used": 1500,
        "Sort Space Type": "Memory",
        "Temp Written Blocks": 10,
        "Plans": [
            {
                "Node Type": "Hash Join",
                "Plans": [
                    {"Node Type": "Seq Scan"},
                    {
                        "Node Type": "Hash",
                        "Peak Memory Usage": 300,
                        "Hash Batches": 1,
                        "Plans": [{"Node Type": "Seq Scan"}],
                    },
                ],
            },
            {
                "Node Type": "Gather",
                "Plans": [
                    {
                        "Node Type": "Aggregate",
                        "Strategy": "Hashed",
                        "Peak Memory Usage": 100,
                        "Disk Usage": 0,
                        "Workers": [
                            {"Worker Number": 0, "Peak Memory Usage": 90, "Disk Usage": 0},
                            {"Worker Number": 1, "Peak Memory Usage": 80, "Disk Usage": 0},
                        ],
                    }
                ],
            },
        ],
    }
    memory, spill = plan_memory(_explained(plan), WORK_MEM, 8192)
    assert memory == (1500 + 300 + 100 + 90 + 80) * KB
    assert spill == 10 * 8192


def test_a_sort_on_disk_filled_work_mem_first() -> None:
    plan = {
        "Node Type": "Sort",
        "Sort Space Used": 90000,  # the disk's kB, not memory
        "Sort Space Type": "Disk",
        "Temp Written Blocks": 11250,
        "Plans": [
            {
                "Node Type": "Incremental Sort",
                "Full-sort Groups": {"Sort Space Memory": {"Peak Sort Space Used": 40}},
                "Pre-sorted Groups": {"Sort Space Memory": {"Peak Sort Space Used": 60}},
            }
        ],
    }
    memory, spill = plan_memory(_explained(plan), WORK_MEM, 8192)
    assert memory == WORK_MEM + 100 * KB
    assert spill == 11250 * 8192


def test_a_plan_without_memory_takes_none_and_garbage_is_refused() -> None:
    assert plan_memory(_explained({"Node Type": "Result"}), WORK_MEM, 8192) == (0.0, 0.0)
    for bad in ([], {"Plan": 3}, "text"):
        with pytest.raises(ValueError, match="not the output of EXPLAIN"):
            plan_memory(bad, WORK_MEM, 8192)
