"""Hostile input on both front ends: mutated real sessions (``testing.fuzz``) over real sockets.

Load: a few hundred fuzzed cases, eight at a time from a process of their own, while another
client runs ``select 1`` every 10 ms through the same front end. After the run: no internal
error and no case left unanswered, the bystander's answers all right with a p99 at most 50 ms
above its own p99 on the same machine just before the fuzzing (the machine may be busy with
more than this test: ``benchmarks/fuzz.py`` reports the p99 itself), a fresh
client's ``select 1`` answered, the gate's capacity in use and its queue back to 0 (read from
the scheduler on the front end's loop), the process's RSS grown by less than 64 MB.

Differential: 60 well-framed cases straight to PostgreSQL and through the front end. Through
the relay every answer must be PostgreSQL's, message type by message type with each error's
SQLSTATE class; the embedded DuckDB server must answer with a sane SQLSTATE wherever
PostgreSQL answers an error, never with an internal one, and keep or close the session as
PostgreSQL does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from admission import Limits
from testing import fuzz
from testing.embeddedharness import Embedded
from testing.pgcluster import Cluster
from testing.proxyharness import ProxyHarness

RELAY, EMBEDDED = "relay", "embedded"
LOAD_CASES = 400
DIFFERENTIAL_CASES = 60
P99_TARGET = 0.050  # seconds: another client's select 1 while the fuzzer runs
RSS_GROWTH_KB = 64 * 1024
BASELINE = 1.5  # seconds of select 1 before the fuzzing


class FrontEnd:
    """One front end under test: where it listens, who may connect, its gate's books."""

    def __init__(self, port: int, user: str, dbname: str, books: Callable[[], dict[str, int]]):
        self.port = port
        self.user = user
        self.dbname = dbname
        self.books = books

    @property
    def startup(self) -> bytes:
        return fuzz.startup_packet(self.user, self.dbname)

    def wait_idle(self, timeout: float = 15.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        books = self.books()
        while any(books.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
            books = self.books()
        return books


@pytest.fixture(params=[RELAY, EMBEDDED])
def front_end(request: pytest.FixtureRequest, pg: Cluster) -> Iterator[FrontEnd]:
    if request.param == RELAY:
        relay = ProxyHarness(pg.port)
        try:

            def relay_books() -> dict[str, int]:
                state = relay.state()
                return {k: state[k] for k in ("in_service", "threads", "queued")}

            yield FrontEnd(relay.port, "postgres", "postgres", relay_books)
        finally:
            relay.close()
        return
    embedded = Embedded(Limits())
    try:

        def embedded_books() -> dict[str, int]:
            s = embedded.scheduler
            read: dict[str, int] = embedded.call(
                lambda: {
                    "in_service": s.in_service,
                    "threads": s.threads_in_use,
                    "queued": s.queued,
                }
            )
            return read

        yield FrontEnd(embedded.port, "app", "app", embedded_books)
    finally:
        embedded.close()


def test_fuzzing_costs_the_front_end_nothing(front_end: FrontEnd) -> None:
    rss_before = fuzz.rss_kb()
    bystander = fuzz.Bystander(front_end.port, front_end.user, front_end.dbname)
    bystander.start()
    time.sleep(BASELINE)
    before = len(bystander.latencies)
    baseline = bystander.percentile(99)
    try:
        stats = fuzz.fuzz_in_subprocess(
            "127.0.0.1", front_end.port, range(LOAD_CASES), front_end.startup, timeout=15
        )
    finally:
        bystander.stop()
    assert stats.cases == LOAD_CASES and stats.refused == 0
    assert stats.messages > 10 * LOAD_CASES
    assert not stats.insane, stats.insane
    assert not stats.timeouts, f"cases nobody answered (seeds): {stats.timeouts}"
    assert stats.crashes == 0
    assert stats.ends["answered"] > LOAD_CASES // 4  # most cases are answered to the end
    assert not bystander.failures, bystander.failures
    assert len(bystander.latencies) - before > 50
    p99 = bystander.percentile(99, since=before)
    assert p99 <= baseline + P99_TARGET, (
        f"select 1 p99 {p99 * 1e3:.1f} ms during the fuzzing, {baseline * 1e3:.1f} ms before"
    )
    assert fuzz.select_one(front_end.port, front_end.user, front_end.dbname) == 1
    assert front_end.wait_idle() == {"in_service": 0, "threads": 0, "queued": 0}
    assert fuzz.rss_kb() - rss_before < RSS_GROWTH_KB


def test_the_relay_answers_as_postgresql_does(pg: Cluster, proxy: ProxyHarness) -> None:
    startup = fuzz.startup_packet("postgres", "postgres")
    mismatches = fuzz.differential(
        "127.0.0.1",
        pg.port,
        proxy.port,
        range(DIFFERENTIAL_CASES),
        startup,
        startup,
        fuzz.relay_mismatch,
    )
    assert not mismatches, "\n".join(mismatches)
    proxy.wait_idle()


def test_the_embedded_server_answers_hostile_input_sanely(pg: Cluster) -> None:
    embedded = Embedded(Limits())
    try:
        mismatches = fuzz.differential(
            "127.0.0.1",
            pg.port,
            embedded.port,
            range(DIFFERENTIAL_CASES),
            fuzz.startup_packet("postgres", "postgres"),
            fuzz.startup_packet("app", "app"),
            fuzz.embedded_mismatch,
        )
    finally:
        embedded.close()
    assert not mismatches, "\n".join(mismatches)


def test_cases_are_deterministic_and_mutated() -> None:
    startup = fuzz.startup_packet("u", "d")
    assert fuzz.generate(7, startup) == fuzz.generate(7, startup)
    cases = [fuzz.generate(seed, startup) for seed in range(200)]
    assert all(c.mutations for c in cases)
    assert any(not c.framed for c in cases) and any(c.framed for c in cases)
    assert all(fuzz.generate(seed, startup, framed=True).framed for seed in range(200))


def test_the_judges_see_a_difference() -> None:
    postgres = fuzz.Transcript(["Z", "1", "E:08P01", "Z"], "answered")
    assert (
        fuzz.relay_mismatch(postgres, fuzz.Transcript(list(postgres.replies), "answered")) is None
    )
    assert fuzz.relay_mismatch(postgres, fuzz.Transcript(["Z", "E!:08P01"], "closed"))
    assert fuzz.relay_mismatch(postgres, fuzz.Transcript(["Z", "1", "E:22P02", "Z"], "answered"))
    internal = fuzz.Transcript(["Z", "1", "E!:XX000"], "closed")
    assert "XX000" in (fuzz.embedded_mismatch(postgres, internal) or "")
    assert fuzz.embedded_mismatch(postgres, fuzz.Transcript(["Z", "1", "Z"], "answered"))
    closed = fuzz.Transcript(["Z", "1", "E:08P01"], "closed")
    assert fuzz.embedded_mismatch(postgres, closed)
