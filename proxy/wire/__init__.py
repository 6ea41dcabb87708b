"""The sans-IO PostgreSQL v3 layer: bytes in, events and actions out; no sockets, no asyncio."""
