"""The TPC-H locust workload as the soak benchmark runs it: every request logged, connections
renewed now and then.

    locust -f benchmarks/soak_locustfile.py --headless -u 16 -r 8 -t 1800s \\
        --host postgresql://soak@127.0.0.1:6432/tpch --soak-events events.tsv \\
        [--soak-reconnect 50] [--tpch-mix all] [--tpch-sf 0.01] [--tpch-think 0]

The users are ``workloads/tpch/locustfile.py``'s, unchanged but for one thing: with
``--soak-reconnect N`` a user closes its connection after a query with probability 1/N and
opens a new one, so a long run also exercises the proxy's session set-up and tear-down, where
per-connection state would pile up if it were never freed. locust's own statistics are
cumulative or over a sliding window of seconds; the soak reports each minute on its own, so
every request (and every exception a user raises outside a request) is also appended to the
``--soak-events`` file as one tab-separated line — ``time  name  milliseconds  error`` — that
the benchmark reads as it goes.
"""

from __future__ import annotations

import time
from typing import IO, Any

import psycopg
from locust import events
from locust.env import Environment

# Imported as a module, not by name: locust runs every User class it finds in this module's
# namespace, and only the subclass below should run.
import workloads.tpch.locustfile as tpch

_log: IO[str] | None = None


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: Any) -> None:
    parser.add_argument("--soak-events", default="", help="append every request to this file")
    parser.add_argument(
        "--soak-reconnect",
        type=int,
        default=0,
        help="mean queries per connection (0 = keep one connection for the whole run)",
    )


def _clean(text: str) -> str:
    """One line without tabs: the log's fields are tab-separated and one request is a line."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first.replace("\t", " ")


def describe(error: BaseException) -> str:
    """How an error is grouped in the report: SQLSTATE (when the server sent one), type and
    the first line of the message."""
    sqlstate = getattr(error, "sqlstate", None)
    prefix = f"{sqlstate} " if sqlstate else ""
    return _clean(f"{prefix}{type(error).__name__}: {error}")


def _write(name: str, milliseconds: float, error: str) -> None:
    if _log is not None:
        _log.write(f"{time.time():.3f}\t{name}\t{milliseconds:.3f}\t{error}\n")


@events.init.add_listener  # type: ignore[untyped-decorator]
def _open_log(environment: Environment, **_kwargs: Any) -> None:
    global _log
    path = environment.parsed_options.soak_events if environment.parsed_options else ""
    if path:
        _log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115  # closed at quit


@events.quitting.add_listener  # type: ignore[untyped-decorator]
def _close_log(**_kwargs: Any) -> None:
    global _log
    if _log is not None:
        _log.close()
        _log = None


@events.request.add_listener  # type: ignore[untyped-decorator]
def _on_request(
    name: str, response_time: float, exception: BaseException | None, **_kwargs: Any
) -> None:
    _write(name, response_time, describe(exception) if exception is not None else "")


@events.user_error.add_listener  # type: ignore[untyped-decorator]
def _on_user_error(exception: BaseException, **_kwargs: Any) -> None:
    _write("(user)", 0.0, describe(exception))  # soak.OUTSIDE


class SoakUser(tpch.TpchUser):
    """``TpchUser`` that renews its connection between queries with probability 1/N.

    locust calls ``wait_time`` after every task, so the renewal happens there; overriding the
    task itself would leave the parent's in the task list too (locust collects tasks from base
    classes), and half the queries would skip it."""

    def wait_time(self) -> float:
        every = int(self.environment.parsed_options.soak_reconnect)
        if every > 0 and self.rng.random() < 1 / every:
            self.conn.close()
            self.conn = psycopg.connect(self.conninfo, autocommit=True)
        return super().wait_time()
