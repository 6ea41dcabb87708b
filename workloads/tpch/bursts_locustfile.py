"""Locust with bursts: the TPC-H users of ``locustfile.py`` under a load shape that multiplies
the number of users for a while, again and again — the same on/off bursts as
``admission bench --arrivals bursty``.

    locust -f workloads/tpch/bursts_locustfile.py --headless -t 120s \\
        --host postgresql://app@127.0.0.1:6432/app --tpch-think 0.5 \\
        --burst-users 8 --burst-factor 2 --burst-every 60 --burst-length 20

Users think between statements (``--tpch-think``, exponential), so their rate of arrivals is
about users / (think + response time): with a think time well above the response time the load
is close to open arrivals, and a burst multiplies it by the factor. Without a ``-t`` run time
the shape runs until stopped.
"""

from __future__ import annotations

from typing import Any

from locust import LoadTestShape, events

from workloads.arrivals import Bursts
from workloads.tpch.locustfile import TpchUser

__all__ = ["BurstShape", "TpchUser"]


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: Any) -> None:
    parser.add_argument("--burst-users", type=int, default=8, help="users outside bursts")
    parser.add_argument("--burst-factor", type=float, default=2.0, help="users × this in a burst")
    parser.add_argument("--burst-every", type=float, default=60.0, help="s from burst to burst")
    parser.add_argument("--burst-length", type=float, default=20.0, help="s a burst lasts")


class BurstShape(LoadTestShape):
    """``burst_users`` users, × ``burst_factor`` for ``burst_length`` s every ``burst_every`` s
    (the first burst after ``burst_every`` s), until the run time given with ``-t``."""

    def tick(self) -> tuple[int, float] | None:
        runner: Any = self.runner  # set by locust before the first tick
        options = runner.environment.parsed_options
        bursts = Bursts(options.burst_factor, options.burst_every, options.burst_length)
        base = max(1, int(options.burst_users))
        t: float = self.get_run_time()  # type: ignore[no-untyped-call]
        limit = getattr(options, "run_time", None)
        if limit and t >= limit:
            return None
        inside = t >= bursts.every and (t % bursts.every) < bursts.length
        users = max(1, round(base * bursts.factor)) if inside else base
        return users, float(users)  # all at once: a burst starts together
