"""DuckDB values in PostgreSQL's wire form: type OIDs, typmods and the text encoding.

The embedded DuckDB backend answers the PostgreSQL protocol itself, so each result column needs
a PostgreSQL type (OID, size, typmod) for RowDescription and each value PostgreSQL's own text
output (DateStyle ISO, TimeZone UTC, IntervalStyle postgres, bytea_output hex), exactly — a
client that parses ``1 day 02:00:00`` or ``{1,2,"a b"}`` must not be able to tell.

``pg_type(duckdb_type)`` maps a DuckDB type name (as in a cursor's description) to a ``PgType``;
``encode_text(value, pg_type)`` turns the Python value DuckDB returned into bytes;
``encode_binary`` gives PostgreSQL's binary send format instead (what asyncpg asks for).
"""

from __future__ import annotations

import datetime
import math
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Context, Decimal

__all__ = [
    "ARRAY_ELEMENT",
    "BUILTIN",
    "PgType",
    "encode_binary",
    "encode_text",
    "pg_type",
    "text_encoder",
]


@dataclass(frozen=True, slots=True)
class PgType:
    name: str
    oid: int
    size: int  # typlen: -1 for variable length
    typmod: int = -1
    element: PgType | None = None  # for arrays


def _t(name: str, oid: int, size: int) -> PgType:
    return PgType(name, oid, size)


BOOL = _t("bool", 16, 1)
BYTEA = _t("bytea", 17, -1)
INT8 = _t("int8", 20, 8)
INT2 = _t("int2", 21, 2)
INT4 = _t("int4", 23, 4)
TEXT = _t("text", 25, -1)
JSON = _t("json", 114, -1)
JSONB = _t("jsonb", 3802, -1)
FLOAT4 = _t("float4", 700, 4)
FLOAT8 = _t("float8", 701, 8)
VARCHAR = _t("varchar", 1043, -1)
DATE = _t("date", 1082, 4)
TIME = _t("time", 1083, 8)
TIMESTAMP = _t("timestamp", 1114, 8)
TIMESTAMPTZ = _t("timestamptz", 1184, 8)
INTERVAL = _t("interval", 1186, 16)
NUMERIC = _t("numeric", 1700, -1)
UUID = _t("uuid", 2950, 16)
CHAR = _t("char", 18, 1)
NAME = _t("name", 19, 64)
OID = _t("oid", 26, 4)

_ARRAY_OIDS = {
    16: 1000,
    17: 1001,
    20: 1016,
    21: 1005,
    23: 1007,
    25: 1009,
    114: 199,
    3802: 3807,
    700: 1021,
    701: 1022,
    1043: 1015,
    1082: 1182,
    1083: 1183,
    1114: 1115,
    1184: 1185,
    1186: 1187,
    1700: 1231,
    2950: 2951,
    26: 1028,
    18: 1002,
    19: 1003,
}
_ALL = [
    BOOL,
    BYTEA,
    INT8,
    INT2,
    INT4,
    TEXT,
    JSON,
    JSONB,
    FLOAT4,
    FLOAT8,
    VARCHAR,
    DATE,
    TIME,
    TIMESTAMP,
]
_ALL += [TIMESTAMPTZ, INTERVAL, NUMERIC, UUID, CHAR, NAME, OID]
BUILTIN = {t.oid: t for t in _ALL}

ARRAY_ELEMENT = {array: element for element, array in _ARRAY_OIDS.items()}

_SCALARS: dict[str, PgType] = {
    "BOOLEAN": BOOL,
    "TINYINT": INT2,
    "SMALLINT": INT2,
    "UTINYINT": INT2,
    "INTEGER": INT4,
    "USMALLINT": INT4,
    "BIGINT": INT8,
    "UINTEGER": INT8,
    "UBIGINT": NUMERIC,
    "HUGEINT": NUMERIC,
    "UHUGEINT": NUMERIC,
    "FLOAT": FLOAT4,
    "DOUBLE": FLOAT8,
    "VARCHAR": TEXT,
    "BLOB": BYTEA,
    "DATE": DATE,
    "TIME": TIME,
    "TIMESTAMP": TIMESTAMP,
    "TIMESTAMP_S": TIMESTAMP,
    "TIMESTAMP_MS": TIMESTAMP,
    "TIMESTAMP_NS": TIMESTAMP,
    "TIMESTAMP WITH TIME ZONE": TIMESTAMPTZ,
    "INTERVAL": INTERVAL,
    "UUID": UUID,
    # (jsonb, not json: a DuckDB JSON column is what a jsonb one is created as, as ORMs
    # declare JSON columns, and Django reads only jsonb's text as its own)
    "JSON": JSONB,
}
_DECIMAL = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")
SCALAR_NAMES = tuple(_SCALARS)  # the DuckDB type names with a PostgreSQL type of their own


def unbounded_decimal(precision: int, scale: int) -> bool:
    """Whether a DuckDB DECIMAL is PostgreSQL's numeric without a typmod: the embedded
    server's DECIMAL(38,9) for it (``compat.UNBOUNDED_NUMERIC``) and what products of such
    values are (scale 18, 27, 36). Its values are written without the fixed scale's trailing
    zeros, as the numbers they are (the C encoder of ``_rows`` decides the same)."""
    return precision == 38 and scale > 0 and scale % 9 == 0


def pg_type(duckdb_type: str) -> PgType:
    """The PostgreSQL type for a DuckDB type name; anything unknown travels as text."""
    name = str(duckdb_type).upper().strip()
    if name.endswith("[]"):
        element = pg_type(name[:-2])
        oid = _ARRAY_OIDS.get(element.oid, 1009)
        return PgType(element.name + "[]", oid, -1, element=element if oid != 1009 else TEXT)
    decimal = _DECIMAL.fullmatch(name)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if unbounded_decimal(precision, scale):
            return NUMERIC
        return PgType("numeric", NUMERIC.oid, -1, ((precision << 16) | scale) + 4)
    return _SCALARS.get(name, TEXT)


# -- text encoders -------------------------------------------------------------------------


def _bool(v: object) -> str:
    return "t" if v else "f"


def _numeric(v: object) -> str:
    if isinstance(v, Decimal):
        if v.is_nan():
            return "NaN"
        if v.is_infinite():
            return "Infinity" if v > 0 else "-Infinity"
        return format(v, "f")
    return str(v)


def _trimmed(d: Decimal) -> Decimal:
    """``d`` without trailing zeros after its point (100.000 is 100, not 1E+2)."""
    exponent = d.as_tuple().exponent
    if not isinstance(exponent, int) or exponent >= 0:
        return d
    trimmed = d.normalize(_EXACT)  # (the default context rounds to 28 digits)
    if trimmed.as_tuple().exponent > 0:  # type: ignore[operator]
        trimmed = trimmed.quantize(_ONE, context=_EXACT)
    return trimmed if trimmed or not trimmed.is_signed() else trimmed.copy_abs()


_ONE = Decimal(1)
_EXACT = Context(prec=100)  # (more digits than a DECIMAL has)


def _numeric_unbounded(v: object) -> str:
    """An unconstrained numeric's text (see ``unbounded_decimal``)."""
    return _numeric(_trimmed(v) if isinstance(v, Decimal) else v)


def _special(x: float) -> str | None:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return None


def _shortest(shortest: str, fixed_below: int) -> str:
    """PostgreSQL's float output from the shortest round-trip digits: fixed notation for a
    decimal exponent in [-4, fixed_below), else d.ddde±XX (two exponent digits at least)."""
    sign, digits, exponent = Decimal(shortest).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    scientific = len(digits) - 1 + exponent
    if text == "0":
        return "-0" if sign else "0"
    if -4 <= scientific < fixed_below:
        fixed = format(Decimal(shortest), "f")
        if "." in fixed:
            fixed = fixed.rstrip("0").rstrip(".")
        return fixed
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if scientific < 0 else '+'}{abs(scientific):02d}"


def _float8(v: object) -> str:
    x = float(v)  # type: ignore[arg-type]
    if 1e-4 <= abs(x) < 1e15:  # Python's repr is fixed there, with PostgreSQL's digits
        text = repr(x)
        return text[:-2] if text.endswith(".0") else text
    return _special(x) or _shortest(repr(x), 15)


def _float4(v: object) -> str:
    x = float(v)  # type: ignore[arg-type]
    special = _special(x)
    if special:
        return special
    as32 = struct.unpack("f", struct.pack("f", x))[0]
    for precision in range(1, 10):  # the fewest digits that read back as the same float4
        text = f"{as32:.{precision}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == as32:
            return _shortest(text, 6)
    return _shortest(repr(as32), 6)


def _fraction(micro: int) -> str:
    return f".{micro:06d}".rstrip("0") if micro else ""


def _time(v: object) -> str:
    t = v if isinstance(v, datetime.time) else datetime.time()
    return f"{t.hour:02d}:{t.minute:02d}:{t.second:02d}{_fraction(t.microsecond)}"


def _date(v: object) -> str:
    d = v
    if type(d) is datetime.date:
        return d.isoformat()  # (a datetime's would have its time)
    assert isinstance(d, datetime.date)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}"


def _timestamp(v: object) -> str:
    assert isinstance(v, datetime.datetime)
    return f"{_date(v)} {_time(v.time())}"


def _timestamptz(v: object) -> str:
    assert isinstance(v, datetime.datetime)
    utc = v.astimezone(datetime.UTC) if v.tzinfo else v
    return f"{_timestamp(utc.replace(tzinfo=None))}+00"


def _interval(v: object) -> str:
    """IntervalStyle postgres ('3 days 04:05:06', '-1 days -01:00:00'). DuckDB hands over a
    timedelta, so months arrive as days and a mixed-sign interval as its net value."""
    assert isinstance(v, datetime.timedelta)
    total = v // datetime.timedelta(microseconds=1)
    sign = -1 if total < 0 else 1
    days, rest = divmod(abs(total), 86_400_000_000)
    parts = []
    if days:
        days *= sign
        parts.append(f"{days} day{'' if days == 1 else 's'}")
    if rest or not parts:
        seconds, micro = divmod(rest, 1_000_000)
        h, rem = divmod(seconds, 3600)
        m, s = divmod(rem, 60)
        clock = f"{h:02d}:{m:02d}:{s:02d}{_fraction(micro)}"
        parts.append(("-" if sign < 0 else "") + clock)
    return " ".join(parts)


def _bytea(v: object) -> str:
    assert isinstance(v, bytes | bytearray | memoryview)
    return "\\x" + bytes(v).hex()


def _str(v: object) -> str:
    return str(v)


_ENCODERS: dict[int, Callable[[object], str]] = {
    BOOL.oid: _bool,
    INT2.oid: _str,
    INT4.oid: _str,
    INT8.oid: _str,
    NUMERIC.oid: _numeric,
    FLOAT4.oid: _float4,
    FLOAT8.oid: _float8,
    DATE.oid: _date,
    TIME.oid: _time,
    TIMESTAMP.oid: _timestamp,
    TIMESTAMPTZ.oid: _timestamptz,
    INTERVAL.oid: _interval,
    BYTEA.oid: _bytea,
    UUID.oid: _str,
}

_NEEDS_QUOTES = re.compile(r'[\s{},"\\]')


def _array(values: object, element: PgType) -> str:
    assert isinstance(values, list | tuple)
    items = []
    for item in values:
        if item is None:
            items.append("NULL")
            continue
        text = _scalar(item, element)
        if not text or _NEEDS_QUOTES.search(text) or text.upper() == "NULL":
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        items.append(text)
    return "{" + ",".join(items) + "}"


def _scalar(value: object, t: PgType) -> str:
    encoder = _numeric_unbounded if t == NUMERIC else _ENCODERS.get(t.oid)
    if encoder is not None:
        return encoder(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


def text_encoder(t: PgType) -> Callable[[object], bytes]:
    """``encode_text`` for the values of one column, chosen once (not NULL): a row encoder
    calls it per value."""
    if t.element is not None:
        element = t.element
        return lambda v: _array(v, element).encode()
    scalar = _numeric_unbounded if t == NUMERIC else _ENCODERS.get(t.oid, str)
    return lambda v: scalar(v).encode()


def encode_text(value: object, t: PgType) -> bytes | None:
    """PostgreSQL's text output for ``value`` of type ``t``; None for SQL NULL."""
    if value is None:
        return None
    if t.element is not None:
        return _array(value, t.element).encode()
    return _scalar(value, t).encode()


# -- binary encoders (PostgreSQL's *send functions) -----------------------------------------

_EPOCH_DATE = datetime.date(2000, 1, 1)
_EPOCH = datetime.datetime(2000, 1, 1)
_EPOCH_TZ = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_MICRO = datetime.timedelta(microseconds=1)
_NUMERIC_SPECIAL = {"NaN": 0xC000, "Infinity": 0xD000, "-Infinity": 0xF000}


def _b_numeric(v: object) -> bytes:
    d = v if isinstance(v, Decimal) else Decimal(str(v))
    if not d.is_finite():
        return struct.pack("!hhHh", 0, 0, _NUMERIC_SPECIAL[_numeric(d)], 0)
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    whole, _, fraction = format(d.copy_abs(), "f").partition(".")
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    fraction = fraction + "0" * (-len(fraction) % 4)
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    sign = 0x4000 if d.is_signed() and groups else 0
    return struct.pack(f"!hhHh{len(groups)}h", len(groups), weight, sign, dscale, *groups)


def _b_time(v: object) -> bytes:
    assert isinstance(v, datetime.time)
    micro = ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
    return struct.pack("!q", micro)


def _b_date(v: object) -> bytes:
    assert isinstance(v, datetime.date)
    return struct.pack("!i", (v - _EPOCH_DATE).days)


def _b_timestamp(v: object) -> bytes:
    assert isinstance(v, datetime.datetime)
    if v.tzinfo is not None:
        return struct.pack("!q", (v - _EPOCH_TZ) // _MICRO)
    return struct.pack("!q", (v - _EPOCH) // _MICRO)


def _b_interval(v: object) -> bytes:
    """Days and time with the sign of the net value, as the text output shows them."""
    assert isinstance(v, datetime.timedelta)
    total = v // _MICRO
    sign = -1 if total < 0 else 1
    days, rest = divmod(abs(total), 86_400_000_000)
    return struct.pack("!qii", sign * rest, sign * days, 0)


def _b_bytea(v: object) -> bytes:
    assert isinstance(v, bytes | bytearray | memoryview)
    return bytes(v)


def _b_uuid(v: object) -> bytes:
    return v.bytes if isinstance(v, uuid.UUID) else uuid.UUID(str(v)).bytes


_BINARY: dict[int, Callable[[object], bytes]] = {
    BOOL.oid: lambda v: b"\x01" if v else b"\x00",
    INT2.oid: struct.Struct("!h").pack,
    INT4.oid: struct.Struct("!i").pack,
    INT8.oid: struct.Struct("!q").pack,
    FLOAT4.oid: struct.Struct("!f").pack,
    FLOAT8.oid: struct.Struct("!d").pack,
    NUMERIC.oid: _b_numeric,
    DATE.oid: _b_date,
    TIME.oid: _b_time,
    TIMESTAMP.oid: _b_timestamp,
    TIMESTAMPTZ.oid: _b_timestamp,
    INTERVAL.oid: _b_interval,
    BYTEA.oid: _b_bytea,
    UUID.oid: _b_uuid,
    JSONB.oid: lambda v: b"\x01" + _scalar(v, JSONB).encode(),  # (jsonb's version 1, its text)
    OID.oid: struct.Struct("!I").pack,
}


def _b_array(values: object, element: PgType) -> bytes:
    assert isinstance(values, list | tuple)
    if not values:
        return struct.pack("!iii", 0, 0, element.oid)
    parts = [struct.pack("!iiiii", 1, int(None in values), element.oid, len(values), 1)]
    for item in values:
        encoded = encode_binary(item, element)
        parts.append(b"\xff\xff\xff\xff" if encoded is None else _LENGTH.pack(len(encoded)))
        if encoded is not None:
            parts.append(encoded)
    return b"".join(parts)


_LENGTH = struct.Struct("!i")


def encode_binary(value: object, t: PgType) -> bytes | None:
    """PostgreSQL's binary (send) format for ``value`` of type ``t``; None for SQL NULL.
    Types without a binary form of their own (text, varchar, json) send their text."""
    if value is None:
        return None
    if t.element is not None:
        return _b_array(value, t.element)
    if t == NUMERIC and isinstance(value, Decimal):
        value = _trimmed(value)
    encoder = _BINARY.get(t.oid)
    if encoder is not None:
        return encoder(value)
    return _scalar(value, t).encode()
