"""The embedded server is safe to put on a network: clients reach none of the host's files and
download no extension, change none of the server's settings, authenticate with SCRAM-SHA-256
when it has users, and meet TLS when it has a certificate — with PostgreSQL's SQLSTATEs."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest
import trustme

from admission import Limits
from proxy.backends.embedded import Lockdown, Users
from proxy.backends.embedded.auth import verifier
from testing.embeddedharness import Embedded

ADMISSION = str(Path(sys.executable).with_name("admission"))


@pytest.fixture
def server() -> Iterator[Embedded]:
    e = Embedded(Limits(mpl=2))
    yield e
    e.close()


def sqlstate(conn: psycopg.Connection, sql: str) -> str | None:
    """The SQLSTATE ``sql`` fails with (None if it runs); the session must go on after it."""
    try:
        conn.execute(sql)
        state = None
    except psycopg.Error as e:
        state = e.sqlstate
    assert conn.execute("select 42").fetchone() == (42,)  # the session goes on
    return state


def test_clients_reach_no_file_and_no_extension(server: Embedded, tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    with server.connect() as conn:
        assert sqlstate(conn, "select count(*) from read_csv('/etc/passwd')") == "42501"
        assert sqlstate(conn, f"copy (select 42) to '{target}'") == "42501"
        assert sqlstate(conn, f"attach '{tmp_path / 'other.duckdb'}' as other") == "42501"
        assert sqlstate(conn, "select * from glob('/etc/*')") == "42501"
        assert sqlstate(conn, "install httpfs") == "42501"
        assert sqlstate(conn, "load httpfs") == "42501"
        assert sqlstate(conn, "select * from read_parquet('https://example.com/x.parquet')") == (
            "42501"
        )
    assert not target.exists()
    assert not (tmp_path / "other.duckdb").exists()


@pytest.mark.parametrize(
    "statement",
    [
        "set enable_external_access = true",
        "set autoinstall_known_extensions = true",
        "set autoload_known_extensions = true",
        "set threads = 1",
        "set memory_limit = '1MB'",
        "reset memory_limit",
        "pragma threads = 1",
        "pragma memory_limit = '1MB'",
        "set global search_path = 'main'",
        "set lock_configuration = true",
        "set profiling_output = '/tmp/x.json'",
        "pragma enable_checkpoint_on_shutdown",
        'set "threads" = 1',
    ],
)
def test_server_wide_settings_are_refused(server: Embedded, statement: str) -> None:
    with server.connect() as conn:
        assert sqlstate(conn, statement) == "42501"
        threads, memory = conn.execute(
            "select current_setting('threads'), current_setting('memory_limit')"
        ).fetchone()
        assert int(threads) > 1 and memory != "1.0 MiB"


@pytest.mark.parametrize(
    "statement",
    [
        "drop view admission_pg.main.pg_class",
        "drop macro if exists admission_pg.main.format_type",
        "create or replace view admission_pg.main.pg_class as select 1",
        "create table admission_pg.main.mine (a int)",
        "create schema admission_pg.other",
        "insert into admission_pg.main.anything values (1)",
        "detach admission_pg",
        "detach database if exists admission_pg",
        "use admission_pg",
        'USE "admission_pg".main',
        "alter view admission_pg.main.pg_class rename to x",
    ],
)
def test_the_catalogs_are_read_only_to_clients(server: Embedded, statement: str) -> None:
    with server.connect() as conn:
        assert sqlstate(conn, statement) == "42501"
        tables = conn.execute("select count(*) from pg_catalog.pg_class").fetchone()
        assert tables is not None and tables[0] > 0
        # reading them, and a view of one's own over them, stay allowed
        assert sqlstate(conn, "create temp view mine as select relname from pg_class") is None
        assert sqlstate(conn, "select * from admission_pg.main.pg_namespace") is None


def test_a_session_still_sets_its_own(server: Embedded) -> None:
    with server.connect() as conn:
        for ok in (
            "set search_path = 'main'",
            "reset search_path",
            "set timezone = 'UTC'",
            "set time zone 'UTC'",
            "set variable answer = 42",
            "create table mine (a int)",
            "pragma table_info('mine')",
            "pragma version",
            "set application_name = 'mine'",  # a PostgreSQL parameter, answered here
        ):
            assert sqlstate(conn, ok) is None, ok
        assert conn.execute("select getvariable('answer')").fetchone() == (42,)
        # the server runs in UTC for every session: another zone is not silently ignored
        assert sqlstate(conn, "set timezone = 'Europe/Berlin'") == "0A000"
        assert sqlstate(conn, "select 1; set threads = 1") == "42501"
    # extended protocol: a prepared SET is guarded at Execute too
    with server.connect() as conn, pytest.raises(psycopg.Error) as e:
        conn.execute("set threads = %s", (1,), prepare=True)
    assert e.value.sqlstate in ("42501", "42601")


def test_allowed_paths_and_extensions(tmp_path: Path) -> None:
    allowed = tmp_path / "shared"
    allowed.mkdir()
    (allowed / "in.csv").write_text("a,b\n1,2\n3,4\n")
    (tmp_path / "secret.csv").write_text("a\n1\n")
    e = Embedded(Limits(), lockdown=Lockdown(file_access=(allowed,), extensions=("json",)))
    try:
        with e.connect() as conn:
            assert conn.execute(f"select sum(b) from read_csv('{allowed / 'in.csv'}')").fetchone()[
                0
            ] == (6)
            conn.execute(f"copy (select 7 as x) to '{allowed / 'out.csv'}'")
            assert (allowed / "out.csv").read_text().strip().splitlines() == ["x", "7"]
            assert sqlstate(conn, f"select * from read_csv('{tmp_path / 'secret.csv'}')") == (
                "42501"
            )
            assert conn.execute("""select json_extract('{"k": 5}', '$.k')::int""").fetchone() == (
                5,
            )
    finally:
        e.close()
    with pytest.raises(ValueError, match="not an extension name"):
        Embedded(Limits(), lockdown=Lockdown(extensions=("json; select 1",)))


# -- authentication --------------------------------------------------------------------------


def connect(
    e: Embedded, user: str = "app", password: str | None = None, **kw: object
) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=e.port,
        user=user,
        dbname="app",
        password=password,
        autocommit=True,
        **kw,
    )


def test_scram_with_one_password() -> None:
    e = Embedded(Limits(), users=Users.from_password("s3cret"))
    try:
        with connect(e, password="s3cret") as conn:
            assert conn.execute("select 1").fetchone() is not None
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            connect(e, password="nope")

        async def with_asyncpg() -> int:
            conn = await asyncpg.connect(
                host="127.0.0.1", port=e.port, user="other", database="app", password="s3cret"
            )
            try:
                return int(await conn.fetchval("select 7"))
            finally:
                await conn.close()

        assert asyncio.run(with_asyncpg()) == 7
        with pytest.raises(asyncpg.InvalidPasswordError):
            asyncio.run(
                asyncpg.connect(
                    host="127.0.0.1", port=e.port, user="app", database="app", password="x"
                )
            )
    finally:
        e.close()


def test_scram_with_a_users_file(tmp_path: Path) -> None:
    users = tmp_path / "users.txt"
    users.write_text(f'# who may connect\n"alice" "wonderland"\n"bob" "{verifier("builder")}"\n')
    e = Embedded(Limits(), users=Users.from_file(users))
    try:
        with connect(e, "alice", "wonderland") as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        with connect(e, "bob", "builder") as conn:
            assert conn.execute("select 2").fetchone() == (2,)
        for user, password in (("alice", "builder"), ("mallory", "wonderland")):
            with pytest.raises(psycopg.OperationalError) as failed:
                connect(e, user, password)
            # the same answer whether or not the user exists
            assert f'password authentication failed for user "{user}"' in str(failed.value)
        assert raw_startup_answer(e.port, "alice") == b"R"  # asks for SASL, nothing more
    finally:
        e.close()


def raw_startup_answer(port: int, user: str) -> bytes:
    """The first message type the server answers a bare startup message with."""
    params = b"user\0" + user.encode() + b"\0database\0app\0\0"
    body = (196608).to_bytes(4, "big") + params
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall((len(body) + 4).to_bytes(4, "big") + body)
        first = s.recv(1)
        # a client that answers with garbage instead of a SASL message gets 08P01 and is closed
        s.sendall(b"Q\0\0\0\x0dselect 1\0")
        rest = b""
        while chunk := s.recv(4096):
            rest += chunk
        assert b"08P01" in rest, rest
    return first


def test_users_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text('"alice" "ok"\n"bob"\n')
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        Users.from_file(bad)
    bad.write_text('"carol" "SCRAM-SHA-256$4096:notbase64$x:y"\n')
    with pytest.raises(ValueError, match=r"bad.txt:1: a SCRAM-SHA-256 verifier"):
        Users.from_file(bad)
    with pytest.raises(ValueError, match="cannot read the users file"):
        Users.from_file(tmp_path / "missing.txt")
    assert Users.configured(None, {}) is None
    assert Users.configured(None, {"ADMISSION_PASSWORD": "pw"}) is not None


# -- TLS and exposure ------------------------------------------------------------------------


def _other_address() -> str | None:
    """An address of this machine that is not loopback, to connect from "another host"."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent
            address: str = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_tls_and_required_tls_from_other_hosts(tmp_path: Path) -> None:
    ca = trustme.CA()
    address = _other_address()
    cert = ca.issue_cert("127.0.0.1", *([address] if address else []))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    e = Embedded(
        Limits(),
        users=Users.from_password("pw"),
        tls=context,
        require_tls=True,
        host="0.0.0.0",
    )
    try:
        with connect(e, password="pw", sslmode="verify-full", sslrootcert=str(ca_file)) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("select 'over tls'").fetchone() == ("over tls",)
        with connect(e, password="pw", sslmode="disable") as conn:  # loopback may go in clear
            assert not conn.pgconn.ssl_in_use
        if address is None:
            pytest.skip("no non-loopback address on this machine")
        remote = {"host": address, "port": e.port, "user": "app", "dbname": "app", "password": "pw"}
        with pytest.raises(psycopg.OperationalError, match="no encryption"):
            psycopg.connect(**remote, sslmode="disable")
        with psycopg.connect(**remote, sslmode="verify-full", sslrootcert=str(ca_file)) as conn:
            assert conn.execute("select 3").fetchone() == (3,)
    finally:
        e.close()


def test_serve_refuses_an_exposed_embedded_server(tmp_path: Path) -> None:
    env = {**os.environ, "ADMISSION_PASSWORD": ""}
    result = subprocess.run(
        [ADMISSION, "serve", "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2
    assert "needs authentication" in result.stderr and "TLS" in result.stderr
    assert "--insecure" in result.stderr
    result = subprocess.run(
        [ADMISSION, "serve", "--backend", "postgresql://127.0.0.1:1", "--users", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "belong to the embedded DuckDB" in result.stderr


def test_passwd_prints_a_users_file_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [ADMISSION, "passwd", "dana"],
        input="pa ss\npa ss\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith('"dana" "SCRAM-SHA-256$4096:') and "pa ss" not in line
    users = tmp_path / "users.txt"
    users.write_text(line + "\n")
    e = Embedded(Limits(), users=Users.from_file(users))
    try:
        with connect(e, "dana", "pa ss") as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        e.close()
