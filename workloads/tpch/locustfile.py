"""Locust load test: TPC-H through the proxy, each query class its own request name.

    locust -f workloads/tpch/locustfile.py --headless -u 32 -r 8 -t 60s \\
        --host postgresql://app@127.0.0.1:6432/app [--tpch-mix medium] [--tpch-sf 0.1]

Every simulated user holds one psycopg connection (psycopg ≥ 3.1.14 cooperates with locust's
gevent by itself) and runs one query at a time from the mix, with the TPC-H specification's
random parameters; between queries it thinks for ``--tpch-think`` seconds on average
(exponential; 0 = closed loop with no think time). The SQL dialect follows the server: the
proxy's embedded DuckDB announces itself in ``server_version``.
"""

from __future__ import annotations

import random
import time
from typing import Any

import psycopg
from locust import User, events, task

from workloads.tpch.mixes import mix_by_name
from workloads.tpch.queries import Dialect, draw_parameters, render_query


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: Any) -> None:
    parser.add_argument(
        "--tpch-mix", default="medium", help="light, medium, heavy or all", env_var="TPCH_MIX"
    )
    parser.add_argument("--tpch-sf", type=float, default=0.1, help="scale factor loaded")
    parser.add_argument("--tpch-think", type=float, default=0.0, help="mean think time, s")


class TpchUser(User):
    """One client: a connection and a stream of TPC-H queries from the mix."""

    def wait_time(self) -> float:
        think = float(self.environment.parsed_options.tpch_think)
        return self.rng.expovariate(1 / think) if think > 0 else 0.0

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.mix = mix_by_name(options.tpch_mix)
        self.scale_factor = float(options.tpch_sf)
        self.rng = random.Random()
        if not self.host:
            raise ValueError("--host postgresql://USER@HOST:PORT/DB (the proxy) is required")
        self.conninfo: str = self.host
        self.conn = psycopg.connect(self.conninfo, autocommit=True)
        version = self.conn.info.parameter_status("server_version") or ""
        self.dialect: Dialect = "duckdb" if "DuckDB" in version else "postgres"

    def on_stop(self) -> None:
        self.conn.close()

    @task
    def query(self) -> None:
        queries = self.mix.queries
        q = self.rng.choices(queries, [self.mix.weights[x] for x in queries])[0]
        sql = render_query(q, draw_parameters(q, self.rng, self.scale_factor), self.dialect)
        started = time.perf_counter()
        rows: list[Any] = []
        error: Exception | None = None
        try:
            rows = self.conn.execute(sql).fetchall()
        except psycopg.Error as e:
            error = e
        self.environment.events.request.fire(
            request_type="SQL",
            name=f"Q{q}",
            response_time=(time.perf_counter() - started) * 1000,
            response_length=len(rows),
            exception=error,
            context={},
        )
        if self.conn.closed:
            self.conn = psycopg.connect(self.conninfo, autocommit=True)
