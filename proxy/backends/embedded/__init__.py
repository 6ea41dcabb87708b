"""The embedded backend: the proxy answers the PostgreSQL protocol itself, on DuckDB.

Every client gets its own DuckDB cursor (its own transaction state) on one shared database,
in memory by default. Statements pass the same admission gate as with a PostgreSQL backend —
a simple Query, or an extended batch from its first Execute (or Describe of a portal) up to its
Sync — and run in a worker pool, off the event loop, so a long query never stalls other
clients' I/O. A CancelRequest withdraws a queued statement or interrupts a running one.

Results travel in text format with PostgreSQL's type OIDs and text output
(``proxy.backends.pgtypes``), in binary where the client asks for it (asyncpg does); DuckDB errors
carry PostgreSQL SQLSTATEs (``proxy.backends.errors``).

With ``profile`` on, each statement's CPU time and wall time come from DuckDB's profiler, and
observers registered with ``EmbeddedServer.observe`` receive one ``Measurement`` per statement
(what training needs).

It is safe to put on a network: ``lockdown`` closes DuckDB to the host's files and to
extension downloads once the server's own data is in, and guards its configuration from
clients; ``auth`` asks clients for a password (SCRAM-SHA-256) when the server has users; TLS
is offered when it has a certificate.

The modules, from the socket inwards:

- ``server``: the asyncio shell. ``EmbeddedServer`` accepts clients; each connection reads its
  client through the front-end core the relay drives too (``proxy.wire.frontend``: startup,
  cancel requests, batches) and takes admission from the gate.
- ``session``: one client's statements (``DuckDBSession``): Query, Parse, Bind, Describe,
  Execute and Close, its prepared statements, portals and transaction status.
- ``params``: Bind's parameters, text or binary, as Python values.
- ``executor``: the database and its worker threads (``DuckDBBackend``), running a statement
  and encoding its result as PostgreSQL messages.
- ``compat``: what PostgreSQL clients send that DuckDB does not understand, answered the
  PostgreSQL way (SHOW, SET, savepoints, drivers' catalog queries).
- ``lockdown``: no file access, no extension downloads, no server-wide settings for clients.
- ``auth``: SCRAM-SHA-256 against a users file or one password.
"""

from proxy.backends.embedded.auth import Users
from proxy.backends.embedded.executor import DuckDBBackend, Measurement
from proxy.backends.embedded.lockdown import Lockdown
from proxy.backends.embedded.server import EmbeddedServer

__all__ = ["DuckDBBackend", "EmbeddedServer", "Lockdown", "Measurement", "Users"]
