"""A protocol v3 client on a bare socket, for tests that send what drivers would not (or not
in one write) and read the replies message by message."""

from __future__ import annotations

import socket
import struct

__all__ = ["RawClient", "startup_packet"]


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def startup_packet(user: str, dbname: str) -> bytes:
    body = struct.pack("!I", 196608) + f"user\0{user}\0database\0{dbname}\0\0".encode()
    return struct.pack("!I", len(body) + 4) + body


class RawClient:
    """A protocol v3 client on a bare socket, read message by message."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_message(self) -> tuple[bytes, bytes] | None:
        """The next message (type, body), or None when the server closed the connection."""
        while True:
            if len(self.buffer) >= 5:
                (length,) = struct.unpack_from("!I", self.buffer, 1)
                if len(self.buffer) >= 1 + length:
                    kind, body = self.buffer[:1], self.buffer[5 : 1 + length]
                    self.buffer = self.buffer[1 + length :]
                    return kind, body
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buffer += chunk

    def read_until(self, *kinds: bytes) -> list[tuple[bytes, bytes]]:
        """Messages up to and including the first of ``kinds`` (or up to the close)."""
        out = []
        while (message := self.read_message()) is not None:
            out.append(message)
            if message[0] in kinds:
                break
        return out

    def replies(self, count: int) -> list[tuple[bytes, bytes]]:
        """Messages up to and including the ``count``-th ReadyForQuery."""
        out: list[tuple[bytes, bytes]] = []
        while count:
            message = self.read_message()
            assert message is not None, f"the connection was closed after {out}"
            out.append(message)
            count -= message[0] == b"Z"
        return out

    def login(self, user: str = "postgres", dbname: str = "postgres") -> None:
        """Startup (trust authentication) up to the first ReadyForQuery."""
        self.send(startup_packet(user, dbname))
        self.replies(1)

    def queries(self, *sqls: str) -> None:
        """Simple Queries, all in one write (pipelined: none waits for the one before)."""
        self.send(b"".join(_message(b"Q", sql.encode() + b"\0") for sql in sqls))

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()

    def reset(self) -> None:
        """Die without a word: SO_LINGER 0 makes close() send an RST, not a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
