"""The layers hold: every import of every module, inside functions and ``if TYPE_CHECKING``
blocks too, with no file exempt.

Bottom to top: ``admission`` (the pure core) and ``workloads``; ``proxy``; ``training``;
``lab``; ``cli``. A layer imports itself and what is below it — except that the proxy knows no
workload (data to load comes to it as a callback) and the two bottom layers know nothing of
each other. ``testing`` (harnesses) may import anything but the command line; ``benchmarks``
anything but the command line and the tests.

The core stays pure besides: the live proxy and the simulator drive one scheduler, which works
only while the core never reads the time or blocks; and it installs with pglast, numpy and
pydantic alone (the last test imports it with the optional dependencies made unimportable).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = {
    "admission",
    "workloads",
    "proxy",
    "training",
    "lab",
    "cli",
    "testing",
    "benchmarks",
    "tests",
}
# What each package may import of ours, besides itself.
ALLOWED: dict[str, set[str]] = {
    "admission": set(),
    "workloads": set(),
    "proxy": {"admission"},
    "training": {"admission", "workloads", "proxy"},
    "lab": {"admission", "workloads", "proxy", "training"},
    "cli": {"admission", "workloads", "proxy", "training", "lab"},
    "testing": OURS - {"cli", "tests"},
    "benchmarks": OURS - {"cli", "tests"},
}
FORBIDDEN_IN_CORE = {
    "asyncio",
    "socket",
    "threading",
    "time",
    "selectors",
    "subprocess",
    "multiprocessing",
    "concurrent",
    "datetime",
    "random",
}
CORE_THIRD_PARTY = {"numpy", "pglast", "pydantic"}
# What ``admission[all]`` brings: the core must import and run without any of it.
EXTRAS = (
    "duckdb",
    "fastapi",
    "matplotlib",
    "prometheus_client",
    "psycopg",
    "pytz",
    "rich",
    "starlette",
    "typer",
    "uvicorn",
    "uvloop",
)


def _imports(path: Path, package: str) -> set[str]:
    """The top-level names every import statement in ``path`` reaches, wherever it stands (a
    relative import stays inside ``package``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.add(package)
            elif node.module:
                names.add(node.module.split(".")[0])
    return names


def _modules(root: Path, package: str) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def layer_violations(root: Path) -> dict[str, list[str]]:
    """Per module (relative to ``root``): the packages of ours it imports and may not."""
    found: dict[str, list[str]] = {}
    for package, allowed in ALLOWED.items():
        for path in _modules(root, package):
            ours = _imports(path, package) & OURS
            wrong = sorted(ours - allowed - {package})
            if wrong:
                found[str(path.relative_to(root))] = wrong
    return found


def test_every_import_respects_the_layers() -> None:
    for package in ALLOWED:
        assert _modules(ROOT, package), f"{package}/ has no modules: is the layer list stale?"
    assert not layer_violations(ROOT)


def test_the_layer_check_catches_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "sneaky.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from lab.target import Target

            def later():
                from workloads.tpch.data import generate
                import cli.app
            """
        )
    )
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "harness.py").write_text("from tests.conftest import pg\n")
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "fine.py").write_text("from . import sampler\nimport proxy.app\n")
    assert layer_violations(tmp_path) == {
        "proxy/sneaky.py": ["cli", "lab", "workloads"],
        "benchmarks/harness.py": ["tests"],
    }


def test_core_imports_no_io_threads_or_clocks() -> None:
    modules = _modules(ROOT, "admission")
    assert len(modules) >= 10
    offenders = {str(p.relative_to(ROOT)): _imports(p, "admission") for p in modules}
    assert not {
        k: sorted(v & FORBIDDEN_IN_CORE) for k, v in offenders.items() if v & FORBIDDEN_IN_CORE
    }


def test_core_imports_no_third_party_package_but_its_three() -> None:
    allowed = set(sys.stdlib_module_names) | CORE_THIRD_PARTY | {"admission"}
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imports(p, "admission") - allowed)
        for p in _modules(ROOT, "admission")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_check_itself_detects_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom asyncio import sleep\n\ndef f():\n    import matplotlib\n")
    assert _imports(bad, "admission") & FORBIDDEN_IN_CORE == {"time", "asyncio"}
    assert _imports(bad, "admission") - set(sys.stdlib_module_names) == {"matplotlib"}


def test_the_core_install_asks_for_its_three_packages_and_the_extra_for_the_rest() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0] for d in project["dependencies"]}
    assert names == CORE_THIRD_PARTY
    assert "admission[all]" in project["optional-dependencies"]["dev"]
    assert project["scripts"]["admission"] == "cli:main"


_BLOCK = f"""
import sys

BLOCKED = {set(EXTRAS)!r}


class Unimportable:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Unimportable())
for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
"""


def _without_extras(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_core_runs_without_the_optional_dependencies() -> None:
    result = _without_extras(
        """
        import pkgutil, importlib
        import admission
        for info in pkgutil.walk_packages(admission.__path__, "admission."):
            importlib.import_module(info.name)
        from admission import Limits, Scheduler, classify_sql
        from admission.policies import POLICIES
        from admission.sim import SimConfig, synthetic
        from admission.sim.study import run_study

        assert classify_sql("select 1").fingerprint
        study = run_study(
            synthetic("var-service"),
            SimConfig(completions=300, warmup=30),
            policies=tuple(POLICIES),
            replications=1,
        )
        assert set(study.policies) == set(POLICIES)
        Scheduler(None, "fcfs", Limits(mpl=2))
        loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
        assert not loaded, loaded
        print("core ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "core ok"


def test_the_command_line_without_the_extras_says_what_to_install() -> None:
    result = _without_extras(
        """
        sys.argv = ["admission", "--help"]
        from cli import main

        main()
        """
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'admission[all]'" in lines[0], result.stderr
