"""Framing: a byte stream in, complete protocol messages out.

``FrameScanner.feed(data)`` appends to an internal buffer and returns the complete messages now
available as ``Frame`` objects, each carrying its type, body and the raw bytes (header included)
so that the shell can forward them untouched. Incomplete trailing bytes stay buffered; feeding
a stream whole, byte by byte or split anywhere yields the same frames.

The first message a client sends has no type byte (startup, SSL/GSSENC negotiation, cancel);
``expect_startup()`` arms the scanner for one such untyped message. Malformed input (a length
below 4, above the configured maximum) raises ``ProtocolViolation`` and nothing else.
"""

from __future__ import annotations

import struct

from proxy.wire.protocol import ProtocolViolation

__all__ = ["DEFAULT_MAX_MESSAGE", "STARTUP", "Frame", "FrameScanner"]

DEFAULT_MAX_MESSAGE = 256 * 1024 * 1024  # PostgreSQL's own limit is 1 GB for most messages
MAX_STARTUP = 10_000  # PostgreSQL rejects longer startup packets
STARTUP = -1  # Frame.type of an untyped (startup-phase) message: no type byte is -1

_LEN = struct.Struct("!I")
_TYPED = struct.Struct("!BI")


class Frame:
    """One message: its type (or STARTUP) and its raw bytes; the body is sliced on demand."""

    __slots__ = ("raw", "type")

    def __init__(self, kind: int, raw: bytes) -> None:
        self.type = kind
        self.raw = raw

    @property
    def body(self) -> bytes:
        """The payload after the length (and after the type byte of a typed message)."""
        return self.raw[4:] if self.type == STARTUP else self.raw[5:]

    @property
    def name(self) -> str:
        return "startup" if self.type == STARTUP else chr(self.type)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frame) and (self.type, self.raw) == (other.type, other.raw)

    def __hash__(self) -> int:
        return hash((self.type, self.raw))

    def __repr__(self) -> str:
        return f"Frame({self.name!r}, {self.raw!r})"


class FrameScanner:
    __slots__ = ("_max", "_startup", "buffer")

    def __init__(self, *, startup: bool = False, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.buffer = bytearray()  # bytes of an incomplete message (read-only outside)
        self._startup = startup
        self._max = max_message

    def expect_startup(self) -> None:
        """The next message is untyped (after an SSLRequest answered 'N', say)."""
        self._startup = True

    @property
    def buffered(self) -> int:
        return len(self.buffer)

    def feed(self, data: bytes) -> list[Frame]:
        buf = self.buffer
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        while True:
            if self._startup:
                if end - pos < 4:
                    break
                (length,) = _LEN.unpack_from(buf, pos)
                if length < 8 or length > MAX_STARTUP:
                    raise ProtocolViolation(f"invalid startup packet length {length}")
                if end - pos < length:
                    break
                frames.append(Frame(STARTUP, bytes(buf[pos : pos + length])))
                pos += length
                self._startup = False
                # a startup message is answered before the client sends more
                break
            if end - pos < 5:
                break
            kind, length = _TYPED.unpack_from(buf, pos)
            if length < 4 or length > self._max:
                raise ProtocolViolation(
                    f"message {chr(kind)!r} has invalid length {length} (limit {self._max})"
                )
            total = length + 1
            if end - pos < total:
                break
            frames.append(Frame(kind, bytes(buf[pos : pos + total])))
            pos += total
        if pos:
            del buf[:pos]
        return frames
