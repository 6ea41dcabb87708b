"""The optional C versions of a few hot functions, and the switch that turns them off.

Each C module (built by the install when a C compiler is there) has a Python reference it must
match, which a property test checks; without the module, or with ``ADMISSION_PURE_PYTHON=1``
set, the Python code runs.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["native"]


def native(name: str) -> ModuleType | None:
    """The C module ``name`` (``admission._literal``, ``proxy.wire._speedups``), or None when
    it was not built or ``ADMISSION_PURE_PYTHON`` is set."""
    if os.environ.get("ADMISSION_PURE_PYTHON"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
