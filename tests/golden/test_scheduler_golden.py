"""Golden-script tests of the scheduler: see tests/golden/scheduler_driver.py for the format.

Regenerate the expected output after an intended change with ``GOLDEN_REWRITE=1``, then read
the diff: every changed line is a changed decision.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.golden.scheduler_driver import run_script

SCRIPTS = sorted((Path(__file__).parent / "scheduler").glob("*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_golden(script: Path) -> None:
    expected, actual = run_script(script)
    if os.environ.get("GOLDEN_REWRITE"):
        script.write_text(actual)
        return
    assert actual == expected, f"{script.name} differs; rerun with GOLDEN_REWRITE=1 and diff"


def test_scripts_exist() -> None:
    assert len(SCRIPTS) >= 6
