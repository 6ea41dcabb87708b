"""The one thing pyproject.toml cannot say without an experimental table: the C versions of
the session's fast path and of the classifier's literal key and cache hits. ``optional=True``:
without a C compiler the install goes on and the same code runs in Python
(proxy/wire/session.py, admission/classify.py; see admission/native.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("proxy.wire._speedups", ["proxy/wire/_speedups.c"], optional=True),
        Extension("admission._literal", ["admission/_literal.c"], optional=True),
    ]
)
