"""DuckDB exceptions → PostgreSQL SQLSTATEs, so clients see the error classes they expect."""

from __future__ import annotations

import duckdb

__all__ = ["sqlstate_for", "sqlstate_for_message"]

_BY_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (duckdb.ParserException, "42601"),  # syntax_error
    (duckdb.InterruptException, "57014"),  # query_canceled
    (duckdb.ConstraintException, "23505"),
    (duckdb.ConversionException, "22P02"),  # invalid_text_representation
    (duckdb.OutOfRangeException, "22003"),  # numeric_value_out_of_range
    (duckdb.TransactionException, "25P02"),
    (duckdb.NotImplementedException, "0A000"),
    (duckdb.PermissionException, "42501"),
    (duckdb.OutOfMemoryException, "53200"),
    (duckdb.IOException, "58030"),
    (duckdb.InvalidInputException, "22023"),
    (duckdb.CatalogException, "42P01"),
    (duckdb.BinderException, "42703"),
    (duckdb.ProgrammingError, "42000"),
    (duckdb.DataError, "22000"),
)


def sqlstate_for(error: BaseException) -> str:
    message = str(error)
    if "Division by zero" in message:
        return "22012"
    if isinstance(error, duckdb.CatalogException) and "does not exist" in message:
        if "Table with name" in message or "Table " in message:
            return "42P01"  # undefined_table
        if "Function" in message:
            return "42883"  # undefined_function
    if isinstance(error, duckdb.TransactionException) and "onflict" in message:
        # two transactions wrote the same row (DuckDB's optimistic concurrency): PostgreSQL's
        # "could not serialize access due to concurrent update", which clients retry
        # (pgbench --max-tries, retrying ORMs)
        return "40001"  # serialization_failure
    if "duplicate key" in message:  # a key checked at COMMIT fails the commit itself
        return "23505"  # unique_violation
    if isinstance(error, duckdb.ConstraintException) and "NOT NULL" in message:
        return "23502"
    if isinstance(error, duckdb.ConstraintException) and "foreign key" in message:
        return "23503"  # foreign_key_violation (ORMs tell it from a duplicate key by it)
    if isinstance(error, duckdb.ConstraintException) and "CHECK constraint" in message:
        return "23514"  # check_violation
    if isinstance(error, duckdb.BinderException) and "column" not in message.lower():
        return "42804"  # datatype_mismatch and other binding errors
    for cls, state in _BY_CLASS:
        if isinstance(error, cls):
            return state
    return "XX000"


# DuckDB's error messages start with the name of their class ("Conversion Error: …")
_BY_PREFIX: dict[str, type[duckdb.Error]] = {
    "Parser": duckdb.ParserException,
    "INTERRUPT": duckdb.InterruptException,
    "Interrupt": duckdb.InterruptException,
    "Constraint": duckdb.ConstraintException,
    "Conversion": duckdb.ConversionException,
    "Out of Range": duckdb.OutOfRangeException,
    "TransactionContext": duckdb.TransactionException,
    "Not implemented": duckdb.NotImplementedException,
    "Permission": duckdb.PermissionException,
    "Out of Memory": duckdb.OutOfMemoryException,
    "IO": duckdb.IOException,
    "Invalid Input": duckdb.InvalidInputException,
    "Catalog": duckdb.CatalogException,
    "Binder": duckdb.BinderException,
}


def sqlstate_for_message(message: str) -> str:
    """``sqlstate_for`` for an error known only by its message (an Arrow stream's)."""
    prefix = message.split(" Error:", 1)[0] if " Error:" in message else ""
    cls = _BY_PREFIX.get(prefix.strip(), duckdb.Error)
    return sqlstate_for(cls(message))
