"""Golden-script tests of the session state machine: see tests/golden/session_driver.py.

Each script pins what ``ProxySession`` does with one kind of traffic: the bytes it forwards each
way, the jobs it submits and releases, the replies it makes up. Regenerate the expected output
after an intended change with ``GOLDEN_REWRITE=1``, then read the diff: every changed line is
a changed behaviour on the wire or towards the gate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.golden.session_driver import run_script

SCRIPTS = sorted((Path(__file__).parent / "session").glob("*.txt"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_session_golden(script: Path) -> None:
    expected, actual = run_script(script)
    if os.environ.get("GOLDEN_REWRITE"):
        script.write_text(actual)
        return
    assert actual == expected, f"{script.name} differs; rerun with GOLDEN_REWRITE=1 and diff"


def test_session_scripts_exist() -> None:
    assert len(SCRIPTS) >= 8
