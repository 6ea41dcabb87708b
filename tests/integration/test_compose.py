"""docker-compose.yml: valid (``docker compose config`` where a Docker client with compose is
present, otherwise a structural check of the YAML), PostgreSQL's data directory on tmpfs, and
every command in it documented in the README and accepted by our own command line."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ADMISSION = str(Path(sys.executable).with_name("admission"))


def _compose() -> dict:  # type: ignore[type-arg]
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _has_compose() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_compose_file_is_valid() -> None:
    if _has_compose():
        result = subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
    spec = _compose()
    services = spec["services"]
    assert set(services) == {"postgres", "train", "proxy", "locust"}
    for name, service in services.items():
        assert ("image" in service) != ("build" in service), name
        assert isinstance(service.get("command", []), list), name
        for port in service.get("ports", []):
            *address, host, container = str(port).split(":")
            assert host.isdigit() and container.isdigit(), (name, port)
            assert address in ([], ["127.0.0.1"]), (name, port)
        depends = service.get("depends_on", {})
        for other in depends:
            assert other in services, (name, other)
        if isinstance(depends, dict):
            for condition in depends.values():
                assert condition["condition"] in (
                    "service_started",
                    "service_healthy",
                    "service_completed_successfully",
                )
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in spec.get("volumes", {}) or source.startswith((".", "/")), volume
    assert "/var/lib/postgresql/data" in services["postgres"]["tmpfs"]  # an in-memory database
    assert "healthcheck" in services["postgres"]
    assert services["proxy"]["ports"] == ["127.0.0.1:6432:6432", "127.0.0.1:6433:6433"]
    assert (ROOT / services["proxy"]["build"] / "Dockerfile").exists()


def test_compose_commands_are_the_documented_ones() -> None:
    readme = " ".join(ROOT.joinpath("README.md").read_text().split())
    for name in ("train", "proxy", "locust"):
        command = _compose()["services"][name]["command"]
        assert shlex.join(command) in readme, f"the README does not show the {name} command"


def test_compose_commands_parse_with_our_cli() -> None:
    """Our own commands in the file are accepted by the CLI (checked with --help appended, so
    nothing runs): a renamed option would fail here, not in someone's container."""
    services = _compose()["services"]
    for name in ("train", "proxy"):
        command = services[name]["command"]
        assert command[0] == "admission"
        options = [a for a in command[2:] if a.startswith("--")]
        help_text = subprocess.run(
            [ADMISSION, command[1], "--help"], capture_output=True, text=True, timeout=60
        ).stdout
        for option in options:
            assert option in help_text, (name, option)
    locust = services["locust"]["command"]
    assert locust[:3] == ["locust", "-f", "workloads/tpch/locustfile.py"]
    assert (ROOT / locust[2]).exists()
    source = (ROOT / locust[2]).read_text()
    for option in ("--tpch-mix", "--tpch-sf"):
        assert option in locust and option in source
