"""What the proxy can stand in front of. ``pgtypes`` renders DuckDB values the way PostgreSQL
would, for the embedded DuckDB backend."""
