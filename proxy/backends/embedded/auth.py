"""Password authentication for the embedded server: SCRAM-SHA-256, as PostgreSQL does it.

The relay needs none of this (PostgreSQL authenticates its own clients through it); the
embedded server has no users of its own, so the operator names them: a users file in
PgBouncer's ``userlist.txt`` form — one ``"user" "secret"`` per line, the secret a password or a
SCRAM verifier as PostgreSQL stores it (``SCRAM-SHA-256$4096:salt$StoredKey:ServerKey``, what
``admission passwd`` prints) — or one password for every user name (``ADMISSION_PASSWORD``).
Plain passwords are turned into verifiers when the file is read; the server keeps no password.

``Users.exchange(user)`` starts one client's exchange: ``start()`` is the AuthenticationSASL
message to send, ``step(body)`` takes each SASLInitialResponse/SASLResponse body and returns what
to send back; after the last step the client is in (``done``). A wrong password raises
``AuthenticationFailed`` (FATAL 28P01), a malformed message ``pg.ProtocolViolation`` (08P01).
An unknown user gets the same exchange against a verifier nobody knows, so the answer does not
say whether the user exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import shlex
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import scramp

from proxy.wire import protocol as pg

__all__ = ["MECHANISM", "AuthenticationFailed", "Exchange", "Users", "verifier"]

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # PostgreSQL's scram_iterations default
_SCRAM = scramp.ScramMechanism(MECHANISM)
_INT32 = struct.Struct("!i")

# (salt, StoredKey, ServerKey, iterations): what SCRAM needs to check a client, not the password
AuthInfo = tuple[bytes, bytes, bytes, int]


class AuthenticationFailed(Exception):
    """The client did not prove it knows the password (SQLSTATE 28P01)."""


def verifier(password: str, iterations: int = ITERATIONS) -> str:
    """``password`` as PostgreSQL stores it: ``SCRAM-SHA-256$iter:salt$StoredKey:ServerKey``."""
    salt, stored, server, count = _SCRAM.make_auth_info(password, iteration_count=iterations)
    b64 = base64.b64encode
    return f"{MECHANISM}${count}:{b64(salt).decode()}${b64(stored).decode()}:{b64(server).decode()}"


def _auth_info(secret: str) -> AuthInfo:
    """A users-file secret (a verifier, or a password) as SCRAM's server keys."""
    if not secret.startswith(MECHANISM + "$"):
        salt, stored, server, count = _SCRAM.make_auth_info(secret, iteration_count=ITERATIONS)
        return salt, stored, server, count
    try:
        _, count_salt, keys = secret.split("$")
        count, salt = count_salt.split(":")
        stored, server = keys.split(":")
        b64 = base64.b64decode
        return (
            b64(salt, validate=True),
            b64(stored, validate=True),
            b64(server, validate=True),
            int(count),
        )
    except ValueError:
        raise ValueError(
            "a SCRAM-SHA-256 verifier must read SCRAM-SHA-256$ITER:SALT$STOREDKEY:SERVERKEY"
        ) from None


@dataclass(frozen=True)
class Users:
    """Who may connect: verifiers by user name, or one for every name (``everyone``)."""

    by_name: Mapping[str, AuthInfo]
    everyone: AuthInfo | None = None

    @classmethod
    def from_file(cls, path: Path) -> Users:
        """A PgBouncer-style users file; ValueError names the line that is wrong."""
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"cannot read the users file {path}: {e.strerror or e}") from None
        users: dict[str, AuthInfo] = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith(("#", ";")):
                continue
            try:
                fields = shlex.split(line, comments=True)
                if len(fields) != 2:
                    raise ValueError('expected "user" "password or SCRAM verifier"')
                users[fields[0]] = _auth_info(fields[1])
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}") from None
        if not users:
            raise ValueError(f"the users file {path} names no user")
        return cls(users)

    @classmethod
    def from_password(cls, password: str) -> Users:
        """One password for every user name (``ADMISSION_PASSWORD``)."""
        if not password:
            raise ValueError("the password is empty")
        return cls({}, _auth_info(password))

    @classmethod
    def configured(
        cls, users_file: Path | None, environ: Mapping[str, str] = os.environ
    ) -> Users | None:
        """From ``--users`` or ``ADMISSION_PASSWORD``; None when neither is given (no
        authentication: only for clients on this machine, see ``admission serve --help``)."""
        if users_file is not None:
            return cls.from_file(users_file)
        password = environ.get("ADMISSION_PASSWORD")
        return cls.from_password(password) if password else None

    def exchange(self, user: str) -> Exchange:
        info = self.by_name.get(user, self.everyone)
        if info is None:  # unknown: fail at the proof, like a wrong password
            info = (
                secrets.token_bytes(16),
                secrets.token_bytes(32),
                secrets.token_bytes(32),
                ITERATIONS,
            )
        return Exchange(user, info)


class Exchange:
    """One client's SCRAM-SHA-256 exchange (RFC 5802 and 7677, as PostgreSQL runs it: the user
    name inside the exchange is empty, the startup message's counts; no channel binding is
    offered, so a client may send ``n`` or ``y`` but not ``p``)."""

    __slots__ = ("_auth", "_client_first_bare", "_nonce", "_server_first", "done", "user")

    def __init__(self, user: str, info: AuthInfo) -> None:
        self.user = user
        self._auth = info
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self.done = False

    def start(self) -> bytes:
        """AuthenticationSASL: the mechanisms this server offers."""
        return pg.message(b"R", _INT32.pack(10) + MECHANISM.encode() + b"\0\0")

    def step(self, body: bytes) -> bytes:
        """The answer to a SASLInitialResponse (the first call) or SASLResponse body."""
        try:
            if not self._server_first:
                return self._first(body)
            return self._final(body.decode("utf-8"))
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as e:
            raise pg.ProtocolViolation(f"malformed SCRAM message: {e}") from None

    def _first(self, body: bytes) -> bytes:
        mechanism, pos = pg.read_cstring(body, 0)
        if mechanism != MECHANISM:
            raise pg.ProtocolViolation(
                f"the client chose SASL mechanism {mechanism!r}; this server offers {MECHANISM}"
            )
        (length,) = _INT32.unpack_from(body, pos)
        message = body[pos + 4 : pos + 4 + max(length, 0)].decode("utf-8")
        flag, _authzid, bare = message.split(",", 2)
        if flag not in ("n", "y"):
            raise ValueError("channel binding was not offered")
        attributes = _attributes(bare)
        client_nonce = attributes["r"]
        if not client_nonce or "m" in attributes:
            raise ValueError("no client nonce, or a mandatory extension")
        salt, _stored, _server, iterations = self._auth
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        self._client_first_bare = bare
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return pg.message(b"R", _INT32.pack(11) + self._server_first.encode())

    def _final(self, final: str) -> bytes:
        without_proof, _, proof_attr = final.rpartition(",p=")
        attributes = _attributes(without_proof)
        if attributes.get("r") != self._nonce or attributes.get("c") not in ("biws", "eSws"):
            raise ValueError("the nonce or the channel binding does not match")
        proof = base64.b64decode(proof_attr, validate=True)
        _salt, stored_key, server_key, _iterations = self._auth
        message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(stored_key, message, "sha256")
        if len(proof) != len(signature):
            raise AuthenticationFailed(self.user)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key):
            raise AuthenticationFailed(self.user)
        self.done = True
        server_signature = base64.b64encode(hmac.digest(server_key, message, "sha256"))
        return pg.message(b"R", _INT32.pack(12) + b"v=" + server_signature) + pg.message(
            b"R", _INT32.pack(0)
        )


def _attributes(text: str) -> dict[str, str]:
    """``a=1,b=2`` as a dict (values may hold '=')."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ValueError(f"not a SCRAM attribute: {part!r}")
        out[key] = value
    return out
