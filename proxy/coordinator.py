"""Several proxies, one budget: leases on a global budget, kept in the PostgreSQL they front.

``admission serve --coordinator postgresql://…`` makes ``--mpl`` — and ``--threads`` and
``--memory`` when given — the budgets of every proxy started with the same coordinator
together. Each proxy holds *leases* — a row of the table ``admission_leases`` per resource
(``mpl``: statements, ``threads``: the thread budget's fork sizes, ``memory``: bytes of the
memory budget) with the units it holds, its demand and an expiry — and admits locally up to
what it holds, so a statement pays no round trip to the coordinator in the
common case. The arithmetic, and why the invariant Σ held ≤ budget holds, is in
``admission.coordination``; this module is its plumbing on the proxy's event loop:

* **Heartbeat** every ``period`` (default TTL/5), and at once when statements queue while the
  local limit is full and the pool had units to give (looked at every 10 ms, off the
  statements' path): the local limit drops to what the proxy still needs (``release``; the
  demand is, per tenant, the largest of the last three heartbeats', summed, so a closed
  loop's client between two statements does not cost it its unit), then one transaction —
  serialized by a transaction-level advisory lock — deletes the rows whose lease expired (a
  proxy that died: its units come back), reads every row, takes free units up to this
  proxy's fair share (``grow``), writes its row with ``expires = now() + TTL`` (the
  database's clock, the only one that matters) and commits; the local limit grows only
  then. A proxy that gave units back, or saw dead ones deleted, while another proxy wants
  more than it holds sends a ``NOTIFY admission_leases``: the others listen and heartbeat at
  once, so a unit given back is picked up within a round trip, not a period.
* **Demand** is, per resource, what is in service plus what the queued statements would take
  here (statements; their fork sizes; their classes' M_r), reported per workload class
  (tenant; the column ``tenants``) with its weight; the fair share is the budget water-filled
  over the tenants' demands pooled over every proxy, by weight, background tenants last
  (``tenant_shares``), then split among the proxies serving each tenant — so one busy host
  cannot starve another, a tenant weighted 2 gets twice the units of one weighted 1 on
  whichever hosts they run, and without workload classes the shares are the budget
  water-filled over the proxies' demands (``fair_shares``). Give every proxy the same
  workload file: where they weigh a tenant differently, the largest weight counts. Each
  resource is leased on its own, by the same rule; a proxy holding none of a resource admits
  nothing. As with a local budget, a statement larger than the proxy's share
  of threads or memory runs alone there, so it may take more than its proxy holds of that
  resource.
* **Failures.** Each heartbeat has TTL/2 to finish. A coordinator that cannot be reached (down,
  restarting, partitioned) leaves the proxy on what it holds until its lease would expire
  (last successful heartbeat's start + TTL: never later than the database's own expiry);
  then on a **fallback** budget (``--coordinator-fallback``, by default the budget divided by
  the proxies last seen), logged and shown in ``/status``. Back in touch, it registers what it
  has in service: if that is more than the pool has free (its units were given to others
  meanwhile), the sum is over the budget until its statements finish, and nobody grows until
  then. **Over-admission is bounded**: at most the fallback budget per cut-off proxy while it is
  cut off, and, after it, at most what it had in service then, for as long as those statements
  run. A proxy killed outright holds its units until its lease expires (at most TTL) — under,
  never over, the budget meanwhile.
* **Shutdown** admits nothing more, then gives back at once every unit but those of the
  statements still in service — their clients are about to be closed and their cancels sent,
  and the database may run them a little longer — which stay leased for one TTL.

The tables are created on first use (``admission_leases``, ``admission_budget``) under the
same lock. The budget in ``admission_budget`` is written by every proxy that starts (the latest
``--mpl`` wins, and a proxy that finds another value there says so in its log).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import socket
from datetime import timedelta
from typing import Any

from admission.coordination import Claim, grow, release, shares_with_slack, tenant_split
from proxy.gate import AdmissionGate

__all__ = ["DEFAULT_TTL", "Coordinator"]

log = logging.getLogger("admission.coordinator")

DEFAULT_TTL = 2.0  # seconds a lease lives without a heartbeat
SHUT_GRACE = 0.25  # s a heartbeat whose socket was shut down has to fail before it is cancelled
LOCK_KEY = 0x61646D69  # the advisory lock that serializes heartbeats ("admi")
CHANNEL = "admission_leases"
APPLICATION = "admission-coordinator"
ROTATE = 1.0  # seconds: who gets a remainder unit among equal demands changes this often
WATCH = 0.01  # seconds between looks for statements waiting on units the pool may have
KICK_GAP = 0.02  # seconds at least between two heartbeats the look asks for
DEMAND_MEMORY = 3  # heartbeats whose largest demand a proxy keeps units for
IDLE_WEIGHT = 0.05  # a tenant given no unit here: this part of the least weight given

_SCHEMA = """
create table if not exists admission_leases (
    proxy text not null,
    resource text not null,
    held bigint not null check (held >= 0),
    demand bigint not null check (demand >= 0),
    expires timestamptz not null,
    started timestamptz not null default now(),
    host text not null default '',
    tenants jsonb not null default '{}',
    primary key (proxy, resource)
);
create table if not exists admission_budget (
    name text primary key,
    units bigint not null check (units >= 1)
)
"""
RESOURCES = ("mpl", "threads", "memory")  # the Limits fields a coordinator can share
UNITS = {"mpl": "statements", "threads": "threads", "memory": "bytes"}


class Coordinator:
    """The lease keeper of one proxy (a ``Tuner``: started and stopped on the proxy's loop).
    ``budgets``: the global budget of each shared resource (``mpl`` always; ``threads`` and
    ``memory`` when given)."""

    # stopped and closed before the server closes its clients (proxy.app.serve): ``stop``
    # sees the statements in service, ``aclose`` keeps their units leased
    stop_before_close = True

    def __init__(
        self,
        gate: AdmissionGate,
        dsn: str,
        budgets: dict[str, int] | int,
        *,
        ttl: float = DEFAULT_TTL,
        period: float | None = None,
        fallback: int | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(budgets, int):
            budgets = {"mpl": budgets}
        if "mpl" not in budgets or set(budgets) - set(RESOURCES):
            raise ValueError(f"budgets name the MPL and at most {', '.join(RESOURCES[1:])}")
        for resource, units in budgets.items():
            if units < 1:
                raise ValueError(f"the global {resource} must be at least 1, not {units}")
        if ttl <= 0:
            raise ValueError(f"the lease TTL must be positive, not {ttl}")
        self.gate = gate
        self.dsn = dsn
        self.budgets = dict(budgets)
        self.ttl = ttl
        self.period = period if period is not None else ttl / 5
        self.fallback_given = fallback
        host = socket.gethostname()
        self.host = host
        self.name = name or f"{host}:{os.getpid()}:{secrets.token_hex(3)}"
        # per resource: units held (the row, as last committed), the fair share at the last
        # heartbeat, the units left free in the pool after it
        self.held_by = dict.fromkeys(self.budgets, 0)
        self.target_by: dict[str, int | None] = dict.fromkeys(self.budgets)
        self.free_by = dict.fromkeys(self.budgets, 0)
        self.proxies = 1  # live proxies seen at the last heartbeat
        self.state = "starting"  # ok | unreachable | fallback
        self.last_ok: float | None = None  # loop time of the last committed heartbeat
        self.deadline: float | None = None  # when this proxy's lease may have expired
        self.heartbeats = 0
        self.failures = 0
        self.last_error = ""
        self._conn: Any = None
        self._listen: Any = None
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._inflight: asyncio.Future[None] | None = None  # the heartbeat under way
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._last_start = float("-inf")  # loop time the last heartbeat began
        self._registered = False  # the budgets written (once per process)
        self._others_short = False  # at the last heartbeat, another proxy wanted more units
        # per resource and tenant, its demand at the last heartbeats (newest last)
        self._recent: dict[str, dict[tuple[str, bool], list[int]]] = {r: {} for r in self.budgets}
        self.claims: dict[str, dict[str, Claim]] = {r: {} for r in self.budgets}  # last sent
        self._leaving: dict[str, int] = {}  # in service when stopped: kept a TTL at leaving
        gate.coordinator = self

    # the MPL's lease, which /status, /metrics and the dashboard show first

    @property
    def budget(self) -> int:
        return self.budgets["mpl"]

    @property
    def held(self) -> int:
        return self.held_by["mpl"]

    @property
    def target(self) -> int | None:
        return self.target_by["mpl"]

    @property
    def free(self) -> int:
        return self.free_by["mpl"]

    # -- the proxy's side ------------------------------------------------------------------

    def start(self) -> None:
        self._apply(dict.fromkeys(self.budgets, 0))  # nothing admitted before the first lease
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="coordinator")
        self._task.add_done_callback(self._died)
        self._listener = loop.create_task(self._listen_loop(), name="coordinator-listen")
        self._watch = loop.create_task(self._watch_loop(), name="coordinator-watch")

    def stop(self) -> None:
        """Stop renewing and admitting. Called before the server closes its clients
        (``proxy.app.serve``): what is in service now is what the database may still be
        running after they are closed, which ``aclose`` keeps leased for one TTL rather than
        give to another proxy at once."""
        if not self._stopping:
            self._leaving = {r: n for r, n in self._in_use().items() if n > 0}
            self._apply(dict.fromkeys(self.budgets, 0))  # nothing admitted into what goes back
        self._stopping = True
        for task in (self._task, self._listener, self._watch):
            if task is not None:
                task.cancel()
        if self._expiry is not None:
            self._expiry.cancel()

    async def aclose(self) -> None:
        """After ``stop``: give the units back, all but those of the statements in service
        then (the proxy awaits it on shutdown, before it closes its clients)."""
        for task in (self._task, self._listener, self._watch):
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task
        if self._inflight is not None and not self._inflight.done():
            # a heartbeat still under way would write the rows again after they are deleted
            await asyncio.wait({self._inflight}, timeout=self.ttl)
        await self._leave()

    def _arm_expiry(self, deadline: float) -> None:
        """At ``deadline`` without a newer heartbeat, the lease may be gone: the fallback
        budget then, whatever the heartbeat under way is doing."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = asyncio.get_running_loop().call_at(deadline, self._expired, deadline)

    def _fall_back(self) -> None:
        self.state = "fallback"
        self.gate.scheduler.set_tenant_weights(None)  # alone again: the configured weights
        self.held_by = self.fallbacks  # what it runs on, and registers when back
        self._apply(self.fallbacks)

    def _expired(self, deadline: float) -> None:
        if self._stopping or self.deadline != deadline:
            return
        if self.state != "fallback":
            log.warning(
                "no heartbeat for a lease's life (%s): on the fallback budget of %d statements",
                self.last_error or "the coordinator is slow",
                self.fallback,
            )
        self._fall_back()

    def _died(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        error = task.exception()
        if error is not None:  # a bug: never leave the proxy on a lease nobody renews
            log.error("the coordinator's heartbeat stopped: %r; on the fallback budget", error)
            self._fall_back()

    async def _watch_loop(self) -> None:
        """Every WATCH seconds, two looks at a few numbers (nothing on the statements' own
        path), each of which asks for a heartbeat now rather than at the next period:
        statements queue while the local MPL is full and the pool had units free at the
        last heartbeat; or this proxy holds units it no longer uses
        (its limit was lowered to its share and the statements over it have finished) while
        another proxy is short — give them back at once, not up to a period later. (Threads
        and memory follow at the heartbeats.) A proxy under its fair share while no unit is
        free does not ask again and again: the units it waits for are still in other proxies'
        hands until their own heartbeats give them back, and those send NOTIFY, which wakes
        its heartbeat (every 20 ms it asked before: 15–20 heartbeats a second among three
        saturated proxies, each a transaction under the lock, for units that were not there)."""
        scheduler = self.gate.scheduler
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH)
            if self.state not in ("ok", "starting") or self._kick.is_set():
                continue
            if loop.time() - self._last_start < KICK_GAP:
                continue
            mpl = scheduler.limits.mpl
            if mpl is None:
                continue
            running = scheduler.running
            wants = (
                scheduler.queued
                and running >= mpl >= self.held  # none kept for statements over it
                and (self.free > 0 or self.state == "starting")
            )
            idle = self._others_short and self.held > max(running, mpl)
            if wants or idle:
                self._kick.set()

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows under ``coordinator``: the MPL's lease, and every shared
        resource's under ``shared``."""
        loop = asyncio.get_event_loop()
        limits = self.gate.scheduler.limits
        return {
            "proxy": self.name,
            "state": self.state,
            "global_mpl": self.budget,
            "held": self.held,
            "local_mpl": limits.mpl,
            "fair_share": self.target,
            "free": self.free,
            "shared": {
                r: {
                    "global": self.budgets[r],
                    "held": self.held_by[r],
                    "local": getattr(limits, r),
                    "fair_share": self.target_by[r],
                    "free": self.free_by[r],
                    "unit": UNITS[r],
                }
                for r in self.budgets
            },
            # the demand this proxy reported, by workload class, at its last heartbeat
            "tenants": {
                n: {"demand": c.demand, "weight": c.weight, "background": c.background}
                for n, c in self.claims.get("mpl", {}).items()
            },
            "proxies": self.proxies,
            "ttl": self.ttl,
            "heartbeats": self.heartbeats,
            "failures": self.failures,
            "last_error": self.last_error or None,
            "seconds_since_heartbeat": None
            if self.last_ok is None
            else round(loop.time() - self.last_ok, 3),
            "fallback_mpl": self.fallback,
        }

    @property
    def fallback(self) -> int:
        """The local MPL once the lease may have expired without the coordinator."""
        if self.fallback_given is not None:
            return self.fallback_given
        return max(1, self.budget // max(1, self.proxies))

    @property
    def fallbacks(self) -> dict[str, int]:
        """Every shared resource's local budget once cut off: the fallback MPL, and the
        others' budgets divided by the proxies last seen."""
        out = {r: max(1, units // max(1, self.proxies)) for r, units in self.budgets.items()}
        out["mpl"] = self.fallback
        return out

    def _apply(self, local: dict[str, int]) -> None:
        """The scheduler's limits from what this proxy may use of each shared resource; none
        of one (a thread or memory budget of 0, which Limits cannot hold) admits nothing."""
        limits = self.gate.scheduler.limits
        threads, memory = limits.threads, limits.memory
        none_left = any(local.get(r, 1) <= 0 for r in ("threads", "memory"))
        if "threads" in local:
            threads = max(1, local["threads"])
        if "memory" in local:
            memory = max(1, local["memory"])
        mpl = 0 if none_left else local["mpl"]
        if (limits.mpl, limits.threads, limits.memory) != (mpl, threads, memory):
            self.gate.set_limits(
                dataclasses.replace(limits, mpl=mpl, threads=threads, memory=memory)
            )

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            # cleared before, not after: a NOTIFY that comes while this heartbeat is under way
            # (units another proxy gave back after it read the rows) asks for the next one
            self._kick.clear()
            try:
                await self._bounded(self._heartbeat(), self.ttl / 2)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # unreachable, restarting, a partition, a broken row
                await self._lost(e)
                if self.deadline is not None and loop.time() >= self.deadline:
                    self._expired(self.deadline)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self.period)

    async def _bounded(self, work: Any, timeout: float) -> None:
        """``work`` with a deadline that holds even when the coordinator went silent mid-way:
        a cancelled psycopg operation waits for its connection (a rollback over a partition
        never returns), so on the deadline the connection's socket is shut down under it,
        which ends any wait on it at once."""
        task = self._inflight = asyncio.ensure_future(work)
        # (its failure is read here or raised below as the deadline's: never "not retrieved")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if task in done:
            task.result()
            return
        conn = self._conn
        if conn is not None:
            with (
                contextlib.suppress(Exception),
                socket.socket(fileno=os.dup(conn.fileno())) as sock,
            ):
                sock.shutdown(socket.SHUT_RDWR)
            # the call under way fails on its own now; cancelling it first would make psycopg
            # send a CancelRequest — over the same partition, on a new connection it waits for
            await asyncio.wait({task}, timeout=SHUT_GRACE)
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)  # it ends now; if not, it is left behind
        raise TimeoutError(f"no answer from the coordinator within {timeout:g} s")

    async def _lost(self, error: BaseException) -> None:
        self.failures += 1
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if self.state == "ok":
            log.warning("coordinator heartbeat failed: %s", text)
        if self.state in ("ok", "starting"):
            self.state = "unreachable"
        self.last_error = text
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), timeout=0.5)

    def _options(self) -> str:
        """Server settings of the coordinator's sessions: a heartbeat's transaction holds the
        lock every proxy's heartbeat takes, so a proxy cut off in the middle of one must not
        hold it for long — the server ends a transaction left idle, a wait for the lock and
        a statement after TTL/2 (the other proxies wait at most that, not TCP's minutes)."""
        ms = max(100, int(self.ttl * 500))
        return (
            f"-c idle_in_transaction_session_timeout={ms} -c lock_timeout={ms} "
            f"-c statement_timeout={ms}"
        )

    async def _connect(self) -> Any:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=max(1, int(self.ttl / 2)),
            application_name=APPLICATION,
            options=self._options(),
        )
        # in reach of the heartbeat's deadline (which shuts its socket down) and of ``_lost``
        # (which closes it) from now on: a registration that fails or times out leaves no
        # connection behind
        self._conn = conn
        async with conn.transaction():
            await conn.execute("select pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            await conn.execute(_SCHEMA)
            # a table made by an earlier version has no ``tenants``: added once (looked up
            # first: ALTER TABLE takes the table's strongest lock even when it changes
            # nothing, and needs its owner)
            cur = await conn.execute(
                "select 1 from pg_attribute where attrelid = 'admission_leases'::regclass "
                "and attname = 'tenants' and not attisdropped"
            )
            if await cur.fetchone() is None:
                await conn.execute(
                    "alter table admission_leases "
                    "add column if not exists tenants jsonb not null default '{}'"
                )
            if self._registered:  # a reconnect: the budgets are what the table says
                return conn
            for resource, units in self.budgets.items():
                cur = await conn.execute(
                    "select units from admission_budget where name = %s", (resource,)
                )
                row = await cur.fetchone()
                if row is not None and row[0] != units:
                    log.warning(
                        "the global %s was %d; this proxy's %d replaces it for all",
                        resource,
                        row[0],
                        units,
                    )
                await conn.execute(
                    "insert into admission_budget (name, units) values (%s, %s) "
                    "on conflict (name) do update set units = excluded.units",
                    (resource, units),
                )
        self._registered = True
        return conn

    def _in_use(self) -> dict[str, int]:
        """Per shared resource: what the statements in service hold."""
        scheduler = self.gate.scheduler
        in_use = {
            "mpl": scheduler.running,
            "threads": scheduler.threads_in_use,
            "memory": scheduler.memory_in_use,
        }
        return {r: in_use[r] for r in self.budgets}

    def _claims(self) -> dict[str, dict[str, Claim]]:
        """Per shared resource and tenant: what its statements in service hold and its queued
        ones would take, the largest of the last DEMAND_MEMORY heartbeats' — the demand of
        one instant understates a closed loop's (a client between two statements), so units
        are given back only when unused that long."""
        load = self.gate.scheduler.tenant_load()
        weights = {k: v[0] for k, v in load.items()}
        claims: dict[str, dict[str, Claim]] = {}
        for i, r in enumerate(("mpl", "threads", "memory")):
            if r not in self.budgets:
                continue
            recent = self._recent[r]
            for key in load.keys() | recent.keys():
                now = int(load[key][1 + i]) if key in load else 0
                recent[key] = [*recent.get(key, [])[-(DEMAND_MEMORY - 1) :], now]
                if not any(recent[key]):
                    del recent[key]
            claims[r] = {
                f"{name}/background" if bg else name: Claim(
                    max(history), weights.get((name, bg), self._weight(name)), bg
                )
                for (name, bg), history in recent.items()
            }
        return claims

    def _weight(self, tenant: str) -> float:
        """A tenant's weight when none of its statements is live (it is remembered for its
        recent demand): the workload config's."""
        config = self.gate.scheduler.workloads
        if config is None:
            return 1.0
        try:
            return float(config.workload(tenant).weight)
        except KeyError:
            return 1.0

    async def _heartbeat(self) -> None:
        from psycopg import AsyncClientCursor

        loop = asyncio.get_running_loop()
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        limits = self.gate.scheduler.limits
        self._last_start = loop.time()
        in_use = self._in_use()
        claims = self._claims()
        limit: dict[str, int] = {}
        keep: dict[str, int] = {}
        demand: dict[str, int] = {}
        for r in self.budgets:
            demand[r] = sum(c.demand for c in claims[r].values())
            limit[r], keep[r] = release(self.held_by[r], in_use[r], demand[r], self.target_by[r])
        if any(limit[r] < (getattr(limits, r) or 0) for r in self.budgets):
            # lowered before the rows are
            self._apply({r: min(limit[r], getattr(limits, r) or 0) for r in self.budgets})
        sent = loop.time()
        conn = self._conn
        grants = {}
        split: dict[str, int] | None = None  # this proxy's statements by tenant, as split
        # two round trips, each one simple Query of several statements (bound on this side):
        # the lock and the reads; then the rows written, the NOTIFY and the COMMIT. A Query
        # reaches the server whole or not at all, and between the two the server's
        # idle_in_transaction_session_timeout runs — so a proxy cut off mid-heartbeat holds
        # the lock at most TTL/2 (pipelined extended-protocol messages left the server waiting
        # for a Sync, under no timeout, with the lock held). One statement at a time it took
        # nine round trips, each a wake-up of this loop and of a backend.
        cur = AsyncClientCursor(conn)
        await cur.execute(
            # read committed whatever the server's default: each read after the lock must see
            # the commit of the heartbeat that held it before
            "begin isolation level read committed; "
            "select pg_advisory_xact_lock(%s); "
            "delete from admission_leases where expires < now(); "
            "select name, units, extract(epoch from now())::float8 from admission_budget; "
            "select proxy, resource, held, demand, tenants from admission_leases "
            "where proxy <> %s",
            (LOCK_KEY, self.name),
        )
        for _ in range(2):  # BEGIN's, the lock's
            cur.nextset()
        dead = cur.rowcount
        cur.nextset()
        budget_rows = await cur.fetchall()
        cur.nextset()
        others = await cur.fetchall()
        budgets = {str(n): int(u) for n, u, _now in budget_rows if str(n) in self.budgets}
        now = float(budget_rows[0][2]) if budget_rows else 0.0
        short = any(int(d) > int(h) for _p, _r, h, d, _t in others)  # someone waits
        writes: list[str] = []
        params: list[Any] = []
        for r in self.budgets:
            budget = budgets.get(r, self.budgets[r])
            rows = [(str(p), int(h), int(d), t) for p, res, h, d, t in others if res == r]
            # fair shares of the tenants' demands, then slack from what is left: while the
            # budget has room every proxy keeps a little beyond its demand (an arrival finds
            # a unit here)
            demands = {p: _claims_of(d, t) for p, _h, d, t in rows}
            demands[self.name] = claims[r]
            by_tenant = tenant_split(budget, demands, int(now / ROTATE))
            targets = shares_with_slack(budget, demands, int(now / ROTATE), by_tenant)
            if r == "mpl" and self.gate.scheduler.workloads is not None:
                split = by_tenant[self.name]
            grants[r] = grow(
                budget, keep[r], sum(h for _p, h, _d, _t in rows), demand[r], targets[self.name]
            )
            self.budgets[r] = budget
            writes.append(
                "insert into admission_leases (proxy, resource, held, demand, expires, host, "
                "tenants) values (%s, %s, %s, %s, now() + make_interval(secs => %s), %s, %s) "
                "on conflict (proxy, resource) do update set held = excluded.held, "
                "demand = excluded.demand, expires = excluded.expires, "
                "tenants = excluded.tenants"
            )
            params += [self.name, r, grants[r].held, demand[r], self.ttl, self.host]
            params.append(
                json.dumps({n: [c.demand, c.weight, c.background] for n, c in claims[r].items()})
            )
        released = any(grants[r].held < self.held_by[r] for r in self.budgets)
        if short and (dead or released):
            writes.append(f"notify {CHANNEL}")
        writes.append("commit")
        await cur.execute("; ".join(writes), params)
        self._others_short = short
        if self.state != "ok" and self.state != "starting":
            log.warning(
                "coordinator reachable again: holding %d of %d statements",
                grants["mpl"].held,
                self.budgets["mpl"],
            )
        self.state = "ok"
        self.held_by = {r: g.held for r, g in grants.items()}
        self.target_by = {r: g.target for r, g in grants.items()}
        self.free_by = {r: g.free for r, g in grants.items()}
        self.proxies = len({p for p, *_ in others}) + 1
        self.claims = claims
        if split is not None:
            self.gate.scheduler.set_tenant_weights(drr_weights(split, claims["mpl"]))
        self.last_ok = sent
        self.deadline = sent + self.ttl
        self.heartbeats += 1
        # raised after the rows are, by the units taken (units kept for statements still in
        # service beyond the limit are not admitted against: they come back as those finish);
        # over a budget (free < 0: back from a partition, a lapsed lease) nothing more is
        # admitted until enough of this proxy's statements finished
        local = {}
        for r, g in grants.items():
            local[r] = limit[r] + g.held - keep[r]
            if g.free < 0:
                local[r] = max(0, min(local[r], keep[r] + g.free))
        self._apply(local)
        self._arm_expiry(self.deadline)

    async def _listen_loop(self) -> None:
        """LISTEN on a connection of its own: another proxy gave units back, heartbeat now."""
        import psycopg

        while not self._stopping:
            try:
                self._listen = await psycopg.AsyncConnection.connect(
                    self.dsn,
                    autocommit=True,
                    connect_timeout=max(1, int(self.ttl / 2)),
                    application_name=APPLICATION,
                    # an idle LISTEN over a partition would otherwise wait for TCP's minutes:
                    # the kernel probes it after a TTL and gives up after three missed probes
                    keepalives=1,
                    keepalives_idle=max(1, int(self.ttl)),
                    keepalives_interval=1,
                    keepalives_count=3,
                )
                await self._listen.execute(f"listen {CHANNEL}")
                async for _note in self._listen.notifies():
                    self._kick.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # the heartbeat reports the coordinator's state; retry quietly
                pass
            finally:
                conn, self._listen = self._listen, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), timeout=0.5)
            await asyncio.sleep(self.period)

    async def _leave(self) -> None:
        """Give the units back at shutdown (best effort: the lease expires anyway) — all but
        those of the statements in service when the proxy stopped: their clients are gone and
        their cancels sent, but the database may run them a little longer, so those units
        stay leased for one TTL (the bound a killed proxy has too)."""
        if self._conn is None:
            return
        keep = self._leaving
        ttl = timedelta(seconds=self.ttl)

        async def leave() -> None:
            conn = self._conn
            async with conn.transaction():
                await conn.execute(
                    "delete from admission_leases where proxy = %s and not resource = any(%s)",
                    (self.name, list(keep)),
                )
                for resource, units in keep.items():
                    await conn.execute(
                        "update admission_leases set held = least(held, %s), demand = 0, "
                        "expires = now() + %s where proxy = %s and resource = %s",
                        (units, ttl, self.name, resource),
                    )
            await conn.execute(f"notify {CHANNEL}")

        try:
            await self._bounded(leave(), 1.0)
        except Exception:
            pass
        finally:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), timeout=0.5)


def drr_weights(split: dict[str, int], claims: dict[str, Claim]) -> dict[str, float]:
    """This proxy's DRR weights from its units by tenant as the global split counted them:
    in the units' proportions, scaled to the sum of the tenants' configured weights (the
    DRR's quantum is a weight's worth of statements: raw unit counts would let a tenant
    keep its turn for dozens of statements, and would dwarf the configured weight of a
    tenant that arrives before the next heartbeat). A tenant given no unit here gets a
    twentieth of the least weight given: it runs when the others have nothing queued."""
    units: dict[str, int] = {}
    configured: dict[str, float] = {}
    for name, n in sorted(split.items(), key=lambda kv: claims[kv[0]].background):
        tenant = name.removesuffix("/background") if claims[name].background else name
        if tenant not in units:  # its foreground units when it has both
            units[tenant], configured[tenant] = n, claims[name].weight
    total = sum(units.values())
    if total == 0:
        return {}  # nothing given here: the configured weights
    scale = sum(configured.values()) / total
    given = {t: n * scale for t, n in units.items() if n > 0}
    least = min(given.values())
    return {t: given.get(t, IDLE_WEIGHT * least) for t in units}


def _claims_of(demand: int, tenants: Any) -> dict[str, Claim] | int:
    """Another proxy's row: its demand by tenant (the ``tenants`` column: name → [demand,
    weight, background]), or, from a row that has none, its demand as one tenant's."""
    if not isinstance(tenants, dict) or not tenants:
        return demand
    try:
        return {
            str(n): Claim(max(0, int(v[0])), min(1e6, max(1e-6, float(v[1]))), v[2] is True)
            for n, v in tenants.items()
        }
    except (TypeError, ValueError, LookupError, OverflowError):
        return demand  # written by something else: its total still counts
