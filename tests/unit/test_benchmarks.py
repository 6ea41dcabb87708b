"""The benchmark scripts' own workloads run as the figures they print say (no timing here)."""

from __future__ import annotations

import pytest

from benchmarks.path_instructions import run_statements
from benchmarks.proxy_overhead import logic_cost, on_event_loop, statement_cycle


@pytest.mark.parametrize("mode", ["simple", "prepared"])
def test_the_measured_statements_all_pass_the_gate(mode: str) -> None:
    run_statements(mode, 300, 400)  # raises unless all 300 were admitted and released
    assert logic_cost(mode, 300) > 0


def test_simple_statements_carry_their_own_numbers_and_share_a_class() -> None:
    def check() -> float:
        conn, statements, reply = statement_cycle("simple", 50)
        assert len(set(statements)) == 50  # pgbench's texts: the literal-key path, not a cache
        for statement in statements:
            conn.data_received(statement)
            conn.from_server(reply)
        scheduler = conn.server.gate.scheduler
        assert scheduler.stats.completed == 50 and len(scheduler.class_names) == 1
        return 0.0

    on_event_loop(check)
