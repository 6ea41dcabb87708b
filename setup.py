"""The one thing pyproject.toml cannot say without an experimental table: the session's fast
path in C. ``optional=True``: without a C compiler the install goes on and the same code runs
in Python (proxy/wire/session.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("proxy.wire._speedups", ["proxy/wire/_speedups.c"], optional=True),
    ]
)
