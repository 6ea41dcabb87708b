"""Django's ORM against the embedded DuckDB server, as a Django project runs it: its
PostgreSQL backend on psycopg, with the client-side binding Django uses by default and with
server-side binding. The app is ``django_shop`` (models and the script that drives them)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from admission import Limits
from testing.embeddedharness import Embedded


@pytest.fixture
def embedded() -> Iterator[Embedded]:
    server = Embedded(Limits(mpl=2))
    yield server
    server.close()


@pytest.mark.parametrize("binding", ["client-side", "server-side"])
def test_django_migrates_and_queries_the_embedded_server(embedded: Embedded, binding: str) -> None:
    script = Path(__file__).with_name("django_shop") / "run.py"
    done = subprocess.run(
        [sys.executable, str(script), str(embedded.port), binding],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]
