"""SQL text → query class (the statement's *skeleton*).

A class is one query shape: the same statement with other constants, IN-lists, whitespace or
comments is the same class. Three sources, in order of precedence:

1. a hint comment ``/* admission:class=NAME */`` anywhere in the text: the application names
   the class itself (useful when two shapes should share a profile, or for readable names);
2. the libpg_query fingerprint (via pglast) when the text parses as PostgreSQL: constants are
   ignored by construction, so it is robust to every formatting difference;
3. otherwise a normaliser for other dialects (DuckDB's, say): comments dropped, string and
   numeric literals replaced by ``?``, IN-lists and VALUES lists folded, whitespace and case
   folded; the class is a hash of that skeleton.

Classification never raises: empty text, garbage and multi-statement strings all get a class.
Session-control statements (SET, SHOW, BEGIN, …) are flagged ``control`` so that the gate lets
them bypass the admission queue (SPEC §4).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from pglast import parser as _pg

from admission.native import native

__all__ = ["QueryClass", "classify_sql", "normalize_sql"]

HINT = re.compile(r"/\*\s*admission:class\s*=\s*([A-Za-z0-9_.:\-]+)\s*\*/")

# Statements that must never wait behind other clients' work (SPEC §4).
CONTROL_VERBS = frozenset(
    {
        "set",
        "show",
        "reset",
        "begin",
        "start",
        "commit",
        "end",
        "rollback",
        "abort",
        "savepoint",
        "release",
        "discard",
        "listen",
        "unlisten",
        "deallocate",
    }
)


@dataclass(frozen=True, slots=True)
class QueryClass:
    """One SQL skeleton.

    ``fingerprint`` is stable across runs and versions of this package for the same skeleton
    (prefix ``pg:`` for libpg_query fingerprints, ``sk:`` for normalised skeletons, ``hint:``
    for named classes); ``name`` is a readable label; ``control`` marks session-control
    statements that bypass admission.
    """

    fingerprint: str
    name: str
    control: bool = False


_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_STRINGS = re.compile(r"(?:[EeBbXxNnUu]&?)?'(?:[^']|'')*'|\$([A-Za-z_]*)\$.*?\$\1\$", re.S)
_NUMBERS = re.compile(r"(?<![\w$])[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")
_LISTS = re.compile(r"\(\s*\?(?:\s*,\s*\?)+\s*\)")
_VALUES_ROWS = re.compile(r"(\(\s*\?\s*\))(?:\s*,\s*\(\s*\?\s*\))+")
_SPACE = re.compile(r"\s+")
_SPACE_PUNCT = re.compile(r"\s*([(),;=<>+*/-])\s*")
# A table name follows FROM/JOIN/INTO/UPDATE and is not closed by ")" (as in extract(x from col)).
_FROM_TABLES = re.compile(r"\b(?:from|join|into|update)\s+([a-z_][a-z0-9_.]*)\b(?!\s*\))")


def normalize_sql(text: str) -> str:
    """The dialect-agnostic skeleton of ``text`` (used when libpg_query cannot parse it)."""
    s = _COMMENTS.sub(" ", text)
    s = _STRINGS.sub("?", s)
    s = _NUMBERS.sub("?", s)
    s = _SPACE.sub(" ", s).strip().lower()
    s = _SPACE_PUNCT.sub(r"\1", s)
    # Fold repeatedly: a list of lists folds from the inside out.
    while True:
        folded = _VALUES_ROWS.sub(r"\1", _LISTS.sub("(?)", s))
        if folded == s:
            break
        s = folded
    return s.rstrip(";")


_WORD = re.compile(r"[a-z_]+")


def _verb(statement: str) -> str:
    match = _WORD.match(statement.lstrip("( "))
    return match.group(0) if match else ""


def _is_control(skeleton: str) -> bool:
    """Every statement in the text is session control (an empty text counts as control)."""
    return all(_verb(s) in CONTROL_VERBS for s in skeleton.split(";") if s.strip())


def _label(verb: str, skeleton: str, fingerprint: str) -> str:
    tables: list[str] = []
    for table in _FROM_TABLES.findall(skeleton):
        if table not in tables and table not in {"select", "lateral"}:
            tables.append(table)
    shown = ",".join(tables[:3]) + (",…" if len(tables) > 3 else "")
    digest = fingerprint.split(":", 1)[1][:8]
    return f"{verb or 'empty'}{'(' + shown + ')' if shown else ''}#{digest}"


# A fingerprint always stands for the same statements, so its label and control flag are
# worked out once (the normaliser is the slow part) and remembered; a bounded dict suffices
# because a workload has few classes.
_KNOWN: dict[str, QueryClass] = {}
_KNOWN_LIMIT = 65_536

# Texts sent with their constants inline (the simple protocol) are rarely the same twice, so a
# cache by text misses and every statement would be parsed again (about 4 µs, the largest part
# of the proxy's work per statement). A data-manipulation statement with its numeric literals
# blanked out is a finer key than the fingerprint — libpg_query ignores constants — so texts
# that share that key share a class. A key is trusted after its first few texts were
# classified in full and agreed; one that ever disagrees is never trusted again.
# (whitespace and a name's characters as the lexer has them; the keyword in ASCII, any case)
_DML = re.compile(
    r"[ \t\n\r\f\v]*(?:select|with|insert|update|delete|values|table)"
    r"(?![A-Za-z0-9_$\x80-\U0010FFFF])",
    re.I | re.A,
)
# A number as PostgreSQL's lexer reads one: ASCII digits (with a dot, or a dot and digits, and
# an exponent) not glued to a name, a parameter or another number — where a name is made of
# ASCII letters, digits, _ and $ and of any non-ASCII character (scan.l's ident_cont), so that
# "€1" and "٣" stay names. As a plain pattern:
#   (?<![A-Za-z0-9_$.\x80-\U0010FFFF])(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?
# written here to start with a digit or a dot, so the engine scans for those instead of trying
# the look-behind at every position (0.65 µs per pgbench text instead of 1.4).
_NUMERIC_LITERAL = re.compile(
    r"[0-9.](?<![A-Za-z0-9_$.\x80-\U0010FFFF][0-9.])"
    r"(?:(?<=[0-9])[0-9]*\.?[0-9]*|(?<=\.)[0-9]+)(?:[eE][-+]?[0-9]+)?"
)
_CHECKS = 3  # texts classified in full before a key is trusted
_BY_KEY: dict[str, tuple[QueryClass | None, int]] = {}  # key → (class, agreeing texts)
_UNSEEN: tuple[QueryClass | None, int] = (None, 0)
_BY_KEY_LIMIT = 65_536


# (these caches are handed to the C module once: clear them, never rebind them)
_TEXTS: dict[str, QueryClass] = {}  # recent texts (prepared statements repeat their text)
_TEXTS_LIMIT = 8192


def literal_key(text: str) -> str | None:
    """``text`` with its numeric literals blanked, when that is a safe cache key: one DML
    statement, no quoted identifiers (a number inside one is part of a name), no hint."""
    if '"' in text or "admission:class" in text or not _DML.match(text):
        return None
    semicolon = text.find(";")
    if semicolon >= 0 and text[semicolon + 1 :].strip(" \t\n\r\f\v"):
        return None  # several statements
    return _NUMERIC_LITERAL.sub("0", text)


# The same in C (admission/_literal.c) when built: the regular expressions above are most of
# the classifier's work per simple-protocol statement.
_c_literal = native("admission._literal")
_literal_key: Callable[[str], str | None] = (
    literal_key if _c_literal is None else _c_literal.literal_key
)


def classify_sql(text: str) -> QueryClass:
    """Return the class of one SQL text (possibly several statements). Never raises.

    (When the C module is built, ``classify_sql`` is its version of this function: the same
    cache hits in C, everything else through ``_classify_missed``.)"""
    found = _TEXTS.get(text)
    if found is not None:
        return found
    key = _literal_key(text)
    if key is not None:
        cached, agreed = _BY_KEY.get(key, _UNSEEN)
        if cached is not None and agreed >= _CHECKS:
            return cached
    return _classify_missed(text, key)


def _classify_missed(text: str, key: str | None) -> QueryClass:
    """``classify_sql`` past its caches: classify the text in full, and count whether it
    agrees with the class its literal key had."""
    if key is None:
        return _classify_cached(text)
    cached, agreed = _BY_KEY.get(key, _UNSEEN)
    found = _classify_cached(text)
    if agreed == 0:
        if len(_BY_KEY) < _BY_KEY_LIMIT:
            _BY_KEY[key] = (found, 1)
    elif cached is not None:
        # a shape whose numbers are not all constants (or a bug): never shortcut it
        _BY_KEY[key] = (cached, agreed + 1) if cached == found else (None, 1)
    return found


classify_sql_py = classify_sql  # the reference, which the C version is tested against
if _c_literal is not None:
    _c_literal.setup(_TEXTS, _BY_KEY, _CHECKS, _classify_missed)
    classify_sql = _c_literal.classify_sql


def _classify_cached(text: str) -> QueryClass:
    found = _classify(text)
    if len(_TEXTS) >= _TEXTS_LIMIT:
        _TEXTS.clear()  # cheaper than LRU bookkeeping on every statement; refills at once
    _TEXTS[text] = found
    return found


def _classify(text: str) -> QueryClass:
    if "admission:class" in text:
        hint = HINT.search(text)
        if hint:
            name = hint.group(1)
            return QueryClass(f"hint:{name}", name, _is_control(normalize_sql(text)))
    skeleton = None
    try:
        fingerprint = "pg:" + _pg.fingerprint(text)
    except Exception:  # pglast raises ParseError, or ValueError for NUL bytes and the like
        skeleton = normalize_sql(text)
        digest = hashlib.sha1(skeleton.encode(), usedforsecurity=False).hexdigest()[:16]
        fingerprint = "sk:" + digest
    known = _KNOWN.get(fingerprint)
    if known is not None:
        return known
    if skeleton is None:
        skeleton = normalize_sql(text)
    label = _label(_verb(skeleton), skeleton, fingerprint)
    found = QueryClass(fingerprint, label, _is_control(skeleton))
    if len(_KNOWN) < _KNOWN_LIMIT:
        _KNOWN[fingerprint] = found
    return found
