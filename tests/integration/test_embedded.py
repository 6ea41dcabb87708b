"""The embedded DuckDB backend: the proxy answers the PostgreSQL protocol itself, on DuckDB.

Real clients (psql, psycopg, asyncpg, SQLAlchemy) over real sockets: parameters and types both
ways in text and binary, SQLSTATEs, transactions and savepoints, what drivers send on connect,
cancel of a running DuckDB query, the admission gate in front of DuckDB (measured inside DuckDB
by a UDF), and the profiler's per-statement measurements. Raw byte streams for what no driver
sends: negotiation, malformed packets, batches that end early.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import asyncpg
import duckdb
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from admission import Limits
from proxy.backends.embedded import Measurement
from proxy.wire import protocol as pg
from testing import fuzz
from testing.embeddedharness import Embedded
from testing.pgcluster import Cluster


def _items(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "create table items (id integer primary key, name varchar, price decimal(10,2), added date)"
    )
    con.execute("insert into items values (1, 'tea', 3.50, '2024-01-02'), (2, 'cake', null, null)")


@pytest.fixture
def embedded() -> Iterator[Embedded]:
    server = Embedded(Limits(mpl=2), _items)
    yield server
    server.close()


def test_psql_through_the_embedded_backend(embedded: Embedded) -> None:
    out = subprocess.run(
        [
            "psql",
            f"host=127.0.0.1 port={embedded.port} user=app dbname=app",
            "-X",
            "-A",
            "-t",
            "-c",
            "select id, name, price from items order by id",
            "-c",
            "select count(*) from nope",
            "-c",
            "select 'after the error'",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.splitlines() == ["1|tea|3.50", "2|cake|", "after the error"]
    assert "Table with name nope does not exist" in out.stderr


def test_pgbench_initializes_and_runs_against_the_embedded_server(embedded: Embedded) -> None:
    """``pgbench -i`` (DROP of several tables, WITH (fillfactor), COPY FROM STDIN, VACUUM,
    primary keys added) and its TPC-B-like run: DuckDB's write conflicts (every transaction
    updates the one branch row) are 40001, which pgbench retries."""
    dsn = f"host=127.0.0.1 port={embedded.port} user=app dbname=app"
    for steps in ("dtgvp", "dtGvp"):  # client-side data (COPY), then server-side (INSERT)
        init = subprocess.run(
            ["pgbench", "-i", "-I", steps, "-s", "1", "-q", dsn],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert init.returncode == 0, init.stderr
        with embedded.connect() as conn:
            assert conn.execute("select count(*), sum(aid) from pgbench_accounts").fetchone() == (
                100_000,
                5_000_050_000,
            )
    for mode in ("simple", "extended", "prepared"):  # (extended: parameters left untyped)
        args = ["-M", mode, "-c", "4", "-j", "2", "-t", "20", "--max-tries", "1000", "-n"]
        run = subprocess.run(
            ["pgbench", *args, dsn],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "number of transactions actually processed: 80/80" in run.stdout, run.stdout
    with embedded.connect() as conn:
        assert conn.execute("select count(*) from pgbench_history").fetchone() == (240,)
        # every update counted once: the branch's balance is the history's sum
        assert conn.execute(
            "select (select sum(bbalance) from pgbench_branches) = (select sum(delta) from "
            "pgbench_history)"
        ).fetchone() == (True,)


def test_copy_in_and_out_with_psql(embedded: Embedded, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("1\ttea\t\\N\n2\ttab\\there\t3.5\n")
    csv_file = tmp_path / "in.csv"
    csv_file.write_text('id,name\n3,"a,b"\n4,\n')

    def psql(*commands: str) -> subprocess.CompletedProcess[str]:
        args = [f"host=127.0.0.1 port={embedded.port} user=app dbname=app", "-X", "-v"]
        args += ["ON_ERROR_STOP=1"]
        for command in commands:
            args += ["-c", command]
        return subprocess.run(["psql", *args], capture_output=True, text=True, timeout=30)

    done = psql(
        "create table menu (id int, name varchar, price decimal(4, 1))",
        f"\\copy menu from '{source}'",
        f"\\copy menu (id, name) from '{csv_file}' with (format csv, header)",
        "\\copy (select * from menu order by id) to stdout",
        "\\copy menu to stdout with csv header",
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()[1:]  # (after CREATE TABLE)
    assert out[:2] == ["COPY 2", "COPY 2"]
    assert out[2:6] == ["1\ttea\t\\N", "2\ttab\\there\t3.5", "3\ta,b\t\\N", "4\t\\N\t\\N"]
    assert out[6:8] == ["id,name,price", "1,tea,"] and '3,"a,b",' in out
    failed = psql("\\copy menu from stdin (format binary)")
    assert failed.returncode != 0 and "binary format is not supported" in failed.stderr


def test_copy_with_psycopg_is_one_statement(embedded: Embedded) -> None:
    """psycopg's copy(): rows written and read; bad data, a CopyFail and a short row fail the
    whole COPY and leave the session usable; inside a transaction it rolls back with it."""
    with embedded.connect() as conn:
        conn.execute("create table log (id int, msg varchar, at_time timestamp)")
        with conn.cursor().copy("copy log (id, msg, at_time) from stdin") as cp:
            for i in range(3):
                cp.write_row((i, f"line\t{i}\\", datetime.datetime(2024, 1, 1, i)))
        with conn.cursor().copy("copy (select id, msg from log order by id) to stdout") as cp:
            assert list(cp.rows()) == [(str(i), f"line\t{i}\\") for i in range(3)]
        with (
            pytest.raises(psycopg.errors.InvalidTextRepresentation),
            conn.cursor().copy("copy log (id) from stdin") as cp,
        ):
            cp.write(b"7\nseven\n")
        with (
            pytest.raises(psycopg.errors.QueryCanceled),
            conn.cursor().copy("copy log (id) from stdin") as cp,
        ):
            cp.write(b"8\n")
            raise psycopg.errors.QueryCanceled("the client gives up")  # (psycopg: CopyFail)
        with (
            pytest.raises(psycopg.errors.BadCopyFileFormat),  # 22P04
            conn.cursor().copy("copy log (id, msg) from stdin") as cp,
        ):
            cp.write(b"9\n")
        assert conn.execute("select count(*) from log").fetchone() == (3,)
        conn.execute("begin")
        with conn.cursor().copy("copy log (id) from stdin") as cp:
            cp.write(b"10\n11\n")
        assert conn.execute("select count(*) from log").fetchone() == (5,)
        conn.execute("rollback")
        assert conn.execute("select count(*) from log").fetchone() == (3,)


_UNALIASED = [
    "count(*), sum(id)",
    "id::int, '1'::int, items.id, coalesce(price, 0), nullif(id, 2)",
    "case when id > 1 then 1 end, case when id > 1 then 1 else id end",
    "exists(select 1), (select max(id) from items), (select id as x from items limit 1)",
    "1 + 2, upper(name) as u, current_date, greatest(id, 2), id is null, -id, (id)",
    "lower((name)), id::text, array[1], row(1, 2), now()",
    "max(id) filter (where id > 0), count(distinct name)",
]


@pytest.mark.parametrize("targets", _UNALIASED)
def test_result_columns_are_named_as_postgresql_names_them(
    embedded: Embedded, pg: Cluster, targets: str
) -> None:
    """A column with no alias: PostgreSQL's name (``count``, ``?column?``), not DuckDB's text
    of the expression; compared with a real PostgreSQL holding the same table."""
    query = f"select {targets} from items limit 1"
    with psycopg.connect(pg.dsn(), autocommit=True) as real:
        real.execute("drop table if exists items")
        real.execute("create table items (id int primary key, name varchar, price decimal(10,2))")
        expected = [d.name for d in real.execute(query).description or ()]
        real.execute("drop table items")
    with embedded.connect() as conn:
        got = [d.name for d in conn.execute(query).description or ()]
        assert got == expected
        # the same through a Describe of a prepared statement (asyncpg reads names there)
        prepared = [d.name for d in conn.execute(query, prepare=True).description or ()]
        assert prepared == expected


def test_what_node_orms_send(embedded: Embedded) -> None:
    """Statements Sequelize, knex, TypeORM, kysely, drizzle and postgres.js send (captured
    from them), each answered as PostgreSQL answers it."""
    with embedded.connect() as conn:
        # knex and TypeORM read the version's column by its name on connect
        cur = conn.execute("SELECT version();")
        assert cur.description is not None and cur.description[0].name == "version"
        # Sequelize's type discovery on connect reads pg_range; drizzle-kit pg_policies
        assert conn.execute("select count(*) from pg_catalog.pg_range").fetchone() == (0,)
        assert conn.execute("select count(*) from pg_policies").fetchone() == (0,)
        # TypeORM
        assert conn.execute("SELECT * FROM current_schema()").fetchone() == ("public",)
        # drizzle-kit: an empty select list
        assert conn.execute("select exists (select from items) as e").fetchone() == (True,)
        # Sequelize writes every timestamp with a space before its offset, bound or literal
        conn.execute("create table stamped (id int, at_time timestamptz)")
        conn.execute(
            'insert into "stamped" ("id", "at_time") values (%s, %s)',
            (1, "2024-01-02 03:04:05.000 +00:00"),
        )
        conn.execute(
            "insert into stamped values (2, '2024-01-02 03:04:05.000 +05:30'::timestamptz)"
        )
        assert conn.execute(
            "select id, at_time from stamped where at_time > '2000-01-01 00:00:00.000 +00:00' "
            "order by id"
        ).fetchall() == [
            (1, datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)),
            (2, datetime.datetime(2024, 1, 1, 21, 34, 5, tzinfo=datetime.UTC)),
        ]
        # (the same text stored in a text column keeps its space)
        conn.execute("create table notes (body varchar)")
        conn.execute("insert into notes values ('2024-01-02 03:04:05 +05:30')")
        assert conn.execute("select body from notes").fetchone() == ("2024-01-02 03:04:05 +05:30",)
        # Sequelize's bulkCreate: the literals inline, several rows, in a transaction too
        conn.execute('create table "Logged" (id int, "createdAt" timestamptz, note varchar)')
        with conn.transaction():
            conn.execute(
                'INSERT INTO "Logged" ("id","createdAt","note") VALUES '
                "(3,'2024-01-02 03:04:05.000 +00:00','2024-01-02 03:04:05.000 +01:30'),"
                "(4,'2024-01-02 03:04:05.000 +01:00','x')"
            )
        assert conn.execute(
            'select id, "createdAt", note from "Logged" order by id'
        ).fetchall() == [
            (
                3,
                datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
                "2024-01-02 03:04:05.000 +01:30",
            ),
            (4, datetime.datetime(2024, 1, 2, 2, 4, 5, tzinfo=datetime.UTC), "x"),
        ]
        # Sequelize's CREATE TABLE: ON DELETE SET NULL ON UPDATE CASCADE, which DuckDB refuses —
        # dropped with a warning, the key kept and enforced
        conn.execute("create table sq_parent (id int primary key)")
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute(
            'create table sq_child (id int, "ParentId" int references "sq_parent" ("id") '
            "on delete set null on update cascade)"
        )
        assert any("referential action" in n for n in notices), notices
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("insert into sq_child values (1, 9)")
        # Sequelize's showIndex: array_agg(attname) is name[] (its driver leaves it as text)
        cur = conn.execute(
            "select i.relname as name, array_agg(a.attname) as column_names "
            "from pg_class t, pg_class i, pg_index ix, pg_attribute a "
            "where t.oid = ix.indrelid and i.oid = ix.indexrelid and a.attrelid = t.oid "
            "and a.attnum = any(ix.indkey) and t.relname = 'sq_parent' group by i.relname"
        )
        assert cur.description is not None and cur.description[1].type_code == 1003
        assert cur.fetchall() == [("sq_parent_pkey", ["id"])]
        conn.execute("drop table sq_child")
        conn.execute("drop table sq_parent")
        # node-postgres and postgres.js send an array for = ANY($1) as an untyped literal
        import pg8000.native

        untyped = pg8000.native.Connection(
            "app", host="127.0.0.1", port=embedded.port, database="app"
        )
        try:
            assert untyped.run("select name from items where id = any(:ids)", ids="{1,2}") == [
                ["tea"],
                ["cake"],
            ]
        finally:
            untyped.close()
        # PostgreSQL's JSON functions and path operators (drizzle, Sequelize)
        got = conn.execute(
            """select json_agg(json_build_array(id, name)), jsonb_build_object('k', 1), """
            """'{"a": {"b": [5, 6]}}'::jsonb #>> '{a,b,1}' from items"""
        ).fetchone()
        assert got == ([[1, "tea"], [2, "cake"]], {"k": 1}, "6")  # (psycopg reads jsonb)
        # Sequelize and drizzle-kit join table_constraints with constraint_column_usage
        conn.execute("create table parent (id int primary key)")
        conn.execute("create table child (id int, pid int references parent (id))")
        rows = conn.execute(
            "SELECT tc.constraint_name, ccu.table_name FROM information_schema.table_constraints"
            " tc JOIN information_schema.constraint_column_usage ccu ON ccu.constraint_name = "
            "tc.constraint_name WHERE constraint_type = 'FOREIGN KEY'"
        ).fetchall()
        assert len(rows) == 1
        # ORMs compare their models with information_schema.columns in PostgreSQL's words
        conn.execute(
            "create table typed (a int, b varchar, c jsonb, d timestamptz, e decimal(8,2))"
        )
        assert conn.execute(
            "select data_type, udt_name from information_schema.columns "
            "where table_name = 'typed' order by ordinal_position"
        ).fetchall() == [
            ("integer", "int4"),
            ("text", "text"),
            ("jsonb", "jsonb"),
            ("timestamp with time zone", "timestamptz"),
            ("numeric", "numeric"),
        ]
        # Sequelize's showIndex groups by the index's key columns it returns
        assert conn.execute(
            "select ix.indkey, count(*) from pg_index ix group by ix.indkey"
        ).fetchall()


def test_serial_sequences_belong_to_their_table(embedded: Embedded) -> None:
    """A serial column's sequence is the table's: it is dropped with the table (ORMs' test
    suites drop and make tables again and expect ids from 1); a sequence the user made
    stays."""
    with embedded.connect() as conn:
        conn.execute("create sequence shared_ids")
        conn.execute(
            "create table counted (id serial primary key, own bigint default nextval('shared_ids'))"
        )
        conn.execute("insert into counted default values")
        conn.execute("insert into counted default values")
        conn.execute("drop table counted")
        conn.execute("create table counted (id serial primary key)")
        assert conn.execute("insert into counted default values returning id").fetchone() == (1,)
        assert conn.execute("select nextval('shared_ids')").fetchone() == (3,)


@pytest.mark.parametrize(
    "pattern",
    [
        "YYYY-MM-DD",
        "YYYY-MM-DD HH24:MI:SS",
        "Mon DD, YYYY",
        "FMMonth FMDD",
        "HH12:MI AM",
        "DD/MM/YY",
        '"Q"YYYY',
        'YYYY-"W"IW',
        "Dy, DDD",
        "HH24:MI:SS.MS",
    ],
)
def test_to_char_of_a_date_writes_what_postgresql_writes(
    embedded: Embedded, pg: Cluster, pattern: str
) -> None:
    query = "select to_char(timestamp '2024-03-05 14:07:09.123', %s)"
    with psycopg.connect(pg.dsn(), autocommit=True) as real:
        expected = real.execute(query, (pattern,)).fetchone()
    with embedded.connect() as conn:
        literal = "'" + pattern.replace("'", "''") + "'"
        assert conn.execute(query.replace("%s", literal)).fetchone() == expected


def test_advisory_locks_as_migration_tools_take_them(embedded: Embedded) -> None:
    """pg_advisory_lock and its kin (Prisma, Rails, kysely's Migrator): a second session waits
    for the key, a try fails at once, an xact lock ends with its transaction, a session's end
    gives its locks back, a cancel ends a wait — and waiting takes no admission slot (MPL 2,
    two waiters, the holder still runs)."""
    holder, waiter, other = embedded.connect(), embedded.connect(), embedded.connect()
    try:
        cur = holder.execute("select pg_advisory_lock(72707369)")
        assert cur.description is not None and cur.description[0].name == "pg_advisory_lock"
        assert other.execute("select pg_try_advisory_lock(72707369) as ok").fetchone() == (False,)
        got: list[object] = []
        waiting = threading.Thread(
            target=lambda: got.append(
                waiter.execute("select pg_advisory_lock(72707369)").fetchone()
            )
        )
        waiting.start()
        also = threading.Thread(
            target=lambda: got.append(
                other.execute("select pg_advisory_lock_shared(72707369)").fetchone()
            )
        )
        also.start()
        time.sleep(0.3)
        assert got == [] and holder.execute("select count(*) from items").fetchone() == (2,)
        assert holder.execute("select pg_advisory_unlock(72707369)").fetchone() == (True,)
        waiting.join(5)
        assert got[:1] == [("",)]  # (void, as PostgreSQL prints it)
        assert waiter.execute("select pg_advisory_unlock(%s)", (72707369,)).fetchone() == (True,)
        also.join(5)
        assert len(got) == 2
        assert holder.execute("select pg_advisory_unlock(5)").fetchone() == (False,)  # warned
        # a transaction-level lock ends with its transaction
        holder.execute("begin")
        holder.execute("select pg_advisory_xact_lock(1, 2)")
        assert waiter.execute("select pg_try_advisory_lock(1, 2)").fetchone() == (False,)
        holder.execute("commit")
        assert waiter.execute("select pg_try_advisory_lock(1, 2)").fetchone() == (True,)
        # a cancel ends a wait
        cancelled: list[BaseException] = []

        def wait_then_fail() -> None:
            try:
                holder.execute("select pg_advisory_lock(1, 2)")
            except psycopg.errors.QueryCanceled as e:
                cancelled.append(e)

        blocked = threading.Thread(target=wait_then_fail)
        blocked.start()
        time.sleep(0.2)
        holder.cancel_safe()  # (cancel() blocks the GIL the in-process server needs)
        blocked.join(5)
        assert len(cancelled) == 1
        # a session's end gives its locks back
        waiter.close()
        assert holder.execute("select pg_try_advisory_lock(1, 2)").fetchone() == (True,)
        holder.execute("select pg_advisory_unlock_all()")
    finally:
        for conn in (holder, waiter, other):
            conn.close()


def test_alter_table_carries_the_indexes_along(embedded: Embedded) -> None:
    """What migrations do to indexed tables, which DuckDB refuses while an index depends on the
    table: the indexes are dropped and made again around the ALTER (renamed with a column or
    the table, gone with a dropped column), and a failed ALTER leaves them as they were."""
    with embedded.connect() as conn:
        conn.execute(
            'create table dev (id int primary key, name varchar not null, kind varchar, "Tag" int)'
        )
        conn.execute("create index dev_kind on dev (kind)")
        conn.execute('create unique index dev_name on dev (lower(name), "Tag")')
        conn.execute("insert into dev values (1, 'a', 'k', 1)")
        for alter in (
            "alter table dev alter column name drop not null",
            "alter table dev rename column kind to sort",
            "alter table dev alter column sort type text",
            'alter table dev alter column "Tag" type bigint',
            "alter table dev add column extra int",
            "alter table dev drop column sort",
            "alter table dev rename to device",
        ):
            assert conn.execute(alter).statusmessage == "ALTER TABLE", alter
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            conn.execute("alter table device alter column name type int")  # ('a' is no int)

        def indexes() -> list[tuple[str, str]]:
            return conn.execute(
                "select index_name, sql from duckdb_indexes() where table_name = 'device'"
            ).fetchall()

        assert indexes() == [
            ("dev_name", 'CREATE UNIQUE INDEX dev_name ON public.device((lower("name")), Tag);')
        ]
        with pytest.raises(psycopg.errors.UniqueViolation):  # (still enforced)
            conn.execute("""insert into device (id, name, "Tag") values (2, 'A', 1)""")
        # Django's unique_together: a unique index DuckDB can carry through later ALTERs
        conn.execute('alter table device add constraint device_pair unique (id, "Tag")')
        conn.execute("alter table device alter column extra set default 0")
        assert conn.execute("alter table device drop constraint device_pair").statusmessage
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # (a constraint DuckDB keeps)
            conn.execute("alter table device drop constraint device_pkey")
        conn.execute("begin")  # (in a transaction block: renamed, then rolled back)
        conn.execute("alter table device rename column extra to more")
        conn.execute("rollback")
        assert [d.name for d in conn.execute("select * from device").description or ()] == [
            "id",
            "name",
            "Tag",
            "extra",
        ]


def test_inferred_parameter_types_follow_the_schema(embedded: Embedded) -> None:
    """A statement parsed again reuses the types inferred for its text (pgbench -M extended
    parses every execution) until the schema changes, in any session — or a transaction that
    changed it rolls back."""
    import pg8000.native

    conn = pg8000.native.Connection("app", host="127.0.0.1", port=embedded.port, database="app")
    other = pg8000.native.Connection("app", host="127.0.0.1", port=embedded.port, database="app")
    try:
        conn.run("create table shifting (k int)")
        conn.run("insert into shifting values (7)")
        query = "select count(*) from shifting where k = :k"
        assert conn.run(query, k="7") == [[1]]  # (k's text read as the column's integer)
        other.run("drop table shifting")
        other.run("create table shifting (k date)")
        other.run("insert into shifting values ('2024-01-02')")
        assert conn.run(query, k="2024-01-02") == [[1]]  # (a date now, not a stale integer)
        conn.run("begin")
        conn.run("drop table shifting")
        conn.run("create table shifting (k int)")
        assert conn.run(query, k="3") == [[0]]
        conn.run("rollback")
        assert conn.run(query, k="2024-01-02") == [[1]]
    finally:
        conn.close()
        other.close()


def test_the_database_a_client_connected_to_is_current_database(embedded: Embedded) -> None:
    """current_database(), information_schema's *_catalog columns and pg_database name the
    database the client connected to (tools filter the catalogs by it), not DuckDB's."""
    with psycopg.connect(
        f"host=127.0.0.1 port={embedded.port} user=app dbname=shop", autocommit=True
    ) as conn:
        assert conn.execute("select current_database()").fetchone() == ("shop",)
        assert conn.execute("select * from current_database()").fetchone() == ("shop",)
        conn.execute("create table if not exists shop_parent (id int primary key)")
        conn.execute(
            "create table if not exists shop_child (id int, parent int references shop_parent (id))"
        )
        rows = conn.execute(
            "select tc.constraint_name, ccu.table_name "
            "from information_schema.table_constraints tc "
            "join information_schema.constraint_column_usage ccu "
            "on ccu.constraint_name = tc.constraint_name "
            "where tc.constraint_type = 'FOREIGN KEY' and tc.table_name = 'shop_child' "
            "and tc.table_catalog = 'shop'"
        ).fetchall()  # (Sequelize's foreign key query, in short)
        assert [table for _, table in rows] == ["shop_parent"]
        assert conn.execute(
            "select count(*) from information_schema.tables "
            "where table_catalog = current_database() and table_name like 'shop_%'"
        ).fetchone() == (2,)
        assert conn.execute(
            "select datname from pg_database where datname = current_database()"
        ).fetchone() == ("shop",)
    with embedded.connect() as conn:  # (dbname app: the same tables, its own name)
        assert conn.execute("select current_database()").fetchone() == ("app",)
        assert conn.execute(
            "select distinct table_catalog from information_schema.tables "
            "where table_name like 'shop_%'"
        ).fetchall() == [("app",)]
        conn.execute("drop table shop_child")
        conn.execute("drop table shop_parent")


def test_reset_and_search_path_as_clients_send_them(embedded: Embedded) -> None:
    """RESET of a PostgreSQL parameter and RESET ALL; search_path set to PostgreSQL's public
    (the default schema) or a list of schemas, as ORMs and migration tools set it, and reset."""
    with embedded.connect() as conn:
        conn.execute("set application_name = 'mine'")
        assert conn.execute("reset application_name").statusmessage == "RESET"
        assert conn.execute("show application_name").fetchone() == ("",)
        conn.execute("set statement_timeout = 5000")
        assert conn.execute("reset all").statusmessage == "RESET"
        assert conn.execute("show statement_timeout").fetchone() == ("0",)
        conn.execute("create schema side")
        assert conn.execute('set search_path to side, "$user", public').statusmessage == "SET"
        assert conn.execute("show search_path").fetchone() == ("side, public",)
        conn.execute("create table lands_in_side (a int)")
        assert conn.execute(
            "select table_schema from information_schema.tables where table_name = 'lands_in_side'"
        ).fetchone() == ("side",)
        assert conn.execute("select count(*) from items").fetchone() == (2,)  # (public, found)
        conn.execute("set search_path = side")
        with pytest.raises(psycopg.errors.UndefinedTable):  # (public is off the path)
            conn.execute("select count(*) from items")
        conn.execute("set search_path = public")
        assert conn.execute("show search_path").fetchone() == ('"$user", public',)
        conn.execute("create table lands_in_public (a int)")
        conn.execute("set search_path = side")
        conn.execute("reset search_path")
        assert conn.execute("show search_path").fetchone() == ('"$user", public',)
        assert conn.execute(
            "select table_schema from information_schema.tables "
            "where table_name = 'lands_in_public'"
        ).fetchone() == ("public",)
        conn.execute("set search_path to side")
        conn.execute("set search_path to not_made_yet, side")  # (skipped, as PostgreSQL does)
        conn.execute("create table lands_in_side_too (a int)")
        assert conn.execute(
            "select table_schema from information_schema.tables "
            "where table_name = 'lands_in_side_too'"
        ).fetchone() == ("side",)
        conn.execute("set search_path to default")
        assert conn.execute("select count(*) from public.items").fetchone() == (2,)
        assert conn.execute("select count(*) from items").fetchone() == (2,)


def test_write_conflicts_are_serialization_failures(embedded: Embedded) -> None:
    """Two transactions updating one row: DuckDB's optimistic concurrency fails the second
    with 40001 (PostgreSQL's code for it under REPEATABLE READ), which clients retry."""
    with embedded.connect() as first, embedded.connect() as second:
        first.execute("begin")
        first.execute("update items set price = price + 1 where id = 1")
        second.execute("begin")
        with pytest.raises(psycopg.errors.SerializationFailure):
            second.execute("update items set price = price + 2 where id = 1")
        second.execute("rollback")
        first.execute("commit")
        assert second.execute("select price from items where id = 1").fetchone() == (
            Decimal("4.50"),
        )


def test_psycopg2_transactions_ddl_and_errors(embedded: Embedded) -> None:
    """psycopg2 (libpq) opens every transaction with its own BEGIN and fails it unless the
    reply is a bare command tag: a command answers with no RowDescription, as in PostgreSQL."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=embedded.port, user="app", dbname="app")
    try:
        cur = conn.cursor()
        cur.execute("select name from items where id = %s", (1,))
        assert cur.fetchone() == ("tea",)
        cur.execute("create temp table t2 (a int, b text)")
        assert cur.description is None and cur.statusmessage == "CREATE TABLE"
        cur.execute("insert into t2 values (%s, %s), (%s, %s)", (1, "it's", 2, None))
        assert cur.rowcount == 2
        conn.commit()
        cur.execute("select a, b from t2 order by a")
        assert cur.fetchall() == [(1, "it's"), (2, None)]
        with pytest.raises(psycopg2.Error) as failed:
            cur.execute("select * from nope")
        assert failed.value.pgcode == "42P01"
        conn.rollback()
        cur.execute("select 2")
        assert cur.fetchone() == (2,)
        conn.commit()
    finally:
        conn.close()
    with embedded.connect() as conn:  # the bare reply, read without a driver's leniency
        for sql, tag in [("BEGIN", "BEGIN"), ("create table t3 (a int)", "CREATE TABLE")]:
            result = conn.pgconn.exec_(sql.encode())
            assert result.status == psycopg.pq.ExecStatus.COMMAND_OK and result.nfields == 0
            assert result.command_status == tag.encode()
        result = conn.pgconn.exec_(b"ROLLBACK")
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK


def test_pg8000_untyped_parameters_transactions_and_errors(embedded: Embedded) -> None:
    """pg8000 (pure Python) leaves every parameter's type to the server and binds text."""
    import pg8000.dbapi
    import pg8000.native

    conn = pg8000.native.Connection("app", host="127.0.0.1", port=embedded.port, database="app")
    try:
        assert conn.run("select 1 + :x as y", x=41) == [[42]]
        assert conn.run("select name from items where id = :i", i=2) == [["cake"]]
        assert conn.run("select :p * 2.0", p=Decimal("1.25")) == [[Decimal("2.5")]]
        statement = conn.prepare("select count(*) from items where price > :p")
        assert statement.run(p=Decimal("1")) == [[1]]
        statement.close()
        with pytest.raises(pg8000.native.DatabaseError) as failed:
            conn.run("select * from nope")
        assert failed.value.args[0]["C"] == "42P01"
        assert conn.run("select 'after the error'") == [["after the error"]]
    finally:
        conn.close()
    dbapi = pg8000.dbapi.connect("app", host="127.0.0.1", port=embedded.port, database="app")
    try:
        cur = dbapi.cursor()
        cur.execute("create temp table t8 (a int, b text, d date)")
        cur.executemany(
            "insert into t8 values (%s, %s, %s)",
            [(1, "a", datetime.date(2024, 1, 2)), (2, None, None)],
        )
        dbapi.commit()
        cur.execute("select a, b, d from t8 order by a")
        assert [tuple(r) for r in cur.fetchall()] == [
            (1, "a", datetime.date(2024, 1, 2)),
            (2, None, None),
        ]
        dbapi.rollback()
    finally:
        dbapi.close()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2", "pg8000"])
def test_sqlalchemy_orm_serial_keys_and_streamed_results(embedded: Embedded, driver: str) -> None:
    """SQLAlchemy's defaults on each driver: an integer primary key is SERIAL, new rows get
    their key back (RETURNING), reflection, pandas' to_sql, stream_results (a named cursor)
    and psycopg's DEALLOCATE ALL after DDL."""
    import pandas as pd

    class Base(DeclarativeBase):
        pass

    class Item(Base):
        __tablename__ = f"orm_{driver}"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str]
        price: Mapped[Decimal | None] = mapped_column(sa.Numeric(10, 2))

    engine = sa.create_engine(f"postgresql+{driver}://app@127.0.0.1:{embedded.port}/app")
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            for i in range(6):  # (psycopg prepares a statement run five times)
                session.add(Item(name=f"n{i}", price=Decimal(i)))
                session.commit()
            assert [i.id for i in session.scalars(sa.select(Item).order_by(Item.id))] == [
                1,
                2,
                3,
                4,
                5,
                6,
            ]
            session.get(Item, 2).name = "two"  # type: ignore[union-attr]
            session.commit()
        columns = [c["name"] for c in sa.inspect(engine).get_columns(f"orm_{driver}")]
        assert columns == ["id", "name", "price"]
        frame = pd.DataFrame({"x": range(500)})
        frame.to_sql(f"df_{driver}", engine, index=False, if_exists="replace", chunksize=200)
        with engine.connect() as conn:
            rows = conn.execution_options(stream_results=True, yield_per=50).execute(
                sa.text(f"select x from df_{driver} order by x")
            )
            assert [r[0] for r in rows] == list(range(500))
        Base.metadata.drop_all(engine)
    finally:
        engine.dispose()


def test_a_client_that_dies_as_its_statement_starts_leaves_nothing_running(
    embedded: Embedded,
) -> None:
    """Killed at any moment after sending a statement that would run for hours — before its
    admission, before DuckDB has begun it (where DuckDB loses an interrupt), or running — the
    statement is stopped and its capacity given back within seconds."""
    import random

    from testing.rawclient import RawClient

    rng = random.Random(7)
    for _ in range(15):
        victim = RawClient(embedded.port)
        victim.login("app", "app")
        victim.queries("select count(*), 'm' from range(100000000000) t(x) where x % 7 = 3")
        time.sleep(rng.uniform(0.0005, 0.006))
        victim.reset()
        deadline = time.monotonic() + 5
        while embedded.call(lambda: embedded.scheduler.in_service):
            assert time.monotonic() < deadline, "a dead client's statement still holds the MPL"
            time.sleep(0.02)


def test_discard_all_starts_the_session_over(embedded: Embedded) -> None:
    """What a pooler in front sends when a server connection changes hands: the session's
    temporary objects, settings and prepared statements are gone after it."""
    with embedded.connect() as conn:
        conn.execute("create temp table scratch (a int)")
        conn.execute("set variable answer = 42")
        conn.execute("set application_name = 'before'")
        conn.execute("select name from items where id = %s", (1,), prepare=True)
        conn.execute("begin")
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):  # 25001, as PostgreSQL
            conn.execute("discard all")
        conn.execute("rollback")
        assert conn.execute("discard all").statusmessage == "DISCARD ALL"
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("select * from scratch")
        assert conn.execute("select getvariable('answer')").fetchone() == (None,)
        assert conn.execute("show application_name").fetchone() != ("before",)
        assert conn.execute("select count(*) from items").fetchone() == (2,)
        assert conn.execute("discard plans").statusmessage == "DISCARD PLANS"
        assert conn.execute("discard temp").statusmessage == "DISCARD TEMP"  # (none left)


def test_asyncpg_reads_the_rows_of_insert_returning(embedded: Embedded) -> None:
    """asyncpg decodes rows by the statement's Describe: a RETURNING list is described."""

    async def run() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=embedded.port, user="app")
        try:
            got = await conn.fetchrow(
                "insert into items (id, name) values ($1, $2) returning id, upper(name) as up",
                7,
                "pie",
            )
            assert got is not None and tuple(got) == (7, "PIE") and list(got.keys()) == ["id", "up"]
            assert await conn.fetchval("delete from items where id = $1 returning name", 7) == "pie"
        finally:
            await conn.close()

    asyncio.run(run())


def test_named_cursors_of_psycopg_and_psycopg2_fetch_in_batches(embedded: Embedded) -> None:
    """Server-side cursors (DECLARE … FETCH … CLOSE): psycopg declares, describes the portal
    named as the cursor and fetches; psycopg2 fetches itersize rows at a time."""
    import psycopg2

    with embedded.connect(autocommit=False) as conn:
        with conn.cursor(name="big") as cur:
            cur.execute("select x, x * 2 as y from range(%s) t(x) order by x", (25_000,))
            assert [d.name for d in cur.description or ()] == ["x", "y"]
            assert cur.fetchmany(3) == [(0, 0), (1, 2), (2, 4)]
            # another statement between two fetches: the cursor's rows are not lost to it
            assert conn.execute("select count(*) from items").fetchone() == (2,)
            rest = cur.fetchall()
            assert len(rest) == 25_000 - 3 and rest[0] == (3, 6) and rest[-1] == (24_999, 49_998)
        conn.commit()
    conn2 = psycopg2.connect(host="127.0.0.1", port=embedded.port, user="app", dbname="app")
    try:
        with conn2.cursor(name="items_cur") as cur2:
            cur2.itersize = 1
            cur2.execute("select id, name from items order by id")
            assert list(cur2) == [(1, "tea"), (2, "cake")]
        conn2.commit()
    finally:
        conn2.close()


def test_sql_cursor_statements_and_their_errors(embedded: Embedded) -> None:
    with embedded.connect() as conn:
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):  # 25P01, as PostgreSQL
            conn.execute("declare c cursor for select 1")
        conn.execute("begin")
        assert conn.execute("declare c cursor for select * from range(10)").statusmessage == (
            "DECLARE CURSOR"
        )
        cur = conn.execute("fetch 3 from c")
        assert cur.fetchall() == [(0,), (1,), (2,)] and cur.statusmessage == "FETCH 3"
        assert conn.execute("move forward 2 in c").statusmessage == "MOVE 2"
        assert conn.execute("fetch next from c").fetchall() == [(5,)]
        assert conn.execute("fetch all from c").fetchall() == [(6,), (7,), (8,), (9,)]
        assert conn.execute("fetch c").fetchall() == []
        with pytest.raises(psycopg.errors.DuplicateCursor):
            conn.execute("declare c cursor for select 1")
        conn.execute("rollback")
        conn.execute("begin")
        conn.execute('declare "Mixed" cursor without hold for select 7')
        assert conn.execute('fetch forward all from "Mixed"').fetchall() == [(7,)]
        assert conn.execute('close "Mixed"').statusmessage == "CLOSE CURSOR"
        with pytest.raises(psycopg.errors.InvalidCursorName):  # 34000
            conn.execute('fetch "Mixed"')
        conn.execute("rollback")
        conn.execute("begin")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute("declare h binary cursor for select 1")
        conn.execute("rollback")
        conn.execute("begin")
        conn.execute("declare d cursor for select 1")
        conn.execute("commit")  # a cursor lives until its transaction ends
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("fetch d")


def test_with_hold_cursors_outlive_their_transaction(embedded: Embedded) -> None:
    """psycopg's named cursors outside a transaction (Django's ``iterator()``) declare WITH
    HOLD, fetch in batches and look the cursor up in pg_cursors before closing it."""
    with embedded.connect() as conn:  # (autocommit)
        with conn.cursor(name="walk", withhold=True) as cur:
            cur.itersize = 7
            cur.execute("select x from range(%s) t(x) order by x", (100,))
            assert [r[0] for r in cur] == list(range(100))
        # closed: pg_cursors no longer lists it
        assert conn.execute("select count(*) from pg_catalog.pg_cursors").fetchone() == (0,)
        conn.execute("declare h cursor with hold for select name from items order by id")
        conn.execute("begin")
        conn.execute("declare t cursor for select 1")
        listed = conn.execute(
            "select name, is_holdable from pg_cursors c order by c.name"
        ).fetchall()
        assert listed == [("h", True), ("t", False)]
        conn.execute("commit")
        assert conn.execute("fetch 1 from h").fetchall() == [("tea",)]
        assert conn.execute("fetch all from h").fetchall() == [("cake",)]
        assert conn.execute("select name from pg_cursors").fetchall() == [("h",)]
        assert conn.execute("close h").statusmessage == "CLOSE CURSOR"
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("fetch h")


def test_what_orm_migrations_create(embedded: Embedded) -> None:
    """The DDL of Django's and SQLAlchemy's PostgreSQL dialects: identity keys, indexes with
    operator classes, deferrable constraints, foreign keys added after the table (accepted
    with a warning: DuckDB cannot add them), JSON columns as jsonb."""
    notices: list[str] = []
    with embedded.connect() as conn:
        conn.add_notice_handler(lambda d: notices.append(f"{d.severity} {d.message_primary}"))
        conn.execute(
            'CREATE TABLE "shop" ("id" bigint NOT NULL PRIMARY KEY GENERATED BY DEFAULT AS '
            'IDENTITY, "name" varchar(100) NOT NULL UNIQUE, "attrs" jsonb NOT NULL)'
        )
        conn.execute(
            'CREATE TABLE "product" ("id" integer GENERATED ALWAYS AS IDENTITY (START WITH 100) '
            'PRIMARY KEY, "shop_id" bigint NOT NULL, "title" varchar(200) NOT NULL)'
        )
        conn.execute('CREATE INDEX "product_title_like" ON "product" ("title" varchar_pattern_ops)')
        conn.execute('CREATE INDEX "product_shop" ON "product" USING btree ("shop_id")')
        status = conn.execute(
            'ALTER TABLE "product" ADD CONSTRAINT "product_shop_fk" FOREIGN KEY ("shop_id") '
            'REFERENCES "shop" ("id") DEFERRABLE INITIALLY DEFERRED'
        ).statusmessage
        assert status == "ALTER TABLE"
        assert notices and notices[-1].startswith("WARNING foreign key not added")
        got = conn.execute(
            "insert into shop (name, attrs) values (%s, %s), (%s, %s) returning id",
            ("a", '{"n": 1}', "b", '{"n": [2, 3]}'),
        ).fetchall()
        assert got == [(1,), (2,)]
        conn.execute("insert into product (shop_id, title) values (1, 'x'), (2, 'y')")
        assert conn.execute("select min(id) from product").fetchone() == (100,)
        cur = conn.execute("select attrs from shop order by id")
        assert cur.description is not None and cur.description[0].type_code == 3802  # jsonb
        assert cur.fetchall() == [({"n": 1},), ({"n": [2, 3]},)]  # (psycopg reads jsonb)
        binary = conn.cursor(binary=True)
        assert binary.execute("select attrs from shop where id = 2").fetchone() == ({"n": [2, 3]},)
        # Django's annotate(Count): grouped by the key, other columns of its table selected
        rows = conn.execute(
            'SELECT "shop"."name", COUNT("product"."id") AS "n" FROM "shop" LEFT OUTER JOIN '
            '"product" ON ("shop"."id" = "product"."shop_id") GROUP BY "shop"."id" ORDER BY 1'
        ).fetchall()
        assert rows == [("a", 1), ("b", 1)]
        # psycopg's client-side binding of lists (Django's bulk_create)
        client = psycopg.ClientCursor(conn)
        client.execute(
            "insert into product (shop_id, title) select * from unnest(%s::bigint[], "
            "%s::varchar[])",
            ([1, 2, 1], ["it's", "a,b", 'q"uote']),
        )
        assert conn.execute("select title from product where id > 101 order by id").fetchall() == [
            ("it's",),
            ("a,b",),
            ('q"uote',),
        ]


def test_asyncpg_sends_and_reads_jsonb_in_binary(embedded: Embedded) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=embedded.port, user="app")
        try:
            await conn.execute("create table docs (id int, body jsonb)")
            await conn.execute("insert into docs values ($1, $2)", 1, '{"a": [1, 2]}')
            assert json.loads(await conn.fetchval("select body from docs")) == {"a": [1, 2]}
            assert json.loads(await conn.fetchval("select $1::jsonb", '{"b": 1}')) == {"b": 1}
        finally:
            await conn.close()

    asyncio.run(run())


def test_psycopg_parameters_types_and_errors(embedded: Embedded) -> None:
    with embedded.connect() as conn:
        assert conn.execute("select name from items where id = %s", (1,)).fetchone() == ("tea",)
        row = conn.execute(
            "select %s::int + 1, %s::text, price, added from items where id = 1", (41, "hi")
        ).fetchone()
        assert row is not None and row[:2] == (42, "hi") and str(row[2]) == "3.50"
        assert str(row[3]) == "2024-01-02"
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1 // 0")
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("select * from nope")
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("selec 1")
        conn.execute("insert into items (id, name) values (%s, %s)", (3, "pie"))
        assert conn.execute("select count(*) from items").fetchone() == (3,)
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0


def test_mpl_holds_inside_duckdb(embedded: Embedded) -> None:
    """Four clients, MPL 2: never more than two statements run in DuckDB at once."""
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, embedded.call(lambda: embedded.scheduler.in_service))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()

    def work() -> None:
        with embedded.connect() as conn:
            conn.execute("select count(*) from range(30000000) t(x) where x % 7 = 0").fetchone()

    workers = [threading.Thread(target=work) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    stop.set()
    watcher.join()
    assert peak == 2
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0


def test_transactions_savepoints_and_failed_state(embedded: Embedded) -> None:
    with embedded.connect(autocommit=False) as conn:
        with conn.transaction():
            conn.execute("insert into items (id, name) values (10, 'jam')")
            with conn.transaction():  # a SAVEPOINT, released
                conn.execute("insert into items (id, name) values (11, 'bun')")
        assert conn.execute("select count(*) from items").fetchone() == (4,)
        conn.commit()
        # Rolling back to a savepoint fails (0A000) and fails the transaction: psycopg logs
        # that, re-raises the application's error and rolls the whole transaction back.
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("delete from items")
            with conn.transaction():
                raise RuntimeError("roll back to the savepoint")
    with embedded.connect() as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="no savepoints"):
            conn.execute("begin; savepoint s; rollback to savepoint s")
        conn.execute("rollback")
        assert conn.execute("select count(*) from items").fetchone() == (4,)  # nothing lost
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("commit")  # as PostgreSQL: a warning, not an error
        conn.execute("begin")
        conn.execute("begin")
        conn.execute("rollback")
        assert notices == [
            "there is no transaction in progress",
            "there is already a transaction in progress",
        ]
        conn.execute("begin")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1 // 0")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("select 1")
        conn.execute("rollback")
        assert conn.execute("select 1").fetchone() == (1,)
        conn.execute("begin isolation level repeatable read")
        conn.execute("update items set name = 'chai' where id = 1")
        conn.execute("commit")
        assert conn.execute("select name from items where id = 1").fetchone() == ("chai",)


def test_what_drivers_send_on_connect(embedded: Embedded) -> None:
    with embedded.connect() as conn:
        assert conn.execute("show standard_conforming_strings").fetchone() == ("on",)
        assert conn.execute("show transaction isolation level").fetchone() == ("repeatable read",)
        conn.execute("set extra_float_digits = 3")
        assert conn.execute("show extra_float_digits").fetchone() == ("3",)
        version = conn.execute("select pg_catalog.version()").fetchone()
        assert version is not None and version[0].startswith("PostgreSQL 15.0 (admission, DuckDB")
        assert conn.execute("select current_schema()").fetchone() == ("public",)
        assert psycopg.types.TypeInfo.fetch(conn, "hstore") is None  # psycopg type discovery
        assert conn.execute("begin; savepoint a; release a; commit").rowcount in (-1, 0)
    engine = sa.create_engine(f"postgresql+psycopg://app@127.0.0.1:{embedded.port}/app")
    with engine.connect() as conn:  # the dialect's initialization runs first
        rows = conn.execute(sa.text("select id, name from items order by id")).all()
        assert [tuple(r) for r in rows] == [(1, "tea"), (2, "cake")]
    engine.dispose()
    out = subprocess.run(
        ["psql", f"host=127.0.0.1 port={embedded.port} user=app dbname=app", "-X", "-c", "\\dt"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "items" in out.stdout and "app" in out.stdout  # the owner column


TYPES = """
create table typed (
    b boolean, i2 smallint, i4 integer, i8 bigint, n decimal(12,3), f4 real, f8 double,
    t varchar, d date, tm time, ts timestamp, tz timestamptz, iv interval, bl blob, u uuid,
    a integer[], s varchar[]
)
"""
VALUES = (
    True,
    -7,
    2_000_000_000,
    9_007_199_254_740_993,
    Decimal("-1234.500"),
    0.5,
    1 / 3,
    "héllo, 'wörld'",
    datetime.date(2024, 2, 29),
    datetime.time(1, 2, 3, 250_000),
    datetime.datetime(1999, 12, 31, 23, 59, 59, 500_000),
    datetime.datetime(2020, 1, 2, 1, 4, 5, tzinfo=datetime.UTC),
    datetime.timedelta(days=3, hours=4, seconds=5),
    b"\x00\x01\xff",
    uuid.UUID("6f1e8c0e-5b1a-4b3e-9b1e-0e8c5b1a4b3e"),
    [1, None, 3],
    ["a", "b c", ""],
)
COLUMNS = "b, i2, i4, i8, n, f4, f8, t, d, tm, ts, tz, iv, bl, u, a, s"


def test_every_type_round_trips_through_psycopg_text_and_binary(embedded: Embedded) -> None:
    with embedded.connect() as conn:
        conn.execute(TYPES)
        placeholders = ", ".join(["%s"] * len(VALUES))
        conn.execute(f"insert into typed ({COLUMNS}) values ({placeholders})", VALUES)
        conn.execute(f"insert into typed ({COLUMNS}) values ({placeholders})", [None] * 17)
        for binary in (False, True):
            rows = conn.cursor(binary=binary).execute(f"select {COLUMNS} from typed").fetchall()
            assert rows[0] == VALUES, binary
            assert rows[1] == (None,) * 17


def test_every_type_round_trips_through_asyncpg(embedded: Embedded) -> None:
    async def run() -> tuple[object, ...]:
        conn = await asyncpg.connect(embedded.url)
        try:
            await conn.execute(TYPES)
            placeholders = ", ".join(f"${i + 1}" for i in range(len(VALUES)))
            await conn.execute(f"insert into typed ({COLUMNS}) values ({placeholders})", *VALUES)
            row = await conn.fetchrow(f"select {COLUMNS} from typed")
            assert row is not None
            by_param = await conn.fetchval("select count(*) from typed where i4 = $1", 2 * 10**9)
            assert by_param == 1
            return tuple(row)
        finally:
            await conn.close()

    assert asyncio.run(run()) == VALUES


def test_errors_carry_sqlstates(embedded: Embedded) -> None:
    cases = {
        "selec 1": "42601",
        "select * from nope": "42P01",
        "select nope from items": "42703",
        "select 1 // 0": "22012",
        "insert into items (id) values (1)": "23505",
    }
    with embedded.connect() as conn:
        for sql, sqlstate in cases.items():
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(sql)
            assert caught.value.sqlstate == sqlstate, sql

    async def run() -> None:
        conn = await asyncpg.connect(embedded.url)
        try:
            for sql, sqlstate in cases.items():
                with pytest.raises(asyncpg.PostgresError) as caught:
                    await conn.fetch(sql)
                assert caught.value.sqlstate == sqlstate, sql
            assert await conn.fetchval("select 40 + 2") == 42  # the session is still fine
        finally:
            await conn.close()

    asyncio.run(run())


def test_a_failed_commit_ends_the_transaction_as_in_postgresql(embedded: Embedded) -> None:
    # DuckDB checks a primary key at commit between two transactions: the second COMMIT fails
    # and DuckDB ends its transaction. The session must say so (idle, as PostgreSQL after a
    # failed COMMIT), not stay "in a failed transaction" that no ROLLBACK could leave.
    with embedded.connect() as a, embedded.connect() as b:
        a.execute("begin")
        b.execute("begin")
        a.execute("insert into items (id, name) values (20, 'one')")
        b.execute("insert into items (id, name) values (20, 'two')")
        a.execute("commit")
        with pytest.raises(psycopg.errors.UniqueViolation, match="duplicate key"):
            b.execute("commit")
        assert b.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert b.execute("select name from items where id = 20").fetchone() == ("one",)
        b.execute("begin")
        b.execute("insert into items (id, name) values (21, 'three')")
        b.execute("commit")
        assert b.execute("select count(*) from items where id >= 20").fetchone() == (2,)


def test_a_cancel_that_lands_on_begin_leaves_the_session_usable(embedded: Embedded) -> None:
    # A CancelRequest sent right behind a pipelined BEGIN interrupts it now and then after
    # DuckDB started (and aborted) its transaction: the client hears 57014 and has no
    # transaction, so DuckDB must have none either — else every statement after it failed
    # with 25P02 and the session's ROLLBACK, answered as "no transaction in progress", never
    # reached DuckDB (one case in five of these hung so).
    steps = (
        fuzz.query("begin"),
        fuzz.query("create temp table if not exists t (a int)"),
        fuzz.query("insert into t values (1)"),
        fuzz.query("commit"),
        fuzz.Cancel(),
    )
    ends = []
    for seed in range(30):
        case = fuzz.Case(seed, fuzz.startup_packet("app", "app"), steps, ())
        transcript = asyncio.run(
            fuzz.run_case("127.0.0.1", embedded.port, case, timeout=10, exact=False)
        )
        # answered: the sentinel after the cancel came back
        ends.append(f"{transcript.end}: {' '.join(transcript.replies)}")
    assert [e for e in ends if not e.startswith("answered")] == []


def test_cancel_interrupts_a_running_duckdb_query(embedded: Embedded) -> None:
    long = "select count(*) from range(10000000000) a(x) where x % 3 = 1"
    with embedded.connect() as conn, embedded.connect() as other:
        threading.Timer(0.5, conn.cancel_safe).start()
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(long)
        assert time.monotonic() - started < 10
        assert other.execute("select 1").fetchone() == (1,)  # I/O for others never stalled
        assert conn.execute("select 2").fetchone() == (2,)
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0


def test_profiler_measures_each_statement(embedded: Embedded) -> None:
    seen: list[Measurement] = []
    embedded.call(lambda: embedded.server.observers.append(seen.append))
    with embedded.connect() as conn:
        conn.execute("select sum(x * x) from range(20000000) t(x) group by x % 5").fetchall()
    measured = seen[-1]
    assert measured.class_name.startswith("select(range)")
    assert measured.cpu_time is not None and measured.cpu_time > 0
    assert 0.01 < measured.latency < 60
    assert measured.parallelism is not None and measured.parallelism > 0.5


def _raw(embedded: Embedded, data: bytes) -> bytes:
    """Send ``data`` on a connection of its own; everything the server says until it closes
    (end ``data`` with a Terminate unless the server is to close it)."""
    with socket.create_connection(("127.0.0.1", embedded.port), timeout=30) as sock:
        sock.sendall(data)
        reply = bytearray()
        while chunk := sock.recv(65536):
            reply += chunk
    return bytes(reply)


def _untyped(code: int, body: bytes = b"") -> bytes:
    return struct.pack("!II", len(body) + 8, code) + body


STARTUP = _untyped(pg.PROTOCOL_3_0, b"user\0app\0database\0app\0\0")
TERMINATE = pg.message(b"X")


def _query(sql: str) -> bytes:
    return pg.message(b"Q", sql.encode() + b"\0")


def _extended(sql: str) -> bytes:
    """Parse, Bind and Execute of ``sql`` (unnamed statement and portal), no Sync."""
    parse = pg.message(b"P", b"\0" + sql.encode() + b"\0" + b"\0\0")
    bind = pg.message(b"B", b"\0\0" + b"\0\0" * 3)
    return parse + bind + pg.message(b"E", b"\0" + b"\0\0\0\0")


def test_encryption_requests_are_declined_then_the_startup_proceeds(embedded: Embedded) -> None:
    ssl = _untyped(pg.SSL_REQUEST_CODE)
    gssenc = _untyped(pg.GSSENC_REQUEST_CODE)
    reply = _raw(embedded, gssenc + ssl + STARTUP + _query("select 41 + 1") + TERMINATE)
    assert reply.startswith(b"NNR\0\0\0\x08\0\0\0\0")  # two declines, AuthenticationOk
    assert b"D\0\0\0\x0c\0\x01\0\0\0\x0242" in reply and reply.endswith(b"Z\0\0\0\x05I")


@pytest.mark.parametrize(
    ("packet", "message"),
    [
        (_untyped(2 << 16, b"user\0app\0\0"), b"unsupported protocol version 2.0"),
        (_untyped(pg.CANCEL_REQUEST_CODE, b"\0\0\0\x01"), b"short CancelRequest"),
        (STARTUP + b"Q\0\0\0\x02", b"message 'Q' has invalid length 2"),
    ],
)
def test_malformed_packets_close_the_client_with_08p01(
    embedded: Embedded, packet: bytes, message: bytes
) -> None:
    reply = _raw(embedded, packet)
    error = reply[reply.rindex(b"E") :]
    assert b"SFATAL\0" in error and b"C08P01\0" in error and message in error


def test_a_cancel_request_for_an_unknown_key_is_closed_quietly(embedded: Embedded) -> None:
    assert _raw(embedded, _untyped(pg.CANCEL_REQUEST_CODE, struct.pack("!II", 1, 2))) == b""


def test_a_batch_gives_its_capacity_back_however_it_ends(embedded: Embedded) -> None:
    """A Query before the Sync of an executed batch joins that batch and ends it; one that
    comes while the server skips to a Sync after an error is answered and ends the failed batch.
    Either way the batch's job is released and nothing is left in service."""
    sync = pg.message(b"S")
    reply = _raw(
        embedded,
        STARTUP
        + _extended("select 1")
        + _query("select 5")
        + sync
        + _extended("select * from nope")
        + _query("select 6")
        + sync
        + TERMINATE,
    )
    assert reply.count(b"42P01") == 1  # the failed Execute
    assert b"\x015" in reply and b"\x016" in reply  # both Queries answered
    assert reply.count(b"Z\0\0\0\x05I") == 5  # startup, each Query, each Sync
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0


class Probe:
    """A DuckDB scalar function that counts the statements executing it at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.calls = 0

    def __call__(self, x: int) -> int:
        with self.lock:
            self.active += 1
            self.calls += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.03)
        with self.lock:
            self.active -= 1
        return x


def test_sixteen_clients_mpl_two_measured_inside_duckdb() -> None:
    probe = Probe()

    def setup(con: duckdb.DuckDBPyConnection) -> None:
        con.create_function("probe", probe, ["BIGINT"], "BIGINT", side_effects=True)

    server = Embedded(Limits(mpl=2), setup, workers=8)
    try:
        errors: list[BaseException] = []

        def client(n: int) -> None:
            try:
                with server.connect() as conn:
                    for i in range(3):
                        assert conn.execute("select probe(%s)", (n * 10 + i,)).fetchone() == (
                            n * 10 + i,
                        )
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert probe.calls == 48
        assert probe.peak == 2  # never more than the MPL inside DuckDB, and it was reached
        assert server.call(lambda: server.scheduler.in_service) == 0
    finally:
        server.close()


def _messages(reply: bytes) -> list[tuple[bytes, bytes]]:
    """The backend messages in ``reply`` after the startup's (type, body)."""
    out, pos = [], 0
    while pos + 5 <= len(reply):
        kind, length = reply[pos : pos + 1], struct.unpack("!i", reply[pos + 1 : pos + 5])[0]
        out.append((kind, reply[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out


def test_a_long_result_open_on_the_cursor_is_never_lost_to_another_statement(
    embedded: Embedded,
) -> None:
    # Portal "a" (120,000 rows: more than a chunk, so its stream stays open on the session's
    # DuckDB cursor) is described, then portal "b" runs and a row-limited portal "c" is read in
    # part, and only then is "a" executed: every statement gets all of its own rows.
    def portal(name: bytes, sql: str) -> bytes:
        parse = pg.message(b"P", name + b"\0" + sql.encode() + b"\0\0\0")
        return parse + pg.message(b"B", name + b"\0" + name + b"\0" + b"\0\0" * 3)

    def execute(name: bytes, limit: int = 0) -> bytes:
        return pg.message(b"E", name + b"\0" + struct.pack("!i", limit))

    big = "select range as n, 'row ' || range as s from range(120000)"
    data = (
        STARTUP
        + pg.message(b"Q", b"begin\0")
        + portal(b"a", big)
        + pg.message(b"D", b"Pa\0")
        + portal(b"b", "select 7 * 6")
        + execute(b"b")
        + portal(b"c", "select range from range(60000)")
        + execute(b"c", 10)
        + execute(b"a")
        + execute(b"c")
        + pg.message(b"S")
        + pg.message(b"Q", b"commit\0")
        + TERMINATE
    )
    messages = _messages(_raw(embedded, data))
    assert not [body for kind, body in messages if kind == b"E"]
    tags = [body.rstrip(b"\0").decode() for kind, body in messages if kind == b"C"]
    assert tags == ["BEGIN", "SELECT 1", "SELECT 120000", "SELECT 60000", "COMMIT"]
    assert [kind for kind, _ in messages].count(b"s") == 1  # c suspended after 10 rows
    rows = [body for kind, body in messages if kind == b"D"]
    assert len(rows) == 1 + 10 + 120_000 + 59_990
    assert rows[11].endswith(b"0\x00\x00\x00\x05row 0") and rows[-59_991].endswith(b"row 119999")


def test_a_client_that_leaves_mid_result_frees_its_session(embedded: Embedded) -> None:
    with socket.create_connection(("127.0.0.1", embedded.port), timeout=30) as sock:
        sock.sendall(STARTUP + _query("select range, range::varchar from range(3000000)"))
        sock.recv(65536)  # the first rows, then gone
    deadline = time.monotonic() + 30
    while embedded.call(lambda: embedded.scheduler.in_service) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert embedded.call(lambda: embedded.scheduler.in_service) == 0
    with embedded.connect() as conn:
        assert conn.execute("select count(*) from range(1000)").fetchone() == (1000,)
