"""Sizes as people and DuckDB write them."""

from __future__ import annotations

import pytest

from admission.units import size_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GB", 4 * 10**9),
        ("512 MiB", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("18.6 GiB", int(18.6 * 2**30)),  # DuckDB's current_setting('memory_limit')
        ("1000000", 10**6),
        ("0", 0),
        (" 2kb ", 2000),
    ],
)
def test_sizes_in_bytes(text: str, size: int) -> None:
    assert size_bytes(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1GB", "4 parsecs", "GB", "1e9"])
def test_what_is_not_a_size(text: str) -> None:
    assert size_bytes(text) is None
