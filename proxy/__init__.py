"""proxy — the transparent PostgreSQL-wire proxy with the admission gate.

``proxy.wire`` is the sans-IO protocol layer (framing and the per-connection session state
machine); ``proxy.gate`` puts the pure scheduler on the event loop; ``proxy.server`` is the
asyncio shell; ``proxy.app`` assembles them from a ``ProxyConfig``.
"""
