"""PostgreSQL protocol v3 vocabulary: message codes, the special startup codes, and builders for
the few messages the proxy writes itself (errors, ready-for-query, …). Everything else is
forwarded as the peer sent it.

Reference: PostgreSQL documentation, chapter "Frontend/Backend Protocol" (message formats).
"""

from __future__ import annotations

import struct

__all__ = [
    "CANCEL_REQUEST_CODE",
    "GSSENC_REQUEST_CODE",
    "PROTOCOL_3_0",
    "SSL_REQUEST_CODE",
    "ProtocolViolation",
    "error_response",
    "message",
    "read_cstring",
    "ready_for_query",
]

PROTOCOL_3_0 = 196608  # 3 << 16
PROTOCOL_3_2 = 196610  # PostgreSQL 18
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102

# Frontend (client → server) message types.
QUERY = ord("Q")
PARSE = ord("P")
BIND = ord("B")
DESCRIBE = ord("D")
EXECUTE = ord("E")
CLOSE = ord("C")
SYNC = ord("S")
FLUSH = ord("H")
TERMINATE = ord("X")
PASSWORD = ord("p")  # also SASLInitialResponse, SASLResponse, GSSResponse
COPY_DATA = ord("d")
COPY_DONE = ord("c")
COPY_FAIL = ord("f")
FUNCTION_CALL = ord("F")
FRONTEND_TYPES = frozenset(
    (
        QUERY,
        PARSE,
        BIND,
        DESCRIBE,
        EXECUTE,
        CLOSE,
        SYNC,
        FLUSH,
        TERMINATE,
        PASSWORD,
        COPY_DATA,
        COPY_DONE,
        COPY_FAIL,
        FUNCTION_CALL,
    )
)

# Backend (server → client) message types the proxy looks at.
READY_FOR_QUERY = ord("Z")
BACKEND_KEY_DATA = ord("K")
ERROR_RESPONSE = ord("E")
AUTHENTICATION = ord("R")

# SQLSTATEs the proxy raises.
SQLSTATE_PROTOCOL_VIOLATION = "08P01"
SQLSTATE_CONNECTION_FAILURE = "08006"
SQLSTATE_CANNOT_CONNECT = "08001"
SQLSTATE_QUERY_CANCELED = "57014"
SQLSTATE_TOO_MANY = "53300"
SQLSTATE_OUT_OF_MEMORY = "53200"
SQLSTATE_ADMIN_SHUTDOWN = "57P01"


class ProtocolViolation(Exception):
    """The peer sent bytes that are not a valid protocol v3 stream (SQLSTATE 08P01)."""


_HEADER = struct.Struct("!cI")
_INT32 = struct.Struct("!I")


def message(kind: bytes, body: bytes = b"") -> bytes:
    """One typed message: kind byte, int32 length (counting itself), body."""
    return _HEADER.pack(kind, len(body) + 4) + body


def error_response(
    sqlstate: str, text: str, severity: str = "ERROR", detail: str = "", kind: bytes = b"E"
) -> bytes:
    """An ErrorResponse, or with ``kind=b"N"`` a NoticeResponse (severity WARNING, NOTICE …)."""
    fields = [
        b"S" + severity.encode(),
        b"V" + severity.encode(),
        b"C" + sqlstate.encode(),
        b"M" + text.encode(),
    ]
    if detail:
        fields.append(b"D" + detail.encode())
    return message(kind, b"\0".join(fields) + b"\0\0")


def ready_for_query(status: bytes = b"I") -> bytes:
    return message(b"Z", status)


def read_cstring(data: bytes, offset: int) -> tuple[str, int]:
    """A NUL-terminated string at ``offset``, and the offset after its NUL."""
    end = data.find(0, offset)
    if end < 0:
        raise ProtocolViolation("a string field is not NUL-terminated")
    return data[offset:end].decode("utf-8", "replace"), end + 1


def int32(data: bytes, offset: int = 0) -> int:
    value: int = _INT32.unpack_from(data, offset)[0]
    return value
