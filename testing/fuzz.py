"""A protocol fuzzer for both front ends: real sessions, mutated, sent over real sockets.

A *case* is a client's session as it goes over the wire — a startup packet, then typed messages
and CancelRequests on a second connection — made from the sessions real clients hold (``SESSIONS``:
simple queries, the extended protocol with Parse/Bind/Describe/Execute/Sync/Flush/Close, COPY
FROM STDIN and TO STDOUT, a cancel, Terminate, in the message formats of ``proxy.wire.protocol``,
as psycopg sends them) and mutated: bits flipped, messages truncated, duplicated, reordered,
dropped or given the wrong type, strings left unterminated, a Bind's parameters replaced with bad
numerics, wrong format codes and wrong counts, and — only where ``framed`` allows — length fields
corrupted, oversized or cut off on the wire. ``generate(seed)`` is deterministic: the same seed
gives the same bytes.

``run_case`` plays a case against a server and records what came back as a ``Transcript``: the
backend message types in order, each error with its severity and SQLSTATE, and how the session
ended. A well-framed case ends with a *sentinel* — CopyFail (ends a COPY FROM STDIN, ignored
elsewhere), Sync (ends a failed extended batch), then a Query that rolls back and selects a
token — so the transcript ends exactly when the server has answered everything before it, in
whatever state the case left the session; a case whose framing is broken half-closes its side
instead and reads until the server closes.

Two uses:

* **differential replay** — the same well-framed case straight to PostgreSQL and through a
  front end: through the relay every transcript must be the same (``relay_mismatch``); the
  embedded DuckDB server answers its own way, so it is held to what it can promise
  (``embedded_mismatch``): an ErrorResponse with a sane SQLSTATE wherever PostgreSQL answers
  one, never an internal error, and the session kept or closed as PostgreSQL keeps or closes it;
* **load** — ``fuzz`` runs many cases at once (``fuzz_in_subprocess`` in a process of its own,
  so the fuzzer's work does not slow the proxy it measures) while a ``Bystander`` times another
  client's ``select 1``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import os
import random
import re
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import psycopg

from proxy.wire import protocol as pg

__all__ = [
    "SESSIONS",
    "Bystander",
    "Cancel",
    "Case",
    "FuzzStats",
    "Msg",
    "Transcript",
    "embedded_mismatch",
    "fuzz",
    "fuzz_in_subprocess",
    "generate",
    "relay_mismatch",
    "rss_kb",
    "run_case",
    "startup_packet",
]

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")


# -- messages --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Msg:
    """One typed message. ``length`` overrides the length field and ``keep`` cuts the raw bytes
    short: either breaks the framing (the server can no longer find the next message)."""

    kind: int
    body: bytes
    length: int | None = None
    keep: int | None = None

    @property
    def raw(self) -> bytes:
        length = len(self.body) + 4 if self.length is None else self.length
        raw = bytes([self.kind]) + struct.pack("!I", length & 0xFFFFFFFF) + self.body
        return raw if self.keep is None else raw[: self.keep]

    @property
    def framed(self) -> bool:
        return self.length is None and self.keep is None


@dataclass(frozen=True, slots=True)
class Cancel:
    """A CancelRequest on a connection of its own, ``delay`` seconds after the messages before
    it went out, for the key the session was given (xor ``mangle``); ``packet`` replaces the
    whole packet (a malformed one)."""

    delay: float = 0.0
    mangle: int = 0
    packet: bytes | None = None


Step = Msg | Cancel


def _cstr(text: str | bytes) -> bytes:
    return (text.encode() if isinstance(text, str) else text) + b"\0"


def query(sql: str) -> Msg:
    return Msg(pg.QUERY, _cstr(sql))


def parse(name: str, sql: str, oids: Sequence[int] = ()) -> Msg:
    types = _I16.pack(len(oids)) + b"".join(_I32.pack(o) for o in oids)
    return Msg(pg.PARSE, _cstr(name) + _cstr(sql) + types)


def bind(
    portal: str | bytes,
    statement: str | bytes,
    params: Sequence[bytes | None] = (),
    formats: Sequence[int] = (),
    results: Sequence[int] = (),
    count: int | None = None,
) -> Msg:
    """A Bind; ``count`` overrides the number of parameters it says it carries."""
    body = _cstr(portal) + _cstr(statement)
    body += _I16.pack(len(formats)) + b"".join(_I16.pack(f) for f in formats)
    body += _I16.pack(len(params) if count is None else count)
    for value in params:
        body += _I32.pack(-1) if value is None else _I32.pack(len(value)) + value
    body += _I16.pack(len(results)) + b"".join(_I16.pack(f) for f in results)
    return Msg(pg.BIND, body)


def describe(target: bytes, name: str) -> Msg:
    return Msg(pg.DESCRIBE, target + _cstr(name))


def execute(portal: str, limit: int = 0) -> Msg:
    return Msg(pg.EXECUTE, _cstr(portal) + _I32.pack(limit))


def close(target: bytes, name: str) -> Msg:
    return Msg(pg.CLOSE, target + _cstr(name))


SYNC = Msg(pg.SYNC, b"")
FLUSH = Msg(pg.FLUSH, b"")
TERMINATE = Msg(pg.TERMINATE, b"")
COPY_DONE = Msg(pg.COPY_DONE, b"")


def copy_data(data: bytes) -> Msg:
    return Msg(pg.COPY_DATA, data)


def copy_fail(why: str) -> Msg:
    return Msg(pg.COPY_FAIL, _cstr(why))


def startup_packet(user: str, database: str) -> bytes:
    body = struct.pack("!I", pg.PROTOCOL_3_0) + _cstr("user") + _cstr(user)
    body += _cstr("database") + _cstr(database) + _cstr("application_name") + _cstr("fuzz")
    return struct.pack("!I", len(body) + 5) + body + b"\0"


def cancel_packet(pid: int, secret: int) -> bytes:
    return struct.pack("!IIII", 16, pg.CANCEL_REQUEST_CODE, pid, secret)


def numeric_binary(
    ndigits: int, weight: int, sign: int, dscale: int, digits: Sequence[int]
) -> bytes:
    """A numeric parameter in binary: header and base-10000 digits, as given (true or not)."""
    return struct.pack("!hhHh", ndigits, weight, sign, dscale) + b"".join(
        _I16.pack(d) for d in digits
    )


# The sessions real clients hold, message by message as psycopg sends them (its pipeline and
# prepared statements, COPY with ``cursor.copy``, ``connection.cancel``). Each leaves no state
# behind that the next depends on; the temporary table is the connection's own.
TEMP = "create temp table if not exists fz (a int, b text)"
SESSIONS: dict[str, tuple[Step, ...]] = {
    "simple": (query("select 1"), query("select 'fuzz'::text as t, 2.5::numeric as n")),
    "multi": (query("select 1 as a; select 'two' as b"),),
    "empty": (query(""),),
    "error": (query("select 1/0"), query("select 1")),
    "transaction": (
        query("begin"),
        query(TEMP),
        query("insert into fz values (1, 'a')"),
        query("select a, b from fz"),
        query("commit"),
    ),
    "extended": (
        parse("s1", "select $1::int + $2::int", (23, 23)),
        bind("p1", "s1", (b"40", b"2")),
        describe(b"P", "p1"),
        execute("p1"),
        SYNC,
        close(b"S", "s1"),
        close(b"P", "p1"),
        SYNC,
    ),
    "binary": (
        parse("", "select $1::text as t, $2::numeric as n, $3::int4 as i", (25, 1700, 23)),
        bind(
            "",
            "",
            (b"x", numeric_binary(2, 0, 0, 1, (12, 5000)), _I32.pack(7)),
            (0, 1, 1),
            (1,),
        ),
        describe(b"S", ""),
        describe(b"P", ""),
        execute(""),
        SYNC,
    ),
    "flush": (
        parse("", "select 42 as answer"),
        bind("", ""),
        describe(b"P", ""),
        execute(""),
        FLUSH,
        SYNC,
    ),
    "suspend": (
        parse("s2", "select g from generate_series(1, 5) as g"),
        bind("p2", "s2"),
        execute("p2", 2),
        execute("p2", 2),
        execute("p2"),
        SYNC,
        close(b"S", "s2"),
        SYNC,
    ),
    "insert": (
        query(TEMP),
        parse("", "insert into fz values ($1, $2)", (23, 25)),
        bind("", "", (b"3", b"c")),
        execute(""),
        SYNC,
    ),
    "copy_in": (
        query(TEMP),
        query("copy fz from stdin"),
        copy_data(b"1\ta\n"),
        copy_data(b"2\tb\n"),
        COPY_DONE,
        query("select count(*) > 1 from fz"),
    ),
    "copy_fail": (
        query(TEMP),
        query("copy fz from stdin"),
        copy_data(b"1\ta\n"),
        copy_fail("the client gave up"),
    ),
    "copy_out": (query("copy (select g, 'x' from generate_series(1, 3) as g) to stdout"),),
    "cancel": (query("select pg_sleep(1)"), Cancel(delay=0.25)),
    "terminate": (query("select 1"), TERMINATE),
}
# How often each is drawn: a cancel waits for the statement it cancels, a Terminate ends the case.
WEIGHTS = {name: 1.0 for name in SESSIONS} | {"cancel": 0.15, "terminate": 0.3, "empty": 0.3}


# -- mutations -------------------------------------------------------------------------------

# Message types: the client's own, the server's (a client must not send them) and garbage.
_TYPES = b"QPBDECSHXpdcfF" + b"ZTDRKNAGHWV12ns" + b"\x00\xff#Y"
# Parameter values a Bind can carry: bad numerics and text, wrong binary sizes, odd numeric
# headers (negative digit counts, weights and scales out of range, NaN and infinities).
_BAD_PARAMS: tuple[bytes | None, ...] = (
    None,
    b"",
    b"abc",
    b"1e999999",
    b"NaN",
    b"-",
    b"99999999999999999999999999",
    b"1.5",
    b"\xff\xfe\x00",
    b"{1,2",
    b'{"a',
    b"\\xzz",
    b"2024-13-45",
    _I32.pack(7)[:3],
    struct.pack("!q", 1 << 62),
    numeric_binary(-1, 0, 0, 0, ()),
    numeric_binary(1, 32767, 0, 0, (9999,)),
    numeric_binary(3, 0, 0x1234, 0, (1, 2)),
    numeric_binary(1, -32768, 0x4000, 16383, (1,)),
    numeric_binary(0, 0, 0xC000, 0, ()),
    numeric_binary(0, 0, 0xD000, 0, ()),
    numeric_binary(1, 0, 0, -5, (10001,)),
)


def _bit_flip(rng: random.Random, data: bytes, flips: int) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(flips):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _names(msg: Msg) -> tuple[bytes, bytes]:
    """A Bind's portal and statement names (empty where unreadable)."""
    parts = msg.body.split(b"\0", 2)
    return (parts[0], parts[1]) if len(parts) > 2 else (b"", b"")


def _bad_bind(rng: random.Random, msg: Msg) -> Msg:
    portal, statement = _names(msg) if msg.kind == pg.BIND else (b"", b"")
    n = rng.choice((0, 1, 2, 3, 3, 5))
    params = [rng.choice(_BAD_PARAMS) for _ in range(n)]
    if rng.random() < 0.3:
        params[rng.randrange(n) if n else 0 : 1] = [rng.randbytes(rng.randrange(12))]
    formats = [rng.choice((0, 1, 1, 2, -1, 7)) for _ in range(rng.choice((0, 1, n, n + 1)))]
    results = [rng.choice((0, 1, 3)) for _ in range(rng.choice((0, 1, 2, 9)))]
    count = rng.choice((None, None, None, n + 2, max(n - 1, 0), -1, 32767))
    return bind(portal, statement, params, formats, results, count)


def _unterminated(rng: random.Random, msg: Msg) -> Msg:
    nuls = [i for i, b in enumerate(msg.body) if b == 0]
    if not nuls:
        return replace(msg, body=msg.body + b"x")
    i = rng.choice(nuls)
    return replace(msg, body=msg.body[:i] + msg.body[i + 1 :])


def _mutate(rng: random.Random, steps: list[Step], framed: bool) -> str:
    """Mutate ``steps`` in place; the mutation's name. ``framed``: keep every length right."""
    kinds = [
        "flip",
        "flip",
        "truncate",
        "type",
        "duplicate",
        "reorder",
        "drop",
        "bind",
        "bind",
        "unterminated",
        "insert",
    ]
    if not framed:  # a cancel's timing is a race: it is left out of the differential
        kinds += ["cancel", "length", "oversize", "cut", "header"]
    kind = rng.choice(kinds)
    messages = [i for i, s in enumerate(steps) if isinstance(s, Msg)]
    if not messages:
        steps.append(query("select 1"))
        return "insert"
    i = rng.choice(messages)
    msg = steps[i]
    assert isinstance(msg, Msg)
    if kind == "flip":
        steps[i] = replace(msg, body=_bit_flip(rng, msg.body, rng.choice((1, 1, 2, 4))))
    elif kind == "truncate":
        steps[i] = replace(msg, body=msg.body[: rng.randrange(len(msg.body) + 1)])
    elif kind == "type":
        steps[i] = replace(msg, kind=rng.choice(_TYPES))
    elif kind == "duplicate":
        steps.insert(i, msg)
    elif kind == "reorder":
        j = rng.choice(messages)
        steps[i], steps[j] = steps[j], steps[i]
    elif kind == "drop":
        del steps[i]
    elif kind == "bind":
        binds = [j for j in messages if steps[j].kind == pg.BIND]  # type: ignore[union-attr]
        j = rng.choice(binds) if binds else i
        target = steps[j]
        assert isinstance(target, Msg)
        steps[j] = _bad_bind(rng, target)
    elif kind == "unterminated":
        steps[i] = _unterminated(rng, msg)
    elif kind == "insert":
        junk = Msg(rng.choice(b"QPBDECSHdcfF"), rng.randbytes(rng.randrange(24)))
        steps.insert(i, junk)
    elif kind == "cancel":
        mangle = rng.choice((0, 0, 1, 1 << 40, rng.getrandbits(63)))
        packet = None
        if not framed and rng.random() < 0.3:
            packet = _bit_flip(rng, cancel_packet(1, 2), 2)[: rng.choice((8, 12, 16))]
        steps.insert(i, Cancel(rng.choice((0.0, 0.01)), mangle, packet))
    elif kind == "length":
        steps[i] = replace(msg, length=rng.choice((0, 1, 3, len(msg.body) + 5, len(msg.body) + 99)))
    elif kind == "oversize":
        steps[i] = replace(msg, length=rng.choice((0x7FFFFFFF, 0xFFFFFFFF, 1 << 30, 300 << 20)))
    elif kind == "cut":
        steps[i] = replace(msg, keep=rng.randrange(1, max(len(msg.raw), 2)))
        del steps[i + 1 :]
    else:  # header: bits flipped in the type and length bytes
        raw = _bit_flip(rng, replace(msg, keep=None).raw[:5], rng.choice((1, 2)))
        steps[i] = replace(msg, kind=raw[0], length=struct.unpack("!I", raw[1:5])[0])
    return kind


@dataclass(frozen=True, slots=True)
class Case:
    seed: int
    startup: bytes
    steps: tuple[Step, ...]
    mutations: tuple[str, ...]
    startup_ok: bool = True  # the startup packet is unmutated: its answer is read first

    @property
    def framed(self) -> bool:
        return self.startup_ok and all(
            s.framed if isinstance(s, Msg) else s.packet is None for s in self.steps
        )

    @property
    def messages(self) -> int:
        return 1 + sum(1 for s in self.steps if isinstance(s, Msg))


def _startup_mutation(rng: random.Random, startup: bytes) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:
        return _bit_flip(rng, startup, rng.choice((1, 2, 3)))
    if choice == 1:
        return startup[: rng.randrange(len(startup))]
    if choice == 2:  # another protocol version
        return (
            startup[:4] + struct.pack("!I", rng.choice((0x20000, 0x30009, 0x40000))) + startup[8:]
        )
    if choice == 3:  # SSLRequest or GSSENCRequest first
        code = rng.choice((pg.SSL_REQUEST_CODE, pg.GSSENC_REQUEST_CODE))
        return struct.pack("!II", 8, code) + startup
    if choice == 4:  # a length field out of range
        return struct.pack("!I", rng.choice((0, 4, 7, 10_001, 0xFFFFFFFF))) + startup[4:]
    return startup.replace(b"user\0", b"usr\0")  # no user named


def generate(seed: int, startup: bytes, *, framed: bool = False) -> Case:
    """The case of ``seed``: 1–4 sessions from ``SESSIONS``, then 1–3 mutations. ``framed``:
    only mutations that keep every length field right (the differential replay's)."""
    rng = random.Random(seed)
    names = list(SESSIONS)
    weights = [WEIGHTS[n] for n in names]
    steps: list[Step] = []
    for name in rng.choices(names, weights, k=rng.randint(1, 4)):
        steps.extend(SESSIONS[name])
        if name == "terminate":
            break
    mutations = [_mutate(rng, steps, framed) for _ in range(rng.choice((1, 1, 2, 3)))]
    startup_ok = True
    if not framed and rng.random() < 0.08:
        startup = _startup_mutation(rng, startup)
        startup_ok = False
        mutations.append("startup")
    return Case(seed, startup, tuple(steps), tuple(mutations), startup_ok)


# -- playing a case --------------------------------------------------------------------------

SENTINEL = "fuzz-sentinel"
ENDS_WITHIN = 1.0  # seconds a server has to close after a message it may end the session for
CANCEL_LANDS = 0.3  # seconds a CancelRequest has to reach the statement it cancels
QUIET = 0.1  # seconds without a reply after which a server is taken to wait for the client


def _may_end(kind: int) -> bool:
    """Whether PostgreSQL may end the session for a message of this type (not during a COPY
    FROM STDIN, where such a message only fails the COPY)."""
    return kind == pg.TERMINATE or kind == pg.PASSWORD or kind not in pg.FRONTEND_TYPES


_FATAL = (b"FATAL", b"PANIC")


@dataclass(slots=True)
class Transcript:
    """What a server answered: one token per message (its type; an error's as ``E:08P01``,
    ``E!`` when FATAL) and how it ended: ``answered`` (the sentinel came back), ``closed``
    (the server closed first) or ``timeout``."""

    replies: list[str] = field(default_factory=list)
    end: str = "timeout"
    connections: int = 1
    sent: int = 0

    @property
    def sqlstates(self) -> list[str]:
        return [r.split(":", 1)[1] for r in self.replies if r.startswith("E")]

    @property
    def errors(self) -> list[str]:
        return [r for r in self.replies if r.startswith("E")]

    def shape(self) -> list[str]:
        """The replies as the differential compares them: an error's SQLSTATE class only."""
        return [r[: r.index(":") + 3] if r.startswith("E") else r for r in self.replies]


def _error_token(body: bytes) -> str:
    fields: dict[int, bytes] = {}
    for part in body.split(b"\0"):
        if part:
            fields.setdefault(part[0], part[1:])
    severity = fields.get(ord("V"), fields.get(ord("S"), b""))
    fatal = "!" if severity in _FATAL else ""
    return f"E{fatal}:{fields.get(ord('C'), b'?????').decode('ascii', 'replace')}"


class _Reader:
    """The server's replies to one case, parsed as they come."""

    def __init__(self, transcript: Transcript) -> None:
        self.transcript = transcript
        self.buffer = bytearray()
        self.key: tuple[int, int] | None = None
        self.ready = asyncio.Event()  # the first ReadyForQuery (or the end)
        self.done = asyncio.Event()  # the sentinel was answered, or the server closed
        self._token_seen = False
        self.token = SENTINEL.encode()
        self.received = 0  # messages so far
        self.last = 0  # the type of the last one

    async def quiet(self) -> int:
        """Wait until no reply came for ``QUIET`` seconds (or the end); the last one's type."""
        while not self.done.is_set():
            seen = self.received
            await asyncio.sleep(QUIET)
            if self.received == seen:
                break
        return self.last

    def feed(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos = 0
        while len(buf) - pos >= 5 and not self.done.is_set():
            kind = buf[pos]
            (length,) = struct.unpack_from("!I", buf, pos + 1)
            if len(buf) - pos < 1 + length:
                break
            body = bytes(buf[pos + 5 : pos + 1 + length])
            pos += 1 + length
            self._message(kind, body)
        del buf[:pos]

    def _message(self, kind: int, body: bytes) -> None:
        t = self.transcript
        self.received += 1
        self.last = kind
        if kind == ord("E"):
            t.replies.append(_error_token(body))
            if not self.ready.is_set():
                self.ready.set()
            return
        t.replies.append(chr(kind))
        if kind == pg.BACKEND_KEY_DATA and len(body) >= 8:
            self.key = struct.unpack_from("!II", body)
        elif kind == ord("D") and self.token in body:
            self._token_seen = True
        elif kind == pg.READY_FOR_QUERY:
            self.ready.set()
            if self._token_seen:
                t.end = "answered"
                self.done.set()

    def eof(self) -> None:
        if not self.done.is_set():
            self.transcript.end = "closed"
        self.ready.set()
        self.done.set()


def _sentinel() -> bytes:
    return (
        copy_fail("fuzz").raw + SYNC.raw + query(f"rollback; select '{SENTINEL}' as sentinel").raw
    )


def _writes(rng: random.Random, data: bytes) -> list[bytes]:
    """``data`` cut as a client's writes might cut it: whole, or at random places."""
    mode = rng.randrange(3)
    if mode == 0 or len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 6))))
    if mode == 1:
        cuts = cuts[:1]
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


async def _cancel(host: str, port: int, packet: bytes) -> None:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return
    writer.write(packet)
    try:
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    except OSError:
        pass


async def run_case(
    host: str, port: int, case: Case, *, timeout: float = 10.0, exact: bool = True
) -> Transcript:
    """Play ``case`` against the server at ``host:port`` (see the module docstring).
    ``exact``: a well-framed case waits wherever the server's answer could otherwise depend on
    timing (after a cancel, a COPY FROM STDIN, a message the server may close for), so that
    two servers' transcripts compare; load does not need it."""
    transcript = Transcript()
    reader, writer = await asyncio.open_connection(host, port)
    replies = _Reader(transcript)

    async def read() -> None:
        try:
            while data := await reader.read(65536):
                replies.feed(data)
        except OSError:
            pass
        replies.eof()

    reading = asyncio.get_running_loop().create_task(read())
    rng = random.Random(case.seed ^ 0x5EED)
    try:
        async with asyncio.timeout(timeout):
            writer.write(case.startup)
            transcript.sent += 1
            if case.startup_ok:
                await replies.ready.wait()
            pending: list[bytes] = []
            in_copy = False  # (well-framed cases) the server takes COPY data now

            async def flush() -> None:
                # a server that closed (after a FATAL, say) makes writing fail: what it
                # answered is still read, to the end
                if pending and not replies.done.is_set():
                    try:
                        for chunk in _writes(rng, b"".join(pending)):
                            writer.write(chunk)
                            await writer.drain()
                    except OSError:
                        await replies.done.wait()
                pending.clear()

            for step in case.steps:
                if replies.done.is_set():
                    break
                if isinstance(step, Msg):
                    pending.append(step.raw)
                    transcript.sent += 1
                    if not (case.framed and exact):
                        continue
                    # A well-framed case is compared with another server's answer: no bytes
                    # go after a message the server may end the session for until it has had
                    # its say — bytes it never reads make its close a reset, which can discard
                    # replies not yet read here (a race, not an answer).
                    if in_copy:  # only COPY messages, Flush and Sync are taken in a COPY
                        in_copy = step.kind in (pg.COPY_DATA, pg.FLUSH, pg.SYNC)
                        may_end = not in_copy and step.kind not in (pg.COPY_DONE, pg.COPY_FAIL)
                    else:
                        may_end = _may_end(step.kind)
                    if may_end:
                        await flush()
                        await asyncio.wait([reading], timeout=ENDS_WITHIN)
                    elif step.kind == pg.QUERY and b"stdin" in step.body.lower():
                        await flush()  # whether a COPY FROM STDIN starts
                        in_copy = await replies.quiet() == ord("G")
                    continue
                await flush()
                if step.delay:
                    await asyncio.sleep(step.delay)
                pid, secret = replies.key or (0, 0)
                mangle = step.mangle
                packet = step.packet or cancel_packet(
                    pid ^ (mangle >> 32), secret ^ (mangle & 0xFFFFFFFF)
                )
                transcript.connections += 1
                await _cancel(host, port, packet)
                # it lands before anything else is sent (one that cancelled the sentinel
                # would leave the case unanswered)
                await asyncio.sleep(CANCEL_LANDS)
            await flush()
            if case.framed:
                pending.append(_sentinel())
                transcript.sent += 3
                await flush()
            elif not replies.done.is_set() and writer.can_write_eof():
                with contextlib.suppress(OSError):
                    writer.write_eof()
            await replies.done.wait()
    except TimeoutError:
        pass
    finally:
        if transcript.end == "answered":
            writer.write(TERMINATE.raw)
        writer.close()
        reading.cancel()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await writer.wait_closed()
    return transcript


# -- the differential ------------------------------------------------------------------------

# SQLSTATEs a server may answer hostile input with: a protocol violation, bad input, a
# statement or portal that does not exist, … — any class but internal errors (XX), and none
# that says the server cannot go on (system errors, 58).
_SANE = re.compile(r"^(?!XX|58)[0-9A-Z]{5}$")


def relay_mismatch(direct: Transcript, relayed: Transcript) -> str | None:
    """Why the relay's answer differs from PostgreSQL's own, or None."""
    if direct.end == "timeout":
        return None  # nothing to compare with (PostgreSQL itself did not answer in time)
    if direct.shape() != relayed.shape() or direct.end != relayed.end:
        return (
            f"PostgreSQL: {' '.join(direct.shape())} [{direct.end}]; "
            f"relay: {' '.join(relayed.shape())} [{relayed.end}]"
        )
    return None


def embedded_mismatch(direct: Transcript, embedded: Transcript) -> str | None:
    """Why the embedded server's answer falls short of PostgreSQL's, or None: every error with
    a sane SQLSTATE, an error wherever PostgreSQL answers one, and the session kept or closed
    as PostgreSQL keeps or closes it."""
    insane = [s for s in embedded.sqlstates if not _SANE.match(s)]
    if insane:
        return f"SQLSTATE {', '.join(insane)}: {' '.join(embedded.replies)}"
    if embedded.end == "timeout":
        return f"no answer: {' '.join(embedded.replies)}"
    if direct.end == "timeout":
        return None
    if direct.errors and not embedded.errors:
        return f"no error where PostgreSQL answered {', '.join(direct.errors)}"
    # (PostgreSQL ends a session whose COPY FROM STDIN a message out of place interrupts; the
    # embedded server takes no COPY FROM STDIN at all, so never gets there)
    copy_in = "G" in direct.replies
    if (direct.end == "closed") != (embedded.end == "closed") and not copy_in:
        return (
            f"PostgreSQL {'closed' if direct.end == 'closed' else 'kept'} the session, the "
            f"embedded server {'closed' if embedded.end == 'closed' else 'kept'} it: "
            f"PostgreSQL {' '.join(direct.replies)}; embedded {' '.join(embedded.replies)}"
        )
    return None


# -- load ------------------------------------------------------------------------------------


@dataclass(slots=True)
class FuzzStats:
    """What a fuzz run sent and what came back."""

    cases: int = 0
    messages: int = 0
    connections: int = 0
    ends: Counter[str] = field(default_factory=Counter)
    sqlstates: Counter[str] = field(default_factory=Counter)
    insane: list[str] = field(default_factory=list)  # "seed: SQLSTATE …" (at most 20)
    timeouts: list[int] = field(default_factory=list)  # seeds of cases nobody answered
    refused: int = 0  # connections the server did not accept
    # (seed, internal errors) of each case answered with one
    internal: list[tuple[int, int]] = field(default_factory=list)
    # internal errors of cases PostgreSQL itself answers so (see ``excuse``): relayed, not made
    excused: int = 0

    @property
    def crashes(self) -> int:
        """Answers no hostile input may get: internal errors (but those PostgreSQL itself
        gives the same case, when relayed) and cases nobody answered."""
        internal = sum(self.sqlstates[s] for s in self.sqlstates if not _SANE.match(s))
        return internal - self.excused + len(self.timeouts)

    def add(self, other: FuzzStats) -> None:
        self.cases += other.cases
        self.messages += other.messages
        self.connections += other.connections
        self.ends.update(other.ends)
        self.sqlstates.update(other.sqlstates)
        self.insane.extend(other.insane[: 20 - len(self.insane)])
        self.timeouts.extend(other.timeouts)
        self.refused += other.refused
        self.internal.extend(other.internal)
        self.excused += other.excused


async def fuzz(
    host: str,
    port: int,
    seeds: Iterable[int],
    startup: bytes,
    *,
    concurrency: int = 8,
    timeout: float = 10.0,
    messages: int | None = None,
    progress: int = 0,
) -> FuzzStats:
    """Play the case of every seed (``concurrency`` at a time) until the seeds or ``messages``
    run out; with ``progress``, a line on stderr every that many cases."""
    stats = FuzzStats()
    seeds = iter(seeds)
    lock = asyncio.Lock()

    async def worker() -> None:
        while messages is None or stats.messages < messages:
            async with lock:
                seed = next(seeds, None)
            if seed is None:
                return
            case = generate(seed, startup)
            try:
                t = await run_case(host, port, case, timeout=timeout, exact=False)
            except OSError:
                stats.refused += 1
                continue
            stats.cases += 1
            if progress and stats.cases % progress == 0:
                print(f"{stats.cases} cases, {stats.messages} messages", file=sys.stderr)
            stats.messages += t.sent
            stats.connections += t.connections
            stats.ends[t.end] += 1
            stats.sqlstates.update(t.sqlstates)
            if t.end == "timeout":
                stats.timeouts.append(seed)
            bad = [s for s in t.sqlstates if not _SANE.match(s)]
            if bad:
                stats.internal.append((seed, len(bad)))
                if len(stats.insane) < 20:
                    stats.insane.append(f"seed {seed}: {' '.join(t.replies)}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return stats


def _fuzz_process(
    host: str,
    port: int,
    seeds: range,
    startup: bytes,
    concurrency: int,
    timeout: float,
    messages: int | None,
    progress: int,
) -> FuzzStats:
    return asyncio.run(
        fuzz(
            host,
            port,
            seeds,
            startup,
            concurrency=concurrency,
            timeout=timeout,
            messages=messages,
            progress=progress,
        )
    )


def fuzz_in_subprocess(
    host: str,
    port: int,
    seeds: range,
    startup: bytes,
    *,
    processes: int = 1,
    concurrency: int = 8,
    timeout: float = 10.0,
    messages: int | None = None,
    progress: int = 0,
) -> FuzzStats:
    """``fuzz`` in ``processes`` processes of their own (the seeds and the message budget shared
    out), so that generating and reading cases costs the measured proxy nothing."""
    stats = FuzzStats()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        futures = [
            pool.submit(
                _fuzz_process,
                host,
                port,
                seeds[i::processes],
                startup,
                concurrency,
                timeout,
                None if messages is None else -(-messages // processes),
                progress,
            )
            for i in range(processes)
        ]
        for future in futures:
            stats.add(future.result())
    return stats


class Bystander(threading.Thread):
    """Another client, on its own connection: ``select 1`` every ``interval`` seconds until
    stopped, each answer checked and timed."""

    def __init__(self, port: int, user: str, dbname: str, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(
            host="127.0.0.1", port=port, user=user, dbname=dbname, autocommit=True
        )
        self.interval = interval
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with self.conn:
            while not self._stop_event.is_set():
                started = time.perf_counter()
                try:
                    row = self.conn.execute("select 1").fetchone()
                except psycopg.Error as e:
                    self.failures.append(f"{type(e).__name__}: {e}")
                    return
                self.latencies.append(time.perf_counter() - started)
                if row != (1,):
                    self.failures.append(f"select 1 answered {row!r}")
                self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)

    def percentile(self, q: float, since: int = 0) -> float:
        """The ``q``-th percentile of the latencies (from the ``since``-th on), in seconds."""
        if len(self.latencies) <= since:
            return float("nan")
        ordered = sorted(self.latencies[since:])
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def excuse(
    stats: FuzzStats, host: str, port: int, startup: bytes, *, timeout: float = 10.0
) -> list[str]:
    """Replay each case a relayed server answered with an internal error straight to
    PostgreSQL at ``port``: the internal errors PostgreSQL gives the same case itself are its
    own, relayed (PostgreSQL 15 answers a Parse naming a type OID that does not exist with
    XX000 "cache lookup failed for type"), and are counted in ``stats.excused``. Returns what
    PostgreSQL said for each, for the report."""

    async def run() -> list[str]:
        said: list[str] = []
        for seed, count in stats.internal:
            own: list[str] = []
            for _ in range(3):  # (a server that closes may lose replies to a reset: retry)
                case = generate(seed, startup)
                t = await run_case(host, port, case, timeout=timeout, exact=False)
                own = [s for s in t.sqlstates if not _SANE.match(s)]
                if own:
                    break
            stats.excused += min(len(own), count)
            said.append(f"seed {seed}: PostgreSQL itself answers {' '.join(own) or 'no'} XX")
        return said

    return asyncio.run(run())


def rss_kb(pid: int | None = None) -> int:
    """A process's resident set size (VmRSS), in kB."""
    with open(f"/proc/{pid or os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def select_one(port: int, user: str, dbname: str) -> object:
    """A fresh client's ``select 1`` (what it answered)."""
    with psycopg.connect(
        host="127.0.0.1", port=port, user=user, dbname=dbname, autocommit=True, connect_timeout=10
    ) as conn:
        row = conn.execute("select 1").fetchone()
    return row[0] if row else None


def differential(
    host: str,
    reference: int,
    target: int,
    seeds: Iterable[int],
    reference_startup: bytes,
    target_startup: bytes,
    judge: Callable[[Transcript, Transcript], str | None],
    *,
    timeout: float = 10.0,
) -> list[str]:
    """Play every seed's well-framed case against ``reference`` (PostgreSQL) and ``target``;
    the mismatches ``judge`` finds, as ``"seed N (mutations): why"``."""

    async def run() -> list[str]:
        found: list[str] = []
        for seed in seeds:
            ref_case = generate(seed, reference_startup, framed=True)
            case = generate(seed, target_startup, framed=True)
            direct, other = await asyncio.gather(
                run_case(host, reference, ref_case, timeout=timeout),
                run_case(host, target, case, timeout=timeout),
            )
            why = judge(direct, other)
            if why is not None:
                found.append(f"seed {seed} ({', '.join(case.mutations)}): {why}")
        return found

    return asyncio.run(run())
