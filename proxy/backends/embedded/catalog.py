"""PostgreSQL's system catalogs over DuckDB's, for the tools that introspect them.

psql's ``\\d`` family, SQLAlchemy's reflection, pandas' ``read_sql_table`` and GUI tools ask
PostgreSQL's catalogs what a database holds. DuckDB ships a ``pg_catalog`` of its own, enough
for ``\\dt`` but not for the rest: its ``pg_index`` has no key columns, primary keys and unique
constraints have no index, ``pg_constraint`` counts columns from 0, its functions are all in a
user schema, and the catalogs tools read beside (``pg_roles``, ``pg_policy``, ``pg_inherits``,
``pg_opclass``, …) do not exist. Two parts here:

- ``install``: the catalogs and functions that are missing or incomplete, as views and
  macros in an in-memory database of their own (``admission_pg``, attached once when the
  server starts: nothing is written into the user's database, and no session pays to make
  them), built on DuckDB's own (``duckdb_tables()``, ``duckdb_constraints()``,
  ``duckdb_indexes()``…), so they are what the tables are at the moment they are read.
- ``translate``: a statement that reads the catalogs, parsed by PostgreSQL's own parser
  (pglast) and written back as DuckDB takes it — references to the catalogs made here
  pointed at them, other ``pg_catalog.`` qualifiers dropped (DuckDB finds its own), ``COLLATE
  pg_catalog.default`` and ``OPERATOR(pg_catalog.~)`` made plain, ``::regclass`` and the
  other ``reg*`` types turned into oids (a name is looked up), PostgreSQL-only type names
  replaced. Statements that do not mention the catalogs are not touched (one regular
  expression decides), and translations are cached.

Names follow PostgreSQL: a primary key is ``TABLE_pkey`` and has an index of that name, a
unique constraint ``TABLE_COLUMNS_key``, a foreign key ``TABLE_COLUMNS_fkey``; attribute
numbers count from 1. Unqualified names go to PostgreSQL's schema ``public``
(``executor.default_schema``); DuckDB's ``main``, empty then, is not listed in ``pg_namespace``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind, BoolExprType
from pglast.stream import RawStream
from pglast.visitors import Visitor

from proxy.backends.embedded import compat
from proxy.backends.pgtypes import ARRAY_ELEMENT, SCALAR_NAMES, pg_type

ARRAY_ELEMENT_OF = {element: array for array, element in ARRAY_ELEMENT.items()}

__all__ = ["DATABASE", "install", "session_setup", "translate"]

DATABASE = "admission_pg"  # an in-memory database of DuckDB's beside the user's
S = f"{DATABASE}.main"  # where this module's catalogs and functions are
assert compat.VERSION_CALL.startswith(S + ".")
# the session's user: ``session_setup`` sets the variable on each session's connection
_USER = "coalesce(getvariable('admission_user'), 'duckdb')"
# the schemas of this module's database are no user's
_OWN_SCHEMAS = f"(select oid from duckdb_schemas() where database_name = '{DATABASE}')"
# oids of objects made up here: an index behind a key constraint; the session's role
_INDEX_OFFSET = 500000  # index oid = table oid * 1,000,000 + this + the constraint's number
ROLE_OID = 10

_CONSTRAINTS = f"""
create or replace view {S}.admission_constraints as
select
  d.table_oid * 1000000 + d.constraint_index as oid,
  case d.constraint_type
    when 'PRIMARY KEY' then d.table_name || '_pkey'
    when 'UNIQUE' then d.table_name || '_' || array_to_string(d.constraint_column_names, '_')
                       || '_key'
    when 'FOREIGN KEY' then d.table_name || '_'
                            || array_to_string(d.constraint_column_names, '_') || '_fkey'
    else d.table_name || coalesce('_' || d.constraint_column_names[1], '') || '_check'
  end as conname,
  d.schema_oid as connamespace,
  case d.constraint_type when 'PRIMARY KEY' then 'p' when 'UNIQUE' then 'u'
    when 'FOREIGN KEY' then 'f' else 'c' end as contype,
  d.table_oid as conrelid,
  case when d.constraint_type in ('PRIMARY KEY', 'UNIQUE')
    then d.table_oid * 1000000 + {_INDEX_OFFSET} + d.constraint_index
  -- a foreign key's index is the referenced table's key it points at
  when d.constraint_type = 'FOREIGN KEY' then coalesce(
    (select x.oid from {S}.admission_indexes x
     join duckdb_tables() t on t.table_oid = x.indrelid
     where t.table_name = d.referenced_table and t.schema_oid = d.schema_oid
       and x.elements = d.referenced_column_names and x.indisunique
     limit 1), 0)
  else 0 end as conindid,
  coalesce((select t.table_oid from duckdb_tables() t
            where t.table_name = d.referenced_table and t.schema_oid = d.schema_oid
            limit 1), 0) as confrelid,
  list_transform(d.constraint_column_indexes, lambda i: (i + 1)::smallint) as conkey,
  case when d.constraint_type = 'FOREIGN KEY' then
    (select list(c.column_index::smallint
                 order by list_position(d.referenced_column_names, c.column_name))
     from duckdb_columns() c
     where c.table_name = d.referenced_table and c.schema_oid = d.schema_oid
       and list_contains(d.referenced_column_names, c.column_name))
  end as confkey,
  case d.constraint_type
    when 'PRIMARY KEY' then 'PRIMARY KEY (' || array_to_string(d.constraint_column_names, ', ')
                            || ')'
    when 'UNIQUE' then 'UNIQUE (' || array_to_string(d.constraint_column_names, ', ') || ')'
    when 'FOREIGN KEY' then 'FOREIGN KEY (' || array_to_string(d.constraint_column_names, ', ')
                            || ') REFERENCES ' || d.referenced_table || '('
                            || array_to_string(d.referenced_column_names, ', ') || ')'
    else 'CHECK ' || case when d.expression like '(%' then d.expression
                          else '(' || coalesce(d.expression, 'true') || ')' end
  end as condef,
  d.constraint_column_names as columns,
  d.table_name, d.schema_name, d.expression
from duckdb_constraints() d
where d.constraint_type in ('PRIMARY KEY', 'UNIQUE', 'FOREIGN KEY', 'CHECK')
"""

# every index, PostgreSQL's way: the one behind each primary key and unique constraint, and
# DuckDB's own (CREATE INDEX), whose expressions are column names or, else, expressions
_INDEXES = f"""
create or replace view {S}.admission_indexes as
select
  c.table_oid * 1000000 + {_INDEX_OFFSET} + c.constraint_index as oid,
  c.table_oid as indrelid,
  (case c.constraint_type when 'PRIMARY KEY' then c.table_name || '_pkey'
     else c.table_name || '_' || array_to_string(c.constraint_column_names, '_') || '_key'
   end) as relname,
  c.schema_oid as relnamespace, c.schema_name, c.table_name,
  true as indisunique, c.constraint_type = 'PRIMARY KEY' as indisprimary,
  list_transform(c.constraint_column_indexes, lambda i: (i + 1)::smallint) as indkey,
  c.constraint_column_names as elements,
  c.table_oid * 1000000 + c.constraint_index as constraint_oid
from duckdb_constraints() c
where c.constraint_type in ('PRIMARY KEY', 'UNIQUE')
union all
select
  i.index_oid, i.table_oid, i.index_name, i.schema_oid, i.schema_name, i.table_name,
  i.is_unique, i.is_primary,
  (select list(coalesce(col.column_index, 0)::smallint order by e.pos)
   from (select unnest(x.elements) as name, generate_subscripts(x.elements, 1) as pos) e
   left join duckdb_columns() col
     on col.table_oid = i.table_oid and col.column_name = e.name),
  x.elements,
  null
from duckdb_indexes() i,
  -- (DuckDB writes the list as text; a quoted column's name is quoted in it)
  lateral (select list_transform(cast(i.expressions as varchar[]), lambda e:
    case when regexp_full_match(e, '"(?:[^"]|"")*"')
      then replace(e[2:length(e) - 1], '""', '"') else e end) as elements) x
"""

# an index's definition, as pg_get_indexdef and pg_indexes give it
_INDEX_DEF = (
    "'CREATE ' || case when indisunique then 'UNIQUE ' else '' end || 'INDEX ' || relname "
    "|| ' ON ' || schema_name || '.' || table_name || ' USING btree (' "
    "|| array_to_string(elements, ', ') || ')'"
)
# every index (DuckDB's pg_indexes has those of CREATE INDEX only: peewee's index query joins
# it and lost the primary key's and unique constraints')
_PG_INDEXES = f"""
create or replace view {S}.pg_indexes as
select schema_name as schemaname, table_name as tablename, relname as indexname,
  cast(null as varchar) as tablespace, {_INDEX_DEF} as indexdef
from {S}.admission_indexes
"""

# the catalogs made here (a statement's reference to one, bare or in pg_catalog, is to ours)
_VIEWS = frozenset(
    {
        "pg_type",
        "pg_class",
        "pg_indexes",
        "pg_namespace",
        "pg_attribute",
        "pg_am",
        "pg_collation",
        "pg_index",
        "pg_constraint",
        "pg_proc",
        "pg_database",
        "pg_roles",
        "pg_user",
        "pg_auth_members",
        "pg_policy",
        "pg_statistic_ext",
        "pg_publication",
        "pg_publication_namespace",
        "pg_publication_rel",
        "pg_inherits",
        "pg_trigger",
        "pg_opclass",
        "pg_rewrite",
        "pg_foreign_table",
        "pg_partitioned_table",
        "pg_extension",
        "pg_matviews",
        "pg_settings",
        "pg_stat_user_tables",
        "pg_tables",
        "pg_views",
        "pg_cast",
        "pg_conversion",
        "pg_operator",
        "pg_opfamily",
        "pg_event_trigger",
        "pg_ts_config",
        "pg_ts_parser",
        "pg_db_role_setting",
        "pg_language",
        "pg_foreign_server",
        "pg_foreign_data_wrapper",
        "pg_user_mappings",
        "pg_largeobject_metadata",
        "pg_range",
        "pg_policies",
        "pg_statio_all_tables",
    }
)
# The database a client connected to (its startup's dbname) is what it reads as PostgreSQL's
# current_database() and the catalogs' database names — tools filter by it (Sequelize's foreign
# key query: table_catalog = 'its database'); DuckDB's own database is "memory" or the file's
CLIENT_DATABASE = "coalesce(getvariable('admission_database'), current_database())"


def _as_client(column: str) -> str:
    return f"case when {column} = current_database() then {CLIENT_DATABASE} else {column} end"


# information_schema's views whose database names (*_catalog columns) are the client's
_CATALOG_COLUMNS = {
    "tables": ("table_catalog",),
    "schemata": ("catalog_name",),
    "table_constraints": ("constraint_catalog", "table_catalog"),
    "key_column_usage": ("constraint_catalog", "table_catalog"),
    "referential_constraints": ("constraint_catalog", "unique_constraint_catalog"),
    "views": ("table_catalog",),
    "check_constraints": ("constraint_catalog",),
    "constraint_table_usage": ("table_catalog", "constraint_catalog"),
}
# information_schema views made here (information_schema.columns: information_schema_columns)
_INFORMATION_SCHEMA = frozenset({"columns", "constraint_column_usage", *_CATALOG_COLUMNS})
# … and the functions
_FUNCTIONS = frozenset(
    {
        "regclass_oid",
        "btrim",
        "quote_ident",
        "format",
        "vector",
        "_pg_expandarray",
        "pg_stat_get_numscans",
        "pg_stat_get_tuples_returned",
        "pg_stat_get_tuples_fetched",
        "regclass_name",
        "pg_partition_ancestors",
        "pg_get_constraintdef",
        "pg_get_indexdef",
        "format_type",
        "pg_get_expr",
        "pg_get_function_result",
        "pg_get_function_arguments",
        "pg_get_function_identity_arguments",
        "pg_get_statisticsobjdef_columns",
        "pg_relation_is_publishable",
        "pg_get_serial_sequence",
        "pg_get_partkeydef",
        "pg_tablespace_location",
        "pg_char_to_encoding",
        "pg_statistics_obj_is_visible",
        "pg_get_viewdef",
        "pg_get_triggerdef",
        "shobj_description",
        "pg_table_size",
        "pg_relation_size",
        "pg_total_relation_size",
        "pg_database_size",
        "array_upper",
        "array_lower",
        "json_build_object",
        "current_setting",
    }
)

_CLASS = f"""
create or replace view {S}.pg_class as
select c.* replace (
    {ROLE_OID}::bigint as relowner,
    case c.relkind when 'r' then 2 when 'i' then 403 else 0 end::bigint as relam,
    (c.relhasindex or exists (select 1 from {S}.admission_indexes x where x.indrelid = c.oid))
      as relhasindex,
    case when c.relkind in ('r', 'm') then 'd' else 'n' end as relreplident,
    -- PostgreSQL keeps foreign keys by triggers on both tables (psql asks only then)
    exists (select 1 from {S}.admission_constraints k
            where k.contype = 'f' and c.oid in (k.conrelid, k.confrelid)) as relhastriggers,
    cast(null as varchar[]) as relacl,
    cast(null as varchar[]) as reloptions
  ),
  false as relforcerowsecurity
from pg_catalog.pg_class c
where c.relnamespace not in {_OWN_SCHEMAS}
union all by name
select x.oid, x.relname, x.relnamespace, 0 as reltype, 0 as reloftype, {ROLE_OID} as relowner,
  403 as relam, 0 as relfilenode, 0 as reltablespace, 0 as relpages, 0::float as reltuples,
  0 as relallvisible, 0 as reltoastrelid, 0 as reltoastidxid, false as relhasindex,
  false as relisshared, 'p' as relpersistence, 'i' as relkind, len(x.indkey) as relnatts,
  0 as relchecks, false as relhasoids, false as relhaspkey, false as relhasrules,
  false as relhastriggers, false as relhassubclass, false as relrowsecurity,
  true as relispopulated, 'n' as relreplident, false as relispartition, 0 as relrewrite,
  0 as relfrozenxid, null as relminmxid, cast(null as varchar[]) as relacl,
  cast(null as varchar[]) as reloptions, null as relpartbound, false as relforcerowsecurity
from {S}.admission_indexes x
where x.constraint_oid is not null
"""

_INDEX = """
create or replace view {S}.pg_index as
select x.oid as indexrelid, x.indrelid, len(x.indkey)::smallint as indnatts,
  len(x.indkey)::smallint as indnkeyatts, x.indisunique, false as indnullsnotdistinct,
  x.indisprimary, false as indisexclusion, true as indimmediate, false as indisclustered,
  true as indisvalid, false as indcheckxmin, true as indisready, true as indislive,
  false as indisreplident, array_to_string(x.indkey, ' ') as indkey,
  array_to_string(list_transform(x.indkey, lambda k: 0), ' ') as indcollation,
  array_to_string(list_transform(x.indkey, lambda k: 0), ' ') as indclass,
  array_to_string(list_transform(x.indkey, lambda k: 0), ' ') as indoption,
  cast(null as varchar) as indexprs, cast(null as varchar) as indpred
from {S}.admission_indexes x
"""

_CONSTRAINT = """
create or replace view {S}.pg_constraint as
select c.oid, c.conname, c.connamespace, c.contype, false as condeferrable,
  false as condeferred, true as convalidated, c.conrelid, 0::bigint as contypid, c.conindid,
  0::bigint as conparentid, c.confrelid,
  case when c.contype = 'f' then 'a' else ' ' end as confupdtype,
  case when c.contype = 'f' then 'a' else ' ' end as confdeltype,
  case when c.contype = 'f' then 's' else ' ' end as confmatchtype,
  true as conislocal, 0 as coninhcount, false as connoinherit, c.conkey, c.confkey,
  cast(null as bigint[]) as conpfeqop, cast(null as bigint[]) as conppeqop,
  cast(null as bigint[]) as conffeqop, cast(null as smallint[]) as confdelsetcols,
  cast(null as bigint[]) as conexclop, c.expression as conbin,
  2606::bigint as tableoid  -- PostgreSQL's oid of pg_constraint (a system column there)
from {S}.admission_constraints c
"""

# DuckDB's built-in functions (and this module's) are PostgreSQL's pg_catalog functions:
# \\df lists the user's
_PROC = f"""
create or replace view {S}.pg_proc as
select p.* replace (
  case when f.internal or p.pronamespace in {_OWN_SCHEMAS}
    then (select n.oid from pg_catalog.pg_namespace n where n.nspname = 'pg_catalog' limit 1)
    else p.pronamespace end as pronamespace)
from pg_catalog.pg_proc p
left join (select distinct function_oid, internal from duckdb_functions()) f
  on f.function_oid = p.oid
"""

# the PostgreSQL type of each DuckDB type a column can have, as its results are described
# (VARCHAR is text, JSON jsonb, a list the array of its element; DECIMAL keeps DuckDB's numeric)
_COLUMN_TYPES = ", ".join(
    f"('{name}', {pg_type(name).oid})"
    for scalar in SCALAR_NAMES
    for name in (scalar, scalar + "[]")
)
# PostgreSQL's storage and statistics settings per column, as a table's columns there have them;
# atttypid the type its values travel as (DuckDB's: varchar for text, an OID of its own for a
# list, which pg_type has not — JDBC's getColumns joins the two and lost the column)
_ATTRIBUTE = f"""
create or replace view {{S}}.pg_attribute as
with types(duckdb_type, oid) as (values {_COLUMN_TYPES})
select a.* replace (
    -1 as attstattarget,
    case when a.atttypid in (16, 20, 21, 23, 700, 701, 1082, 1083, 1114, 1184, 1186, 2950)
      then 'p' else 'x' end as attstorage,
    coalesce(
      t.oid,
      case when d.data_type like 'DECIMAL(%)[]' then 1231 end,
      a.atttypid) as atttypid,
    -- (the embedded server's DECIMAL for numeric without a precision: compat)
    case when d.data_type = '{compat.UNBOUNDED_NUMERIC}' then -1 else a.atttypmod end
      as atttypmod,
    '' as attcompression)
from pg_catalog.pg_attribute a
left join duckdb_columns() d on d.table_oid = a.attrelid and d.column_index = a.attnum
left join types t on t.duckdb_type = d.data_type
"""

_AM = """
create or replace view {S}.pg_am as
select * from (values (2::bigint, 'heap', cast(null as varchar), 't'),
                      (403::bigint, 'btree', cast(null as varchar), 'i'))
  t(oid, amname, amhandler, amtype)
"""

# pg_settings with PostgreSQL's settings DuckDB has not (a JDBC driver reads max_index_keys)
_SETTINGS_VIEW = """
create or replace view {S}.pg_settings as
select name, setting, short_desc, vartype from pg_catalog.pg_settings
where name not in (select name from {S}.admission_settings)
union all
select name, setting, '' as short_desc, 'string' as vartype from {S}.admission_settings
"""

# the tables and views of the user's databases (not this module's), owned by the session's user
_TABLES = f"""
create or replace view {S}.pg_tables as
select schema_name as schemaname, table_name as tablename, {_USER} as tableowner,
  cast(null as varchar) as tablespace,
  (index_count > 0 or has_primary_key) as hasindexes, false as hasrules,
  false as hastriggers, false as rowsecurity
from duckdb_tables() where database_name <> '{DATABASE}'
"""

# pg_type with PostgreSQL's array types (_int4, _text, …: DuckDB's has none) and each base
# type's typarray: drivers learn from them which parameters to send as arrays (postgres.js
# reads typelem of typcategory 'A' on connect, and sends [1, 2] as "1,2" without)
_ARRAYS = ", ".join(f"({element}, {array})" for element, array in ARRAY_ELEMENT_OF.items())
_TYPE = f"""
create or replace view {S}.pg_type as
select t.* replace (
  -- DuckDB's built-in types are in a schema pg_namespace has not: pg_catalog's, as there
  -- (JDBC's getTypeInfo joins the two), and no type is a table's row type
  case when t.typnamespace in (select oid from {S}.pg_namespace) then t.typnamespace
    else (select n.oid from {S}.pg_namespace n where n.nspname = 'pg_catalog') end
    as typnamespace,
  coalesce(t.typrelid, 0) as typrelid)
from (
with arrays(element, array_oid) as (values {_ARRAYS}),
-- DuckDB's, and text (the type result columns of VARCHAR are described as), which it has not
base as (
  select * from pg_catalog.pg_type
  union all by name
  select t.* replace (25 as oid, 'text' as typname)
  from pg_catalog.pg_type t
  where t.oid = 1043 and not exists (select 1 from pg_catalog.pg_type where oid = 25)
  union all by name  -- and json and jsonb (a JSON column's values travel as jsonb)
  select t.* replace (j.oid as oid, j.typname as typname, 'U' as typcategory)
  from pg_catalog.pg_type t, (values (114, 'json'), (3802, 'jsonb')) j(oid, typname)
  where t.oid = 1043 and not exists (select 1 from pg_catalog.pg_type where oid = j.oid)
)
select t.* replace (coalesce(t.typarray, a.array_oid) as typarray, ',' as typdelim)
from base t left join arrays a on a.element = t.oid
union all by name
select t.* replace (
    a.array_oid as oid, '_' || t.typname as typname, -1 as typlen, 'b' as typtype,
    'A' as typcategory, t.oid as typelem, 0 as typarray, ',' as typdelim)
from base t join arrays a on a.element = t.oid
) t
"""

_VIEWS_VIEW = f"""
create or replace view {S}.pg_views as
select schema_name as schemaname, view_name as viewname, {_USER} as viewowner,
  sql as definition
from duckdb_views() where database_name <> '{DATABASE}' and not internal
"""

# what the statistics views say of a table: DuckDB's estimate of its rows, nothing scanned
_STAT_TABLES = """
create or replace view {S}.pg_stat_user_tables as
select t.table_oid as relid, t.schema_name as schemaname, t.table_name as relname,
  0::bigint as seq_scan, 0::bigint as seq_tup_read, 0::bigint as idx_scan,
  0::bigint as idx_tup_fetch, 0::bigint as n_tup_ins, 0::bigint as n_tup_upd,
  0::bigint as n_tup_del, 0::bigint as n_tup_hot_upd,
  coalesce(t.estimated_size, 0)::bigint as n_live_tup, 0::bigint as n_dead_tup,
  cast(null as timestamp) as last_vacuum, cast(null as timestamp) as last_autovacuum,
  cast(null as timestamp) as last_analyze, cast(null as timestamp) as last_autoanalyze
from duckdb_tables() t
where t.database_name <> '{DATABASE}' and not t.internal
"""

# information_schema.columns with the udt_name PostgreSQL gives (tools map types by it)
_COLUMNS = f"""
create or replace view {S}.information_schema_columns as
select c.* replace (
    case when c.data_type = 'JSON' then 'jsonb' else coalesce(
      (select case t.typname when 'varchar' then 'text' else t.typname end
       from pg_catalog.pg_type t
       join duckdb_columns() d on t.oid = coalesce(map_type_id_to_pg_oid(d.data_type_id), -1)
       where d.database_name = c.table_catalog and d.schema_name = c.table_schema
         and d.table_name = c.table_name and d.column_name = c.column_name
       limit 1),
      lower(c.data_type)) end as udt_name,
    'pg_catalog' as udt_schema,
    {_as_client("c.table_catalog")} as table_catalog,
    -- PostgreSQL's words for the type (ORMs compare their models' columns by them)
    case
      when c.data_type like '%[]' then 'ARRAY'
      when c.data_type like 'DECIMAL(%' then 'numeric'
      else case c.data_type
      when 'INTEGER' then 'integer'
      when 'BIGINT' then 'bigint'
      when 'SMALLINT' then 'smallint'
      when 'TINYINT' then 'smallint'
      when 'HUGEINT' then 'numeric'
      when 'VARCHAR' then 'text'
      when 'BOOLEAN' then 'boolean'
      when 'DOUBLE' then 'double precision'
      when 'FLOAT' then 'real'
      when 'DATE' then 'date'
      when 'TIME' then 'time without time zone'
      when 'TIMESTAMP' then 'timestamp without time zone'
      when 'TIMESTAMP WITH TIME ZONE' then 'timestamp with time zone'
      when 'TIME WITH TIME ZONE' then 'time with time zone'
      when 'INTERVAL' then 'interval'
      when 'UUID' then 'uuid'
      when 'BLOB' then 'bytea'
      when 'JSON' then 'jsonb'
      else lower(c.data_type) end
    end as data_type)
from information_schema.columns c
where c.table_catalog <> '{DATABASE}'
"""

# information_schema.constraint_column_usage with PostgreSQL's seven columns (DuckDB's two more,
# constraint_type and constraint_text, make the usual join with table_constraints ambiguous:
# Sequelize's and drizzle-kit's foreign key queries) and PostgreSQL's rows: a foreign key uses
# the columns it references (DuckDB lists its own)
_CONSTRAINT_COLUMN_USAGE = f"""
create or replace view {S}.information_schema_constraint_column_usage as
select {_as_client("database_name")} as table_catalog, schema_name as table_schema,
  case when constraint_type = 'FOREIGN KEY' then referenced_table else table_name end
    as table_name,
  column_name, {_as_client("database_name")} as constraint_catalog,
  schema_name as constraint_schema, constraint_name
from (
  select dc.*, unnest(case when dc.constraint_type = 'FOREIGN KEY'
                      then dc.referenced_column_names else dc.constraint_column_names end)
    as column_name
  from duckdb_constraints() dc
  where dc.constraint_type <> 'NOT NULL' and dc.database_name <> '{DATABASE}'
)
"""

_DATABASE = f"""
create or replace view {S}.pg_database as
select d.database_oid as oid, {_as_client("d.database_name")} as datname,
  {ROLE_OID}::bigint as datdba,
  6 as encoding, 'c' as datlocprovider, false as datistemplate, true as datallowconn,
  -1 as datconnlimit, 0::bigint as datfrozenxid, 0::bigint as datminmxid,
  0::bigint as dattablespace, 'C' as datcollate, 'C' as datctype,
  cast(null as varchar) as daticulocale, cast(null as varchar) as datcollversion,
  cast(null as varchar[]) as datacl
from duckdb_databases() d
where not d.internal and d.database_name <> '{DATABASE}'
"""


_ROLES = f"""
create or replace view {S}.pg_roles as
select {ROLE_OID}::bigint as oid, {_USER} as rolname, true as rolsuper, true as rolinherit,
  true as rolcreaterole, true as rolcreatedb, true as rolcanlogin, false as rolreplication,
  -1 as rolconnlimit, '********' as rolpassword, cast(null as timestamp) as rolvaliduntil,
  false as rolbypassrls, cast(null as varchar[]) as rolconfig
"""

_USERS = f"""
create or replace view {S}.pg_user as
select {_USER} as usename, {ROLE_OID}::bigint as usesysid, true as usecreatedb,
  true as usesuper, false as userepl, false as usebypassrls, '********' as passwd,
  cast(null as timestamp) as valuntil, cast(null as varchar[]) as useconfig
"""


# the schemas of the session's database, and the system's pg_catalog and information_schema
# (as PostgreSQL lists them: tools filter them out by name)
_NAMESPACE = f"""
create or replace view {S}.pg_namespace as
select oid, schema_name as nspname, {ROLE_OID}::bigint as nspowner,
  cast(null as varchar[]) as nspacl
from duckdb_schemas()
where (database_name = current_database() and not (
        -- DuckDB's main, empty beside PostgreSQL's public: a schema PostgreSQL has not
        schema_name = 'main'
        and exists (select 1 from duckdb_schemas() p
                    where p.database_name = current_database() and p.schema_name = 'public')
        and not exists (select 1 from duckdb_tables() t
                        where t.database_name = current_database() and t.schema_name = 'main')
        and not exists (select 1 from duckdb_views() v
                        where v.database_name = current_database() and v.schema_name = 'main'
                          and not v.internal)))
   or (database_name = 'system' and schema_name in ('pg_catalog', 'information_schema'))
"""


# catalogs of what DuckDB has none of: their columns, no rows
_EMPTY: dict[str, str] = {
    "pg_auth_members": "roleid bigint, member bigint, grantor bigint, admin_option boolean",
    "pg_policy": "oid bigint, polname varchar, polrelid bigint, polcmd varchar, "
    "polpermissive boolean, polroles bigint[], polqual varchar, polwithcheck varchar",
    "pg_statistic_ext": "oid bigint, stxrelid bigint, stxname varchar, stxnamespace bigint, "
    "stxowner bigint, stxstattarget integer, stxkeys smallint[], stxkind varchar[], "
    "stxexprs varchar",
    "pg_publication": "oid bigint, pubname varchar, pubowner bigint, puballtables boolean, "
    "pubinsert boolean, pubupdate boolean, pubdelete boolean, pubtruncate boolean, "
    "pubviaroot boolean",
    "pg_publication_namespace": "oid bigint, pnpubid bigint, pnnspid bigint",
    "pg_publication_rel": "oid bigint, prpubid bigint, prrelid bigint, prqual varchar, "
    "prattrs smallint[]",
    "pg_inherits": "inhrelid bigint, inhparent bigint, inhseqno integer, inhdetachpending boolean",
    "pg_trigger": "tableoid bigint, oid bigint, tgrelid bigint, tgparentid bigint, tgname varchar, "
    "tgfoid bigint, tgtype smallint, tgenabled varchar, tgisinternal boolean, "
    "tgconstrrelid bigint, tgconstrindid bigint, tgconstraint bigint, tgdeferrable boolean, "
    "tginitdeferred boolean, tgnargs smallint, tgattr smallint[], tgargs blob, "
    "tgqual varchar, tgoldtable varchar, tgnewtable varchar",
    "pg_opclass": "tableoid bigint, oid bigint, opcmethod bigint, opcname varchar, "
    "opcnamespace bigint, opcowner bigint, opcfamily bigint, opcintype bigint, opcdefault boolean, "
    "opckeytype bigint",
    "pg_rewrite": "tableoid bigint, oid bigint, rulename varchar, ev_class bigint, "
    "ev_type varchar, ev_enabled varchar, is_instead boolean, ev_qual varchar, ev_action varchar",
    "pg_foreign_table": "ftrelid bigint, ftserver bigint, ftoptions varchar[]",
    "pg_partitioned_table": "partrelid bigint, partstrat varchar, partnatts smallint, "
    "partdefid bigint, partattrs smallint[], partclass bigint[], partcollation bigint[], "
    "partexprs varchar",
    "pg_matviews": "schemaname varchar, matviewname varchar, matviewowner varchar, "
    "tablespace varchar, hasindexes boolean, ispopulated boolean, definition varchar",
    "pg_collation": "oid bigint, collname varchar, collnamespace bigint, collowner bigint, "
    "collprovider varchar, collisdeterministic boolean, collencoding integer, "
    "collcollate varchar, collctype varchar, colliculocale varchar, collversion varchar",
    "pg_cast": "oid bigint, castsource bigint, casttarget bigint, castfunc bigint, "
    "castcontext varchar, castmethod varchar",
    "pg_conversion": "oid bigint, conname varchar, connamespace bigint, conowner bigint, "
    "conforencoding integer, contoencoding integer, conproc bigint, condefault boolean",
    "pg_operator": "oid bigint, oprname varchar, oprnamespace bigint, oprowner bigint, "
    "oprkind varchar, oprcanmerge boolean, oprcanhash boolean, oprleft bigint, "
    "oprright bigint, oprresult bigint, oprcom bigint, oprnegate bigint, oprcode bigint, "
    "oprrest bigint, oprjoin bigint, tableoid bigint",
    "pg_opfamily": "oid bigint, opfmethod bigint, opfname varchar, opfnamespace bigint, "
    "opfowner bigint, tableoid bigint",
    "pg_event_trigger": "oid bigint, evtname varchar, evtevent varchar, evtowner bigint, "
    "evtfoid bigint, evtenabled varchar, evttags varchar[]",
    "pg_ts_config": "oid bigint, cfgname varchar, cfgnamespace bigint, cfgowner bigint, "
    "cfgparser bigint",
    "pg_ts_parser": "oid bigint, prsname varchar, prsnamespace bigint",
    "pg_db_role_setting": "setdatabase bigint, setrole bigint, setconfig varchar[]",
    "pg_language": "tableoid bigint, oid bigint, lanname varchar, lanowner bigint, "
    "lanispl boolean, lanpltrusted boolean, lanplcallfoid bigint, laninline bigint, "
    "lanvalidator bigint, lanacl varchar[]",
    "pg_foreign_server": "oid bigint, srvname varchar, srvowner bigint, srvfdw bigint, "
    "srvtype varchar, srvversion varchar, srvacl varchar[], srvoptions varchar[]",
    "pg_foreign_data_wrapper": "oid bigint, fdwname varchar, fdwowner bigint, "
    "fdwhandler bigint, fdwvalidator bigint, fdwacl varchar[], fdwoptions varchar[]",
    "pg_user_mappings": "umid bigint, srvid bigint, srvname varchar, umuser bigint, "
    "usename varchar, umoptions varchar[]",
    "pg_largeobject_metadata": "oid bigint, lomowner bigint, lomacl varchar[]",
    "pg_extension": "oid bigint, extname varchar, extowner bigint, extnamespace bigint, "
    "extrelocatable boolean, extversion varchar, extconfig bigint[], extcondition varchar[]",
    # (no range types, no row security, no I/O statistics here: Sequelize reads pg_range on
    # connect, drizzle-kit pg_policies, Sequelize's describeTable pg_statio_all_tables)
    "pg_range": "rngtypid bigint, rngsubtype bigint, rngmultitypid bigint, rngcollation bigint, "
    "rngsubopc bigint, rngcanonical bigint, rngsubdiff bigint",
    "pg_policies": "schemaname varchar, tablename varchar, policyname varchar, "
    "permissive varchar, roles varchar[], cmd varchar, qual varchar, with_check varchar",
    "pg_statio_all_tables": "relid bigint, schemaname varchar, relname varchar, "
    "heap_blks_read bigint, heap_blks_hit bigint, idx_blks_read bigint, idx_blks_hit bigint, "
    "toast_blks_read bigint, toast_blks_hit bigint, tidx_blks_read bigint, tidx_blks_hit bigint",
}


def _empty(name: str, columns: str) -> str:
    select = ", ".join(
        f"cast(null as {kind}) as {column}"
        for column, kind in (c.strip().split(" ", 1) for c in columns.split(","))
    )
    return f"create or replace view {S}.{name} as select {select} where false"


_TYPE_NAMES = {
    "int2": "smallint",
    "int4": "integer",
    "int8": "bigint",
    "float4": "real",
    "float8": "double precision",
    "bool": "boolean",
    "varchar": "text",  # DuckDB's VARCHAR has no length (varchar(10) is VARCHAR): text
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
    "time": "time without time zone",
    "timetz": "time with time zone",
}
# the PostgreSQL settings compat answers SHOW with (one-word names), and the locale
_SETTINGS = {
    **{name: value for name, value in compat.PG_SETTINGS.items() if " " not in name},
    "lc_collate": "C",
    "lc_ctype": "C",
}
# format()'s argument i as its placeholder wants it: %I an identifier quoted where PostgreSQL's
# quote_ident would (anything but lower-case letters, digits, _ and $ not first), %L a literal
# (NULL, or quoted with its quotes doubled), %s the text (NULL: empty)
_FORMAT_ARG = (
    "(fmt_, pos_, val_) as case list_extract(regexp_extract_all(fmt_, '%[sIL]'), pos_) "
    "when '%I' then case when regexp_full_match(val_::varchar, '[a-z_][a-z0-9_$]*') "
    "then val_::varchar else '\"' || replace(val_::varchar, '\"', '\"\"') || '\"' end "
    "when '%L' then case when val_ is null then 'NULL' "
    "else chr(39) || replace(val_::varchar, chr(39), chr(39) || chr(39)) || chr(39) end "
    "else coalesce(val_::varchar, '') end"
)
# PostgreSQL's reserved key words, which quote_ident quotes
_RESERVED = (
    "["
    + ", ".join(
        f"'{w}'"
        for w in (
            "all",
            "analyse",
            "analyze",
            "and",
            "any",
            "array",
            "as",
            "asc",
            "asymmetric",
            "both",
            "case",
            "cast",
            "check",
            "collate",
            "column",
            "constraint",
            "create",
            "current_catalog",
            "current_date",
            "current_role",
            "current_time",
            "current_timestamp",
            "current_user",
            "default",
            "deferrable",
            "desc",
            "distinct",
            "do",
            "else",
            "end",
            "except",
            "false",
            "fetch",
            "for",
            "foreign",
            "from",
            "grant",
            "group",
            "having",
            "in",
            "initially",
            "intersect",
            "into",
            "lateral",
            "leading",
            "limit",
            "localtime",
            "localtimestamp",
            "not",
            "null",
            "offset",
            "on",
            "only",
            "or",
            "order",
            "placing",
            "primary",
            "references",
            "returning",
            "select",
            "session_user",
            "some",
            "symmetric",
            "table",
            "then",
            "to",
            "trailing",
            "true",
            "union",
            "unique",
            "user",
            "using",
            "variadic",
            "when",
            "where",
            "window",
            "with",
        )
    )
    + "]"
)
_FORMATS = [
    "(f, {args}) as printf(regexp_replace(f, '%[IL]', '%s', 'g'), {quoted})".format(
        args=", ".join(f"a{i}" for i in range(n)),
        quoted=", ".join(f"{S}.format_arg(f, {i + 1}, a{i})" for i in range(n)),
    )
    for n in range(1, 5)
]
_JSON_PAIRS = 8  # json_build_object with up to this many key/value pairs


# one-row views of (keys, values) for the macros' lookups
_LOOKUPS = {
    "lookup_class_oids": "select c.relname as k, c.oid as v from {S}.pg_class c "
    "union all select n.nspname || '.' || c.relname, c.oid from {S}.pg_class c "
    "join {S}.pg_namespace n on n.oid = c.relnamespace",
    "lookup_class_names": "select oid as k, relname as v from {S}.pg_class",
    "lookup_constraint_defs": "select oid as k, condef as v from {S}.admission_constraints",
    "lookup_index_defs": f"select oid as k, {_INDEX_DEF} as v from {{S}}.admission_indexes",
    "lookup_index_elements": "select oid as k, elements as v from {S}.admission_indexes",
    "lookup_function_results": "select function_oid as k, "
    "lower(coalesce(return_type, 'unknown')) as v from duckdb_functions()",
    "lookup_function_arguments": "select function_oid as k, "
    "array_to_string(list_transform(range(len(parameters)), lambda i: parameters[i + 1] "
    "|| coalesce(' ' || lower(parameter_types[i + 1]), '')), ', ') as v "
    "from duckdb_functions()",
}


def _lookups() -> list[str]:
    return [
        f"create or replace view {S}.{name} as "
        f"select list({{'k': k, 'v': v}}) as admission_lookup from ({body})"
        for name, body in _LOOKUPS.items()
    ]


def _macros() -> list[str]:
    pairs = []
    for n in range(1, _JSON_PAIRS + 1):
        args = ", ".join(f"k{i}, v{i}" for i in range(n))
        body = ", ".join(f"k{i}::varchar, v{i}" for i in range(n))
        pairs.append(f"({args}) as json_object({body})")
    return [
        # the lookups below read a one-row view of (keys, values) in an uncorrelated subquery,
        # passed in: a macro's argument substituted into a correlated subquery would be bound
        # to the subquery's own columns when they share a name (pg_get_constraintdef(oid))
        # (``m`` once in the body: a macro's argument is substituted as often as it appears,
        # and two runs of one subquery need not list its rows in the same order)
        f"create or replace macro {S}.pick(m, x) as list_filter(m, lambda e: e.k = x)[1].v",
        # an oid stays an oid; a name ('lineitem', 'main.lineitem', 'pg_catalog.pg_class')
        # is looked up, as PostgreSQL's regclass input does
        f"create or replace macro {S}.regclass_oid(x) as coalesce(try_cast(x as bigint), "
        "{S}.pick((select admission_lookup from {S}.lookup_class_oids), x::varchar))",
        f"create or replace macro {S}.pg_get_constraintdef(x) as "
        "{S}.pick((select admission_lookup from {S}.lookup_constraint_defs), x), "
        "(x, pretty) as {S}.pick((select admission_lookup from {S}.lookup_constraint_defs), x)",
        f"create or replace macro {S}.pg_get_indexdef(x) as "
        "{S}.pick((select admission_lookup from {S}.lookup_index_defs), x), "
        "(x, k, pretty) as case when k = 0 "
        "then {S}.pick((select admission_lookup from {S}.lookup_index_defs), x) "
        "else {S}.pick((select admission_lookup from {S}.lookup_index_elements), x)[k] end",
        # DuckDB's names of the types PostgreSQL spells out (SQLAlchemy maps them by name),
        # and the types pg_type has beyond DuckDB's (text, json, jsonb, the arrays)
        f"create or replace macro {S}.format_scalar_type(t, m) as (select case "
        "when t = 25 then 'text' when t = 114 then 'json' when t = 3802 then 'jsonb' "
        "else case f "
        + " ".join(f"when '{duck}' then '{pg}'" for duck, pg in _TYPE_NAMES.items())
        + " else f end end from (select pg_catalog.format_type(t, m) as f))",
        f"create or replace macro {S}.format_type(t, m) as case t "
        + " ".join(
            f"when {array} then {S}.format_scalar_type({element}, m) || '[]'"
            for array, element in ARRAY_ELEMENT.items()
        )
        + f" else {S}.format_scalar_type(t, m) end",
        # settings PostgreSQL has and DuckDB does not (DuckDB's current_setting fails on
        # those as it binds, even in a branch not taken)
        f"create or replace macro {S}.current_setting(n) as case lower(n) "
        + " ".join(
            f"when {literal(name)} then {literal(value)}" for name, value in _SETTINGS.items()
        )
        + " else (select value from duckdb_settings() where name = lower(n)) end",
        f"create or replace macro {S}.pg_get_expr(e, r) as e::varchar, "
        "(e, r, pretty) as e::varchar",
        f"create or replace macro {S}.pg_get_function_result(x) as "
        "{S}.pick((select admission_lookup from {S}.lookup_function_results), x)",
        f"create or replace macro {S}.pg_get_function_arguments(x) as "
        "{S}.pick((select admission_lookup from {S}.lookup_function_arguments), x)",
        f"create or replace macro {S}.pg_get_function_identity_arguments(x) as "
        "{S}.pg_get_function_arguments(x)",
        f"create or replace macro {S}.pg_get_statisticsobjdef_columns(x) as cast(null as varchar)",
        f"create or replace macro {S}.pg_relation_is_publishable(x) as false",
        # information_schema._pg_expandarray: an array's elements with their positions
        f"create or replace macro {S}._pg_expandarray(a) as "
        "unnest(list_transform(range(len(a)), lambda i: {'x': a[i + 1], 'n': i + 1}))",
        # an int2vector or oidvector column (text, as PostgreSQL prints it) as an array
        f"create or replace macro {S}.vector(v) as case when v is null then null "
        "when trim(v) = '' then []::bigint[] "
        "else list_transform(string_split(trim(v), ' '), lambda e: e::bigint) end",
        f"create or replace macro {S}.pg_stat_get_numscans(x) as 0::bigint",
        f"create or replace macro {S}.pg_stat_get_tuples_returned(x) as 0::bigint",
        f"create or replace macro {S}.pg_stat_get_tuples_fetched(x) as 0::bigint",
        # a table is its only ancestor (DuckDB has no partitions); psql calls it in FROM too
        f"create or replace macro {S}.pg_partition_ancestors(x) as {S}.regclass_oid(x)",
        # generate_subscripts in FROM (DuckDB's is a scalar): PostgreSQL's from 1, and from 0
        # for its vectors (catalog.translate chooses)
        f"create or replace macro {S}.subscripts(a, d) as table "
        "select unnest(range(1, len(a) + 1)) as generate_subscripts",
        f"create or replace macro {S}.subscripts_from_0(a, d) as table "
        "select unnest(range(0, len(a))) as generate_subscripts",
        f"create or replace macro {S}.pg_partition_ancestors_rows(x) as table "
        "select {S}.regclass_oid(x) as relid, 1 as depth",
        # the name a regclass prints as (an oid of no relation prints as itself)
        f"create or replace macro {S}.regclass_name(x) as coalesce("
        "{S}.pick((select admission_lookup from {S}.lookup_class_names), x), x::varchar)",
        # (NULL: a subquery here would fail SQLAlchemy's reflection, which calls it inside
        # what DuckDB binds as a lambda)
        f"create or replace macro {S}.pg_get_serial_sequence(t, c) as cast(null as varchar)",
        f"create or replace macro {S}.pg_get_partkeydef(x) as cast(null as varchar)",
        f"create or replace macro {S}.pg_tablespace_location(x) as ''",
        f"create or replace macro {S}.pg_char_to_encoding(x) as 6",
        f"create or replace macro {S}.pg_statistics_obj_is_visible(x) as true",
        f"create or replace macro {S}.pg_get_viewdef(x) as pg_catalog.pg_get_viewdef(x), "
        "(x, pretty) as pg_catalog.pg_get_viewdef(x)",
        f"create or replace macro {S}.pg_get_triggerdef(x) as cast(null as varchar), "
        "(x, pretty) as cast(null as varchar)",
        f"create or replace macro {S}.shobj_description(x, c) as cast(null as varchar)",
        f"create or replace macro {S}.pg_table_size(x) as 0::bigint",
        f"create or replace macro {S}.pg_relation_size(x) as {S}.pg_table_size(x), "
        "(x, fork) as {S}.pg_table_size(x)",
        f"create or replace macro {S}.pg_total_relation_size(x) as {S}.pg_table_size(x)",
        f"create or replace macro {S}.pg_database_size(x) as 0",
        f"create or replace macro {S}.btrim(t) as trim(t), (t, c) as trim(t, c)",
        # PostgreSQL's format (%s, %I, %L), not DuckDB's ({})
        f"create or replace macro {S}.format_arg{_FORMAT_ARG}",
        # (as format's %I quotes; PostgreSQL also quotes its reserved words)
        f"create or replace macro {S}.quote_ident(t) as case "
        "when regexp_full_match(t::varchar, '[a-z_][a-z0-9_$]*') "
        f"and not list_contains({_RESERVED}, t::varchar) then t::varchar "
        "else '\"' || replace(t::varchar, '\"', '\"\"') || '\"' end",
        f"create or replace macro {S}.format(f) as f, " + ", ".join(_FORMATS),
        f"create or replace macro {S}.array_upper(a, d) as case when len(a) > 0 then len(a) end",
        f"create or replace macro {S}.array_lower(a, d) as case when len(a) > 0 then 1 end",
        f"create or replace macro {S}.json_build_object" + ", ".join(pairs),
    ]


def install(connection: Any) -> None:
    """Make this module's catalogs and functions, once, in an in-memory database of their own
    attached to ``connection`` (before clients come: the lockdown refuses ATTACH after)."""
    statements = [
        f"attach if not exists ':memory:' as {DATABASE}",
        _INDEXES,
        _CONSTRAINTS,
        _CLASS,
        _NAMESPACE,
        *_lookups(),
        *_macros(),
        _INDEX,
        _PG_INDEXES,
        _CONSTRAINT,
        _ATTRIBUTE,
        _AM,
        _PROC,
        _DATABASE,
        _ROLES,
        _USERS,
        "create or replace table {S}.admission_settings (name varchar, setting varchar)",
        "delete from {S}.admission_settings",
        "insert into {S}.admission_settings values "
        + ", ".join(f"({literal(name)}, {literal(value)})" for name, value in _SETTINGS.items()),
        _SETTINGS_VIEW,
        _STAT_TABLES,
        _TABLES,
        _VIEWS_VIEW,
        _TYPE,
        _COLUMNS,
        _CONSTRAINT_COLUMN_USAGE,
        *_information_schema_views(),
        f"create or replace macro {S}.client_database() as {CLIENT_DATABASE}",
        *(_empty(name, columns) for name, columns in _EMPTY.items()),
    ]
    for sql in statements:
        connection.execute(sql.replace("{S}", S))


def _information_schema_views() -> list[str]:
    """information_schema's views with the client's database name for DuckDB's (and without
    the rows of this module's database)."""
    views = []
    for name, columns in _CATALOG_COLUMNS.items():
        replaced = ", ".join(f"{_as_client(column)} as {column}" for column in columns)
        views.append(
            f"create or replace view {S}.information_schema_{name} as "
            f"select * replace ({replaced}) from information_schema.{name} "
            f"where {columns[0]} <> '{DATABASE}'"
        )
    return views


def session_setup(user: str, database: str = "") -> str:
    """The statements that tell a session's connection who its user is (``pg_roles``) and
    which database it connected to (``current_database()``, the catalogs' database names)."""
    setup = f"set variable admission_user = {literal(user)}"
    if database:
        setup += f"; set variable admission_database = {literal(database)}"
    return setup


# what marks a statement as one that reads PostgreSQL's catalogs (or uses its casts on them)
_CATALOG_WORDS = sorted(
    {
        *_VIEWS,
        # (the functions by their PostgreSQL names only: a user's own DuckDB statement that
        # calls format() or vector() is not a catalog statement)
        *(name for name in _FUNCTIONS if name.startswith(("pg_", "_pg_"))),
        "pg_catalog",
        "information_schema",
        "pg_namespace",
        "pg_attribute",
        "pg_type",
        "pg_attrdef",
        "pg_description",
        "pg_collation",
        "pg_am",
        "pg_settings",
        "pg_tables",
        "pg_views",
        "pg_indexes",
        "pg_sequence",
        "pg_enum",
        "pg_depend",
        "pg_tablespace",
    }
)
_GATE = re.compile(
    r"\b(?:" + "|".join(_CATALOG_WORDS) + r")\b|\breg(?:class|type|proc|namespace|role)\b"
    r"|\bcollate\b|\boperator\s*\(|\b(?:current_database|quote_ident)\s*\(",
    re.I,
)

# PostgreSQL type names DuckDB lacks, and what stands for them
_TYPES = {
    "name": "varchar",
    "int2vector": "smallint[]",
    "oidvector": "bigint[]",
    "pg_node_tree": "varchar",
    "aclitem": "varchar",
    "regoper": "bigint",
    "regoperator": "bigint",
    "regprocedure": "bigint",
    "regconfig": "bigint",
    "regdictionary": "bigint",
    "xid": "bigint",
    "cid": "bigint",
    "tid": "varchar",
}
_REG_TYPES = {"regclass", "regtype", "regproc", "regnamespace", "regrole"}


def _is_catalog(names: Any) -> bool:
    return bool(names) and len(names) > 1 and getattr(names[0], "sval", None) == "pg_catalog"


# PostgreSQL's int2vector and oidvector columns: text as a client reads them ("1 2", which
# SQLAlchemy splits), arrays where a statement unnests or indexes them
_VECTORS = frozenset({"indkey", "indoption", "indclass", "indcollation"})


def _ours(name: str) -> tuple[ast.String, ...]:
    return (ast.String(DATABASE), ast.String("main"), ast.String(name))


class _Translate(Visitor):
    """The changes ``translate`` makes, node by node."""

    def visit_RangeVar(self, ancestors: Any, node: Any) -> None:
        if node.schemaname == "information_schema" and node.relname in _INFORMATION_SCHEMA:
            if node.alias is None:  # (its columns stay known by the view's name)
                node.alias = ast.Alias(aliasname=node.relname)
            node.catalogname, node.schemaname = DATABASE, "main"
            node.relname = f"information_schema_{node.relname}"
            return
        if node.schemaname in (None, "pg_catalog") and node.catalogname is None:
            if node.relname in _VIEWS:
                node.catalogname, node.schemaname = DATABASE, "main"
            elif node.schemaname == "pg_catalog":
                node.schemaname = None  # DuckDB's, found without its schema

    def visit_FuncCall(self, ancestors: Any, node: Any) -> None:
        names = node.funcname
        if _is_catalog(names) or (len(names) == 2 and names[0].sval == "information_schema"):
            names = names[1:]
        if len(names) == 1 and names[0].sval in _FUNCTIONS:
            names = _ours(names[0].sval)
        elif len(names) == 1 and names[0].sval == "current_database":
            names = _ours("client_database")
        node.funcname = names

    def visit_ColumnRef(self, ancestors: Any, node: Any) -> Any:
        fields: Any = node.fields or ()
        if len(fields) >= 3 and getattr(fields[0], "sval", None) == "pg_catalog":
            node.fields = fields = fields[1:]  # pg_catalog.pg_class.relname: found bare
        if (
            fields
            and getattr(fields[-1], "sval", None) in _VECTORS
            and not _returned(ancestors)
            and not _grouped(ancestors)  # (GROUP BY ix.indkey: as the target it groups)
            and not _in_vector(ancestors)  # (translated before: a prepared statement's)
        ):
            # a vector column read inside the statement (unnest, [i], = ANY) is an array; one
            # the statement returns stays text, as PostgreSQL prints it
            return ast.FuncCall(funcname=_ours("vector"), args=(node,))
        return None

    def visit_RangeFunction(self, ancestors: Any, node: Any) -> None:
        for item in node.functions or ():
            call: Any = item[0]
            names = call.funcname if isinstance(call, ast.FuncCall) else ()
            if names and names[-1].sval == "pg_partition_ancestors":  # in FROM: the rows
                call.funcname = _ours("pg_partition_ancestors_rows")
                node.ordinality = False  # (its depth is the ordinal WITH ORDINALITY adds)
            elif names and names[-1].sval == "generate_subscripts" and call.args:
                # an array's subscripts: from 0 for a vector column, as PostgreSQL's
                # int2vector and oidvector count (peewee's index query reads
                # pg_get_indexdef(indexrelid, k + 1) over generate_subscripts(indkey, 1))
                first: Any = call.args[0]
                vector = _is(first, ast.ColumnRef) and _field(first) in _VECTORS
                call.funcname = _ours("subscripts_from_0" if vector else "subscripts")
                # (``AS k``: k is the subscript itself, as PostgreSQL names a function's
                # single column by its alias)
                alias = node.alias or ast.Alias(aliasname="generate_subscripts")
                if not alias.colnames:
                    alias.colnames = (ast.String(alias.aliasname),)
                node.alias = alias

    def visit_A_Indirection(self, ancestors: Any, node: Any) -> None:
        # a vector column's element by PostgreSQL's subscript (from 0: indkey[0] is the first
        # column) as DuckDB's (from 1); once, on the column as the statement has it
        indices: Any = node.indirection or ()
        if (
            _is(node.arg, ast.ColumnRef)
            and _field(node.arg) in _VECTORS
            and len(indices) == 1
            and _is(indices[0], ast.A_Indices)
            and not indices[0].is_slice
            and indices[0].uidx is not None
        ):
            indices[0].uidx = ast.A_Expr(
                kind=A_Expr_Kind.AEXPR_OP,
                name=(ast.String("+"),),
                lexpr=indices[0].uidx,
                rexpr=ast.A_Const(val=ast.Integer(1)),
            )

    def visit_A_Expr(self, ancestors: Any, node: Any) -> Any:
        if _is_catalog(node.name):
            node.name = node.name[1:]
        escape: Any = node.rexpr
        if (
            node.kind in (A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE)
            and _is(escape, ast.FuncCall)
            and escape.funcname[-1].sval == "like_escape"
            and len(escape.args or ()) == 2
        ):
            # PostgreSQL's parser turns LIKE … ESCAPE into like_escape(pattern, escape), a
            # function DuckDB has with the string as a first argument
            name = "like_escape" if node.kind == A_Expr_Kind.AEXPR_LIKE else "ilike_escape"
            args = tuple(_visited(a) for a in (node.lexpr, *escape.args))
            call = ast.FuncCall(funcname=(ast.String(name),), args=args)
            if node.name[-1].sval.startswith("!"):
                return ast.BoolExpr(boolop=BoolExprType.NOT_EXPR, args=(call,))
            return call
        return None

    def visit_CollateClause(self, ancestors: Any, node: Any) -> Any:
        return _visited(node.arg)

    def visit_ResTarget(self, ancestors: Any, node: Any) -> None:
        # a relation's oid selected as ::regclass (or ::regclass::text) is printed by name
        value: Any = node.val
        if _cast_to(value, ("text", "varchar", "name")):
            value = value.arg
        if _cast_to(value, ("regclass",)) and not _is_string(value.arg):
            if node.name is None and _is(value.arg, ast.ColumnRef):
                node.name = value.arg.fields[-1].sval  # the column PostgreSQL names it by
            # (its argument is visited next, as the rest of the target is)
            node.val = ast.FuncCall(funcname=_ours("regclass_name"), args=(value.arg,))

    def visit_TypeCast(self, ancestors: Any, node: Any) -> Any:
        if _cast_to(node, ("text", "varchar", "name")) and _cast_to(node.arg, ("regclass",)):
            inner = node.arg.arg
            if not _is_string(inner):  # ::regclass::text, as in an ORDER BY: the name
                return ast.FuncCall(funcname=_ours("regclass_name"), args=(_visited(inner),))
        names = node.typeName.names
        name = names[-1].sval.lower() if names else ""
        if name not in _REG_TYPES or node.typeName.arrayBounds:
            return None
        arg = _visited(node.arg)  # (a node returned is not visited again)
        if name == "regclass" and not isinstance(arg, ast.ColumnRef):
            return ast.FuncCall(funcname=_ours("regclass_oid"), args=(arg,))
        if name == "regtype" and _is_string(arg):
            return ast.FuncCall(funcname=(ast.String("to_regtype"),), args=(arg,))
        return arg  # an oid, as the oid it is

    def visit_TypeName(self, ancestors: Any, node: Any) -> None:
        names = node.names or ()
        if _is_catalog(names):
            names = names[1:]
        if names:
            replacement = _TYPES.get(names[-1].sval.lower())
            if replacement is not None:
                base = replacement.removesuffix("[]")
                node.names = (ast.String(base),)
                if replacement.endswith("[]") and not node.arrayBounds:
                    node.arrayBounds = (ast.Integer(-1),)
                return
        node.names = names


def _visited(node: Any) -> Any:
    """``node`` with ``_Translate``'s changes made in it (and to it, if it is replaced)."""
    holder = ast.ResTarget(val=node)
    _Translate()(holder)
    return holder.val


def _returned(ancestors: Any) -> bool:
    """Whether a node is one of the columns the statement returns: a target of the outermost
    SELECT (or of a branch of its UNION), not of a subquery."""
    if not isinstance(ancestors.node, ast.ResTarget):
        return False
    select = ancestors.parent.parent if ancestors.parent is not None else None  # (a tuple)
    if select is None or not isinstance(select.node, ast.SelectStmt):
        return False
    if select.member != "targetList":
        return False
    while True:
        up = select.parent
        if up is None or up.node is None or isinstance(up.node, ast.RawStmt):
            return True
        if isinstance(up.node, ast.SelectStmt) and up.member in ("larg", "rarg"):
            select = up
            continue
        return False


def _grouped(ancestors: Any) -> bool:
    """Whether a node is an item of a GROUP BY list itself (Sequelize's showIndex groups by
    the index's key columns, which it also returns)."""
    up = ancestors.parent
    return (
        isinstance(ancestors.node, tuple)
        and up is not None
        and isinstance(up.node, ast.SelectStmt)
        and up.member == "groupClause"
    )


def _field(column: Any) -> str | None:
    """A column reference's last name."""
    fields = column.fields or ()
    return getattr(fields[-1], "sval", None) if fields else None


def _in_vector(ancestors: Any) -> bool:
    """Whether a node is already the argument of ``vector``."""
    parent = ancestors.parent.node if isinstance(ancestors.node, tuple) else ancestors.node
    if not isinstance(parent, ast.FuncCall):
        return False
    names: Any = parent.funcname
    return bool(names) and names[-1].sval == "vector"


def _is(node: Any, kind: type) -> bool:
    return isinstance(node, kind)


def _cast_to(node: Any, types: tuple[str, ...]) -> bool:
    """Whether ``node`` is a cast to one of ``types`` (a name without its schema)."""
    if not isinstance(node, ast.TypeCast):
        return False
    type_name: Any = node.typeName
    if type_name.arrayBounds:
        return False
    names: Any = type_name.names or ()
    return bool(names) and names[-1].sval.lower() in types


def _is_string(node: Any) -> bool:
    return isinstance(node, ast.A_Const) and isinstance(node.val, ast.String)


# what every statement _GATE can match contains, looked for first: plain substring searches
# take a microsecond where the regular expression's alternation takes half a millisecond on a
# long statement (every statement passes here)
_MARKS: tuple[str, ...] = ("pg_", "information_schema", "regclass", "regtype", "regproc")
_MARKS += ("regnamespace", "regrole", "collate", "operator", "current_database", "quote_ident")


def translate(sql: str) -> str | None:
    """``sql`` as DuckDB can run it against the catalogs ``install`` makes, or None when it
    reads no catalog (or PostgreSQL's parser cannot read it: DuckDB's own syntax)."""
    lowered = sql.lower()
    if not any(mark in lowered for mark in _MARKS) or not _GATE.search(sql):
        return None
    return _translate(sql)


@functools.lru_cache(maxsize=512)
def _translate(sql: str) -> str | None:
    try:
        statements = parse_sql(sql)
    except Exception:  # pglast's ParseError, or DuckDB syntax PostgreSQL's parser rejects
        return None
    visitor = _Translate()
    out = []
    try:
        for statement in statements:
            visitor(statement)
            out.append(RawStream()(statement))
    except Exception:  # a node the deparser cannot print: leave the statement as it was
        return None
    return "; ".join(out)


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
