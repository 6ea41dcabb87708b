"""Test support that the tests and the benchmarks both import: a real PostgreSQL cluster
(``pgcluster``), the proxy on an event loop of its own in front of it (``proxyharness``) and
the embedded DuckDB server the same way (``embeddedharness``).

It is a package of its own, not part of ``tests/``, so that a benchmark never imports a test
module; it may import every layer but the command line.
"""
