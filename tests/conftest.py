"""Shared by every test directory.

``scripts/check`` runs the suite in two passes: the tests marked ``serial`` one at a time, the
rest on every core (pytest-xdist). Every integration test is ``serial``: it starts real servers
whose timing, throughput and timeouts another test beside it would change.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests check behaviour, not speed: on a loaded machine (the parallel pass shares the
# cores) an example may take longer than hypothesis' default 200 ms deadline.
settings.register_profile("admission", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("admission")

INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.serial)
