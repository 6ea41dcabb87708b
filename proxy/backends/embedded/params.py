"""Bind parameters from PostgreSQL's wire formats to the Python values DuckDB takes.

A client sends each parameter in text or in binary (asyncpg sends binary), typed by the OID
the statement's Parse declared or this server inferred (``compat.infer_parameter_types``).
``decode_param`` reads one; arrays are one-dimensional, as drivers send them. A value that
does not read raises ``ValueError``, ``ArithmeticError`` (a numeric out of range) or
``struct.error`` (the caller answers 22P02, or 22P03 for binary), a type whose binary form is
not read here ``QueryError`` 0A000.
"""

from __future__ import annotations

import datetime
import re
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal

from proxy.backends.embedded import compat
from proxy.backends.embedded.compat import array_items
from proxy.backends.embedded.executor import QueryError
from proxy.backends.pgtypes import ARRAY_ELEMENT

__all__ = ["decode_param"]


def decode_param(raw: bytes | None, oid: int, binary: bool) -> object:
    if raw is None:
        return None
    if oid in ARRAY_ELEMENT:
        element = ARRAY_ELEMENT[oid]
        if binary:
            return _binary_array(raw, element)
        return [
            None if item is None else decode_param(item.encode(), element, False)
            for item in array_items(raw.decode())
        ]
    if binary:
        decoder = _BINARY_PARAMS.get(oid)
        if decoder is None:
            raise QueryError("0A000", f"binary parameters of type {oid} are not supported")
        return decoder(raw)
    text = raw.decode()
    if oid in (20, 21, 23, 26):
        return int(text)
    if oid in (700, 701):
        return float(text)
    if oid == 1700:
        return Decimal(text)
    if oid == 16:
        return text.lower() in ("t", "true", "1", "on", "yes", "y")
    if oid == 1082:
        return _date_param(text)
    if oid == 17 and text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    if oid in (1114, 1184):  # ('… 03:04:05.000 +00:00', Sequelize's: DuckDB wants no space)
        return compat.spaced_offset(text)
    return text


# a date followed by what PostgreSQL's date input reads and drops: a time, a zone or both
# (pgjdbc sends setDate's value as '2020-01-31 +00', untyped)
_DATE_AND_MORE = re.compile(
    r"(\d{4,}-\d\d?-\d\d?)(?:[ T]\d\d?:\d\d(?::\d\d(?:\.\d+)?)?)?"
    r"(?:\s*(?:[+-]\d\d?(?::?\d\d){0,2}|Z|UTC|GMT))?"
)


def _date_param(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        found = _DATE_AND_MORE.fullmatch(text.strip())
        if found is None:
            raise
        year, month, day = (int(part) for part in found.group(1).split("-"))
        return datetime.date(year, month, day)


def _jsonb_param(raw: bytes) -> str:
    """jsonb's binary form: a version byte (1) and the text."""
    if raw[:1] != b"\x01":
        raise QueryError("22P03", f"unsupported jsonb version number {raw[:1].hex() or 'none'}")
    return raw[1:].decode()


def _binary_array(raw: bytes, element: int) -> list[object]:
    ndim, _, _ = struct.unpack_from("!iii", raw)
    if ndim == 0:
        return []
    if ndim != 1:
        raise ValueError("multidimensional array parameters are not supported")
    (count,) = struct.unpack_from("!i", raw, 12)
    pos, items = 20, []
    for _ in range(count):
        (length,) = struct.unpack_from("!i", raw, pos)
        pos += 4
        items.append(None if length < 0 else decode_param(raw[pos : pos + length], element, True))
        pos += max(length, 0)
    return items


_PG_EPOCH = datetime.datetime(2000, 1, 1)


def _numeric_param(raw: bytes) -> Decimal:
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", raw)
    if sign == 0xC000:
        return Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return Decimal("Infinity" if sign == 0xD000 else "-Infinity")
    digits = struct.unpack_from(f"!{ndigits}h", raw, 8)
    value = sum(Decimal(d) * Decimal(10000) ** (weight - i) for i, d in enumerate(digits))
    value = value.quantize(Decimal(1).scaleb(-dscale)) if digits else Decimal(0).scaleb(-dscale)
    return -value if sign == 0x4000 else value


def _micro(raw: bytes, offset: int = 0) -> datetime.timedelta:
    return datetime.timedelta(microseconds=struct.unpack_from("!q", raw, offset)[0])


def _interval_param(raw: bytes) -> datetime.timedelta:
    _, days, months = struct.unpack("!qii", raw)
    return _micro(raw) + datetime.timedelta(days=days + 30 * months)


_BINARY_PARAMS: dict[int, Callable[[bytes], object]] = {
    16: lambda raw: raw != b"\0",
    17: bytes,
    20: lambda raw: struct.unpack("!q", raw)[0],
    21: lambda raw: struct.unpack("!h", raw)[0],
    23: lambda raw: struct.unpack("!i", raw)[0],
    26: lambda raw: struct.unpack("!I", raw)[0],
    25: lambda raw: raw.decode(),
    700: lambda raw: struct.unpack("!f", raw)[0],
    701: lambda raw: struct.unpack("!d", raw)[0],
    1043: lambda raw: raw.decode(),
    705: lambda raw: raw.decode(),
    0: lambda raw: raw.decode(),
    1700: _numeric_param,
    1082: lambda raw: datetime.date(2000, 1, 1) + datetime.timedelta(struct.unpack("!i", raw)[0]),
    1083: lambda raw: (datetime.datetime.min + _micro(raw)).time(),
    1114: lambda raw: _PG_EPOCH + _micro(raw),
    1184: lambda raw: (_PG_EPOCH + _micro(raw)).replace(tzinfo=datetime.UTC),
    1186: _interval_param,
    2950: lambda raw: uuid.UUID(bytes=raw),
    114: lambda raw: raw.decode(),
    3802: _jsonb_param,
}
