"""The core stays pure: nothing in admission/ (but the CLI shell) imports I/O, threads or clocks.

The live proxy and the simulator drive one scheduler; that works only while the core never
reads the time or blocks. This test reads the import statements of every module.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "admission"
FORBIDDEN = {
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
SHELL = {"cli.py"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_no_io_threads_or_clocks() -> None:
    modules = [p for p in CORE.rglob("*.py") if p.name not in SHELL]
    assert len(modules) >= 10
    offenders = {str(p.relative_to(CORE)): sorted(_imports(p) & FORBIDDEN) for p in modules}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_check_itself_detects_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom asyncio import sleep\n")
    assert _imports(bad) & FORBIDDEN == {"time", "asyncio"}
