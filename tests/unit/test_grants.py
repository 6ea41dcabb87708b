"""Work-memory grants: each admitted statement's share of the budget (``admission.grants``), a
plan's work_mem units (``training.pgmemory``), and the relay session that runs the proxy's own
``SET work_mem`` ahead of a statement and cuts its replies from what the client hears."""

from __future__ import annotations

import pytest

from admission import Limits
from admission.grants import (
    DEFAULT_UNITS,
    MIN_WORK_MEM,
    default_units,
    grant_setting,
    work_mem_grant,
    work_mem_units,
)
from proxy.wire import protocol as pg
from proxy.wire.session import ProxySession, Release, SendToClient, SendToServer, Submit
from tests.unit.test_wire import RFQ, bind, cstr, execute, m, parse, ready_session

MiB = 2**20
SYNC, FLUSH = m("S"), m("H")


def test_a_share_is_the_budget_over_the_mpl_spread_over_the_plans_units() -> None:
    assert work_mem_grant(1024 * MiB, Limits(mpl=4), 0, 8.0) == 32 * MiB
    # a thread budget without an MPL: the share of the threads the statement holds
    assert work_mem_grant(1024 * MiB, Limits(threads=8), 2, 1.0) == 256 * MiB
    # both: the smaller share
    assert work_mem_grant(1024 * MiB, Limits(mpl=2, threads=8), 1, 1.0) == 128 * MiB
    # nothing bounds what runs at once: no share is safe
    assert work_mem_grant(1024 * MiB, Limits(), 0, 1.0) is None
    assert work_mem_grant(1024 * MiB, Limits(threads=8), 0, 1.0) is None


def test_a_grant_is_whole_kilobytes_and_never_below_postgresqls_least() -> None:
    assert work_mem_grant(100 * 1024 + 700, Limits(mpl=1), 0, 1.0) == 100 * 1024
    assert work_mem_grant(MiB, Limits(mpl=64), 0, 100.0) == MIN_WORK_MEM
    assert work_mem_grant(MiB, Limits(mpl=1), 0, 0.0) == MiB  # (units below 1 count as 1)
    assert grant_setting(4 * MiB) == b"SET work_mem = '4096kB'"


def test_a_class_whose_plan_was_not_counted_gets_the_counted_classes_median() -> None:
    assert default_units([2.0, None, 6.0, 10.0, 0.0]) == 6.0
    assert default_units([]) == DEFAULT_UNITS


def _explained(plan: dict[str, object]) -> list[dict[str, object]]:
    return [{"Plan": plan}]


def test_work_mem_units_count_sorts_once_hash_tables_by_the_multiplier_per_process() -> None:
    plan = {
        "Node Type": "Sort",
        "Plans": [
            {
                "Node Type": "Gather",
                "Workers Planned": 2,
                "Workers Launched": 2,
                "Plans": [
                    {
                        "Node Type": "Hash Join",
                        "Plans": [
                            {"Node Type": "Seq Scan"},
                            {"Node Type": "Hash", "Plans": [{"Node Type": "Seq Scan"}]},
                        ],
                    },
                    {"Node Type": "Aggregate", "Strategy": "Hashed"},
                    {"Node Type": "Aggregate", "Strategy": "Plain"},
                ],
            }
        ],
    }
    # the sort above the Gather: 1; below it, a hash and a hashed aggregate in 3 processes
    assert work_mem_units(_explained(plan), 2.0) == 1 + 3 * (2.0 + 2.0)
    assert work_mem_units(_explained(plan), 1.0) == 1 + 3 * (1.0 + 1.0)
    assert work_mem_units(_explained({"Node Type": "Seq Scan"})) == 0.0
    with pytest.raises(ValueError, match="EXPLAIN"):
        work_mem_units([{"no plan": 1}])


SETTING = grant_setting(8 * MiB)
# what the server answers to the proxy's own statement: ParseComplete, BindComplete,
# CommandComplete, CloseComplete, ReadyForQuery
OWN_REPLY = m("1") + m("2") + m("C", cstr("SET")) + m("3") + RFQ
SELECT_REPLY = m("T", b"\0\0") + m("C", cstr("SELECT 1")) + RFQ


def _session() -> ProxySession:
    s = ready_session()
    s.watch_settings = True  # (the server turns it on with grants)
    return s


def _granted_bytes(actions: list[object]) -> bytes:
    (send,) = [a for a in actions if isinstance(a, SendToServer)]
    return send.data


def test_the_grant_runs_as_a_named_statement_ahead_and_the_client_hears_only_its_own() -> None:
    s = _session()
    query = m("Q", cstr("select * from t"))
    (submit,) = s.client_data(query)
    assert isinstance(submit, Submit)
    sent = _granted_bytes(s.granted(submit.job, SETTING))
    assert sent.endswith(query)
    own = sent[: -len(query)]
    # Parse of a named statement (never the client's unnamed one), Bind, Execute, Close, Sync
    assert own.startswith(b"P") and b"_admission_grant\0" + SETTING + b"\0" in own
    assert own.endswith(m("C", b"S_admission_grant\0") + SYNC)
    # the server's replies to it are cut, split anywhere
    whole = OWN_REPLY + SELECT_REPLY
    for cut in range(len(whole) + 1):
        t = _session()
        (job,) = t.client_data(query)
        assert isinstance(job, Submit)
        t.granted(job.job, SETTING)
        actions = t.server_data(whole[:cut]) + t.server_data(whole[cut:])
        heard = b"".join(a.data for a in actions if isinstance(a, SendToClient))
        assert heard == SELECT_REPLY, cut
        assert Release(job.job) in actions


def test_the_same_setting_is_sent_once_and_a_reset_all_sends_it_again() -> None:
    s = _session()
    sent = []
    for sql in ("select 1", "select 2", "discard all", "select 3"):
        query = m("Q", cstr(sql))
        (submit,) = s.client_data(query)
        assert isinstance(submit, Submit)
        data = _granted_bytes(s.granted(submit.job, SETTING))
        sent.append(data != query)
        s.server_data((OWN_REPLY if data != query else b"") + m("C", cstr("X")) + RFQ)
    assert sent == [True, False, False, True]
    # a different share is sent
    (submit,) = s.client_data(m("Q", cstr("select 4")))
    assert isinstance(submit, Submit)
    assert b"_admission_grant" in _granted_bytes(s.granted(submit.job, grant_setting(MiB)))


@pytest.mark.parametrize(
    "statement",
    [
        "SET work_mem = '64MB'",
        "set session work_mem to 65536",
        "RESET work_mem",
        "select set_config('work_mem', '1GB', false)",
        'SET "work_mem" = 1024',
    ],
)
def test_a_session_that_sets_work_mem_itself_keeps_it(statement: str) -> None:
    s = _session()
    (own,) = s.client_data(m("Q", cstr(statement)))
    assert isinstance(own, Submit)
    s.granted(own.job)
    s.server_data(m("C", cstr("SET")) + RFQ)
    query = m("Q", cstr("select 1"))
    (submit,) = s.client_data(query)
    assert isinstance(submit, Submit)
    assert _granted_bytes(s.granted(submit.job, SETTING)) == query


def test_reading_work_mem_is_not_setting_it() -> None:
    s = _session()
    query = m("Q", cstr("show work_mem"))
    (submit,) = s.client_data(query)
    assert isinstance(submit, Submit)
    assert _granted_bytes(s.granted(submit.job, SETTING)) != query


def test_an_unnamed_statement_parsed_in_an_earlier_sync_survives_the_grant() -> None:
    # asyncpg without a statement cache: Parse '' + Describe + Sync, then Bind '' in the next
    s = _session()
    prepared = parse("", "select $1::int") + m("D", b"S\0") + SYNC
    assert s.client_data(prepared) == [SendToServer(prepared)]
    s.server_data(m("1") + m("t", b"\0\0") + m("n") + RFQ)
    run = bind("", "") + execute() + SYNC
    (submit,) = s.client_data(run)
    assert isinstance(submit, Submit)
    own = _granted_bytes(s.granted(submit.job, SETTING))[: -len(run)]
    # nothing of the proxy's touches the unnamed statement: no simple Query, no Parse of ''
    assert not own.startswith(b"Q") and b"P\0\0\0" not in own[:1]
    frames = []
    pos = 0
    while pos < len(own):
        length = int.from_bytes(own[pos + 1 : pos + 5], "big")
        frames.append((own[pos : pos + 1], own[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    assert [k for k, _ in frames] == [b"P", b"B", b"E", b"C", b"S"]
    assert frames[0][1].startswith(b"_admission_grant\0")  # the Parse names its statement
    assert frames[1][1].startswith(b"\0_admission_grant\0")  # Bind: unnamed portal, ours


def test_an_error_of_the_grant_is_cut_and_the_next_grant_tries_again() -> None:
    s = _session()
    query = m("Q", cstr("select 1"))
    (submit,) = s.client_data(query)
    assert isinstance(submit, Submit)
    s.granted(submit.job, SETTING)
    error = pg.error_response("22023", "invalid value for parameter")
    actions = s.server_data(error + RFQ + m("C", cstr("SELECT 1")) + RFQ)
    heard = b"".join(a.data for a in actions if isinstance(a, SendToClient))
    assert heard == m("C", cstr("SELECT 1")) + RFQ
    (again,) = s.client_data(query)
    assert isinstance(again, Submit)
    assert _granted_bytes(s.granted(again.job, SETTING)) != query


def test_a_fatal_error_during_the_grant_reaches_the_client() -> None:
    s = _session()
    (submit,) = s.client_data(m("Q", cstr("select 1")))
    assert isinstance(submit, Submit)
    s.granted(submit.job, SETTING)
    fatal = pg.error_response("57P01", "terminating connection", severity="FATAL")
    actions = s.server_data(fatal)
    heard = b"".join(a.data for a in actions if isinstance(a, SendToClient))
    assert heard == fatal


def test_an_execute_that_continues_unsynced_messages_gets_no_grant() -> None:
    # asyncpg: Parse, Describe, Flush; then Bind; then Execute and Sync — a Sync of the
    # proxy's before the Execute would end the implicit transaction and drop the portal
    s = _session()
    prepared = parse("", "select 1") + m("D", b"S\0") + FLUSH
    assert s.client_data(prepared) == [SendToServer(prepared)]
    s.server_data(m("1") + m("t", b"\0\0") + m("n"))
    assert s.client_data(bind("", "")) == [SendToServer(bind("", ""))]
    (submit,) = s.client_data(execute() + SYNC)
    assert isinstance(submit, Submit)
    assert _granted_bytes(s.granted(submit.job, SETTING)) == execute() + SYNC
    s.server_data(m("2") + m("C", cstr("SELECT 1")) + RFQ)
    # the next batch starts after a Sync: granted
    run = bind("", "") + execute() + SYNC
    (again,) = s.client_data(run)
    assert isinstance(again, Submit)
    assert _granted_bytes(s.granted(again.job, SETTING)) != run


def test_a_batch_pipelined_behind_others_gets_no_grant() -> None:
    # BEGIN and a statement sent together: when the statement is granted the server still
    # owes BEGIN's reply, and will be inside a transaction block — a setting there would be
    # rolled back with it (and a Sync of the proxy's would end the client's extended batch)
    s = _session()
    begin, select = m("Q", cstr("BEGIN")), m("Q", cstr("select 1"))
    (first,) = s.client_data(begin + select)
    assert isinstance(first, Submit) and first.bypass  # (so the server gives it no setting)
    actions = s.granted(first.job)
    assert _granted_bytes(actions) == begin
    (second,) = [a for a in actions if isinstance(a, Submit)]
    assert _granted_bytes(s.granted(second.job, SETTING)) == select


def test_a_discard_all_queued_before_the_first_grant_still_resets_it() -> None:
    s = _session()
    select, discard = m("Q", cstr("select 1")), m("Q", cstr("discard all"))
    (first,) = s.client_data(select + discard)
    assert isinstance(first, Submit)
    actions = s.granted(first.job, SETTING)
    assert _granted_bytes(actions) != select  # granted: the session had nothing to wait for
    (second,) = [a for a in actions if isinstance(a, Submit)]
    assert _granted_bytes(s.granted(second.job)) == discard
    s.server_data(OWN_REPLY + m("C", cstr("SELECT 1")) + RFQ + m("C", cstr("DISCARD ALL")) + RFQ)
    (third,) = s.client_data(select)
    assert isinstance(third, Submit)
    assert _granted_bytes(s.granted(third.job, SETTING)) != select  # sent again


def test_what_else_the_server_sends_during_the_grant_reaches_the_client() -> None:
    s = _session()
    (submit,) = s.client_data(m("Q", cstr("select 1")))
    assert isinstance(submit, Submit)
    s.granted(submit.job, SETTING)
    notify = m("A", b"\0\0\0\x07" + cstr("chan") + cstr("hi"))
    status = m("S", cstr("TimeZone") + cstr("UTC"))
    own = m("1") + m("2") + notify + m("C", cstr("SET")) + status + m("3") + RFQ
    actions = s.server_data(own + SELECT_REPLY)
    heard = b"".join(a.data for a in actions if isinstance(a, SendToClient))
    assert heard == notify + status + SELECT_REPLY


def test_a_session_that_copies_gets_no_more_grants() -> None:
    s = _session()
    copy = m("Q", cstr("copy t from stdin")) + m("d", b"1\n") + m("c")
    (submit,) = s.client_data(copy)
    assert isinstance(submit, Submit)
    assert _granted_bytes(s.granted(submit.job)) == copy
    s.server_data(m("G", b"\0\0\0") + m("C", cstr("COPY 1")) + RFQ)
    select = m("Q", cstr("select 1"))
    (after,) = s.client_data(select)
    assert isinstance(after, Submit)
    assert _granted_bytes(s.granted(after.job, SETTING)) == select
