"""A Java application through the PostgreSQL JDBC driver (pgjdbc 42.7): ``jdbc/JdbcCheck.java``
— server-prepared statements (after pgjdbc's fifth execution), batches, generated keys, typed
parameters and results (java.time, UUID, BigDecimal, bytea, arrays), fetch-size portals,
scrollable results, DatabaseMetaData (tables, columns, keys, indexes, types), savepoints,
cancel by query timeout — run against PostgreSQL itself, the proxy in front of it in session
and in transaction pooling mode, and the embedded DuckDB server.

Needs a JDK (``java``, ``javac``); the driver's jar is taken from the local Maven repository or
downloaded once from Maven Central into ``.venv/jars``. Without either the tests are skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from admission import Limits
from proxy.pool import PoolConfig
from testing.embeddedharness import Embedded
from testing.pgcluster import Cluster
from testing.proxyharness import ProxyHarness

VERSION = "42.7.13"
CENTRAL = "https://repo1.maven.org/maven2/org/postgresql/postgresql"
ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).parent / "jdbc" / "JdbcCheck.java"


def _driver() -> Path | None:
    local = Path.home() / f".m2/repository/org/postgresql/postgresql/{VERSION}"
    jar = local / f"postgresql-{VERSION}.jar"
    if jar.exists():
        return jar
    cached = ROOT / ".venv" / "jars" / f"postgresql-{VERSION}.jar"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        try:
            url = f"{CENTRAL}/{VERSION}/postgresql-{VERSION}.jar"
            with urllib.request.urlopen(url, timeout=30) as response:
                data = response.read()
        except OSError:
            return None
        partial = cached.with_suffix(".part")
        partial.write_bytes(data)
        partial.rename(cached)
    return cached


@pytest.fixture(scope="module")
def jdbc(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, str], list[str]]:
    """Runs JdbcCheck against a port: its output lines."""
    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.skip("no JDK here")
    jar = _driver()
    if jar is None:
        pytest.skip("the PostgreSQL JDBC driver could not be found or downloaded")
    classes = tmp_path_factory.mktemp("jdbc")
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", str(jar), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=180,
    )

    def run(port: int, user: str) -> list[str]:
        out = subprocess.run(
            ["java", "-cp", f"{classes}:{jar}", "JdbcCheck", str(port), user],
            capture_output=True,
            text=True,
            timeout=180,
        )
        return out.stdout.splitlines() + out.stderr.splitlines()

    return run


def _failures(lines: list[str]) -> list[str]:
    assert lines and (lines[-1] == "ALL OK" or lines[-1].endswith("FAILED")), lines
    return [line for line in lines if line.startswith("FAIL")]


def test_jdbc_through_the_proxy_as_directly(
    pg: Cluster,
    make_proxy: Callable[..., ProxyHarness],
    jdbc: Callable[[int, str], list[str]],
) -> None:
    assert _failures(jdbc(pg.port, "postgres")) == []  # (the program itself is right)
    session = make_proxy()
    assert _failures(jdbc(session.port, "postgres")) == []
    pooled = make_proxy(pool=PoolConfig(size=2))
    assert _failures(jdbc(pooled.port, "postgres")) == []


def test_jdbc_on_the_embedded_server(jdbc: Callable[[int, str], list[str]]) -> None:
    server = Embedded(Limits(mpl=2))
    try:
        lines = jdbc(server.port, "app")
    finally:
        server.close()
    # all of it but a savepoint's rollback, which DuckDB has not (documented; the transaction
    # goes on and the client rolls it back as a whole)
    failed = _failures(lines)
    assert len(failed) == 1 and failed[0].startswith("FAIL savepoint:"), lines
    assert "ROLLBACK TO SAVEPOINT is not supported" in failed[0]
