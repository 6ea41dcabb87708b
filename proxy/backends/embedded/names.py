"""Result column names as PostgreSQL gives them. DuckDB names a column with no alias by its
expression's text (``count_star()``, ``sum(x)``, ``(x IS NULL)``); PostgreSQL by the rule of
its ``FigureColname``: a function by its name (``count``), a cast by what it casts or else its
type, CASE by its ELSE or ``case``, a scalar subquery by its column, EXISTS, ARRAY, ROW,
COALESCE, GREATEST/LEAST, NULLIF and CURRENT_DATE-like words by themselves, anything else
``?column?``. Clients read results by these names (pandas' ``read_sql``, dict rows), so the
embedded server tells PostgreSQL's.
"""

from __future__ import annotations

import re
from typing import Any

import pglast
from pglast import ast
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.enums.primnodes import MinMaxOp, SubLinkType

__all__ = ["postgresql_names"]

_PLAIN = re.compile(r"[A-Za-z_][\w$]*")  # (a name DuckDB gives a column reference or an alias)
_KEEP = 512  # statements whose names are remembered
_NAMES: dict[str, list[str | None] | None] = {}


def postgresql_names(query: str, names: list[str]) -> list[str]:
    """``names`` (DuckDB's, one per result column of ``query``) with each column that has no
    alias and is not a column reference named as PostgreSQL names it; ``names`` itself when
    every one is a plain name or the query cannot be read (a ``*`` in its list, say)."""
    if all(_PLAIN.fullmatch(name) for name in names):
        return names  # (the usual case: no expression without an alias)
    if query in _NAMES:
        figured = _NAMES[query]
    else:
        figured = _figured(query)
        if len(_NAMES) >= _KEEP:
            _NAMES.clear()
        _NAMES[query] = figured
    if figured is None or len(figured) != len(names):
        return names
    return [
        mine if mine is not None else theirs for mine, theirs in zip(figured, names, strict=True)
    ]


def _figured(query: str) -> list[str | None] | None:
    """PostgreSQL's name for each target of ``query``'s SELECT list (None where DuckDB's is
    kept: an alias, a column reference); None when there is no such list to read."""
    try:
        statements = pglast.parse_sql(query)
    except Exception:  # (DuckDB's own syntax: its names stay)
        return None
    if len(statements) != 1:
        return None
    select = statements[0].stmt
    while isinstance(select, ast.SelectStmt) and select.larg is not None:  # (UNION: the left's)
        select = select.larg
    if not isinstance(select, ast.SelectStmt) or not select.targetList:
        return None
    out: list[str | None] = []
    for target in select.targetList:
        value = target.val
        if isinstance(value, ast.ColumnRef) and any(
            isinstance(f, ast.A_Star) for f in value.fields or ()
        ):
            return None  # (a * expands to columns this list does not count)
        if target.name or isinstance(value, ast.ColumnRef):
            out.append(None)
            continue
        name, _ = _figure(value)
        out.append(name or "?column?")
    return out


def _figure(node: Any) -> tuple[str | None, int]:
    """PostgreSQL's FigureColnameInternal: a name and its strength (2: a column or function's
    name, 1: a fallback such as a type's or "case", 0: none)."""
    if isinstance(node, ast.ColumnRef):
        last = node.fields[-1] if node.fields else None
        return (last.sval, 2) if isinstance(last, ast.String) else (None, 0)
    if isinstance(node, ast.A_Indirection):
        last = node.indirection[-1] if node.indirection else None
        if isinstance(last, ast.String):
            return last.sval, 2
        return _figure(node.arg)
    if isinstance(node, ast.FuncCall) and node.funcname:
        return node.funcname[-1].sval, 2
    if isinstance(node, ast.A_Expr):
        return ("nullif", 2) if node.kind == A_Expr_Kind.AEXPR_NULLIF else (None, 0)
    if isinstance(node, ast.TypeCast):
        name, strength = _figure(node.arg)
        if strength <= 1 and node.typeName is not None and node.typeName.names:
            return node.typeName.names[-1].sval, 1
        return name, strength
    if isinstance(node, ast.CollateClause):
        return _figure(node.arg)
    if isinstance(node, ast.GroupingFunc):
        return "grouping", 2
    if isinstance(node, ast.SubLink):
        kind = node.subLinkType
        if kind == SubLinkType.EXISTS_SUBLINK:
            return "exists", 2
        if kind == SubLinkType.ARRAY_SUBLINK:
            return "array", 2
        if kind == SubLinkType.EXPR_SUBLINK:
            inner = node.subselect
            if isinstance(inner, ast.SelectStmt) and inner.targetList:
                first = inner.targetList[0]
                return (first.name, 2) if first.name else _figure(first.val)
        return None, 0
    if isinstance(node, ast.CaseExpr):
        name, strength = _figure(node.defresult) if node.defresult is not None else (None, 0)
        return (name, strength) if strength > 1 else ("case", 1)
    if isinstance(node, ast.A_ArrayExpr):
        return "array", 2
    if isinstance(node, ast.RowExpr):
        return "row", 2
    if isinstance(node, ast.CoalesceExpr):
        return "coalesce", 2
    if isinstance(node, ast.MinMaxExpr):
        return ("greatest" if node.op == MinMaxOp.IS_GREATEST else "least"), 2
    if isinstance(node, ast.SQLValueFunction) and node.op is not None:
        word = node.op.name.lower().removeprefix("svfop_").removesuffix("_n")
        return word, 2
    return None, 0


# PostgreSQL's catalog columns of type name: an array of them (``array_agg(a.attname)``) is
# name[], which drivers leave as its text where they parse text[] into a list (node-postgres),
# and ORMs split that text themselves (Sequelize's showIndex, behind its sync())
_CATALOG_NAMES = frozenset(
    {
        "attname",
        "relname",
        "nspname",
        "typname",
        "proname",
        "conname",
        "rolname",
        "datname",
        "usename",
        "collname",
        "amname",
        "opcname",
        "tgname",
        "extname",
        "lanname",
    }
)
_ARRAYS: dict[str, list[int]] = {}


def name_arrays(query: str) -> list[int]:
    """The positions of ``query``'s result columns that are ``array_agg`` of a catalog column
    of type name (a statement that reads the catalogs; [] for any other)."""
    low = query.lower()
    if "array_agg" not in low or "pg_" not in low:
        return []
    if query in _ARRAYS:
        return _ARRAYS[query]
    found: list[int] = []
    try:
        statements = pglast.parse_sql(query)
    except Exception:
        statements = ()
    select = statements[0].stmt if len(statements) == 1 else None
    if isinstance(select, ast.SelectStmt) and select.targetList:
        for i, target in enumerate(select.targetList):
            value = target.val
            if (
                isinstance(value, ast.FuncCall)
                and value.funcname
                and getattr(value.funcname[-1], "sval", "") == "array_agg"
                and value.args
                and len(value.args) == 1
                and isinstance(arg := value.args[0], ast.ColumnRef)
                and arg.fields
                and getattr(arg.fields[-1], "sval", "") in _CATALOG_NAMES
            ):
                found.append(i)
    if len(_ARRAYS) >= _KEEP:
        _ARRAYS.clear()
    _ARRAYS[query] = found
    return found
