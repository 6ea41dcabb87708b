"""COPY … FROM STDIN and COPY … TO STDOUT on the embedded server: the statement's options,
and PostgreSQL's text and CSV formats read into rows and written from them (``pgbench -i``,
psql's ``\\copy``, psycopg's ``cursor.copy()``). The session moves the data
(``DuckDBSession._copy_in`` / ``_copy_out``); nothing here touches DuckDB or a socket.

Text format: one row per line, columns split by the delimiter (a tab), ``\\N`` for NULL, a
backslash escaping the delimiter, a newline, a backslash and the usual control characters
(``\\t \\n \\r \\b \\f \\v``, octal ``\\123`` and hex ``\\x7f``); a line ``\\.`` ends the data.
CSV: RFC 4180 as PostgreSQL writes it — an unquoted empty field (or the NULL string) is NULL,
a quoted one the empty string. The binary format is not supported.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from proxy.backends.embedded.compat import IDENTIFIER, split_list

__all__ = ["CopyOptions", "CopyStatement", "copy_statement", "read_rows", "write_lines"]


class CopyError(ValueError):
    """The statement or its data is malformed; ``sqlstate`` is PostgreSQL's for it."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


@dataclass(frozen=True, slots=True)
class CopyOptions:
    format: str = "text"  # text | csv
    delimiter: str = "\t"
    null: str = "\\N"
    header: bool = False
    quote: str = '"'
    escape: str = '"'


@dataclass(frozen=True, slots=True)
class CopyStatement:
    direction: str  # "in" (FROM STDIN) or "out" (TO STDOUT)
    table: str | None  # the table (with its column list, if any) …
    columns: str | None
    query: str | None  # … or, out only, the query whose rows are copied
    options: CopyOptions


_NAME = IDENTIFIER
_STATEMENT = re.compile(
    r"\s*copy\s+(?:(?P<table>" + _NAME + r"(?:\s*\.\s*" + _NAME + r")?)\s*"
    r"(?:\((?P<columns>[^()]*)\))?|\((?P<query>.+)\))\s+"
    r"(?P<direction>from\s+stdin|to\s+stdout)\b(?P<options>.*?)\s*;?\s*$",
    re.I | re.S,
)
STDIO = re.compile(r"\s*copy\b.*\b(?:from\s+stdin|to\s+stdout)\b", re.I | re.S)


def copy_statement(sql: str) -> CopyStatement:
    """A COPY FROM STDIN or TO STDOUT statement, read (CopyError 42601/0A000 if it is not
    one this server carries out)."""
    found = _STATEMENT.match(sql)
    if found is None:
        raise CopyError(
            "42601",
            "syntax error in COPY: expected COPY table [(columns)] FROM "
            "STDIN or COPY {table | (query)} TO STDOUT",
        )
    direction = "in" if found.group("direction").lower().startswith("from") else "out"
    if direction == "in" and found.group("query"):
        raise CopyError("42601", "COPY FROM needs a table, not a query")
    return CopyStatement(
        direction,
        found.group("table"),
        found.group("columns"),
        found.group("query"),
        _options(found.group("options")),
    )


_OPTION = re.compile(r"\s*(?P<name>[A-Za-z_]+)(?:\s+(?P<value>'(?:[^']|'')*'|[\w.-]+))?\s*")
_OLD_OPTION = re.compile(
    r"\s*(?:(?P<flag>binary|csv|header)|(?P<name>delimiter|null|quote|escape)\s+(?:as\s+)?"
    r"(?P<value>'(?:[^']|'')*')|(?P<ignored>force\s+(?:not\s+null|quote)\s+[\w\s,\"*]+?"
    r"(?=\s+\w+\s|$)))",
    re.I,
)


def _options(text: str) -> CopyOptions:
    """PostgreSQL's option list (``WITH (FORMAT csv, HEADER)``) or its older form
    (``WITH CSV HEADER DELIMITER ','``)."""
    text = text.strip()
    if text.lower().startswith("with"):
        text = text[4:].strip()
    values: dict[str, str] = {}
    if text.startswith("("):
        if not text.endswith(")"):
            raise CopyError("42601", "syntax error in COPY's options")
        for item in split_list(text[1:-1]):
            found = _OPTION.fullmatch(item)
            if found is None:
                raise CopyError("42601", f"syntax error in COPY's option {item.strip()!r}")
            values[found.group("name").lower()] = _unquote(found.group("value") or "true")
    else:
        position = 0
        while position < len(text):
            found = _OLD_OPTION.match(text, position)
            if found is None or found.end() == position:
                raise CopyError("42601", f"syntax error in COPY at {text[position:]!r}")
            if found.group("flag"):
                flag = found.group("flag").lower()
                if flag == "header":
                    values["header"] = "true"
                else:
                    values["format"] = flag
            elif found.group("name"):
                values[found.group("name").lower()] = _unquote(found.group("value"))
            position = found.end()
    return _checked(values)


def _unquote(value: str) -> str:
    return value[1:-1].replace("''", "'") if value.startswith("'") else value


_IGNORED = {"freeze", "encoding", "force_not_null", "force_null", "force_quote", "on_error"}


def _checked(values: dict[str, str]) -> CopyOptions:
    fmt = values.pop("format", "text").lower()
    if fmt == "binary":
        raise CopyError(
            "0A000",
            "COPY's binary format is not supported by the embedded DuckDB "
            "server: use the text or CSV format",
        )
    if fmt not in ("text", "csv"):
        raise CopyError("22023", f'COPY format "{fmt}" not recognized')
    csv_format = fmt == "csv"
    header = values.pop("header", "false").lower() in ("true", "on", "1", "match")
    delimiter = values.pop("delimiter", "," if csv_format else "\t")
    null = values.pop("null", "" if csv_format else "\\N")
    quote = values.pop("quote", '"')
    escape = values.pop("escape", quote)
    for name in list(values):
        if name in _IGNORED:
            values.pop(name)
    if values:
        raise CopyError("42601", f'option "{next(iter(values))}" not recognized')
    if len(delimiter) != 1:
        raise CopyError("22023", "COPY delimiter must be a single one-byte character")
    if csv_format and (len(quote) != 1 or len(escape) != 1):
        raise CopyError("22023", "COPY quote and escape must be single one-byte characters")
    if not csv_format and header:
        raise CopyError("0A000", "COPY HEADER available only in CSV mode")
    return CopyOptions(fmt, delimiter, null, header, quote, escape)


# -- reading ----------------------------------------------------------------------------------

_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.S)


def _unescape(field: str) -> str:
    def one(found: re.Match[str]) -> str:
        octal, hexa, other = found.groups()
        if octal:
            return chr(int(octal, 8))
        if hexa:
            return chr(int(hexa, 16))
        return _ESCAPES.get(other, other)

    return _ESCAPE.sub(one, field)


def _text_fields(line: str, options: CopyOptions) -> list[str | None]:
    delimiter, null = options.delimiter, options.null
    if "\\" not in line:  # (the common case: nothing escaped)
        return [None if f == null else f for f in line.split(delimiter)]
    fields: list[str | None] = []
    start, i = 0, 0
    while i <= len(line):
        if i == len(line) or line[i] == delimiter:
            raw = line[start:i]
            fields.append(None if raw == null else _unescape(raw))
            start = i + 1
        elif line[i] == "\\":
            i += 1  # (what follows the backslash is data, the delimiter too)
        i += 1
    return fields


def read_rows(
    lines: Sequence[str], options: CopyOptions, first: bool
) -> Iterator[list[str | None]]:
    """The rows of complete lines of COPY data (``first``: these lines start the data, whose
    header line, if any, is skipped). Stops at a ``\\.`` line. Text lines come without their
    newline; CSV's with it (a quoted field may hold one), and all of the data at once."""
    if options.format == "csv":
        yield from _csv_rows(lines, options, first)
        return
    for line in lines:
        if line.endswith("\r"):
            line = line[:-1]
        if line == "\\.":
            return
        yield _text_fields(line, options)


def _csv_rows(
    lines: Sequence[str], options: CopyOptions, first: bool
) -> Iterator[list[str | None]]:
    reader = csv.reader(
        lines,
        delimiter=options.delimiter,
        quotechar=options.quote,
        escapechar=None if options.escape == options.quote else options.escape,
        doublequote=options.escape == options.quote,
        strict=True,
    )
    null = options.null
    try:
        for number, row in enumerate(reader):
            if first and number == 0 and options.header:
                continue
            if row == ["\\."]:
                return
            # (an unquoted empty field is NULL; csv does not tell quoted from unquoted, so a
            # quoted empty string "" reads as NULL too when NULL is the empty string)
            yield [None if f == null else f for f in row]
    except csv.Error as e:
        raise CopyError("22P04", f"bad CSV data: {e}") from None


def csv_lines(text: str) -> list[str]:
    """CSV data as lines that keep their newline (only "\\n" ends one: str.splitlines would
    split at a form feed inside a field too)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def split_lines(pending: str, chunk: str) -> tuple[list[str], str]:
    """The complete lines of ``pending + chunk`` and what is left after the last newline.
    CSV fields may hold newlines inside quotes: the caller reads CSV whole (see the session)."""
    text = pending + chunk
    end = text.rfind("\n")
    if end < 0:
        return [], text
    return text[:end].split("\n"), text[end + 1 :]


# -- writing ----------------------------------------------------------------------------------

_TEXT_SPECIAL = re.compile(r"[\\\t\n\r\b\f\v]")
_TEXT_ESCAPE = {
    "\\": "\\\\",
    "\t": "\\t",
    "\n": "\\n",
    "\r": "\\r",
    "\b": "\\b",
    "\f": "\\f",
    "\v": "\\v",
}


def write_lines(rows: Sequence[Sequence[bytes | None]], options: CopyOptions) -> list[bytes]:
    """Rows of values in PostgreSQL's text output (None for NULL) as COPY data, a line each."""
    if options.format == "csv":
        return [
            (options.delimiter.join(_csv_field(v, options) for v in row) + "\n").encode()
            for row in rows
        ]
    delimiter, null = options.delimiter, options.null
    lines = []
    for row in rows:
        fields = []
        for v in row:
            if v is None:
                fields.append(null)
                continue
            text = v.decode()
            if _TEXT_SPECIAL.search(text) or delimiter in text:
                text = _TEXT_SPECIAL.sub(lambda m: _TEXT_ESCAPE[m.group(0)], text)
                text = text.replace(delimiter, "\\" + delimiter)
            fields.append(text)
        lines.append((delimiter.join(fields) + "\n").encode())
    return lines


def _csv_field(value: bytes | None, options: CopyOptions) -> str:
    """One CSV field as PostgreSQL writes it: NULL as the NULL string unquoted; a value quoted
    when it holds the delimiter, the quote, a line break, or reads as NULL or the end marker."""
    if value is None:
        return options.null
    text, quote = value.decode(), options.quote
    if (
        text == options.null
        or text == "\\."
        or any(c in text for c in (options.delimiter, quote, "\n", "\r"))
        or (options.escape != quote and options.escape in text)
    ):
        if options.escape != quote:
            text = text.replace(options.escape, options.escape * 2)
        return quote + text.replace(quote, options.escape + quote) + quote
    return text
