"""A real PostgreSQL cluster for the tests: initdb in a temporary directory, started on a free
port, with users for every authentication method the proxy must pass through.

PostgreSQL refuses to run as root; when the tests run as root (CI), the server runs as the
``postgres`` system user that the PostgreSQL packages create.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

USERS = {"scram_user": ("scram-pass", "scram-sha-256"), "md5_user": ("md5-pass", "md5")}


def pg_bin() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    found = shutil.which("initdb")
    if candidates:
        return Path(candidates[-1]).parent
    if found:
        return Path(found).resolve().parent
    raise RuntimeError(
        "PostgreSQL server binaries (initdb) not found; scripts/check installs them "
        "(apt-get install postgresql)"
    )


def interruptible(argv: list[str]) -> list[str]:
    """``argv`` run with SIGINT at its default disposition, as from a terminal where Ctrl-C
    reaches it: a test run started in the background by a shell without job control (``… &``
    in a script) has SIGINT ignored, which its children inherit — and a Python program that
    starts with SIGINT ignored never raises KeyboardInterrupt."""
    restore = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", restore, *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Cluster:
    bin: Path
    data: Path
    socket_dir: Path
    port: int
    run_as: str | None

    @property
    def url(self) -> str:
        return f"postgresql://127.0.0.1:{self.port}"

    def dsn(
        self,
        user: str = "postgres",
        dbname: str = "postgres",
        port: int | None = None,
        password: str | None = None,
    ) -> str:
        dsn = f"host=127.0.0.1 port={port or self.port} user={user} dbname={dbname}"
        return dsn + (f" password={password}" if password else "")

    def _cmd(self, *args: str) -> list[str]:
        if self.run_as:
            return ["runuser", "-u", self.run_as, "--", *args]
        return list(args)

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        result = subprocess.run(
            self._cmd(
                str(self.bin / "psql"),
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                dbname,
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode:
            raise RuntimeError(f"psql failed: {result.stderr}")
        return result.stdout.strip()

    def restart(self, options: str | None = None) -> None:
        """``pg_ctl restart -m fast``, waiting for it; ``options``: the server's command-line
        options from then on (``pg_ctl -o``; otherwise the ones it was started with)."""
        subprocess.run(
            self._cmd(
                str(self.bin / "pg_ctl"),
                *("-D", str(self.data), "-l", str(self.data.parent / "log")),
                *(("-o", options) if options is not None else ()),
                *("-m", "fast", "-w", "restart"),
            ),
            check=True,
            capture_output=True,
            timeout=60,
        )

    def stop(self) -> None:
        subprocess.run(
            self._cmd(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.data.parent, ignore_errors=True)


def start_cluster(max_connections: int = 200) -> Cluster:
    binary = pg_bin()
    run_as = "postgres" if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="admission-pg-"))
    data, sockets = base / "data", base / "sock"
    sockets.mkdir()
    if run_as:
        entry = pwd.getpwnam(run_as)
        for path in (base, sockets):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    port = free_port()
    cluster = Cluster(binary, data, sockets, port, run_as)
    subprocess.run(
        cluster._cmd(
            str(binary / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    hba = "\n".join(
        [f"host all {user} 127.0.0.1/32 {method}" for user, (_, method) in USERS.items()]
        + ["host all all 127.0.0.1/32 trust", "local all all trust", ""]
    )
    (data / "pg_hba.conf").write_text(hba)
    options = (
        f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
        f"-c synchronous_commit=off -c full_page_writes=off -c max_connections={max_connections} "
        "-c max_parallel_workers_per_gather=2"
    )
    subprocess.run(
        cluster._cmd(
            str(binary / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-w",
            "-l",
            str(base / "log"),
            "start",
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    if run_as:
        os.chmod(base / "log", 0o644)
    for user, (password, method) in USERS.items():
        encryption = "md5" if method == "md5" else "scram-sha-256"
        cluster.psql(
            f"SET password_encryption = '{encryption}'; "
            f"CREATE ROLE {user} LOGIN PASSWORD '{password}' SUPERUSER"
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    return cluster


def connect_when_ready(
    port: int,
    proc: subprocess.Popen[str],
    timeout: float = 120.0,
    user: str = "u",
    dbname: str = "d",
) -> psycopg.Connection:
    """Connect to a server ``proc`` is starting on ``port`` (autocommit), waiting until it
    accepts; fails at once, with the process's output, if the process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(
                host="127.0.0.1", port=port, user=user, dbname=dbname, autocommit=True
            )
        except psycopg.OperationalError:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {proc.communicate()[1]}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing accepted connections on port {port}") from None
            time.sleep(0.2)
