"""``admission serve``: the proxy in front of a database (or of the embedded DuckDB it hosts),
built from options and environment variables and run until SIGINT or SIGTERM.

This module only turns options into a ``proxy.app.ProxyConfig``; ``--tpch`` becomes the
configuration's ``prepare`` step (the lab's TPC-H loader), so the proxy itself knows no
workload.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from admission.contention import ContentionConfig
from admission.model import EtaModel, ModelError
from admission.policies import POLICIES
from admission.scheduler import MAX_CLASSES
from admission.workloads import WorkloadConfig
from cli.options import (
    AUTO,
    DEFAULT_RELEASE_AFTER,
    RECOMMENDED_POLICY,
    BackfillOption,
    DueFactorOption,
    GrantWorkMemOption,
    LifoAfterOption,
    MaxTempSizeOption,
    MaxWaitOption,
    MemoryLimitOption,
    MemoryOption,
    QueueTimeoutOption,
    ReleaseAfterOption,
    ShortLaneOption,
    ThreadsOption,
    env,
    fail,
    limits,
    parse_embedded_sizes,
    parse_grant,
    parse_memory,
    parse_mpl,
    progress_printer,
    recommended_mpl,
)
from proxy.server import MAX_BUFFERED

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.app import Prepare, ProxyConfig
    from proxy.pool import PoolConfig
    from proxy.server import Listener, Tuner


def serve(
    backend: Annotated[
        str | None,
        typer.Option(
            help="The database: postgresql://HOST:PORT (database and user come from each client)."
            " Without it the proxy hosts an in-memory DuckDB database itself.",
            envvar=env("backend"),
        ),
    ] = None,
    tpch: Annotated[
        float | None,
        typer.Option(
            help="Embedded DuckDB only: generate TPC-H at this scale factor (cached) and load it.",
            envvar=env("tpch"),
            min=0.001,
        ),
    ] = None,
    database: Annotated[
        str,
        typer.Option(
            help="Embedded DuckDB only: a database file to open instead of memory.",
            envvar=env("database"),
        ),
    ] = ":memory:",
    workers: Annotated[
        int,
        typer.Option(
            help="Embedded DuckDB only: worker threads, the most statements DuckDB runs at once.",
            envvar=env("workers"),
            min=1,
        ),
    ] = 8,
    memory_limit: MemoryLimitOption = None,
    max_temp_size: MaxTempSizeOption = None,
    grant_work_mem: GrantWorkMemOption = None,
    listen: Annotated[
        str, typer.Option(help="Address to accept clients on, HOST:PORT.", envvar=env("listen"))
    ] = "127.0.0.1:6432",
    policy: Annotated[
        str | None,
        typer.Option(
            help=f"Admission policy: {', '.join(POLICIES)}. Default: {RECOMMENDED_POLICY} "
            "(shortest expected first, aged in units of expected time, far shorter statements "
            "beside a full MPL: what the benchmarks with open arrivals recommend) with --model "
            "or on the embedded DuckDB while learning; fcfs in front of PostgreSQL without a "
            "model.",
            envvar=env("policy"),
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            help="η model file written by `admission train`. While learning, the proxy saves "
            "what it learned back to it every few minutes and on shutdown (a file that does "
            "not exist yet is created).",
            envvar=env("model"),
        ),
    ] = None,
    learn: Annotated[
        bool,
        typer.Option(
            help="Learn each class's service demand D_r from its statements while serving: "
            "classes never trained get one, drifted ones follow (with --model, in the trained "
            "units). --no-learn keeps the model as loaded.",
            envvar=env("learn"),
        ),
    ] = True,
    explain_dsn: Annotated[
        str | None,
        typer.Option(
            help="With --backend: a connection string the proxy may use to EXPLAIN the sample "
            "statement of a class it has not measured yet (nothing is run), so the class starts "
            "from the planner's cost scaled by the measured classes' D_r per unit of cost "
            "(the embedded DuckDB needs none).",
            envvar=env("explain_dsn"),
        ),
    ] = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            help="Share --mpl as one global budget with every proxy started with the same "
            "coordinator: a PostgreSQL connection string (usually the server the proxies "
            "front) where leases on the budget are kept (tables admission_leases and "
            "admission_budget, created on first use). Default: the MPL is this proxy's alone.",
            envvar=env("coordinator"),
            metavar="POSTGRESQL-URL",
        ),
    ] = None,
    lease_ttl: Annotated[
        float,
        typer.Option(
            help="With --coordinator: seconds a proxy's lease lives without a heartbeat (a "
            "proxy that dies gives its share back after this long; heartbeats come every "
            "fifth of it).",
            envvar=env("lease_ttl"),
            min=0.2,
        ),
    ] = 2.0,
    coordinator_fallback: Annotated[
        int | None,
        typer.Option(
            help="With --coordinator: the MPL a proxy runs on once the coordinator has been "
            "out of reach for a lease's life. Default: the global MPL divided by the proxies "
            "it last saw.",
            envvar=env("coordinator_fallback"),
            min=1,
        ),
    ] = None,
    sample_interval: Annotated[
        float,
        typer.Option(
            help="While learning: sample the database's threads in execution every this many "
            "seconds (training's sampler: the embedded DuckDB's threads, or a PostgreSQL on "
            "this machine, from /proc) and keep each class's U_r, Q_r, A_r and A^c_r current "
            "from it, window by window (0: off; D_r is learned either way). Off in "
            "transaction pool mode.",
            envvar=env("sample_interval"),
            min=0,
        ),
    ] = 0.2,
    profile_window: Annotated[
        float,
        typer.Option(
            help="Seconds per window of the live profile: each window's estimates move the "
            "model halfway toward them.",
            envvar=env("profile_window"),
            min=1,
        ),
    ] = 60.0,
    mpl: Annotated[
        str | None,
        typer.Option(
            help="Multiprogramming limit: statements in service at once (0 = unlimited), or "
            "'auto': tuned while serving to the lowest MPL whose throughput is within 5% of "
            "the best measured (starting from the default below; see /status → mpl_auto). "
            "Default: with --model, the cores the model was trained on (what the benchmarks "
            "recommend; a model file still to be learned: this machine's cores); without, on "
            "the embedded DuckDB while learning, 'auto' from this machine's cores; otherwise "
            "unlimited.",
            envvar=env("mpl"),
            metavar="N|auto",
        ),
    ] = None,
    threads: ThreadsOption = 0,
    memory: MemoryOption = AUTO,
    backfill: BackfillOption = False,
    max_wait: MaxWaitOption = None,
    queue_timeout: QueueTimeoutOption = None,
    due_factor: DueFactorOption = None,
    lifo_after: LifoAfterOption = None,
    release_after: ReleaseAfterOption = None,
    short_lane: ShortLaneOption = None,
    max_queue: Annotated[
        int,
        typer.Option(
            help="Statements allowed to wait; more are refused with SQLSTATE 53300.",
            envvar=env("max_queue"),
            min=1,
        ),
    ] = 10_000,
    max_classes: Annotated[
        int,
        typer.Option(
            help="Statement shapes learned as classes of their own while serving, beyond the "
            "model's; more share one class, '(other)' (each class learned costs O(classes²) "
            "once).",
            envvar=env("max_classes"),
            min=1,
        ),
    ] = MAX_CLASSES,
    workload_classes: Annotated[
        Path | None,
        typer.Option(
            "--workload-classes",
            help="A TOML file of workload classes (tenants): each with a weight (fair share "
            "by deficit round robin), a priority (interactive, batch — aged in after "
            "batch_max_wait —, or background, run only in predicted idle periods), what it "
            "matches (user, database, application_name globs; or a statement's "
            "/* admission: tenant=…, priority=… */ tag) and optional limits (mpl, threads, "
            "memory_share, queue_timeout). Reloaded by POST /workloads/reload. See the README.",
            envvar=env("workload_classes"),
            dir_okay=False,
        ),
    ] = None,
    pool_mode: Annotated[
        str,
        typer.Option(
            help="With --backend: 'session' (default) gives each client a server connection of "
            "its own for its whole session, so every PostgreSQL feature works as directly; "
            "'transaction' shares --pool-size server connections per (database, user) among "
            "all clients, each holding one only from a statement's admission to the end of "
            "its transaction — the admission queue is the pool's queue (FCFS is a PgBouncer "
            "pool). Prepared statements and settings follow a client between connections; "
            "LISTEN, session advisory locks, temporary tables and WITH HOLD cursors are "
            "refused (0A000). See the README.",
            envvar=env("pool_mode"),
            metavar="session|transaction",
        ),
    ] = "session",
    pool_size: Annotated[
        int,
        typer.Option(
            help="Transaction pool mode: server connections per (database, user); the MPL is "
            "at most this.",
            envvar=env("pool_size"),
            min=1,
        ),
    ] = 20,
    max_client_conn: Annotated[
        int | None,
        typer.Option(
            help="Clients connected at once, at most; more are refused with SQLSTATE 53300 "
            "('sorry, too many clients already'). Default: no limit.",
            envvar=env("max_client_conn"),
            min=1,
        ),
    ] = None,
    server_idle_timeout: Annotated[
        float,
        typer.Option(
            help="Transaction pool mode: close a server connection idle this many seconds.",
            envvar=env("server_idle_timeout"),
            min=0.1,
        ),
    ] = 600.0,
    server_lifetime: Annotated[
        float,
        typer.Option(
            help="Transaction pool mode: close a server connection this many seconds old once "
            "its client is done with it.",
            envvar=env("server_lifetime"),
            min=0.1,
        ),
    ] = 3600.0,
    max_prepared_statements: Annotated[
        int,
        typer.Option(
            help="Transaction pool mode: prepared statements a server connection keeps; beyond "
            "it the least recently used are closed when the connection next changes hands (a "
            "client's own are kept while it holds the connection, and prepared again where "
            "it lands without them).",
            envvar=env("max_prepared_statements"),
            min=1,
        ),
    ] = 200,
    contention: Annotated[
        bool | None,
        typer.Option(
            "--contention/--no-contention",
            help="The embedded DuckDB: limit how many writing transactions are in progress at "
            "once while they fail on one another's rows (serialization failures, 40001): no "
            "limit until one does, then halved on each such failure and raised by one as "
            'transactions commit (README: "Transactions that write the same rows"). '
            "Default: on for the embedded DuckDB; off in front of PostgreSQL, whose default "
            "isolation makes such writers wait on row locks (turn it on for applications that "
            "run SERIALIZABLE or REPEATABLE READ transactions, which fail with 40001 instead; "
            "not with --pool-mode transaction).",
            envvar=env("contention"),
        ),
    ] = None,
    max_message: Annotated[
        int,
        typer.Option(
            help="Largest protocol message accepted from a client, in bytes.",
            envvar=env("max_message"),
            min=1024,
        ),
    ] = 256 * 1024 * 1024,
    max_buffered: Annotated[
        int,
        typer.Option(
            help="Bytes all clients together may have buffered in the proxy (statements "
            "arriving or waiting for admission); over it clients are not read until it falls, "
            "and one sending a large message with nothing else in flight is refused (53200).",
            envvar=env("max_buffered"),
            min=1 << 20,
        ),
    ] = MAX_BUFFERED,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="Certificate for TLS with clients (with --tls-key).", envvar=env("tls_cert")
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="Private key for --tls-cert.", envvar=env("tls_key"))
    ] = None,
    users: Annotated[
        Path | None,
        typer.Option(
            help='Embedded DuckDB only: who may connect, one `"user" "password"` per line (the '
            "password may be a SCRAM-SHA-256 verifier from `admission passwd`); clients then "
            "authenticate with SCRAM-SHA-256. Without it, ADMISSION_PASSWORD is every user's "
            "password; with neither, clients are trusted (loopback only, unless --insecure). "
            "With --backend, PostgreSQL authenticates its clients itself.",
            envvar=env("users"),
        ),
    ] = None,
    allow_file_access: Annotated[
        list[Path] | None,
        typer.Option(
            "--allow-file-access",
            help="Embedded DuckDB only: a directory or file clients may read and write with SQL "
            "(read_csv, COPY, ATTACH); repeat for more. By default clients reach no file of "
            "this machine: DuckDB's external access is off once the server's data is loaded.",
            envvar=env("allow_file_access"),
        ),
    ] = None,
    allow_extensions: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-extensions",
            help="Embedded DuckDB only: a DuckDB extension to install and load at start, before "
            "the database is locked down (clients cannot install or load any); repeat or "
            "separate with commas.",
            envvar=env("allow_extensions"),
        ),
    ] = None,
    startup_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a client has from connecting to being ready for queries (startup, "
            "TLS, authentication); then it is closed with 08P01.",
            envvar=env("startup_timeout"),
            min=0.1,
        ),
    ] = 60.0,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Listen beyond loopback without TLS (and, embedded, without authentication). "
            "Refused otherwise: anyone who reaches the port would read the data.",
            envvar=env("insecure"),
        ),
    ] = False,
    admin: Annotated[
        str | None,
        typer.Option(
            help="Serve the admin API (status, classes, η, policy, limits, metrics) on HOST:PORT;"
            " off unless given.",
            envvar=env("admin"),
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            help="Bearer token the admin API requires (needed when it listens beyond loopback).",
            envvar=env("admin_token"),
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error.", envvar=env("log_level"))
    ] = "info",
) -> None:
    """Run the admission-control proxy in front of a database.

    By default the proxy hosts an in-memory DuckDB database and answers the PostgreSQL protocol
    for it (--tpch SF loads TPC-H into it); with --backend it sits in front of a PostgreSQL
    server. The embedded database is closed to the host: clients read and write no files and
    install no extensions (--allow-file-access, --allow-extensions open that up), and change
    none of its server-wide settings. It listens on loopback by default; beyond it, it needs
    TLS and authentication (--users or ADMISSION_PASSWORD) or --insecure.

    Clients connect here instead of to the database. Every statement is classified by its SQL
    skeleton and waits in the admission queue until the policy admits it under the MPL and the
    thread budget; session control and statements inside a transaction block pass at once.
    Without --model on the embedded DuckDB it learns each class from nothing and tunes its MPL
    (the latency policy, --mpl auto from this machine's cores). Wherever it chooses the MPL
    itself (no --mpl, or --mpl auto), a statement in service for a second gives its slot to
    the queue (--release-after 1), so that long ad hoc statements cannot hold a short one for
    their whole run; an --mpl number given is a hard cap. On the embedded DuckDB, whose
    transactions fail on each other's rows instead of waiting, writing transactions are
    limited while they do (--contention).
    """
    import logging

    from proxy.app import ProxyConfig
    from proxy.server import parse_backend

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # learning on the embedded DuckDB without a model: the recommended policy under an MPL
    # tuned while serving (--mpl auto from the cores; README "The default without a model,
    # measured"); in front of PostgreSQL, without a model, everything is admitted
    learning_here = model is None and backend is None and learn
    tuned = learning_here and mpl is None
    chosen = policy or (RECOMMENDED_POLICY if model is not None or learning_here else "fcfs")
    _check_combinations(backend, tpch, database, chosen, tls_cert, tls_key)
    if contention and pool_mode == "transaction":
        raise fail(
            "--contention with --pool-mode transaction is not supported: a transaction holds "
            "its server connection, and the pool is its limit"
        )
    if explain_dsn is not None and backend is None:
        raise fail("--explain-dsn belongs to --backend: the embedded DuckDB plans by itself")
    if explain_dsn is not None and not learn:
        raise fail("--explain-dsn gives priors to the live model: it has none with --no-learn")
    if backend is not None and (users or allow_file_access or allow_extensions):
        raise fail(
            "--users, --allow-file-access and --allow-extensions belong to the embedded DuckDB "
            "backend; PostgreSQL keeps its own users and permissions"
        )
    extensions = tuple(
        name.strip()
        for value in allow_extensions or ()
        for name in value.split(",")
        if name.strip()
    )
    try:
        address = parse_backend(backend) if backend is not None else None
        host, _, port = listen.rpartition(":")
        admin_host, admin_port = _admin_address(admin, admin_token)
        loaded = (
            EtaModel.load(model) if model is not None and (model.exists() or not learn) else None
        )
        if model is not None and loaded is None and not model.parent.is_dir():
            raise ValueError(
                f"{model}: the model file does not exist, and its directory does not either "
                "(the proxy would learn a model but could not save it)"
            )
        number, auto_mpl = parse_mpl("auto" if tuned else mpl)
        if number is None:
            if loaded is not None:
                number = recommended_mpl(loaded)
            elif model is not None or auto_mpl:  # learning from nothing: this machine's cores
                number = os.cpu_count() or 1
            else:
                number = 0
        duckdb_limit, temp_limit = parse_embedded_sizes(backend, memory_limit, max_temp_size)
        memory_budget, memory_auto = parse_memory(memory)
        grant = parse_grant(backend, grant_work_mem, number, threads)
        if (
            (mpl is None or auto_mpl)
            and number
            and release_after is None
            and pool_mode == "session"  # (else: an error below, on what was asked)
            and grant is None
            and coordinator is None  # (a statement beside the MPL would be outside the budget)
        ):
            # an MPL serve chose itself (from the model, or tuned from the cores): a statement
            # of a class not measured yet cannot take the short lane, so a statement in service
            # a second gives its slot to the queue — long ad hoc statements cannot hold a short
            # one for their whole run (README "Long statements and the MPL"). On learned mixes
            # it does not fire: their statements end sooner. An MPL number given is a hard cap.
            release_after = DEFAULT_RELEASE_AFTER
        if coordinator is not None and (auto_mpl or not number):
            raise ValueError(
                "--coordinator shares a global MPL among proxies: give it as a number (--mpl N)"
            )
        if coordinator is not None and backend is None:
            raise ValueError(
                "--coordinator shares one PostgreSQL's budget among the proxies in front of it "
                "(--backend postgresql://…); each embedded DuckDB is a database of its own"
            )
        if coordinator is not None and grant is not None:
            raise ValueError(
                "--grant-work-mem with --coordinator is not supported: a grant is the budget "
                "over the local MPL, which the coordinator moves"
            )
        admission_limits = limits(
            number,
            threads,
            backfill,
            max_wait,
            queue_timeout,
            due_factor,
            lifo_after,
            memory_budget,
            release_after,
            short_lane,
        )
        for flag, value in (
            ("--release-after", admission_limits.release_after),
            ("--short-lane", admission_limits.short_lane),
        ):
            if not value:
                continue
            if grant is not None:
                raise ValueError(
                    f"{flag} with --grant-work-mem is not supported: each statement's "
                    "work_mem is the grant over the MPL, and statements beside it have none"
                )
            if coordinator is not None:
                raise ValueError(
                    f"{flag} with --coordinator is not supported: a statement beside the MPL "
                    "would run outside the global budget"
                )
            if pool_mode == "transaction":
                raise ValueError(
                    f"{flag} with --pool-mode transaction is not supported: a statement beside "
                    "the MPL needs a server connection the pool (the MPL) does not have"
                )
            if admission_limits.mpl is None:
                raise ValueError(
                    f"{flag} lets statements run beside the MPL: it needs an MPL (--mpl N, or "
                    "a model's)"
                )
        if admission_limits.short_lane is None and (
            grant is not None or coordinator is not None or pool_mode == "transaction"
        ):  # (the latency policy's own lane: not where nothing can run beside the MPL)
            admission_limits = dataclasses.replace(admission_limits, short_lane=0)
        prepare, dataset = _tpch(tpch)
        pool = _pool(
            pool_mode,
            backend,
            pool_size,
            server_idle_timeout,
            server_lifetime,
            max_prepared_statements,
        )
        if pool is not None and grant is not None:
            raise ValueError(
                "--grant-work-mem needs --pool-mode session: a grant is set on a client's own "
                "server connection"
            )
        config = ProxyConfig(
            backend=address,
            listen_host=host or "127.0.0.1",
            listen_port=int(port),
            policy=chosen,
            model=loaded,
            model_path=model,
            learn=learn,
            limits=admission_limits,
            auto_mpl=auto_mpl,
            explain_dsn=explain_dsn,
            coordinator=coordinator,
            lease_ttl=lease_ttl,
            coordinator_fallback=coordinator_fallback,
            # (not in transaction pool mode: a statement's server process is known only once
            # its connection is, after its admission)
            extend=_live_profile(sample_interval, profile_window, backend is None)
            if learn and sample_interval > 0 and pool is None
            else None,
            max_queue=max_queue,
            memory_limit=duckdb_limit,
            max_temp_size=temp_limit,
            work_mem_grant=grant,
            memory_auto=memory_auto and backend is None,
            max_classes=max_classes,
            workloads=WorkloadConfig.load(workload_classes) if workload_classes else None,
            workloads_path=workload_classes,
            max_message=max_message,
            max_buffered=max_buffered,
            tls_cert=tls_cert,
            tls_key=tls_key,
            admin_host=admin_host,
            admin_port=admin_port,
            admin_token=admin_token,
            database=database,
            prepare=prepare,
            dataset=dataset,
            workers=workers,
            file_access=tuple(allow_file_access or ()),
            extensions=extensions,
            users_file=users,
            insecure=insecure,
            startup_timeout=startup_timeout,
            pool=pool,
            max_client_conn=max_client_conn,
            # (on by default where transactions fail on each other's rows, the embedded
            # DuckDB; in front of PostgreSQL when asked, for SERIALIZABLE applications)
            contention=ContentionConfig()
            if (contention if backend is not None else contention is not False)
            else None,
        )
    except (ValueError, ModelError) as e:
        raise fail(str(e)) from None
    _run(config, listen)


def _pool(
    mode: str,
    backend: str | None,
    size: int,
    idle_timeout: float,
    lifetime: float,
    max_prepared: int = 200,
) -> PoolConfig | None:
    from proxy.pool import POOL_MODES, PoolConfig, backend_password

    if mode not in POOL_MODES:
        raise ValueError(f"--pool-mode must be session or transaction, not {mode!r}")
    if mode == "session":
        return None
    if backend is None:
        raise ValueError(
            "--pool-mode transaction pools PostgreSQL's connections (--backend); the embedded "
            "DuckDB has none to pool"
        )
    return PoolConfig(
        size=size,
        idle_timeout=idle_timeout,
        lifetime=lifetime,
        password=backend_password(backend),
        max_prepared=max_prepared,
    )


def _live_profile(
    interval: float, window: float, embedded: bool
) -> Callable[[Listener], Tuner | None]:
    """Training's sampler, run while serving (``training.live``), on the proxy once built."""
    if window <= interval:
        raise fail("--profile-window must be longer than --sample-interval")

    def extend(listener: Listener) -> Tuner | None:
        from training.live import LiveProfile

        if listener.learning is None:
            return None
        make = LiveProfile.for_embedded if embedded else LiveProfile.for_postgresql
        return make(listener.learning, os.cpu_count() or 1, interval=interval, window=window)

    return extend


def _check_combinations(
    backend: str | None,
    tpch: float | None,
    database: str,
    policy: str,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Options that are wrong together, or a policy the scheduler does not know."""
    if backend is not None and (tpch is not None or database != ":memory:"):
        raise fail("--tpch and --database belong to the embedded DuckDB backend, not --backend")
    if policy not in POLICIES:
        raise fail(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")


def _admin_address(admin: str | None, token: str | None) -> tuple[str | None, int]:
    """Where the admin API listens (no host: it is off); beyond loopback only with a token."""
    from proxy.app import LOOPBACK

    if admin is None:
        return None, 6433
    host, _, port = admin.rpartition(":")
    host, number = host or "127.0.0.1", int(port)
    if host not in LOOPBACK and not token:
        raise ValueError(
            f"the admin API on {host} needs --admin-token: it can change the policy and the limits"
        )
    return host, number


def _tpch(scale_factor: float | None) -> tuple[Prepare | None, str | None]:
    """``--tpch``: the embedded database is filled with TPC-H at this scale factor."""
    if scale_factor is None:
        return None, None
    from lab.target import tpch_prepare

    return tpch_prepare(scale_factor), f"TPC-H SF {scale_factor:g}"


def _run(config: ProxyConfig, listen: str) -> None:
    """Serve until a signal; a failure to start is one line, not a traceback."""
    from proxy.app import run

    try:
        run(config, progress=progress_printer())
    except (ValueError, RuntimeError, subprocess.CalledProcessError) as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"cannot listen on {listen}: {e.strerror or e}") from None
