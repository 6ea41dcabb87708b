"""The TPC-H schema (TPC-H §1.4), one DDL for DuckDB and PostgreSQL, with primary keys."""

from __future__ import annotations

TABLES: dict[str, str] = {
    "region": """r_regionkey integer not null, r_name char(25) not null,
        r_comment varchar(152), primary key (r_regionkey)""",
    "nation": """n_nationkey integer not null, n_name char(25) not null,
        n_regionkey integer not null, n_comment varchar(152), primary key (n_nationkey)""",
    "part": """p_partkey integer not null, p_name varchar(55) not null,
        p_mfgr char(25) not null, p_brand char(10) not null, p_type varchar(25) not null,
        p_size integer not null, p_container char(10) not null,
        p_retailprice decimal(15,2) not null, p_comment varchar(23) not null,
        primary key (p_partkey)""",
    "supplier": """s_suppkey integer not null, s_name char(25) not null,
        s_address varchar(40) not null, s_nationkey integer not null, s_phone char(15) not null,
        s_acctbal decimal(15,2) not null, s_comment varchar(101) not null,
        primary key (s_suppkey)""",
    "partsupp": """ps_partkey integer not null, ps_suppkey integer not null,
        ps_availqty integer not null, ps_supplycost decimal(15,2) not null,
        ps_comment varchar(199) not null, primary key (ps_partkey, ps_suppkey)""",
    "customer": """c_custkey integer not null, c_name varchar(25) not null,
        c_address varchar(40) not null, c_nationkey integer not null, c_phone char(15) not null,
        c_acctbal decimal(15,2) not null, c_mktsegment char(10) not null,
        c_comment varchar(117) not null, primary key (c_custkey)""",
    "orders": """o_orderkey integer not null, o_custkey integer not null,
        o_orderstatus char(1) not null, o_totalprice decimal(15,2) not null,
        o_orderdate date not null, o_orderpriority char(15) not null, o_clerk char(15) not null,
        o_shippriority integer not null, o_comment varchar(79) not null,
        primary key (o_orderkey)""",
    "lineitem": """l_orderkey integer not null, l_partkey integer not null,
        l_suppkey integer not null, l_linenumber integer not null,
        l_quantity decimal(15,2) not null, l_extendedprice decimal(15,2) not null,
        l_discount decimal(15,2) not null, l_tax decimal(15,2) not null,
        l_returnflag char(1) not null, l_linestatus char(1) not null, l_shipdate date not null,
        l_commitdate date not null, l_receiptdate date not null,
        l_shipinstruct char(25) not null, l_shipmode char(10) not null,
        l_comment varchar(44) not null, primary key (l_orderkey, l_linenumber)""",
}


def create_statements() -> list[str]:
    return [f"create table {name} ({columns})" for name, columns in TABLES.items()]
