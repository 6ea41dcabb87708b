"""The one thing pyproject.toml cannot say without an experimental table: the C versions of
the session's fast path, of the classifier's literal key and cache hits, and of the embedded
server's row encoding. ``optional=True``: without a C compiler the install goes on and the same
code runs in Python (proxy/wire/session.py, admission/classify.py,
proxy/backends/embedded/executor.py; see admission/native.py)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("proxy.wire._speedups", ["proxy/wire/_speedups.c"], optional=True),
        Extension("admission._literal", ["admission/_literal.c"], optional=True),
        Extension(
            "proxy.backends.embedded._rows", ["proxy/backends/embedded/_rows.c"], optional=True
        ),
    ]
)
