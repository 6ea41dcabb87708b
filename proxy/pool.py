"""Server connections shared by many clients: the relay's transaction pooling.

With ``serve --pool-mode transaction`` a client holds a server connection (a *link*) only while
it has something at the server — from the admission of a statement until the ReadyForQuery
that says the connection is idle outside a transaction block — and gives it back then; many
clients share ``--pool-size`` links per (database, user). PgBouncer's transaction pooling,
with one difference: the queue for a link *is* the admission queue. Every batch a client
without a link sends is an admission job, a transaction keeps its first statement's job (its
slot under the MPL) until it ends, and the MPL is at most the pool size, so a statement the
scheduler admits finds a link free (or one being opened for it): the policy decides which
waiting transaction gets the next link. (A client whose bypass statement — one inside a
pipelined transaction — finds no link waits in the pool's own FIFO; ``waited`` counts them.)

What a link carries between clients, and what the pool does about it:

* **Named prepared statements** (Parse/Bind/Describe/Close of the extended protocol): a
  client's statement ``N`` is kept by its text and parameter types; on the server it is named
  after them (``_ap_<hash>``), so all clients of one text share one server statement per link.
  A Bind or Describe of a statement the link has not prepared is preceded by its Parse; a
  client's Parse of a statement the link has is preceded by its Close; a client's Close
  leaves the link's statement in place (the client hears CloseComplete as from the server).
* **Settings**: a client's startup parameters (application_name, DateStyle, TimeZone,
  ``options=-c …``) and what it SETs for its session are the client's: a link is given the
  client's settings (``RESET``/``set_config``) before the client's first message when they
  differ from the link's; after a transaction that ran SET, RESET, DISCARD or set_config the
  link's session settings are read back (``pg_settings``) as the client's.

These run as statements of the proxy's own *in front of* the client's bytes, in one write, each
ending in a Sync (or a simple Query): their replies, up to their ReadyForQuery, are cut from
what the client hears. Session features a link cannot carry — LISTEN, session advisory locks,
temporary tables that outlive their transaction, WITH HOLD cursors, SQL PREPARE/EXECUTE — are
refused with SQLSTATE 0A000 (``pooling_refusal``); use ``--pool-mode session`` for them.

A link is opened with only the user and database of its pool, and answers the server's
password request (cleartext, MD5 or SCRAM-SHA-256) with the password in the backend URL or
PGPASSWORD. Links idle longer than ``idle_timeout`` or older than ``lifetime`` are closed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from proxy.wire import protocol as pg
from proxy.wire.session import OWN_STATEMENT

if TYPE_CHECKING:
    from proxy.server import BackendAddress

__all__ = [
    "Link",
    "Pool",
    "PoolConfig",
    "Pools",
    "client_settings",
    "pooling_refusal",
]

log = logging.getLogger("admission.pool")

_TYPED = struct.Struct("!BI")
POOL_MODES = ("session", "transaction")


@dataclass(frozen=True)
class PoolConfig:
    """``--pool-mode transaction`` and what goes with it (see the module docstring)."""

    size: int = 20  # links per (database, user)
    idle_timeout: float = 600.0  # seconds a link may stay idle (PgBouncer's server_idle_timeout)
    lifetime: float = 3600.0  # seconds a link is kept at most (server_lifetime)
    password: str | None = None  # for the server's password request (backend URL/PGPASSWORD)
    connect_timeout: float = 10.0
    # prepared statements a link keeps (PgBouncer's max_prepared_statements): beyond it the
    # least recently used are closed when the link is next handed to a client
    max_prepared: int = 200

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"--pool-size must be at least 1, not {self.size}")
        if self.idle_timeout <= 0 or self.lifetime <= 0:
            raise ValueError("--server-idle-timeout and --server-lifetime must be positive")
        if self.max_prepared < 1:
            raise ValueError(
                f"--max-prepared-statements must be at least 1, not {self.max_prepared}"
            )


class PoolClient(Protocol):
    """A client connection that holds links (proxy.server.ClientConnection)."""

    def from_server(self, data: bytes) -> None: ...

    def backend_lost(self, exc: Exception | None) -> None: ...

    def link_granted(self, link: Link) -> None: ...

    def link_failed(self, message: str) -> None: ...

    def pause_client_reading(self) -> None: ...

    def resume_client_reading(self) -> None: ...


# -- what a link cannot carry ------------------------------------------------------------------

_REFUSED = re.compile(
    r"(?:^|;)\s*(?:listen|prepare|execute)\b"
    r"|(?:^|;)\s*set\s+(?:session\s+)?(?:role|session\s+authorization)\b"
    r"|\bpg_(?:try_)?advisory_lock(?:_shared)?\s*\("
    r"|\bwith\s+hold\b"
    r"|\bcreate\s+(?:global\s+|local\s+)?temp(?:orary)?\s+(?:table|sequence|view)\b",
    re.IGNORECASE,
)
_ON_COMMIT_DROP = re.compile(r"\bon\s+commit\s+drop\b", re.IGNORECASE)
# a statement that may change the session's settings: read them back after its transaction
RESETS_ALL = re.compile(r"\b(?:reset|discard)\s+all\b", re.IGNORECASE)
SETS_TEXT = re.compile(r"(?:^|;)\s*(?:set|reset|discard)\b|\bset_config\s*\(", re.IGNORECASE)


# string literals, quoted identifiers, dollar-quoted bodies and comments: what a statement says
# inside them is not what it does (a function body's EXECUTE, a literal 'listen')
_QUOTED = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|(\$[A-Za-z_0-9]*\$).*?\1|--[^\n]*|/\*.*?\*/",
    re.DOTALL,
)


# a word one of _REFUSED's matches holds (most statements hold none: no regex runs for them)
_REFUSED_WORDS = (
    "listen",
    "prepare",
    "execute",
    "role",
    "authorization",
    "advisory",
    "hold",
    "temp",
)
_REFUSALS: dict[str, str | None] = {}  # a statement text's answer (texts repeat: ≤ 4096 kept)


def pooling_refusal(sql: str) -> str | None:
    """Why a statement cannot run on a shared server connection (None: it can)."""
    try:
        return _REFUSALS[sql]
    except KeyError:
        pass
    lowered = sql.lower()
    why = _refusal(sql) if any(w in lowered for w in _REFUSED_WORDS) else None
    if len(sql) <= 4096:
        if len(_REFUSALS) >= 4096:
            _REFUSALS.clear()
        _REFUSALS[sql] = why
    return why


_SETS: dict[str, bool] = {}  # a statement text's answer, kept as _REFUSALS are


def may_set(sql: str) -> bool:
    """Whether a statement may change the session's settings (SETS_TEXT; the answer per text
    is kept: the regex costs more than the rest of a pooled statement's checks)."""
    try:
        return _SETS[sql]
    except KeyError:
        pass
    found = SETS_TEXT.search(sql) is not None
    if len(sql) <= 4096:
        if len(_SETS) >= 4096:
            _SETS.clear()
        _SETS[sql] = found
    return found


def _refusal(sql: str) -> str | None:
    found = _REFUSED.search(sql)
    if found is None:
        return None
    if "'" in sql or "$" in sql or '"' in sql or "-" in sql or "/*" in sql:
        sql = _QUOTED.sub(" ", sql)
        found = _REFUSED.search(sql)
        if found is None:
            return None
    words = found.group(0).strip(" ;(").split()
    what = words[0].lower()
    if what == "set":
        what = "role"
    if what == "create" and _ON_COMMIT_DROP.search(sql):
        return None
    names = {
        "listen": "LISTEN",
        "prepare": "SQL PREPARE",
        "execute": "SQL EXECUTE",
        "with": "a WITH HOLD cursor",
        "create": "a temporary object that outlives its transaction",
        "role": "SET ROLE or SET SESSION AUTHORIZATION (SET LOCAL ROLE inside a transaction works)",
    }
    feature = names.get(what, "a session advisory lock")
    return (
        f"{feature} is not supported in transaction pool mode (the server connection is "
        "shared between clients): use the extended protocol's prepared statements, "
        "transaction-level locks (pg_advisory_xact_lock), ON COMMIT DROP, or serve with "
        "--pool-mode session"
    )


# -- settings ----------------------------------------------------------------------------------

# startup parameters that are not settings of the session
_NOT_SETTINGS = frozenset(("user", "database", "replication", "options"))


def client_settings(parameters: dict[str, str]) -> dict[str, str]:
    """The session settings a client's startup packet asks for (``options=-c a=b`` too)."""
    settings = {k.lower(): v for k, v in parameters.items() if k.lower() not in _NOT_SETTINGS}
    settings.setdefault("application_name", "")  # (a link has its own, "admission pool")
    words = _option_words(parameters.get("options", ""))
    i = 0
    while i < len(words):
        word = words[i]
        pair = None
        if word == "-c" and i + 1 < len(words):
            pair, i = words[i + 1], i + 1
        elif word.startswith("-c") or word.startswith("--"):
            pair = word[2:]
        if pair and "=" in pair:
            name, value = pair.split("=", 1)
            settings[name.strip().lower().replace("-", "_")] = value
        i += 1
    return settings


def _option_words(options: str) -> list[str]:
    """libpq's ``options`` split on unescaped whitespace (a backslash escapes the next char)."""
    words: list[str] = []
    word: list[str] = []
    escaped = False
    for ch in options:
        if escaped:
            word.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch.isspace():
            if word:
                words.append("".join(word))
                word = []
        else:
            word.append(ch)
    if word:
        words.append("".join(word))
    return words


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def settings_query(have: dict[str, str], want: dict[str, str]) -> bytes | None:
    """The simple Query that turns a link's settings ``have`` into ``want`` (None: equal)."""
    if have == want:
        return None
    parts = [f'RESET "{name}"' for name in sorted(have) if name not in want]
    changes = [
        f"set_config({_literal(name)}, {_literal(value)}, false)"
        for name, value in sorted(want.items())
        if have.get(name) != value
    ]
    if changes:
        parts.append("SELECT " + ", ".join(changes))
    return pg.message(b"Q", "; ".join(parts).encode() + b"\0")


CAPTURE = b"SELECT name, setting FROM pg_catalog.pg_settings WHERE source = 'session'"


# -- prepared statements -----------------------------------------------------------------------


class Statements:
    """A client's named prepared statements: its name → (the server's name, Parse's tail)."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        self.names: dict[bytes, tuple[bytes, bytes]] = {}


def server_name(tail: bytes) -> bytes:
    """The name a statement (its text and parameter types: Parse after the name) has on
    every link: the same text, the same name."""
    return b"_ap_" + hashlib.blake2b(tail, digest_size=10).hexdigest().encode()


def _parse(name: bytes, tail: bytes) -> bytes:
    return pg.message(b"P", name + b"\0" + tail)


def _close_statement(name: bytes) -> bytes:
    return pg.message(b"C", b"S" + name + b"\0")


_SYNC = pg.message(b"S")
_DEALLOCATE = re.compile(
    rb"\s*(?:deallocate\s+(?:prepare\s+)?(?P<name>\"(?:[^\"]|\"\")+\"|[^\s;\"]+)"
    rb"|(?P<discard>discard)\s+(?P<all>all))\s*;?\s*",
    re.IGNORECASE,
)
# a client's Close is answered by closing this (it never exists: CloseComplete, nothing closed)
_NO_STATEMENT = b"_ap_none"


# -- server authentication -----------------------------------------------------------------------


class _Scram:
    """SCRAM-SHA-256 as a client (RFC 5802/7677, no channel binding)."""

    def __init__(self, password: str, nonce: str | None = None, user: str = "") -> None:
        self.password = password
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self.first_bare = f"n={user},r={self.nonce}"  # (PostgreSQL ignores the user here)
        self.server_signature = b""

    def first(self) -> bytes:
        data = ("n,," + self.first_bare).encode()
        return b"SCRAM-SHA-256\0" + struct.pack("!I", len(data)) + data

    def final(self, server_first: bytes) -> bytes:
        fields = dict(p.split("=", 1) for p in server_first.decode().split(","))
        nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self.nonce):
            raise ValueError("the server's SCRAM nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        stored = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.digest(stored, message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", "sha256")
        self.server_signature = hmac.digest(server_key, message, "sha256")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        fields = dict(p.split("=", 1) for p in server_final.decode().split(","))
        return hmac.compare_digest(base64.b64decode(fields.get("v", "")), self.server_signature)


# -- links ----------------------------------------------------------------------------------------


class Link(asyncio.Protocol):
    """One server connection of a pool."""

    def __init__(self, pool: Pool, now: float) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.owner: PoolClient | None = None
        self.ready = False  # authenticated and idle at least once
        self.closed = False
        self.key: tuple[int, int] | None = None  # the server's BackendKeyData
        self.created = now
        self.idle_since = now
        # server names prepared on it, the least recently used first
        self.prepared: dict[bytes, None] = {}
        self.settings: dict[str, str] = {}  # its session settings (beyond the defaults)
        self.uses = 0
        # CancelRequests for it still on their way to the server: till they are through it
        # goes to no other client (a late cancel would stop that client's statement)
        self.canceling = 0
        self.parked = False  # released while canceling: held back, in ``busy``
        self._buf = bytearray()
        # the proxy's own statements whose replies are still to cut, up to a ReadyForQuery
        # each, with the statements each prepares (forgotten if it fails)
        self._swallow: deque[tuple[bytes, ...]] = deque()
        self._swallow_failed = False
        self._auth: _Scram | None = None
        self._capture: Callable[[dict[str, str] | None], None] | None = None
        self._rows: dict[str, str] = {}
        self.failure: str | None = None  # why it could not be opened

    @property
    def pid(self) -> int | None:
        return self.key[0] if self.key is not None else None

    # -- the socket --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = writer = transport  # type: ignore[assignment]
        pool = self.pool
        body = b"".join(
            (
                struct.pack("!I", pg.PROTOCOL_3_0),
                b"user\0" + pool.user.encode() + b"\0",
                b"database\0" + pool.database.encode() + b"\0",
                b"application_name\0admission pool\0",
                b"\0",
            )
        )
        writer.write(struct.pack("!I", len(body) + 4) + body)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        owner = self.owner
        if owner is not None and self.ready and not self._swallow and self._capture is None:
            owner.from_server(data)
            return
        self._buf += data
        self._messages()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        owner = self.owner
        capture, self._capture = self._capture, None
        if capture is not None:
            capture(None)
        self.pool.lost(self, exc)
        if owner is not None:
            owner.backend_lost(exc)

    def pause_writing(self) -> None:
        if self.owner is not None:
            self.owner.pause_client_reading()

    def resume_writing(self) -> None:
        if self.owner is not None:
            self.owner.resume_client_reading()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.write(pg.message(b"X"))
            self.transport.close()

    # -- the server's messages when not simply relayed ---------------------------------------

    def _messages(self) -> None:
        buf = self._buf
        pos = 0
        end = len(buf)
        while end - pos >= 5:
            kind, length = _TYPED.unpack_from(buf, pos)
            nxt = pos + 1 + length
            if length < 4:
                self._fail(f"the database sent a message of length {length}")
                return
            if nxt > end:
                break
            body = bytes(buf[pos + 5 : nxt])
            pos = nxt
            if not self.ready:
                self._auth_message(kind, body)
                if self.closed:
                    return
            elif self._capture is not None:
                self._capture_message(kind, body)
            elif self._swallow:
                if kind == pg.ERROR_RESPONSE:
                    log.warning("a statement of the pool's own failed: %s", _error_text(body))
                    self._swallow_failed = True
                if kind == pg.READY_FOR_QUERY:
                    names = self._swallow.popleft()
                    if self._swallow_failed:  # which failed is not known: prepared again
                        self._swallow_failed = False
                        for name in names:
                            self.prepared.pop(name, None)
            else:  # relayed: the rest goes to the owner as it came
                rest = bytes(buf[pos - 1 - length :])
                buf.clear()
                if self.owner is not None:
                    self.owner.from_server(rest)
                return
        del buf[:pos]
        if (
            buf
            and self.ready
            and not self._swallow
            and self._capture is None
            and self.owner is not None
        ):
            rest = bytes(buf)
            buf.clear()
            self.owner.from_server(rest)

    def _auth_message(self, kind: int, body: bytes) -> None:
        if kind == pg.AUTHENTICATION:
            self._authenticate(body)
        elif kind == pg.BACKEND_KEY_DATA and len(body) >= 8:
            self.key = struct.unpack_from("!II", body)
        elif kind == ord("S"):
            name, _, value = body.rstrip(b"\0").partition(b"\0")
            self.pool.parameters[name.decode()] = value.decode("utf-8", "replace")
        elif kind == pg.ERROR_RESPONSE:
            self._fail(_error_text(body))
        elif kind == pg.READY_FOR_QUERY:
            self.ready = True
            self.pool.opened(self)

    def _authenticate(self, body: bytes) -> None:
        code = struct.unpack_from("!I", body)[0]
        if code == 0:
            return
        password = self.pool.config.password
        if code in (3, 5, 10) and password is None:
            self._fail(
                "the database asks for a password: give it in the backend URL "
                "(postgresql://user:password@host/) or PGPASSWORD"
            )
            return
        assert self.transport is not None and password is not None
        if code == 3:  # cleartext
            self.transport.write(pg.message(b"p", password.encode() + b"\0"))
        elif code == 5:  # MD5
            inner = hashlib.md5((password + self.pool.user).encode()).hexdigest()
            outer = hashlib.md5(inner.encode() + body[4:8]).hexdigest()
            self.transport.write(pg.message(b"p", b"md5" + outer.encode() + b"\0"))
        elif code == 10:  # SASL
            mechanisms = body[4:].split(b"\0")
            if b"SCRAM-SHA-256" not in mechanisms:
                self._fail(f"the database offers no SASL mechanism the pool speaks: {mechanisms}")
                return
            self._auth = _Scram(password)
            self.transport.write(pg.message(b"p", self._auth.first()))
        elif code == 11 and self._auth is not None:  # SASLContinue
            try:
                self.transport.write(pg.message(b"p", self._auth.final(body[4:])))
            except (ValueError, KeyError) as e:
                self._fail(f"SCRAM exchange failed: {e}")
        elif code == 12 and self._auth is not None:  # SASLFinal
            if not self._auth.verify(body[4:]):
                self._fail("the database's SCRAM signature does not match")
        else:
            self._fail(f"the database asks for an authentication the pool does not speak ({code})")

    def _fail(self, why: str) -> None:
        self.failure = why
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    # -- the client's bytes ------------------------------------------------------------------

    def attach(self, statements: Statements, settings: dict[str, str]) -> bytes:
        """What the link must run before a client's first bytes, the link idle and owing
        nothing (the only moment a statement of the proxy's own cannot land between a
        client's messages and their replies): the client's settings where they differ, and
        every statement of the client's the link has not prepared — so that whatever the
        client binds while it holds the link is there. Counted to be cut from the replies."""
        prelude: list[bytes] = []
        if self.settings != settings:
            query = settings_query(self.settings, settings)
            if query is not None:
                prelude.append(query)
                self._swallow.append(())
                self.pool.stats.settings_replayed += 1
            self.settings = dict(settings)
        prepared = self.prepared
        missing = [
            (sname, tail) for sname, tail in statements.names.values() if sname not in prepared
        ]
        evict = len(prepared) + len(missing) - self.pool.config.max_prepared
        if evict > 0:
            # the least recently used go, none of this client's; a client that had one is
            # given it again when it next lands here (``missing``)
            wanted = {sname for sname, _ in statements.names.values()}
            gone = [n for n in prepared if n not in wanted][:evict]
            if gone:
                for name in gone:
                    del prepared[name]
                prelude.append(b"".join(_close_statement(n) for n in gone) + _SYNC)
                self._swallow.append(())
                self.pool.stats.evicted += len(gone)
        if missing:
            # (Close first: preparing again is harmless where a failed prelude left doubt)
            parses = [_close_statement(n) + _parse(n, t) for n, t in missing]
            prelude.append(b"".join(parses) + _SYNC)
            names = tuple(n for n, _ in missing)
            for name in names:
                prepared[name] = None
            self._swallow.append(names)
            self.pool.stats.reprepared += len(missing)
        return b"".join(prelude)

    def send(self, data: bytes, statements: Statements, prelude: bytes = b"") -> None:
        """Write a client's bytes (whole messages), statements named as the link names them,
        after ``prelude`` (``attach``'s)."""
        assert self.transport is not None
        kind = data[0]
        if kind != pg.QUERY or _TYPED.unpack_from(data)[1] + 1 != len(data):
            data = self._rewrite(data, statements)
        elif data[5:40].lstrip()[:7].lower() in (b"dealloc", b"discard"):
            data = self._deallocate(data, statements)
        if prelude:
            self.transport.write(prelude + data)
        elif data:
            self.transport.write(data)

    def _rewrite(self, data: bytes, statements: Statements) -> bytes:
        """Name a client's statements as the link does (see ``attach`` for what it lacks)."""
        out: list[bytes] | None = None
        pos = start = 0
        end = len(data)
        names = statements.names
        while end - pos >= 5:
            kind, length = _TYPED.unpack_from(data, pos)
            nxt = pos + 1 + length
            if nxt > end or length < 4:
                break
            new: bytes | None = None
            if kind == pg.PARSE:
                stop = data.find(0, pos + 5, nxt)
                if stop > pos + 5 and data[pos + 5 : stop] != OWN_STATEMENT:
                    # (the session's own statement keeps its name: it closes it itself)
                    tail = data[stop + 1 : nxt]
                    sname = server_name(tail)
                    n = 0
                    while sname in self.prepared:  # (the link has it: another name for this)
                        n += 1
                        sname = server_name(tail) + b"_" + str(n).encode()
                    names[data[pos + 5 : stop]] = (sname, tail)
                    self.prepared[sname] = None
                    new = _parse(sname, tail)
            elif kind == pg.BIND:
                first = data.find(0, pos + 5, nxt)
                second = data.find(0, first + 1, nxt) if first >= 0 else -1
                if second > first + 1:
                    found = names.get(data[first + 1 : second])
                    if found is not None:
                        prepared = self.prepared  # (used: the most recently)
                        if prepared.pop(found[0], 0) is None:
                            prepared[found[0]] = None
                        new = pg.message(
                            b"B", data[pos + 5 : first + 1] + found[0] + data[second:nxt]
                        )
            elif kind == pg.DESCRIBE or kind == pg.CLOSE:
                if data[pos + 5 : pos + 6] == b"S" and nxt - pos > 7:
                    name = data[pos + 6 : nxt - 1]
                    found = names.get(name)
                    if found is not None:
                        if kind == pg.DESCRIBE:
                            new = pg.message(b"D", b"S" + found[0] + b"\0")
                        else:  # the link keeps it for whoever runs that text next
                            del names[name]
                            new = _close_statement(_NO_STATEMENT)
            elif kind == pg.TERMINATE:
                new = b""  # the client leaves; the link stays
            if new is not None:
                if out is None:
                    out = []
                out.append(data[start:pos])
                out.append(new)
                start = nxt
            pos = nxt
        if out is None:
            return data
        out.append(data[start:])
        return b"".join(out)

    def _deallocate(self, data: bytes, statements: Statements) -> bytes:
        """SQL DEALLOCATE of a protocol-level statement (drivers do it: psycopg), DEALLOCATE
        ALL or DISCARD ALL (a simple Query): the client's statements, as the link names them."""
        found = _DEALLOCATE.fullmatch(data[5:-1])
        if found is None:
            return data
        target = found.group("name")
        if target is None or target.lower() == b"all":  # everything on the link goes
            statements.names.clear()
            self.prepared.clear()
            return data
        quoted = target.startswith(b'"')
        name = target[1:-1].replace(b'""', b'"') if quoted else target.lower()
        mapped = statements.names.pop(name, None)
        if mapped is None:
            return data  # not the client's: the server answers
        sname = mapped[0]
        if sname not in self.prepared:  # (attach prepared it unless that failed: the
            return data  # server answers, about the client's name)
        del self.prepared[sname]
        return pg.message(b"Q", b'DEALLOCATE "' + sname + b'"\0')

    # -- reading the session's settings back -------------------------------------------------

    def capture(self, done: Callable[[dict[str, str] | None], None]) -> None:
        """Read the link's session settings (after a client's SET); ``done`` gets them (None:
        the connection closed first) the moment they are read, before any byte after them."""
        assert self.transport is not None
        self._capture = done
        self._rows = {}
        self.transport.write(pg.message(b"Q", CAPTURE + b"\0"))

    def _capture_message(self, kind: int, body: bytes) -> None:
        if kind == ord("D"):
            values: list[str] = []
            pos = 2
            for _ in range(struct.unpack_from("!H", body)[0]):
                size = struct.unpack_from("!i", body, pos)[0]
                pos += 4
                values.append(body[pos : pos + max(size, 0)].decode("utf-8", "replace"))
                pos += max(size, 0)
            if len(values) == 2:
                self._rows[values[0]] = values[1]
        elif kind == pg.ERROR_RESPONSE:
            log.warning("reading a session's settings failed: %s", _error_text(body))
            self._rows = dict(self.settings)
            self.failure = "its session settings could not be read back"  # (not reused)
        elif kind == pg.READY_FOR_QUERY:
            done, self._capture = self._capture, None
            self.settings = dict(self._rows)
            if done is not None:
                done(dict(self._rows))


def _error_text(body: bytes) -> str:
    for part in body.split(b"\0"):
        if part[:1] == b"M":
            return part[1:].decode("utf-8", "replace")
    return "error"


# -- pools ----------------------------------------------------------------------------------------


@dataclass
class PoolStats:
    """Counts over a pool's life (named like PgBouncer's SHOW STATS where they mean the same)."""

    opened: int = 0
    closed: int = 0
    failed: int = 0
    waited: int = 0  # clients that found every link held at their admission (see acquire)
    wait_seconds: float = 0.0
    handovers: int = 0  # links given to a client
    settings_replayed: int = 0
    reprepared: int = 0
    evicted: int = 0  # prepared statements closed beyond max_prepared
    parked: int = 0  # links held back from the next client until a cancel went through


class Pool:
    """The links of one (database, user)."""

    def __init__(self, pools: Pools, user: str, database: str) -> None:
        self.pools = pools
        self.config = pools.config
        self.user = user
        self.database = database
        self.idle: list[Link] = []  # newest last (taken first: its statements are warm)
        self.busy: set[Link] = set()
        self.opening: set[Link] = set()
        self.waiting: deque[tuple[PoolClient, float]] = deque()
        self.parameters: dict[str, str] = {}  # the server's ParameterStatus at connect
        self.stats = PoolStats()

    @property
    def size(self) -> int:
        return len(self.idle) + len(self.busy) + len(self.opening)

    def acquire(self, client: PoolClient, now: float) -> Link | None:
        """A link for ``client`` now, or None: it is told (``link_granted``/``link_failed``)."""
        while self.idle:
            link = self.idle.pop()
            if link.closed:
                continue
            return self._hand(link, client)
        self.waiting.append((client, now))
        if len(self.busy) >= self.config.size:
            # every connection is held: by construction only a statement admitted around the
            # scheduler (a pipelined one inside a transaction) gets here, or one admitted
            # while a link is parked for a cancel on its way (``release``)
            self.stats.waited += 1
            log.debug("pool %s/%s: a client waits for a connection", self.database, self.user)
        self._open_for_waiters()
        return None

    def forget(self, client: PoolClient) -> None:
        """``client`` went away while waiting."""
        self.waiting = deque(w for w in self.waiting if w[0] is not client)

    def _hand(self, link: Link, client: PoolClient) -> Link:
        link.owner = client
        link.uses += 1
        self.busy.add(link)
        self.stats.handovers += 1
        return link

    def release(self, link: Link, now: float) -> None:
        """``link``'s client is done with it (idle, outside a transaction block). With a
        cancel of that client's still on its way, the link waits for it (``cancel_done``)
        before anyone else gets it, as PgBouncer ≥ 1.19 does."""
        link.owner = None
        if link.canceling and not link.closed:
            link.parked = True  # (still in busy: the pool opens no other in its place)
            self.stats.parked += 1
            return
        self.busy.discard(link)
        if link.closed:
            return
        if link.failure is not None or now - link.created > self.config.lifetime:
            self.stats.closed += 1
            link.close()
            self._open_for_waiters()
            return
        self._give(link, now)

    def _give(self, link: Link, now: float) -> None:
        """A link ready for a client: to the first waiting, else idle."""
        link.idle_since = now
        if self.waiting:
            client, since = self.waiting.popleft()
            self.stats.wait_seconds += now - since
            client.link_granted(self._hand(link, client))
        else:
            self.idle.append(link)

    def cancel_sent(self, link: Link) -> None:
        """A CancelRequest for ``link``'s server process is on its way."""
        link.canceling += 1

    def cancel_done(self, link: Link) -> None:
        """That CancelRequest is through (the server closed its connection) or given up on."""
        link.canceling = max(0, link.canceling - 1)
        if link.canceling or not link.parked:
            return
        if link.closed:  # (closed meanwhile, by the server or the pool's shutdown)
            link.parked = False
            self.busy.discard(link)
            return
        link.parked = False
        self.release(link, self.pools.now())

    def discard(self, link: Link) -> None:
        """Close a link its client left in an unknown state (in a transaction, mid-reply)."""
        self.busy.discard(link)
        link.owner = None
        if not link.closed:
            self.stats.closed += 1
            link.close()
        self._open_for_waiters()

    def _open_for_waiters(self) -> None:
        while len(self.waiting) > len(self.opening) and self.size < self.config.size:
            link = Link(self, self.pools.now())
            self.opening.add(link)
            asyncio.get_running_loop().create_task(self._open(link))

    async def _open(self, link: Link) -> None:
        try:
            await self.pools.connect(lambda: link)
        except (TimeoutError, OSError) as e:
            reason = str(e) or type(e).__name__
            link.failure = f"cannot connect to the database at {self.pools.backend}: {reason}"
            link.closed = True
            self.lost(link, None)
            return
        timeout = self.config.connect_timeout
        asyncio.get_running_loop().call_later(timeout, self._login_expired, link, timeout)

    def _login_expired(self, link: Link, timeout: float) -> None:
        if not link.ready and not link.closed:
            link._fail(f"the database did not finish the connection's startup in {timeout:g} s")

    def opened(self, link: Link) -> None:
        self.opening.discard(link)
        self.stats.opened += 1
        self._give(link, self.pools.now())

    def lost(self, link: Link, exc: Exception | None) -> None:
        """A link closed (the server, the network, or the pool itself)."""
        was_opening = link in self.opening
        self.opening.discard(link)
        self.busy.discard(link)
        if link in self.idle:
            self.idle.remove(link)
            log.info("an idle server connection of %s/%s closed", self.database, self.user)
        if was_opening and not link.ready:
            self.stats.failed += 1
            why = link.failure or "the database closed the connection during its startup"
            log.warning("pool %s/%s: %s", self.database, self.user, why)
            # everyone waiting for a link now is told (a database that refuses will refuse
            # them all); later clients try again
            waiting, self.waiting = self.waiting, deque()
            for client, _ in waiting:
                client.link_failed(why)
            return
        self._open_for_waiters()

    def tick(self, now: float) -> None:
        keep: list[Link] = []
        for link in self.idle:
            if link.closed:
                continue
            if now - link.idle_since > self.config.idle_timeout or (
                now - link.created > self.config.lifetime
            ):
                self.stats.closed += 1
                link.close()
            else:
                keep.append(link)
        self.idle = keep

    def status(self) -> dict[str, object]:
        now = self.pools.now()
        waits = [now - since for _, since in self.waiting]
        return {
            "database": self.database,
            "user": self.user,
            "cl_active": len(self.busy),
            "cl_waiting": len(self.waiting),
            "sv_active": len(self.busy),
            "sv_idle": len(self.idle),
            "sv_login": len(self.opening),
            "pool_size": self.config.size,
            "maxwait": round(max(waits, default=0.0), 6),
            "opened": self.stats.opened,
            "closed": self.stats.closed,
            "failed": self.stats.failed,
            "waited": self.stats.waited,
            "wait_seconds": round(self.stats.wait_seconds, 6),
            "handovers": self.stats.handovers,
            "settings_replayed": self.stats.settings_replayed,
            "reprepared": self.stats.reprepared,
            "evicted": self.stats.evicted,
            "parked": self.stats.parked,
        }


@dataclass
class Pools:
    """Every (database, user)'s pool, for one relay."""

    config: PoolConfig
    backend: BackendAddress
    connect: Callable[[Callable[[], asyncio.Protocol]], Awaitable[asyncio.Transport]]
    now: Callable[[], float] = field(default=lambda: asyncio.get_running_loop().time())
    pools: dict[tuple[str, str], Pool] = field(default_factory=dict)
    _timer: asyncio.TimerHandle | None = None

    def pool(self, user: str, database: str) -> Pool:
        key = (database, user)
        found = self.pools.get(key)
        if found is None:
            found = self.pools[key] = Pool(self, user, database)
            if self._timer is None:
                self._schedule()
        return found

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(1.0, self._tick)

    def _tick(self) -> None:
        now = self.now()
        for pool in self.pools.values():
            pool.tick(now)
        self._schedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for pool in self.pools.values():
            for link in [*pool.idle, *pool.busy, *pool.opening]:
                link.close()
            pool.idle.clear()

    def status(self) -> list[dict[str, object]]:
        return [pool.status() for pool in self.pools.values()]

    @property
    def server_connections(self) -> int:
        return sum(pool.size for pool in self.pools.values())


def backend_password(url: str | None) -> str | None:
    """The password for the pool's links: the backend URL's, else PGPASSWORD."""
    if url:
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(url)
        if parts.password:
            return unquote(parts.password)
    return os.environ.get("PGPASSWORD")
