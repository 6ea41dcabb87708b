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
from dataclasses import dataclass

from proxy.wire.protocol import ProtocolViolation

__all__ = ["DEFAULT_MAX_MESSAGE", "STARTUP", "Frame", "FrameScanner"]

DEFAULT_MAX_MESSAGE = 256 * 1024 * 1024  # PostgreSQL's own limit is 1 GB for most messages
MAX_STARTUP = 10_000  # PostgreSQL rejects longer startup packets
STARTUP = 0  # Frame.type of an untyped (startup-phase) message

_LEN = struct.Struct("!I")
_TYPED = struct.Struct("!BI")


@dataclass(frozen=True, slots=True)
class Frame:
    type: int  # message type byte, or STARTUP
    body: bytes  # payload after the length
    raw: bytes  # the whole message as received

    @property
    def name(self) -> str:
        return chr(self.type) if self.type else "startup"


class FrameScanner:
    __slots__ = ("_buf", "_max", "_startup")

    def __init__(self, *, startup: bool = False, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._startup = startup
        self._max = max_message

    def expect_startup(self) -> None:
        """The next message is untyped (after an SSLRequest answered 'N', say)."""
        self._startup = True

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
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
                raw = bytes(buf[pos : pos + length])
                frames.append(Frame(STARTUP, raw[4:], raw))
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
            raw = bytes(buf[pos : pos + total])
            frames.append(Frame(kind, raw[5:], raw))
            pos += total
        if pos:
            del buf[:pos]
        return frames
