"""Golden scripts for the session state machine (``proxy.wire.session.ProxySession``).

The format is the scheduler's (tests/golden/scheduler_driver.py): a command, ``----``, the
lines it must print; ``#`` lines are comments; ``GOLDEN_REWRITE=1`` rewrites the expected
output. A command that sends several messages in one read lists them on indented lines
before ``----``::

    client
      P s1 "select $1::int"
      B "" s1 42
      E ""
      S
    ----
    submit job=1 class=select#… bypass=no sql="select $1::int"
    state: ready | txn: I | key: 4242/99 | jobs: 1 queued | running: no

Commands (words are split like a shell line, so ``""`` is an empty name):

- ``session [tls=on] [max_message=N] [fast=off]``: a new ``ProxySession`` with job ids 1, 2, …
- ``client [split=N|bytes] MESSAGE``: the client's bytes, one read (or the same bytes cut into
  N pieces, or byte by byte: the actions of every piece are printed with ``[k/N]`` and must add
  up, coalesced, to the actions of the whole read, which a last line confirms).
  Messages: ``startup user=U [database=D] [version=3.0] [k=v …]``, ``sslrequest``,
  ``gssencrequest``, ``cancel pid=N secret=N``, ``Q SQL``, ``P NAME SQL [OID …]``,
  ``B PORTAL STATEMENT [VALUE …]``, ``D S|P NAME``, ``E [PORTAL] [ROWS]``, ``C S|P NAME``,
  ``S``, ``H``, ``X``, ``d DATA``, ``c``, ``f MESSAGE``, ``F OID [ARG …]``, ``p PASSWORD``,
  ``raw HEX``.
- ``server [split=N|bytes] MESSAGE``: the server's bytes, one read. Messages: ``R ok|cleartext|
  md5|sasl MECH…|N``, ``K PID SECRET``, ``S NAME VALUE``, ``Z I|T|E``, ``C TAG``,
  ``E [FATAL] SQLSTATE TEXT``, ``N SQLSTATE TEXT``, ``T COLUMN …``, ``D VALUE …`` (``NULL`` is
  a null), ``1``, ``2``, ``3``, ``n``, ``s``, ``I``, ``t OID …``, ``G|H N`` (COPY in/out of N
  columns), ``d DATA``, ``c``, ``A PID CHANNEL PAYLOAD``, ``V [VALUE]``, ``raw HEX``.
- ``fast client [gate=now|wait] MESSAGE`` and ``fast server MESSAGE``: the same bytes through
  the fast path, as ``ClientConnection.data_received``/``from_server`` drive it (the C
  functions when built): ``fast-submit …`` then, with ``gate=now``, the bytes the shell writes
  itself; with ``gate=wait``, ``fast-wait`` (the gate queued the job). ``fast-declined`` means
  the fast path said no and the general path ran.
- ``grant JOB``, ``reject JOB SQLSTATE TEXT``: the gate's answers.
- ``client-lost``, ``server-lost [WHY]``.

Output: one line per action (``to-server``/``to-client`` with the messages decoded, ``|``
between messages of one write; ``submit``, ``release``, ``connect-server``, ``start-tls``,
``forward-cancel``, ``close``), then a state line: the session's state, the transaction
status of the last ReadyForQuery, the backend key, every active job (queued: waiting for its
grant; forwarded: on the server), whether a statement is running. The state line is read from
a replayed copy of the session through its public queries only, so that asking does not
disturb the session (``active_jobs`` leaves the fast path).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shlex
import struct
from collections.abc import Callable
from pathlib import Path

from proxy.wire import protocol as pg
from proxy.wire import session as wire
from proxy.wire.framing import DEFAULT_MAX_MESSAGE
from proxy.wire.session import (
    Close,
    ConnectServer,
    ForwardCancel,
    ProxySession,
    Release,
    SendToClient,
    SendToServer,
    StartTLS,
    Submit,
)
from tests.golden.scheduler_driver import Case, parse, render

# what one step of a script does to a session: its actions, or a marker line (the fast path)
Event = object
Step = Callable[[ProxySession], list[Event]]

_BARE = re.compile(r"^[A-Za-z0-9_.$:#/-]+$")


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _name(text: str) -> str:
    return text if _BARE.match(text) else _q(text)


def _cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def _hex(words: list[str]) -> bytes:
    return bytes.fromhex("".join(words))


def _kv(words: list[str]) -> tuple[list[str], dict[str, str]]:
    pos: list[str] = []
    kv: dict[str, str] = {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            kv[k] = v
        else:
            pos.append(w)
    return pos, kv


def _arg(args: list[str], i: int, default: str = "") -> str:
    return args[i] if len(args) > i else default


# -- the client's messages ---------------------------------------------------------------


def _untyped(code: int, body: bytes = b"") -> bytes:
    return struct.pack("!II", len(body) + 8, code) + body


def frontend(words: list[str]) -> bytes:
    """One client message from its script words."""
    kind, args = words[0], words[1:]
    m = pg.message
    if kind == "startup":
        _, kv = _kv(args)
        major, minor = (int(x) for x in kv.pop("version", "3.0").split("."))
        body = b"".join(_cstr(k) + _cstr(v) for k, v in kv.items()) + b"\0"
        return _untyped(major << 16 | minor, body)
    if kind == "sslrequest":
        return _untyped(pg.SSL_REQUEST_CODE)
    if kind == "gssencrequest":
        return _untyped(pg.GSSENC_REQUEST_CODE)
    if kind == "cancel":
        _, kv = _kv(args)
        return _untyped(
            pg.CANCEL_REQUEST_CODE, struct.pack("!II", int(kv["pid"]), int(kv["secret"]))
        )
    if kind == "raw":
        return _hex(args)
    if kind == "Q":
        return m(b"Q", _cstr(_arg(args, 0)))
    if kind == "P":
        oids = [int(x) for x in args[2:]]
        types = struct.pack(f"!H{len(oids)}I", len(oids), *oids)
        return m(b"P", _cstr(_arg(args, 0)) + _cstr(_arg(args, 1)) + types)
    if kind == "B":
        values = args[2:]
        params = b"".join(
            struct.pack("!i", -1)
            if v == "NULL"
            else struct.pack("!I", len(v.encode())) + v.encode()
            for v in values
        )
        body = _cstr(_arg(args, 0)) + _cstr(_arg(args, 1)) + struct.pack("!H", 0)
        return m(b"B", body + struct.pack("!H", len(values)) + params + struct.pack("!H", 0))
    if kind in ("D", "C"):
        return m(kind.encode(), _arg(args, 0, "S").encode() + _cstr(_arg(args, 1)))
    if kind == "E":
        return m(b"E", _cstr(_arg(args, 0)) + struct.pack("!I", int(_arg(args, 1, "0"))))
    if kind in ("S", "H", "X", "c"):
        return m(kind.encode())
    if kind == "d":
        return m(b"d", _arg(args, 0).encode())
    if kind in ("f", "p"):
        return m(kind.encode(), _cstr(_arg(args, 0)))
    if kind == "F":
        values = args[1:]
        params = b"".join(struct.pack("!I", len(v.encode())) + v.encode() for v in values)
        body = struct.pack("!IH", int(args[0]), 0) + struct.pack("!H", len(values)) + params
        return m(b"F", body + struct.pack("!H", 0))
    raise ValueError(f"unknown client message {kind!r}")


class _Reader:
    """Fields of one message body, in order."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.pos = 0

    def cstr(self) -> str:
        end = self.body.index(0, self.pos)
        text = self.body[self.pos : end].decode("utf-8", "replace")
        self.pos = end + 1
        return text

    def number(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.body, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def take(self, n: int) -> bytes:
        if n < 0:
            return b""
        data = self.body[self.pos : self.pos + n]
        if len(data) < n:
            raise ValueError("short")
        self.pos += n
        return data

    def values(self) -> list[str]:
        out = []
        for _ in range(self.number("!H")):
            n = self.number("!i")
            out.append("NULL" if n < 0 else _q(self.take(n).decode("utf-8", "replace")))
        return out

    def rest(self) -> str:
        return self.body[self.pos :].decode("utf-8", "replace")


def _frontend_text(kind: str, r: _Reader) -> str:
    if kind == "Q":
        return f"Q {_q(r.cstr())}"
    if kind == "P":
        name, sql = r.cstr(), r.cstr()
        oids = [str(r.number("!I")) for _ in range(r.number("!H"))]
        return " ".join(["P", _name(name), _q(sql), *oids])
    if kind == "B":
        portal, statement = r.cstr(), r.cstr()
        formats = [r.number("!H") for _ in range(r.number("!H"))]
        values = r.values()
        results = [r.number("!H") for _ in range(r.number("!H"))]
        extra = []
        if any(formats) or any(results):
            extra.append(f"formats={formats}/{results}")
        return " ".join(["B", _name(portal), _name(statement), *values, *extra])
    if kind in ("D", "C"):
        what = chr(r.take(1)[0])
        return f"{kind} {what} {_name(r.cstr())}"
    if kind == "E":
        portal, rows = r.cstr(), r.number("!I")
        return f"E {_name(portal)}" + (f" {rows}" if rows else "")
    if kind in ("d",):
        return f"d {_q(r.rest())}"
    if kind in ("f", "p"):
        return f"{kind} {_q(r.cstr())}"
    if kind == "F":
        oid = r.number("!I")
        r.take(2 * r.number("!H"))  # argument formats
        return " ".join(["F", str(oid), *r.values()])
    if kind in ("S", "H", "X", "c"):
        return kind
    raise ValueError("unknown")


# -- the server's messages ---------------------------------------------------------------

_AUTH = {"ok": 0, "cleartext": 3, "md5": 5, "sasl": 10, "sasl-continue": 11, "sasl-final": 12}
_AUTH_NAMES = {v: k for k, v in _AUTH.items()}
_SEVERITIES = ("ERROR", "FATAL", "PANIC")


def backend(words: list[str]) -> bytes:
    """One server message from its script words."""
    kind, args = words[0], words[1:]
    m = pg.message
    if kind == "raw":
        return _hex(args)
    if kind == "R":
        what = _arg(args, 0, "ok")
        code = _AUTH[what] if what in _AUTH else int(what)
        extra = b""
        if what == "md5":
            extra = b"salt"
        elif what == "sasl":
            extra = b"".join(_cstr(a) for a in args[1:]) + b"\0"
        elif what in ("sasl-continue", "sasl-final"):
            extra = _arg(args, 1).encode()
        return m(b"R", struct.pack("!I", code) + extra)
    if kind == "K":
        return m(b"K", struct.pack("!II", int(args[0]), int(args[1])))
    if kind == "S":
        return m(b"S", _cstr(args[0]) + _cstr(_arg(args, 1)))
    if kind == "Z":
        return pg.ready_for_query(_arg(args, 0, "I").encode())
    if kind == "C":
        return m(b"C", _cstr(args[0]))
    if kind in ("E", "N"):
        severity = "ERROR" if kind == "E" else "NOTICE"
        if args and args[0] in _SEVERITIES:
            severity, args = args[0], args[1:]
        return pg.error_response(args[0], _arg(args, 1), severity, kind=kind.encode())
    if kind == "T":
        cols = b"".join(_cstr(c) + struct.pack("!IHIhiH", 0, 0, 25, -1, -1, 0) for c in args)
        return m(b"T", struct.pack("!H", len(args)) + cols)
    if kind == "D":
        values = b"".join(
            struct.pack("!i", -1)
            if v == "NULL"
            else struct.pack("!I", len(v.encode())) + v.encode()
            for v in args
        )
        return m(b"D", struct.pack("!H", len(args)) + values)
    if kind in ("1", "2", "3", "n", "s", "I", "c"):
        return m(kind.encode())
    if kind == "t":
        return m(b"t", struct.pack(f"!H{len(args)}I", len(args), *(int(a) for a in args)))
    if kind in ("G", "H", "W"):
        n = int(_arg(args, 0, "1"))
        return m(kind.encode(), struct.pack(f"!BH{n}H", 0, n, *([0] * n)))
    if kind == "d":
        return m(b"d", _arg(args, 0).encode())
    if kind == "A":
        return m(b"A", struct.pack("!I", int(args[0])) + _cstr(args[1]) + _cstr(_arg(args, 2)))
    if kind == "V":
        value = _arg(args, 0, "NULL")
        data = value.encode()
        return m(
            b"V", struct.pack("!i", -1) if value == "NULL" else struct.pack("!I", len(data)) + data
        )
    raise ValueError(f"unknown server message {kind!r}")


def _backend_text(kind: str, r: _Reader) -> str:
    if kind == "R":
        code = r.number("!I")
        what = _AUTH_NAMES.get(code, str(code))
        if what == "sasl":
            mechs = []
            while (mech := r.cstr()) != "":
                mechs.append(mech)
            return " ".join(["R sasl", *mechs])
        if what in ("sasl-continue", "sasl-final"):
            return f"R {what} {_q(r.rest())}"
        return f"R {what}"
    if kind == "K":
        return f"K {r.number('!I')} {r.number('!I')}"
    if kind == "S":
        return f"S {_name(r.cstr())} {_q(r.cstr())}"
    if kind == "Z":
        return f"Z {r.rest()}"
    if kind == "C":
        return f"C {_q(r.cstr())}"
    if kind in ("E", "N"):
        fields: dict[str, str] = {}
        while r.pos < len(r.body) and r.body[r.pos] != 0:
            field = chr(r.take(1)[0])
            fields[field] = r.cstr()
        severity = fields.get("S", "?")
        shown = "" if severity == ("ERROR" if kind == "E" else "NOTICE") else f" {severity}"
        detail = f" detail={_q(fields['D'])}" if "D" in fields else ""
        return f"{kind}{shown} {fields.get('C', '?')} {_q(fields.get('M', ''))}{detail}"
    if kind == "T":
        names = []
        for _ in range(r.number("!H")):
            names.append(_name(r.cstr()))
            r.take(18)  # table, column, type, size, modifier, format
        return " ".join(["T", *names])
    if kind == "D":
        return " ".join(["D", *r.values()])
    if kind in ("1", "2", "3", "n", "s", "I", "c"):
        return kind
    if kind == "t":
        return " ".join(["t", *(str(r.number("!I")) for _ in range(r.number("!H")))])
    if kind in ("G", "H", "W"):
        r.number("!B")
        return f"{kind} {r.number('!H')}"
    if kind == "d":
        return f"d {_q(r.rest())}"
    if kind == "A":
        return f"A {r.number('!I')} {_name(r.cstr())} {_q(r.cstr())}"
    if kind == "V":
        n = r.number("!i")
        return "V NULL" if n < 0 else f"V {_q(r.take(n).decode('utf-8', 'replace'))}"
    raise ValueError("unknown")


def decode(data: bytes, text: Callable[[str, _Reader], str]) -> str:
    """Typed messages, one after the other, ``|`` between them."""
    out = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 5:
            out.append(f"partial {data[pos:].hex()}")
            break
        kind, length = struct.unpack_from("!BI", data, pos)
        end = pos + 1 + length
        if length < 4 or end > len(data):
            out.append(f"partial {data[pos:].hex()}")
            break
        body = data[pos + 5 : end]
        letter = chr(kind)
        try:
            shown = text(letter, _Reader(body))
        except (ValueError, IndexError, struct.error):
            shown = f"{letter}? {body.hex()}"
        out.append(shown)
        pos = end
    return " | ".join(out)


def _startup_text(packet: bytes) -> str:
    (code,) = struct.unpack_from("!I", packet, 4)
    return f"protocol={code >> 16}.{code & 0xFFFF} bytes={len(packet)}"


def show(event: Event) -> str:
    """One action (or a fast-path marker) as one line."""
    if isinstance(event, str):
        return event
    if isinstance(event, SendToServer):
        return "to-server " + decode(event.data, _frontend_text)
    if isinstance(event, SendToClient):
        if event.data in (b"S", b"N"):
            return f"to-client answer {event.data.decode()}"
        return "to-client " + decode(event.data, _backend_text)
    if isinstance(event, ConnectServer):
        params = " ".join(f"{k}={_name(v)}" for k, v in event.parameters.items())
        return f"connect-server {params} {_startup_text(event.startup)}"
    if isinstance(event, StartTLS):
        return "start-tls"
    if isinstance(event, Submit):
        bypass = "yes" if event.bypass else "no"
        return (
            f"submit job={event.job} class={event.query_class.name} bypass={bypass}"
            f" sql={_q(event.sql)}"
        )
    if isinstance(event, Release):
        return f"release job={event.job}"
    if isinstance(event, ForwardCancel):
        return f"forward-cancel pid={event.pid} secret={event.secret}"
    if isinstance(event, Close):
        return f"close {_q(event.reason)}"
    return f"unknown action {event!r}"


def _coalesce(events: list[Event]) -> list[object]:
    """Adjacent writes the same way joined; every action as comparable plain data."""
    out: list[object] = []
    for e in events:
        if isinstance(e, SendToServer | SendToClient) and out:
            last = out[-1]
            if isinstance(last, tuple) and last[0] == type(e).__name__:
                out[-1] = (last[0], last[1] + e.data)
                continue
        if isinstance(e, SendToServer | SendToClient):
            out.append((type(e).__name__, e.data))
        elif dataclasses.is_dataclass(e) and not isinstance(e, type):
            out.append((type(e).__name__, dataclasses.astuple(e)))
        else:
            out.append(e)
    return out


# -- how the connection drives the fast path (proxy/server.py, ClientConnection) ---------------


def _fast_client(s: ProxySession, data: bytes, gate: str) -> list[Event]:
    submit = wire.fast_client(s, data)
    if submit is None:
        return ["fast-declined", *s.client_data(data)]
    job, query_class, bypass, sql = submit
    out: list[Event] = [
        f"fast-submit job={job} class={query_class.name} bypass={'yes' if bypass else 'no'}"
        f" sql={_q(sql)}"
    ]
    if gate == "now":
        s.fast_sent = True
        out.append(SendToServer(data))  # the shell writes the client's bytes itself
    else:
        s.fast_wait()
        out.append("fast-wait")
    return out


def _fast_server(s: ProxySession, data: bytes) -> list[Event]:
    done = wire.fast_server(s, data)
    if done is None:
        return ["fast-declined", *s.server_data(data)]
    out: list[Event] = [SendToClient(data)]  # relayed untouched by the shell
    if done:
        out.append(Release(done))  # the shell releases the job the reply ended
    return out


# -- the driver ----------------------------------------------------------------------------


def _attempt(step: Step, s: ProxySession) -> list[Event]:
    try:
        return step(s)
    except Exception as e:  # a crash is behaviour too: the script shows it
        return [f"exception {type(e).__name__}: {e}"]


def _pieces(data: bytes, split: str) -> list[bytes]:
    if split == "bytes":
        return [data[i : i + 1] for i in range(len(data))]
    n = int(split)
    cuts = [round(i * len(data) / n) for i in range(n + 1)]
    return [data[a:b] for a, b in itertools.pairwise(cuts)]


class Driver:
    def __init__(self) -> None:
        self.options: dict[str, str] = {}
        self.steps: list[Step] = []
        self.session: ProxySession | None = None

    def run(self, case: Case) -> list[str]:
        words = shlex.split(case.command)
        if words[0] == "fast":
            words = [f"fast-{words[1]}", *words[2:]]
        handler = getattr(self, "do_" + words[0].replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown golden command {words[0]!r}")
        lines: list[str] = handler(words[1:], [shlex.split(line) for line in case.input])
        return lines

    # -- sessions --------------------------------------------------------------------------

    def _new(self) -> ProxySession:
        s = ProxySession(
            tls_available=self.options.get("tls") == "on",
            max_message=int(self.options.get("max_message", DEFAULT_MAX_MESSAGE)),
            job_ids=itertools.count(1),
        )
        if self.options.get("fast") == "off":
            s.fast_path = False
        return s

    def _replay(self, extra: Step | None = None) -> tuple[ProxySession, list[Event]]:
        """A copy of the session: a new one taken through the same steps."""
        s = self._new()
        for step in self.steps:
            _attempt(step, s)
        return s, (_attempt(extra, s) if extra is not None else [])

    @property
    def s(self) -> ProxySession:
        assert self.session is not None, "the script must start a session first"
        return self.session

    def _step(self, step: Step) -> list[str]:
        events = _attempt(step, self.s)
        self.steps.append(step)
        return [*(show(e) for e in events), self._state()]

    def _state(self) -> str:
        try:
            s, _ = self._replay()
            jobs = ", ".join(
                f"{job} {'queued' if s.job_is_queued(job) else 'forwarded'}"
                for job in s.active_jobs
            )
            key = "-" if s.backend_key is None else f"{s.backend_key[0]}/{s.backend_key[1]}"
            return (
                f"state: {s.state.value} | txn: {s.transaction_status.decode()} | key: {key}"
                f" | jobs: {jobs or '-'} | running: {'yes' if s.statement_running else 'no'}"
            )
        except Exception as e:
            return f"state: exception {type(e).__name__}: {e}"

    def do_session(self, words: list[str], lines: list[list[str]]) -> list[str]:
        _, self.options = _kv(words)
        self.steps = []
        self.session = self._new()
        return [self._state()]

    # -- bytes -----------------------------------------------------------------------------

    @staticmethod
    def _bytes(
        words: list[str], lines: list[list[str]], encode: Callable[[list[str]], bytes]
    ) -> tuple[bytes, dict[str, str]]:
        flags: dict[str, str] = {}
        while words and words[0].split("=", 1)[0] in ("split", "gate"):
            k, v = words[0].split("=", 1)
            flags[k] = v
            words = words[1:]
        messages = ([words] if words else []) + lines
        return b"".join(encode(m) for m in messages), flags

    def _feed(self, data: bytes, split: str | None, method: str) -> list[str]:
        def whole(s: ProxySession) -> list[Event]:
            result: list[Event] = getattr(s, method)(data)
            return result

        if split is None:
            return self._step(whole)
        pieces = _pieces(data, split)
        shown: list[str] = []

        def cut(s: ProxySession) -> list[Event]:
            events: list[Event] = []
            for k, piece in enumerate(pieces, 1):
                got: list[Event] = getattr(s, method)(piece)
                if s is self.session:
                    shown.extend(f"[{k}/{len(pieces)}] {show(e)}" for e in got)
                events.extend(got)
            return events

        _, reference = self._replay(whole)
        events = _attempt(cut, self.s)
        self.steps.append(cut)
        verdict = (
            f"split {len(pieces)}: same actions as whole"
            if _coalesce(events) == _coalesce(reference)
            else f"split {len(pieces)}: DIFFERENT, whole gives: "
            + " ; ".join(show(e) for e in reference)
        )
        return [*shown, verdict, self._state()]

    def do_client(self, words: list[str], lines: list[list[str]]) -> list[str]:
        data, flags = self._bytes(words, lines, frontend)
        return self._feed(data, flags.get("split"), "client_data")

    def do_server(self, words: list[str], lines: list[list[str]]) -> list[str]:
        data, flags = self._bytes(words, lines, backend)
        return self._feed(data, flags.get("split"), "server_data")

    def do_fast_client(self, words: list[str], lines: list[list[str]]) -> list[str]:
        data, flags = self._bytes(words, lines, frontend)
        gate = flags.get("gate", "now")
        return self._step(lambda s: _fast_client(s, data, gate))

    def do_fast_server(self, words: list[str], lines: list[list[str]]) -> list[str]:
        data, _ = self._bytes(words, lines, backend)
        return self._step(lambda s: _fast_server(s, data))

    # -- the gate and the sockets ----------------------------------------------------------

    def do_grant(self, words: list[str], lines: list[list[str]]) -> list[str]:
        job = int(words[0])
        return self._step(lambda s: list(s.granted(job)))

    def do_reject(self, words: list[str], lines: list[list[str]]) -> list[str]:
        job, sqlstate, text = int(words[0]), words[1], _arg(words, 2)
        return self._step(lambda s: list(s.rejected(job, sqlstate, text)))

    def do_client_lost(self, words: list[str], lines: list[list[str]]) -> list[str]:
        return self._step(lambda s: list(s.client_lost()))

    def do_server_lost(self, words: list[str], lines: list[list[str]]) -> list[str]:
        if words:
            why = words[0]
            return self._step(lambda s: list(s.server_lost(why)))
        return self._step(lambda s: list(s.server_lost()))


def run_script(path: Path) -> tuple[str, str]:
    """Returns (expected text, actual text) for one script."""
    text = path.read_text()
    cases = parse(text)
    driver = Driver()
    for case in cases:
        case.actual = driver.run(case)
    return text, render(cases)
