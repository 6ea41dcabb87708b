"""The lab: what the live experiments share, above the proxy and training.

``target`` puts the proxy, in this process, in front of the embedded DuckDB or a PostgreSQL
server with TPC-H loaded — one builder for ``admission train`` and ``admission bench``;
``train`` runs training against such a target; ``bench`` compares the policies on one;
``figures`` draws what the simulator, the bench and training report (matplotlib lives here,
not in the core).
"""
