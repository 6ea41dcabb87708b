"""The asyncio shell around ``ProxySession``: accept clients, pump bytes, await grants.

Each client connection gets one backend connection (session mode: the proxy pools nothing, so
session state, prepared statements, LISTEN and temporary tables behave exactly as with a direct
connection). Bytes go through the session state machine; the actions it returns are carried
out here. Flow control is end to end: when one side's write buffer fills, the other side's
reading pauses, so a 100 MB result streams through a bounded buffer.

**Work-memory grants** (``work_mem_grant``, ``serve --grant-work-mem SIZE``): each statement
the gate admits runs with its share of SIZE (``admission.grants``) as its work_mem: the
session (``ProxySession.granted``) sends the proxy's ``SET work_mem`` ahead of it in the same
write when the share changed and the server owes the session nothing, and cuts its replies from
what the client hears; a session that sets work_mem itself is left alone. With grants on, every
statement takes the general path (the fast path forwards before it is admitted).

A CancelRequest arrives on a connection of its own with the backend key the client was given
(the server's real key, relayed untouched): if the target's statement is still queued here it
is withdrawn and its client gets SQLSTATE 57014; otherwise the request goes to the server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import secrets
import ssl
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote, urlsplit

from admission.classify import QueryClass
from admission.grants import default_units, grant_setting, work_mem_grant
from admission.model import EtaModel
from proxy.contention import ContentionGate
from proxy.gate import AdmissionGate
from proxy.pool import (
    RESETS_ALL,
    Link,
    Pool,
    Pools,
    Statements,
    client_settings,
    may_set,
    pooling_refusal,
)
from proxy.wire import protocol as pg
from proxy.wire.framing import DEFAULT_MAX_MESSAGE
from proxy.wire.session import (
    Action,
    Close,
    ConnectServer,
    ForwardCancel,
    ProxySession,
    Release,
    SendToClient,
    SendToServer,
    StartTLS,
    State,
    Submit,
    fast_client,
    fast_server,
)

__all__ = [
    "STARTUP_TIMEOUT",
    "BackendAddress",
    "ProxyServer",
    "Tuner",
    "parse_backend",
    "startup_expired",
    "url_identity",
]


if TYPE_CHECKING:
    from proxy.autompl import AutoMpl
    from proxy.learning import LiveModel

log = logging.getLogger("admission.proxy")


@dataclass(frozen=True, slots=True)
class BackendAddress:
    host: str  # a directory for a Unix socket
    port: int

    @property
    def is_unix(self) -> bool:
        return self.host.startswith("/")

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_backend(url: str) -> BackendAddress:
    """``postgresql://host:port[/db]`` (the database and user come from each client)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"backend must be a postgresql://HOST:PORT URL, not {url!r}")
    host = unquote(parts.hostname or "") if parts.hostname else ""
    if not host and "host=" in parts.query:
        host = unquote(parts.query.split("host=", 1)[1].split("&", 1)[0])
    try:
        port = parts.port or 5432
    except ValueError:
        raise ValueError(f"backend URL {url!r} has an invalid port") from None
    return BackendAddress(host or "127.0.0.1", port)


def url_identity(url: str) -> tuple[str, str]:
    """The user and database a ``postgresql://`` URL names (libpq's defaults otherwise), for
    clients that reach the same database through the proxy."""
    import os

    parts = urlsplit(url)
    query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    user = unquote(parts.username or query.get("user", "")) or os.environ.get("PGUSER") or ""
    user = user or os.environ.get("USER") or "postgres"
    dbname = unquote(parts.path.lstrip("/")) or query.get("dbname") or user
    return user, dbname


def _drop(data: bytes) -> None:
    pass


_TERMINATE = pg.message(b"X")
_FLUSH = pg.message(b"H")
# transaction mode: a login the database let in without a password is answered by the proxy
# for this long after (ClientConnection._login_from_cache)
TRUST_TTL = 60.0
_PLAIN_LOGIN = frozenset(("user", "database", "application_name", "client_encoding"))


def _cacheable(parameters: Mapping[str, str]) -> bool:
    """A startup packet that asks for no settings beyond these (what the cache can answer)."""
    return all(name.lower() in _PLAIN_LOGIN for name in parameters)


def _login_key(parameters: Mapping[str, str]) -> tuple[str, str, str]:
    user = parameters.get("user", "")
    encoding = parameters.get("client_encoding", "").upper().replace("-", "").replace("_", "")
    return user, parameters.get("database") or user, encoding


def _trusted_login(replies: bytes) -> dict[str, str] | None:
    """The ParameterStatus of a login the server answered with AuthenticationOk alone (no
    password asked), up to its ReadyForQuery; None if it asked for anything."""
    parameters: dict[str, str] = {}
    pos = 0
    while len(replies) - pos >= 5:
        kind = replies[pos]
        end = pos + 1 + int.from_bytes(replies[pos + 1 : pos + 5], "big")
        body = replies[pos + 5 : end]
        if kind == pg.AUTHENTICATION and body[:4] != b"\0\0\0\0":
            return None
        if kind == ord("S"):
            name, _, value = body.rstrip(b"\0").partition(b"\0")
            parameters[name.decode()] = value.decode("utf-8", "replace")
        elif kind == pg.READY_FOR_QUERY:
            return parameters
        elif kind == pg.ERROR_RESPONSE:
            return None
        pos = end
    return None


class CancelTarget(Protocol):
    """A client connection a CancelRequest can name (by the backend key it was given)."""

    def cancel(self) -> asyncio.Future[None] | None:
        """Withdraw the queued statement, or stop the running one; what is still on its way to
        the server (a forwarded CancelRequest), if anything."""


# A client has this long from connecting to being ready for queries (PostgreSQL's
# authentication_timeout): idle or stalled connections in startup cannot pile up.
STARTUP_TIMEOUT = 60.0
# A client's bytes held while its statements wait for admission (pipelined behind a queued
# one); beyond it the proxy stops reading that client until it is admitted.
HOLD_LIMIT = 1 << 20
# All clients' bytes buffered in the proxy at once (messages arriving, statements held for
# admission, messages waiting to be handled). Over it, clients with something in flight are
# not read until it falls back under three quarters; one whose bytes are only a message still
# arriving — pausing it would free nothing — is refused once that message passes
# ARRIVING_LIMIT (53200), so that many slow senders of large messages cannot take it all.
MAX_BUFFERED = 256 << 20
ARRIVING_LIMIT = 64 << 10
# Clients waiting for a free accept slot: a burst of thousands of connects is queued by the
# kernel, not refused.
LISTEN_BACKLOG = 4096
# a statement that writes (the contention limit's test, on the SQL text: any of the statements
# a simple Query holds)
_WRITES = re.compile(
    r"(?:^|;)(?:\s|\(|/\*.*?\*/|--[^\n]*(?:\n|$))*"  # (comments, parentheses)
    r"(?:insert|update|delete|merge|copy|create|drop|alter|truncate|call|do|execute)\b"
    r"|^\s*with\b.*?\b(?:insert|update|delete)\b"  # (a CTE that writes)
    r"|\bfor\s+(?:no\s+key\s+)?update\b|\bfor\s+(?:key\s+)?share\b",  # (row locks)
    re.I | re.S,
)


def startup_expired(timeout: float) -> bytes:
    return pg.error_response(
        pg.SQLSTATE_PROTOCOL_VIOLATION,
        f"the connection's startup and authentication did not finish within {timeout:g} s",
        severity="FATAL",
    )


class Buffering(Protocol):
    """A connection whose buffered bytes a ``BufferBudget`` counts."""

    buffer_reported: int  # what it last reported (the budget's to change)

    def buffers_freed(self) -> None:
        """It was paused for the total, which has fallen: look again."""


class BufferBudget:
    """The bytes all clients of a front end have buffered in the proxy, against one limit.

    Each connection reports its own count whenever it may have changed (``report``); the total
    is the sum of the last reports. The connection decides what to do when the total is
    ``over`` (see MAX_BUFFERED); one it pauses for the total registers (``pause``) and is told
    (``buffers_freed``) once the total is back under three quarters of the limit.
    """

    def __init__(self, limit: int = MAX_BUFFERED) -> None:
        if limit < 1:
            raise ValueError(f"the buffer limit must be positive, not {limit}")
        self.limit = limit
        self.total = 0
        self.refused = 0  # connections refused with 53200
        self._paused: set[Buffering] = set()

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def report(self, who: Buffering, buffered: int) -> None:
        delta = buffered - who.buffer_reported
        if not delta:
            return
        who.buffer_reported = buffered
        self.total += delta
        if delta < 0 and self._paused and self.total <= self.limit * 3 // 4:
            paused, self._paused = self._paused, set()
            for other in paused:
                other.buffers_freed()

    def pause(self, who: Buffering) -> None:
        self._paused.add(who)

    def forget(self, who: Buffering) -> None:
        """The connection is gone: its bytes with it."""
        self._paused.discard(who)
        self.report(who, 0)


class Tuner(Protocol):
    """Something that keeps the proxy tuned while it serves, started and stopped with it on
    its event loop (the live model, the adaptive MPL, the live profile sampler)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Listener:
    """What every front end shares: a listening socket, its clients' protocol factory, and its
    clients by the backend key each was given, which a CancelRequest names."""

    _server: asyncio.Server | None = None
    gate: AdmissionGate
    by_key: Mapping[tuple[int, int], CancelTarget]
    buffers: BufferBudget
    startup_timeout: float = STARTUP_TIMEOUT
    learning: LiveModel | None = None  # the model kept current while serving (proxy.app)
    auto_mpl: AutoMpl | None = None  # the MPL tuned while serving (--mpl auto)
    extras: tuple[Tuner, ...] = ()  # more of the kind (ProxyConfig.extend)

    def tuners(self) -> list[Tuner]:
        """What keeps the proxy tuned while it serves, in the order to start them."""
        found: list[Tuner | None] = [self.learning, self.auto_mpl, *self.extras]
        return [t for t in found if t is not None]

    def protocol(self) -> asyncio.Protocol:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def start(self, host: str, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.protocol, host, port, backlog=LISTEN_BACKLOG)
        return self._server

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def cancel(self, pid: int, secret: int) -> asyncio.Future[None] | None:
        """A CancelRequest (``proxy.wire.frontend.CancelRequest``) for the client given this key;
        returns the forwarded request still on its way to the server, if any."""
        target = self.by_key.get((pid, secret))
        if target is None:
            log.info("cancel request for an unknown key ignored")
            return None
        return target.cancel()


class ProxyServer(Listener):
    """Listens for clients and connects each to the backend through the admission gate."""

    def __init__(
        self,
        gate: AdmissionGate,
        backend: BackendAddress,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
        max_buffered: int = MAX_BUFFERED,
    ) -> None:
        self.gate = gate
        self.backend = backend
        self.max_message = max_message
        self.buffers = BufferBudget(max_buffered)
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.connections: set[ClientConnection] = set()
        self.by_key: dict[tuple[int, int], ClientConnection] = {}
        # writing transactions in progress, limited while they abort on one another
        # (serve --contention, proxy.contention; None: no limit)
        self.contention: ContentionGate | None = None
        self._work_mem_grant: int | None = None
        self._units: tuple[EtaModel | None, dict[str, float], float] = (None, {}, 0.0)
        self._renice_failed = False
        # transaction pooling (proxy.pool; None: session mode, a server connection per client)
        self.pools: Pools | None = None
        self.max_client_conn: int | None = None  # clients at once, at most (None: no limit)
        self.clients_refused = 0
        # logins at once in transaction mode (each authenticates on a connection of its own)
        self._logins: asyncio.Semaphore | None = None
        # transaction mode: (user, database) the database let in without a password, when
        # (loop time) and with what parameters (see ClientConnection._login_from_cache)
        # (keyed by user, database and the client_encoding asked for, normalized; "": none)
        self.trusted: dict[tuple[str, str, str], tuple[float, dict[str, str]]] = {}
        self.logins_answered = 0  # logins the proxy answered from ``trusted``

    def pool_transactions(self, pools: Pools, logins: int = 32) -> None:
        """Serve in transaction pool mode (see proxy.pool) with these pools."""
        if self.work_mem_grant is not None:
            raise ValueError("work_mem grants need session pool mode (--pool-mode session)")
        self.pools = self.gate.pools = pools
        self._logins = asyncio.Semaphore(logins)

    def new_key(self) -> tuple[int, int]:
        """A backend key of the proxy's own for a pooled client (a CancelRequest names it)."""
        while True:
            key = (secrets.randbelow(1 << 31) | 1, secrets.randbelow(1 << 32))
            if key not in self.by_key:
                return key

    def prioritize(self, conn: ClientConnection, job: int) -> None:
        """Online over batch at the operating system: with ``[scheduler] renice = N`` in the
        workload classes, the backend process that runs an admitted batch or background
        statement runs at niceness N, one that runs an interactive statement at 0 (Linux's
        scheduler then gives an interactive statement the CPU a batch one would take beside
        it: the non-preemptive admission cannot). Called before the statement is sent; a
        system call only when the connection's niceness changes. It needs PostgreSQL on this
        host and the right to renice its processes (CAP_SYS_NICE, or root; lowering the
        niceness again needs it even for the owner): the first refusal is logged and the
        feature turned off. PostgreSQL's parallel workers are processes of their own and
        keep their niceness."""
        workloads = self.gate.scheduler.workloads
        if workloads is None or workloads.renice is None or self._renice_failed or conn.pooled:
            return
        pid = conn.backend_pid
        record = self.gate.scheduler.job(job)
        if pid is None or record is None:
            return
        want = workloads.renice if record.lane.tier >= 1 else 0
        if conn.nice == want:
            return
        try:
            os.setpriority(os.PRIO_PROCESS, pid, want)
        except OSError as e:
            self._renice_failed = True
            log.warning(
                "cannot renice PostgreSQL backend %s (%s): batch statements run at the "
                "backends' own priority from now on",
                pid,
                e,
            )
            return
        conn.nice = want

    def protocol(self) -> ClientConnection:
        return ClientConnection(self)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        cancels = [
            task
            for conn in list(self.connections)
            if (task := conn.shutdown("the proxy is shutting down")) is not None
        ]
        if self.pools is not None:
            self.pools.close()
        if cancels:  # the statements left running stopped on the server before the proxy goes
            _done, late = await asyncio.wait(cancels, timeout=self.connect_timeout)
            for task in late:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def work_mem_grant(self) -> int | None:
        """Bytes of work memory granted to the statements admitted, in total (see the module
        docstring); None: no grants. Set at any time: the sessions open then follow (a
        session keeps the last grant it had when grants are switched off)."""
        return self._work_mem_grant

    @work_mem_grant.setter
    def work_mem_grant(self, total: int | None) -> None:
        self._work_mem_grant = self.gate.work_mem_grant = total
        for connection in self.connections:
            connection.session.watch_settings = total is not None

    def grant(self, job: int) -> bytes | None:
        """The statement that gives admitted ``job`` its work-memory grant (None: no grant)."""
        total = self.work_mem_grant
        if total is None:
            return None
        scheduler = self.gate.scheduler
        record = scheduler.job(job)
        if record is None or record.bypass:
            return None
        model = scheduler.model
        cached, units, fallback = self._units
        if cached is not model:  # (each model's units, looked up once)
            units = {
                c.fingerprint: c.work_mem_units
                for c in model.classes
                if c.work_mem_units is not None and c.work_mem_units > 0
            }
            fallback = default_units(units.values())
            self._units = (model, units, fallback)
        work_mem = work_mem_grant(
            total, scheduler.limits, record.held, units.get(record.fingerprint, fallback)
        )
        return None if work_mem is None else grant_setting(work_mem)

    async def open_backend(
        self, protocol_factory: Callable[[], asyncio.Protocol]
    ) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        b = self.backend
        if b.is_unix:
            path = f"{b.host}/.s.PGSQL.{b.port}"
            coro = loop.create_unix_connection(protocol_factory, path)
        else:
            coro = loop.create_connection(protocol_factory, b.host, b.port)
        transport, _ = await asyncio.wait_for(coro, self.connect_timeout)
        return transport

    async def _forward_cancel(self, pid: int, secret: int, wait: bool = False) -> None:
        """Send a CancelRequest; with ``wait``, return once the server has taken it (it closes
        the connection when it has signalled the process), or after the connect timeout."""
        packet = struct.pack("!IIII", 16, pg.CANCEL_REQUEST_CODE, pid, secret)
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            transport = await self.open_backend(lambda: _CancelSent(closed))
        except (TimeoutError, OSError) as e:
            log.warning("could not forward a cancel request to %s: %s", self.backend, e)
            return
        transport.write(packet)
        try:
            if wait:
                await asyncio.wait_for(closed, self.connect_timeout)
        except TimeoutError:
            log.warning(
                "a cancel request sent to %s was not answered in %g s: its server connection "
                "goes back to the pool anyway",
                self.backend,
                self.connect_timeout,
            )
        finally:
            transport.close()


def _close_transport(transport: asyncio.BaseTransport, _done: object) -> None:
    transport.close()


class _CancelSent(asyncio.Protocol):
    """A CancelRequest's connection: ``closed`` is done when the server closes it."""

    def __init__(self, closed: asyncio.Future[None]) -> None:
        self.closed = closed

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class _Backend(asyncio.Protocol):
    def __init__(self, owner: ClientConnection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        # the server's bytes go straight to the owner (one call less for every reply)
        self.data_received = owner.from_server  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.owner.from_server(data)

    def retire(self) -> None:
        """Its client no longer reads it (a pooled client's login connection, closed)."""
        self.retired = True
        self.data_received = _drop  # type: ignore[method-assign]
        if self.transport is not None:
            self.transport.write(pg.message(b"X"))
            self.transport.close()

    retired = False

    def connection_lost(self, exc: Exception | None) -> None:
        owner = self.owner
        if self.retired:
            self.__dict__.pop("data_received", None)
            return
        owner.backend_lost(exc)
        # no reference cycle left behind: a closed connection is freed when its last reference
        # goes, not at the next garbage collection
        if owner.backend is self:
            owner.backend = None
        self.__dict__.pop("data_received", None)

    def pause_writing(self) -> None:
        self.owner.pause_client_reading()

    def resume_writing(self) -> None:
        self.owner.resume_client_reading()


class ClientConnection(asyncio.Protocol):
    # the session's fast path, in C when built (see proxy.wire.session.fast_client)
    _fast_client = staticmethod(fast_client)
    _fast_server = staticmethod(fast_server)

    # (slots: an idle client costs ~1.2 kB less than with a __dict__)
    __slots__ = (
        "__weakref__",
        "_backend_full",
        "_capture",
        "_capturing",
        "_client_full",
        "_closed",
        "_early",
        "_finished",
        "_forwarding",
        "_holding",
        "_key",
        "_login",
        "_login_replies",
        "_parked",
        "_pending",
        "_pool",
        "_reading_paused",
        "_refused",
        "_resets",
        "_server_paused",
        "_server_write",
        "_sets",
        "_startup_timer",
        "_terminating",
        "_to_server",
        "_tx_aborted",
        "_tx_starter",
        "_txn_job",
        "_waiting_link",
        "backend",
        "buffer_reported",
        "link",
        "nice",
        "parameters",
        "pooled",
        "server",
        "session",
        "settings",
        "statements",
        "transport",
    )

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.session = ProxySession(
            tls_available=server.tls is not None,
            max_message=server.max_message,
            job_ids=server.gate.job_ids,
        )
        self.session.watch_settings = server.work_mem_grant is not None
        self.transport: asyncio.Transport | None = None
        self.backend: _Backend | None = None
        self._to_server: list[bytes] | None = None  # held while the backend connects
        # bytes for the server go here: dropped before a backend is asked for, held while it
        # connects, then the backend transport's own write
        self._server_write: Callable[[bytes], None] = _drop
        self._closed = False
        self._forwarding: asyncio.Future[None] | None = None  # a cancel on its way (ForwardCancel)
        self._key: tuple[int, int] | None = None
        self._reading_paused = False
        self.parameters: dict[str, str] = {}  # the startup message's (workload classes match)
        self.nice = 0  # the niceness its backend process was given (ProxyServer.prioritize)
        self._backend_full = False  # the server's socket takes no more: stop reading
        self._holding = False  # too much of the client's waits for admission: stop reading
        self.buffer_reported = 0  # its bytes in server.buffers
        self._refused = False  # closed for the total: its bytes no longer count
        self._startup_timer: asyncio.TimerHandle | None = None
        # bytes decrypted before ``start_tls`` returned the TLS transport to answer them on
        self._early: list[bytes] | None = None
        # the contention limit (serve --contention, proxy.contention): a statement held for a
        # place (its job, class, bypass, SQL), the shape of its transaction's first statement,
        # whether a statement of it failed on a conflict
        self._parked: tuple[int, QueryClass, bool, str] | None = None
        self._tx_starter: str | None = None
        self._tx_aborted = False
        # transaction pooling (proxy.pool): the server connection held now, if any
        self.pooled = server.pools is not None
        self.link: Link | None = None
        if self.pooled:
            self._pool: Pool | None = None
            self._pending: list[bytes] = []  # bytes for a link still to come
            self._waiting_link = False
            self._txn_job: int | None = None  # the job a transaction keeps until it ends
            self._finished: list[int] = []  # jobs ended while it held a connection
            self._capture = False  # read the session's settings back when it ends
            self._capturing = False
            self._login = False  # holds one of the server's login slots
            self._login_replies: bytearray | None = None  # the server's, while logging in
            self._server_paused = False
            self._client_full = False  # the client's socket takes no more for now
            self._sets: set[int] = set()  # jobs that may change the session's settings
            self._resets = False  # one of them was a RESET ALL or DISCARD ALL
            self._terminating = False  # a Terminate came: close once the server is done
            self.statements = Statements()
            self.settings: dict[str, str] = {}
            self.session.admit_all = True
            self.session.key_override = server.new_key()

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend process serving this client (from BackendKeyData; pooled:
        the server connection it holds now)."""
        key = self.server_key
        return key[0] if key is not None else None

    @property
    def server_key(self) -> tuple[int, int] | None:
        """The key of the server process that runs this client's statements now."""
        if self.pooled:
            return self.link.key if self.link is not None else None
        return self.session.backend_key

    # -- client side -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        self._startup_timer = asyncio.get_running_loop().call_later(
            self.server.startup_timeout, self._startup_expired
        )

    def _startup_expired(self) -> None:
        """Still not ready for queries after the startup timeout: close, server side too."""
        self._startup_timer = None
        if self.session.state in (State.STARTUP, State.AUTH) and not self._closed:
            log.info("client closed: startup not finished in %g s", self.server.startup_timeout)
            self._apply([SendToClient(startup_expired(self.server.startup_timeout))])
            self._apply(self.session.client_lost())
            if not self._closed and self.transport is not None:
                self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._early.append(data)
            return
        session = self.session
        # (grants on: the general path, see the module docstring)
        submit = None if session.watch_settings else self._fast_client(session, data)
        if submit is None:
            self._apply(session.client_data(data))
            self._check_held()
            return
        job, query_class, bypass, sql = submit
        gate = self.server.gate
        if self.pooled:
            why = pooling_refusal(sql)
            if why is not None:
                session.fast_wait()
                self._apply(session.rejected(job, "0A000", why))
                return
            bypass = bypass and self.link is not None
            if may_set(sql):
                self._note_sets(job, sql)
        contention = self.server.contention
        if contention is not None and not self._place(job, query_class, bypass, sql):
            self._check_held()  # (held for a place, as a statement held for admission)
        elif gate.admits_at_once():
            # Admitted at once for certain: the database starts on it
            # while the gate does its bookkeeping (about 10 µs a statement at -c 1: README).
            session.fast_sent = True
            self._server_write(data)
            if not gate.admit(job, query_class, bypass, sql, self):  # a broken promise:
                log.warning("statement forwarded but not admitted at once; not counted")
                gate.release(job)  # run it uncounted rather than twice
            elif contention is not None and contention.holds(self):
                contention.touch(self, running=True)
        elif gate.admit(job, query_class, bypass, sql, self):
            if contention is not None and contention.holds(self):
                contention.touch(self, running=True)
            self.server.prioritize(self, job)
            session.fast_sent = True
            self._server_write(data)
        else:
            # it waits, still as the fast path's statement: admitted untouched, its bytes go
            # out as they came and its reply takes the fast path (``admitted``)
            self._check_held()  # what waits counts against the total like any held batch

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            self._cancel_orphan()
            self._apply(self.session.client_lost())
        self._teardown()

    def _cancel_orphan(self, stopping: bool = False) -> asyncio.Task[None] | None:
        """The client is going with a statement running on the server: nobody will read its
        result, so stop the work there too (PostgreSQL would run it to its end). The cancel's
        task, if one was sent. After a Terminate what the client sent runs on, as PostgreSQL
        would run it — unless the proxy is ``stopping``: its server connection goes with it,
        and a statement left running would hold a unit nobody accounts for any more."""
        key = self.server_key
        terminated = self.pooled and self._terminating and not stopping
        if not self.session.statement_running or key is None or terminated:
            return None
        return asyncio.get_running_loop().create_task(self.server._forward_cancel(*key))

    def pause_writing(self) -> None:
        if self.pooled:
            self._client_full = True
        if self.link is not None and self.link.transport is not None:
            self._server_paused = True
            self.link.transport.pause_reading()
        elif self.backend is not None and self.backend.transport is not None:
            self.backend.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.pooled:
            self._client_full = False
            self._server_paused = False
            if self.link is not None and self.link.transport is not None:
                self.link.transport.resume_reading()
        elif self.backend is not None and self.backend.transport is not None:
            self.backend.transport.resume_reading()

    def pause_client_reading(self) -> None:
        self._backend_full = True
        self._set_reading()

    def resume_client_reading(self) -> None:
        self._backend_full = False
        self._set_reading()

    def _check_held(self) -> None:
        """Stop reading a client that has more than HOLD_LIMIT bytes waiting for admission
        (pipelined statements behind a queued one), read it again below half of it; and the
        same while all clients' bytes are over the total (MAX_BUFFERED)."""
        if self._refused:
            return
        session = self.session
        buffered = session.buffered_bytes
        budget = self.server.buffers
        budget.report(self, buffered)
        held = session.held_bytes  # (what it is safe to stop reading it for)
        holding = held > HOLD_LIMIT or (self._holding and held > HOLD_LIMIT // 2)
        if buffered and budget.over:
            if held:
                holding = True  # its admission or statement's end, or the total falling,
                budget.pause(self)  # reads it again
            elif session.arriving_bytes > ARRIVING_LIMIT or buffered > budget.limit:
                # a large message still arriving, or more than the whole total from one
                # client with nothing in flight: pausing would never free it. (Complete small
                # messages of a pipeline not yet at its Sync are read on: it needs them.)
                self._refuse_buffered(buffered)
                return
        if holding != self._holding:
            self._holding = holding
            self._set_reading()

    def buffers_freed(self) -> None:
        if not self._closed:
            self._check_held()

    def _refuse_buffered(self, buffered: int) -> None:
        """All clients' buffers are over the total and this one is sending a large message
        with nothing in flight: pausing it would free nothing. Refuse it (53200) and close."""
        budget = self.server.buffers
        budget.refused += 1
        budget.forget(self)
        self._refused = True  # (what follows must not look at its buffers again)
        log.warning(
            "client refused: the proxy's buffers for all clients are over %d MB",
            budget.limit >> 20,
        )
        error = pg.error_response(
            pg.SQLSTATE_OUT_OF_MEMORY,
            f"out of memory: the proxy's buffers for all clients hold "
            f"{budget.total / 2**20:.0f} MB (limit {budget.limit / 2**20:.0f} MB); a message "
            f"of which {buffered} bytes had arrived was refused",
            severity="FATAL",
        )
        self._apply([SendToClient(error)])
        self._apply(self.session.client_lost())
        if not self._closed and self.transport is not None:
            self.transport.close()

    def _set_reading(self) -> None:
        paused = self._backend_full or self._holding
        if self.transport is not None and paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # -- server side -----------------------------------------------------------------------

    def from_server(self, data: bytes) -> None:
        contention = self.server.contention
        if contention is None:
            self._from_server(data)
            return
        holds = contention.holds(self)
        if holds and (b"C40001\0" in data or b"C40P01\0" in data):
            self._tx_aborted = True  # (an ErrorResponse's code: a conflict)
        self._from_server(data)
        if holds or self._tx_starter is not None:
            self._contended(contention)  # (nothing until the replies are all in)

    def _from_server(self, data: bytes) -> None:
        session = self.session
        done = self._fast_server(session, data)
        if done is not None:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.write(data)
            if done:
                if self.link is not None:
                    self._done(done)
                    self._after_server()
                else:
                    self.server.gate.release(done)
                if self._holding or self.buffer_reported:
                    self._check_held()
            return
        if self.pooled and self._login_replies is not None:
            self._login_replies += data
        self._apply(session.server_data(data))
        self._note_key()
        if self.pooled:
            if self.backend is not None and session.state is State.READY:
                self._end_login()
            else:
                self._after_server()

    # -- transaction pooling ----------------------------------------------------------------

    def _note_sets(self, job: int, sql: str) -> None:
        """``job`` may change the session's settings: read them back once it has run."""
        self._sets.add(job)
        if RESETS_ALL.search(sql):
            self._resets = True

    def _done(self, job: int) -> None:
        """``job``'s statement ended. A pooled client holding a server connection releases it
        after the connection is back in the pool (``_after_server``): the job admitted next
        finds it there."""
        if self.link is None:
            self.server.gate.release(job)
            return
        if self._sets and job in self._sets:
            self._sets.discard(job)
            self._capture = True
        if not self._closed and self.session.state is State.READY:
            self._finished.append(job)
            return
        self.server.gate.release(job)

    def _after_server(self) -> None:
        """Pooled, after the server's bytes: the connection back to the pool if the server
        holds nothing of the client's; a transaction keeps its first job (its slot under the
        MPL, and so its connection) until it ends."""
        if self.link is None:
            return
        if self.session.server_idle:
            self._detach()
            if self._terminating and not self.session.in_flight:
                self._close_client()
            return
        if self._terminating and not self.session.in_flight:
            self._close_client()  # (inside a transaction: closed, its connection with it)
        finished = self._finished
        if finished:
            self._finished = []
            gate = self.server.gate
            for job in finished:
                if self._txn_job is None and self.session.transaction_status != b"I":
                    self._txn_job = job
                else:
                    gate.release(job)

    def _end_login(self) -> None:
        """Authenticated (on a server connection of its own, relayed): close that one; the
        client's statements go to the pool's connections from now on."""
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.retire()
        self._login_done()
        self._server_write = self._pooled_write
        replies, self._login_replies = self._login_replies, None
        if replies is not None and _cacheable(self.parameters):
            trusted = _trusted_login(bytes(replies))
            if trusted is not None:
                key = _login_key(self.parameters)
                self.server.trusted[key] = (asyncio.get_running_loop().time(), trusted)

    def _login_from_cache(self) -> bool:
        """A login the proxy may answer itself: the database let this (user, database) in
        without a password within TRUST_TTL seconds — from the proxy's address, which is the
        address every login through the proxy comes from — and the client asks for nothing
        but its application_name and the same client_encoding. AuthenticationOk, the
        parameters the database sent then (application_name the client's), a key of the
        proxy's, ReadyForQuery: no server connection for the login."""
        key = _login_key(self.parameters)
        found = self.server.trusted.get(key)
        if found is None or not _cacheable(self.parameters):
            return False
        when, parameters = found
        if asyncio.get_running_loop().time() - when > TRUST_TTL:
            del self.server.trusted[key]
            return False
        reply = [pg.message(b"R", b"\0\0\0\0")]
        shown = {**parameters, "application_name": self.parameters.get("application_name", "")}
        reply += [pg.message(b"S", f"{k}\0{v}\0".encode()) for k, v in shown.items()]
        reply.append(pg.message(b"K", b"\0" * 8))  # (the session gives its own key)
        reply.append(pg.ready_for_query(b"I"))
        self.server.logins_answered += 1
        self._server_write = self._pooled_write
        self._apply(self.session.server_data(b"".join(reply)))
        self._note_key()
        return True

    def _note_key(self) -> None:
        """Once the client has been given its backend key: findable by it (CancelRequest)."""
        if self._key is None and self.session.backend_key is not None:
            self._key = self.session.backend_key
            self.server.by_key[self._key] = self

    def _login_done(self) -> None:
        if self.pooled and self._login:
            self._login = False
            assert self.server._logins is not None
            self.server._logins.release()

    def _pooled_write(self, data: bytes) -> None:
        if data.endswith(_TERMINATE) and self._terminates(data):
            return
        link = self.link
        if link is not None:
            link.send(data, self.statements)
            return
        if not data.replace(_FLUSH, b""):
            return  # a Flush with no server connection held: there is nothing to flush
        self._pending.append(data)
        if self._waiting_link or self._closed:
            return
        pool = self._pool
        assert pool is not None
        found = pool.acquire(self, asyncio.get_running_loop().time())
        if found is None:
            self._waiting_link = True
        else:
            self._attach(found)

    def _terminates(self, data: bytes) -> bool:
        """The client's Terminate (at the end of ``data``, the way the session forwards it):
        the server connection is not the client's to close. What came before it goes on; the
        client's connection is closed, as PostgreSQL would (its server connection goes back
        to the pool, or is closed if the server still owes the client something)."""
        pos = 0
        end = len(data) - len(_TERMINATE)
        while pos < end:  # (is it a message boundary?)
            pos += 1 + int.from_bytes(data[pos + 1 : pos + 5], "big")
        if pos != end:
            return False
        if end:
            self._pooled_write(data[:end])
        # what the client sent before runs to its end, as PostgreSQL would run it; the client
        # is closed once the server owes it nothing (its replies are not read)
        self._terminating = True
        if not self.session.in_flight:
            self._close_client()
        return True

    def _close_client(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _attach(self, link: Link) -> None:
        self.link = link
        if self._client_full and link.transport is not None:  # (the client reads slowly)
            self._server_paused = True
            link.transport.pause_reading()
        prelude = link.attach(self.statements, self.settings)
        pending, self._pending = self._pending, []
        if pending:
            link.send(b"".join(pending), self.statements, prelude)

    def link_granted(self, link: Link) -> None:
        self._waiting_link = False
        if self._closed:
            link.pool.release(link, asyncio.get_running_loop().time())
            return
        self._attach(link)

    def link_failed(self, message: str) -> None:
        self._waiting_link = False
        self._pending = []
        # (logins are relayed again: the database says why)
        self.server.trusted.pop(_login_key(self.parameters), None)
        if not self._closed:
            self._apply(self.session.server_lost(f"no server connection: {message}"))

    def _detach(self) -> None:
        """The server holds nothing of the client's: its connection goes back to the pool
        (after reading the session's settings back, when it ran a SET)."""
        link = self.link
        assert link is not None
        if self._capturing:
            return
        if self._capture and not link.closed:
            self._capture = False
            self._capturing = True
            link.capture(lambda settings: self._captured(link, settings))
            return
        self.link = None
        if self._server_paused and link.transport is not None:
            self._server_paused = False
            link.transport.resume_reading()
        if self._backend_full:
            self.resume_client_reading()
        link.pool.release(link, asyncio.get_running_loop().time())
        self._release_held()

    def _release_held(self) -> None:
        """Release the jobs a pooled client kept while it held a connection."""
        gate = self.server.gate
        job, self._txn_job = self._txn_job, None
        if job is not None:
            gate.release(job)
        finished, self._finished = self._finished, []
        for job in finished:
            gate.release(job)

    def _captured(self, link: Link, settings: dict[str, str] | None) -> None:
        self._capturing = False
        if settings is not None:
            if self._resets:  # RESET ALL and DISCARD ALL keep what the startup packet set
                self._resets = False
                settings = {**client_settings(self.parameters), **settings}
            self.settings = settings
        if self.link is link and not self._closed and self.session.server_idle:
            self._detach()
            if self._terminating and not self.session.in_flight:
                self._close_client()

    def _drop_link(self) -> None:
        """The client is gone: its connection back to the pool if the server holds nothing of
        its, else closed (a transaction left open, a reply still coming)."""
        if not self.pooled:
            return
        if self._waiting_link and self._pool is not None:
            self._waiting_link = False
            self._pool.forget(self)
        link, self.link = self.link, None
        if link is not None:
            if self._server_paused and link.transport is not None:
                link.transport.resume_reading()
            if self.session.server_idle and not self._capturing and not link.closed:
                link.pool.release(link, asyncio.get_running_loop().time())
            else:
                link.pool.discard(link)
        self._release_held()

    def backend_lost(self, exc: Exception | None) -> None:
        if self.pooled:
            self._login_done()
            if self.link is not None and self.link.closed:
                self.link = None  # (the pool has forgotten it)
        if self._closed:
            return
        why = "the database closed the connection"
        if exc is not None:
            why += f" ({exc})"
        self._apply(self.session.server_lost(why))

    async def _connect(self, startup: bytes) -> None:
        logins = self.server._logins
        if logins is not None:
            await logins.acquire()
            self._login = True
            if self._closed:
                self._login_done()
                return
        try:
            await self.server.open_backend(lambda: self._make_backend())
        except (TimeoutError, OSError) as e:
            reason = str(e) or type(e).__name__
            message = f"the proxy cannot connect to the database at {self.server.backend}: {reason}"
            log.warning(message)
            self._apply(
                [
                    SendToClient(pg.error_response(pg.SQLSTATE_CANNOT_CONNECT, message, "FATAL")),
                    *self.session.server_lost(message),
                ]
            )
            self._login_done()
            return
        if self._closed:
            self._close_backend()
            return
        assert self.backend is not None and self.backend.transport is not None
        pending, self._to_server = self._to_server or [], None
        self._server_write = self.backend.transport.write
        self._server_write(startup + b"".join(pending))

    def _make_backend(self) -> _Backend:
        self.backend = _Backend(self)
        return self.backend

    # -- actions ---------------------------------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendToServer):
                self._server_write(action.data)
            elif isinstance(action, SendToClient):
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.write(action.data)
            elif isinstance(action, Submit):
                job = action.job
                bypass = action.bypass
                if self.pooled:
                    why = pooling_refusal(action.sql)
                    if why is not None:
                        self._apply(self.session.rejected(job, "0A000", why))
                        continue
                    bypass = bypass and self.link is not None
                    if may_set(action.sql):
                        self._note_sets(job, action.sql)
                if self._admit(job, action.query_class, bypass, action.sql):
                    self.server.prioritize(self, job)
                    self._apply(self.session.granted(job, self.server.grant(job)))
            elif isinstance(action, Release):
                self._done(action.job)
            elif isinstance(action, ConnectServer):
                limit = self.server.max_client_conn
                if limit is not None and len(self.server.connections) > limit:
                    self.server.clients_refused += 1
                    error = pg.error_response(
                        pg.SQLSTATE_TOO_MANY,
                        f"sorry, too many clients already (the proxy's --max-client-conn is "
                        f"{limit})",
                        severity="FATAL",
                    )
                    self._apply([SendToClient(error), *self.session.client_lost()])
                    return
                self.parameters = action.parameters
                if self.pooled:
                    assert self.server.pools is not None
                    user = action.parameters.get("user", "")
                    database = action.parameters.get("database") or user
                    self._pool = self.server.pools.pool(user, database)
                    self.settings = client_settings(action.parameters)
                    if self._login_from_cache():
                        continue
                    self._login_replies = bytearray()
                self._to_server = []
                self._server_write = self._to_server.append
                asyncio.get_running_loop().create_task(self._connect(action.startup))
            elif isinstance(action, ForwardCancel):
                self._forwarding = self.server.cancel(action.pid, action.secret)
            elif isinstance(action, StartTLS):
                # the client's handshake must not be read as a startup packet: stop reading
                # now, not when the task runs
                if self.transport is not None:
                    self.transport.pause_reading()
                self._early = []
                asyncio.get_running_loop().create_task(self._start_tls())
            elif isinstance(action, Close):
                self._closed = True
                forwarding, transport = self._forwarding, self.transport
                if forwarding is not None and not forwarding.done() and transport is not None:
                    # a cancel's connection is closed once the server has taken the cancel, as
                    # PostgreSQL closes it once it has signalled the backend: a client that
                    # waits for that (psycopg's cancel_safe) then sends its next statement, and
                    # a cancel still on its way must not stop that statement
                    forwarding.add_done_callback(functools.partial(_close_transport, transport))
                elif transport is not None:
                    transport.close()
                self._close_backend()
                self._teardown()
        if self._holding or self.buffer_reported:  # read the client again? fewer bytes?
            self._check_held()

    def cancel(self) -> asyncio.Future[None] | None:
        """A CancelRequest named this client: withdraw its queued statement, or have the server
        stop the running one (with the key the server gave it, which the client was given).
        Returns the forwarded request, done once the server has taken it."""
        parked = self._parked
        if parked is not None and self.server.contention is not None:
            self._parked = None
            self.server.contention.forget(self)
            self.refused(
                parked[0], pg.SQLSTATE_QUERY_CANCELED, "canceling statement due to user request"
            )
            return None
        gate = self.server.gate
        for job in self.session.active_jobs:
            if gate.cancel(job):
                log.info("cancelled queued statement job=%s", job)
                return None
        key = self.server_key
        if key is None:
            return None
        link = self.link if self.pooled else None
        if link is None:
            return asyncio.get_running_loop().create_task(self.server._forward_cancel(*key, True))
        # the link goes to no other client before the cancel is through (the callback runs
        # however the task ends, even cancelled before it starts)
        pool = link.pool
        pool.cancel_sent(link)
        task = asyncio.get_running_loop().create_task(self.server._forward_cancel(*key, True))
        task.add_done_callback(lambda _task: pool.cancel_done(link))
        return task

    # -- the contention limit (serve --contention: admission.contention) ---------------------

    def _admit(self, job: int, query_class: QueryClass, bypass: bool, sql: str) -> bool:
        """``gate.admit`` behind the contention limit where it is on (``_place``)."""
        contention = self.server.contention
        if contention is not None and not self._place(job, query_class, bypass, sql):
            return False
        if not self.server.gate.admit(job, query_class, bypass, sql, self):
            return False
        if contention is not None and contention.holds(self):
            contention.touch(self, running=True)
        return True

    def _place(self, job: int, query_class: QueryClass, bypass: bool, sql: str) -> bool:
        """Before admission, where the contention limit is on: a writing transaction takes a
        place — an autocommit statement that writes; in a transaction block its first
        statement if it writes or transactions that began with its shape wrote, else its
        first write (the embedded session's rule: PostgreSQL's snapshot too starts with a
        transaction's first statement). False: it must wait, and is held here, its statement
        queued as far as the session knows (holding no MPL slot), till ``_placed``."""
        contention = self.server.contention
        assert contention is not None
        if contention.holds(self):
            return True
        writes = _WRITES.search(sql) is not None
        place = writes
        if self.session.transaction_status != b"I":
            if self._tx_starter is None:  # the transaction's first statement
                self._tx_starter = query_class.fingerprint
                place = writes or contention.control.starts_writer(self._tx_starter)
            elif writes:  # it read first: its shape is held back at its first statement
                contention.control.learn_starter(self._tx_starter)
        if not place:
            return True
        placed = functools.partial(self._placed, job)
        if not contention.request(self, placed, functools.partial(self._expired, job)):
            self._parked = (job, query_class, bypass, sql)
            return False
        return True

    def _placed(self, job: int) -> None:
        """Held statement ``job`` has its place: to the gate with it — if it is still the one
        held (a cancel or the client's end may have come between the grant and this call;
        they gave the place up themselves)."""
        parked = self._parked
        contention = self.server.contention
        if (
            parked is None
            or parked[0] != job
            or self._closed
            or contention is None
            or not contention.holds(self)
        ):
            return
        self._parked = None
        _, query_class, bypass, sql = parked
        if self.server.gate.admit(job, query_class, bypass, sql, self):
            self.admitted(job)

    def _expired(self, job: int, error: Exception) -> None:
        """Held statement ``job`` waited the queue timeout for a place (its wait withdrawn):
        refused, as one that waited that long for admission is."""
        parked = self._parked
        if parked is None or parked[0] != job or self._closed:
            return
        self._parked = None
        self.refused(job, pg.SQLSTATE_QUERY_CANCELED, str(error))

    def _contended(self, contention: ContentionGate) -> None:
        """After the server's bytes: a holder's statement ended, or its transaction."""
        session = self.session
        if session.replies_pending or self._parked is not None:
            return
        over = session.transaction_status == b"I"
        contention.statement_ended(self, over, self._tx_aborted)
        if over:
            self._tx_starter = None
            self._tx_aborted = False

    # -- the gate's answers ------------------------------------------------------------------

    def admitted(self, job: int) -> None:
        contention = self.server.contention
        if contention is not None and contention.holds(self):
            contention.touch(self, running=True)
        self.server.prioritize(self, job)
        data = self.session.fast_granted(job)
        if data is not None:
            self._server_write(data)
            return
        self._apply(self.session.granted(job, self.server.grant(job)))

    def refused(self, job: int, sqlstate: str, message: str) -> None:
        self._apply(self.session.rejected(job, sqlstate, message))
        contention = self.server.contention
        if contention is not None and contention.holds(self):
            # refused before the server saw it (queue full, timed out, cancelled while
            # queued): an autocommit statement's place goes back unused — no reply will end it
            session = self.session
            if session.transaction_status == b"I" and not session.replies_pending:
                contention.forget(self)

    def warn(self, job: int, message: str) -> None:
        self._apply(self.session.notice(message))

    async def _start_tls(self) -> None:
        assert self.transport is not None and self.server.tls is not None
        loop = asyncio.get_running_loop()
        try:
            new = await loop.start_tls(self.transport, self, self.server.tls, server_side=True)
        except (OSError, ssl.SSLError) as e:
            log.info("TLS handshake with a client failed: %s", e)
            self._apply(self.session.client_lost())
            return
        assert new is not None
        self.transport = new
        early, self._early = self._early or [], None
        for data in early:
            self.data_received(data)

    def shutdown(self, why: str) -> asyncio.Task[None] | None:
        """Close the client with ``why`` (57P01); its running statement is cancelled on the
        server (the task sending the cancel, if one was sent)."""
        cancel = None if self._closed else self._cancel_orphan(stopping=True)
        error = pg.error_response(pg.SQLSTATE_ADMIN_SHUTDOWN, why, severity="FATAL")
        self._apply([SendToClient(error), *self.session.client_lost()])
        return cancel

    def _close_backend(self) -> None:
        if self.backend is not None and self.backend.transport is not None:
            self.backend.transport.close()

    def _teardown(self) -> None:
        if self.server.contention is not None:
            self._parked = None
            self.server.contention.forget(self)
        self._drop_link()
        if self.pooled:
            self._login_done()
        self.server.buffers.forget(self)
        if self._startup_timer is not None:
            self._startup_timer.cancel()
            self._startup_timer = None
        self.server.connections.discard(self)
        if self._key is not None and self.server.by_key.get(self._key) is self:
            del self.server.by_key[self._key]
