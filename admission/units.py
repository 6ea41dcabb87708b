"""Sizes as people and databases write them — 4GB, 512 MiB, 1.5GiB, 18.6 GiB (DuckDB's
``current_setting('memory_limit')``), 1000000 (bytes) — in bytes. Decimal units are powers of
1000, binary ones (KiB, MiB …) of 1024, as DuckDB reads them."""

from __future__ import annotations

import re

__all__ = ["size_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def size_bytes(text: str) -> int | None:
    """``text`` in bytes, or None when it is not a size."""
    match = _SIZE.fullmatch(text)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        return None
    return int(float(match.group(1)) * unit)
