"""TPC-H data: generate it with ``tpchgen-cli`` and load it into DuckDB or PostgreSQL.

Generation writes CSV files (with a header row) into a directory per scale factor and is
skipped when that directory is complete. Loading is idempotent: a small ``tpch_meta`` table
records the scale factor loaded, and a database that already holds it is left alone. DuckDB
loads a table from CSV the first time and keeps a Parquet copy beside it, which later loads
read instead (SF 1: the whole load in 9 s rather than 21 s, most of it lineitem's primary key;
the copies are written once, in a few seconds).
``progress`` receives one line per step, for the CLI's progress display.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from workloads.tpch.schema import TABLES, create_statements

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def default_cache() -> Path:
    base = os.environ.get("ADMISSION_DATA") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "admission" if base else Path.home() / ".cache" / "admission"


def _tpchgen() -> str:
    beside = Path(sys.executable).with_name("tpchgen-cli")
    found = str(beside) if beside.exists() else shutil.which("tpchgen-cli")
    if not found:
        raise RuntimeError("tpchgen-cli is not installed (pip install tpchgen-cli)")
    return found


def generate(scale_factor: float, cache: Path | None = None, progress: Progress = _quiet) -> Path:
    """CSV files of every table at ``scale_factor``; generated once, then reused."""
    if scale_factor <= 0:
        raise ValueError(f"the scale factor must be positive, not {scale_factor}")
    target = (cache or default_cache()) / f"tpch-sf{scale_factor:g}"
    if all((target / f"{t}.csv").exists() for t in TABLES) and (target / ".complete").exists():
        progress(f"TPC-H SF {scale_factor:g}: using {target}")
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    progress(f"TPC-H SF {scale_factor:g}: generating with tpchgen-cli into {target}")
    subprocess.run(
        [_tpchgen(), "csv", "-s", f"{scale_factor:g}", f"--output-dir={partial}"],
        check=True,
        capture_output=True,
    )
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def load_duckdb(con: Any, data: Path, scale_factor: float, progress: Progress = _quiet) -> None:
    """Create and fill the tables in a DuckDB connection (in memory or a file)."""
    if _loaded_duckdb(con, scale_factor):
        progress("TPC-H already loaded")
        return
    for name in TABLES:
        con.execute(f"drop table if exists {name}")
    for ddl in create_statements():
        con.execute(ddl)
    for name in TABLES:
        columns = _duck_columns(con, name)
        # named by the table's columns and types: a copy of another schema is never read
        digest = hashlib.sha256(columns.encode()).hexdigest()[:12]
        parquet = data / f"{name}.{digest}.parquet"
        csv = data / f"{name}.csv"
        # (a copy older than its CSV is of other data: someone replaced the CSV)
        if parquet.exists() and parquet.stat().st_mtime >= csv.stat().st_mtime:
            progress(f"loading {name}")
            try:
                con.execute(
                    f"insert into {name} by name select * from read_parquet({_sql(parquet)})"
                )
                continue
            except (duckdb.InvalidInputException, duckdb.IOException) as e:
                # a damaged copy (not a Parquet file, cut short): the CSV is the source
                progress(f"{parquet.name} is unreadable ({e}); loading {name} from CSV")
                con.execute(f"delete from {name}")
        else:
            progress(f"loading {name} (from CSV; a Parquet copy is kept for the next load)")
        con.execute(
            f"insert into {name} select * from read_csv({_sql(csv)}, "
            f"header = true, columns = {columns})"
        )
        _keep_parquet(con, name, parquet, progress)
    con.execute("create or replace table tpch_meta (scale_factor double)")
    con.execute("insert into tpch_meta values (?)", [scale_factor])


def _sql(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _keep_parquet(con: Any, table: str, parquet: Path, progress: Progress) -> None:
    """Write ``table`` as ``parquet`` for the next load: under a name of this process's, then
    renamed, so that a reader sees the whole file or none. A cache that cannot be written
    (read-only, full) only means the next load reads the CSV again."""
    partial = parquet.with_name(f"{parquet.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        con.execute(f"copy {table} to {_sql(partial)} (format parquet)")
        os.replace(partial, parquet)
    except (duckdb.Error, OSError) as e:
        progress(f"could not keep a Parquet copy of {table} ({e}); the next load reads the CSV")
        partial.unlink(missing_ok=True)
        return
    # copies of another schema, and partial ones an hour old (a load killed while writing)
    for other in parquet.parent.glob(f"{table}.*parquet*"):
        try:
            if other != parquet and (
                other.suffix == ".parquet" or other.stat().st_mtime < time.time() - 3600
            ):
                other.unlink()
        except OSError:
            pass


def _duck_columns(con: Any, table: str) -> str:
    rows = con.execute(
        f"select column_name, data_type from information_schema.columns "
        f"where table_name = '{table}' order by ordinal_position"
    ).fetchall()
    return "{" + ", ".join(f"'{c}': '{t}'" for c, t in rows) + "}"


def load_postgres(conn: Any, data: Path, scale_factor: float, progress: Progress = _quiet) -> None:
    """Create and fill the tables through a psycopg connection, with keys and ANALYZE."""
    loaded = _loaded_postgres(conn, scale_factor)
    conn.commit()  # end the check's transaction (a no-op in autocommit mode)
    if loaded:
        progress("TPC-H already loaded")
        return
    with conn.transaction():
        for name in TABLES:
            conn.execute(f"drop table if exists {name} cascade")
        for ddl in create_statements():
            conn.execute(ddl)
        for name in TABLES:
            progress(f"loading {name}")
            with (
                (data / f"{name}.csv").open("rb") as source,
                conn.cursor().copy(
                    f"copy {name} from stdin with (format csv, header true)"
                ) as copy,
            ):
                while chunk := source.read(1 << 20):
                    copy.write(chunk)
        conn.execute("drop table if exists tpch_meta")
        conn.execute("create table tpch_meta (scale_factor double precision)")
        conn.execute("insert into tpch_meta values (%s)", [scale_factor])
    # VACUUM ANALYZE, not just ANALYZE: it also sets the visibility map, so autovacuum has no
    # freshly inserted tables to process later, in the middle of someone's measurements.
    progress("VACUUM ANALYZE")
    conn.commit()
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        conn.execute("vacuum analyze")
    finally:
        conn.autocommit = autocommit


def _loaded_duckdb(con: Any, scale_factor: float) -> bool:
    exists = con.execute(
        "select count(*) from information_schema.tables where table_name = 'tpch_meta'"
    ).fetchone()[0]
    if not exists:
        return False
    row = con.execute("select scale_factor from tpch_meta").fetchone()
    return row is not None and float(row[0]) == scale_factor


def _loaded_postgres(conn: Any, scale_factor: float) -> bool:
    if conn.execute("select to_regclass('tpch_meta')").fetchone()[0] is None:
        return False
    row = conn.execute("select scale_factor from tpch_meta").fetchone()
    return row is not None and float(row[0]) == scale_factor
