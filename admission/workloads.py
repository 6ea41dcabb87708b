"""Workload classes: tenants with weights, priorities and limits, and background work.

A *workload class* (a tenant) is a set of statements that share a weight, a priority tier and
optional limits; it is chosen per statement from the connection (user, database,
application_name, matched by glob patterns) or from a comment tag in the statement,
``/* admission: tenant=web, priority=batch */``. The statement *class* (its SQL skeleton) is a
different axis: the learned policy orders the statements of one tenant by their classes.

The scheduler (``admission.scheduler``) decides in three steps:

1. **Tier, strictly**: interactive before batch before background. A batch statement that
   waited ``max_wait`` is aged into the interactive tier, so batch never starves. Background
   statements run only when no foreground statement waits, the foreground is predicted to
   stay idle (``IdlePredictor``) and the feedback signal is under its bound.
2. **Tenant, by deficit round robin** within the tier (Wang & Merchant's modified DRR, after
   Shreedhar & Varghese): each round a tenant gets a quantum of service proportional to its
   weight; a statement is charged its class's expected service time when admitted and the
   difference to its measured time when it completes, so a tenant of long statements skips
   rounds rather than taking more than its share. Tokens of a tenant with nothing waiting or
   running vanish (unused share goes to the others); a tenant with tokens, statements in
   service and none queued is *held* for up to ``hold`` seconds (its next statement usually
   follows its last within milliseconds in a closed loop). The MPL is the paper's bound D on
   outstanding work. Service is measured in statement-seconds in service (the unit the MPL
   shares).
3. **Statement**: within the tenant, the learned policy (the η scores, aging, due rule).

This module holds the configuration (parsed from TOML, validated with clear errors), the
matcher, the tag parser and the idle-period predictor; all pure.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import re
import tomllib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_WORKLOAD",
    "IdlePredictor",
    "Tier",
    "Workload",
    "WorkloadConfig",
    "WorkloadError",
    "parse_tag",
]

DEFAULT_WORKLOAD = "default"  # statements no rule matches (weight 1, interactive, no limits)


class WorkloadError(ValueError):
    """A workload-classes file that cannot be used; the message names the file and the field."""


class Tier(IntEnum):
    """Priority tiers, highest first (strict priority between them)."""

    INTERACTIVE = 0
    BATCH = 1
    BACKGROUND = 2

    @classmethod
    def parse(cls, text: str) -> Tier:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(t.name.lower() for t in cls)
            raise WorkloadError(f"priority must be one of {names}, not {text!r}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


_MATCH_KEYS = ("user", "database", "application_name")


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload class. ``match``: connection attribute → glob pattern, all must match (an
    empty match selects nothing by the connection: only a tag can choose it)."""

    name: str
    weight: float = 1.0
    tier: Tier = Tier.INTERACTIVE
    match: tuple[tuple[str, str], ...] = ()
    mpl: int | None = None  # statements of this tenant in service at most
    threads: int | None = None  # thread-budget units it may hold at most
    memory_share: float | None = None  # share of the memory budget it may hold at most
    queue_timeout: float | None = None  # its statements fail after waiting this long
    max_wait: float | None = None  # batch aging: waited this long, it competes as interactive

    def __post_init__(self) -> None:
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise WorkloadError(
                f"workload {self.name!r}: weight must be positive, not {self.weight}"
            )

    def matches(self, attrs: Mapping[str, str]) -> bool:
        if not self.match:
            return False
        return all(fnmatch.fnmatchcase(attrs.get(k, ""), pattern) for k, pattern in self.match)


_TAG = re.compile(r"/\*\s*admission:\s*(.*?)\*/", re.S | re.I)
_PAIR = re.compile(r"([A-Za-z_]+)\s*=\s*([A-Za-z0-9_.\-]+)")


def parse_tag(sql: str) -> dict[str, str]:
    """The ``/* admission: key=value, … */`` comment of a statement (keys lowercased), or {}.
    A cheap substring test first: most statements carry no comment at all."""
    if "/*" not in sql:
        return {}
    found = _TAG.search(sql)
    if found is None:
        return {}
    return {k.lower(): v for k, v in _PAIR.findall(found.group(1))}


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """The workload classes of one proxy, and the knobs of the tenant scheduler."""

    workloads: tuple[Workload, ...] = ()
    hold: float = (
        0.002  # DRR hold rule: seconds a tenant with tokens and work in service keeps its turn
    )
    batch_max_wait: float | None = 30.0  # default aging of batch tiers (a workload may override)
    background_mpl: int = 1  # background statements in service at most (beside the MPL)
    idle_wait: float | None = None  # conservative idle wait before background (None: learned)
    pressure_bound: float | None = None  # feedback: no background while the signal is above
    allow_tags: bool = True  # whether a statement's comment tag may choose its tenant
    # PostgreSQL on this host: the niceness of a backend process while it runs a batch or
    # background statement (None: none); interactive statements run at 0 (proxy.server)
    renice: int | None = None
    source: str = ""  # the file it came from, for messages
    _matched: dict[tuple[str, ...], Workload] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        names = [w.name for w in self.workloads]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise WorkloadError(f"{self._where}workload names must be unique: {sorted(dup)}")
        if self.hold < 0 or self.background_mpl < 1:
            raise WorkloadError(f"{self._where}hold must be ≥ 0 and background_mpl ≥ 1")
        if self.renice is not None and not 1 <= self.renice <= 19:
            raise WorkloadError(f"{self._where}renice must be a niceness from 1 to 19")

    @property
    def _where(self) -> str:
        return f"{self.source}: " if self.source else ""

    def workload(self, name: str) -> Workload:
        for w in self.workloads:
            if w.name == name:
                return w
        if name == DEFAULT_WORKLOAD:
            return Workload(DEFAULT_WORKLOAD)
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        out = [w.name for w in self.workloads]
        return out if DEFAULT_WORKLOAD in out else [*out, DEFAULT_WORKLOAD]

    def assign(self, attrs: Mapping[str, str], sql: str = "") -> tuple[str, Tier]:
        """The tenant and tier of a statement: its tag's ``tenant`` (if tags are allowed and it
        names a workload), else the first workload whose match fits the connection, else
        ``default``. A tag's ``priority`` may lower the tier, never raise it (a client cannot
        promote itself above what its workload is given)."""
        tag = parse_tag(sql) if sql else {}
        chosen: Workload | None = None
        if tag and self.allow_tags and "tenant" in tag:
            try:
                chosen = self.workload(tag["tenant"])
            except KeyError:
                chosen = None
        if chosen is None:
            chosen = self._by_connection(attrs)
        tier = chosen.tier
        if tag and "priority" in tag:
            # an unknown priority in a comment is ignored, not an error for the client
            with contextlib.suppress(WorkloadError):
                tier = max(tier, Tier.parse(tag["priority"]))
        return chosen.name, tier

    def _by_connection(self, attrs: Mapping[str, str]) -> Workload:
        """The first workload whose match fits the connection, else ``default``; remembered
        per (user, database, application_name): a connection's statements ask it each."""
        key = tuple(attrs.get(k, "") for k in _MATCH_KEYS)
        found = self._matched.get(key)
        if found is None:
            found = next((w for w in self.workloads if w.matches(attrs)), None)
            found = found or self.workload(DEFAULT_WORKLOAD)
            if len(self._matched) >= 4096:  # (bounded: application names may vary freely)
                self._matched.clear()
            self._matched[key] = found
        return found

    @classmethod
    def load(cls, path: str | Path) -> WorkloadConfig:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise WorkloadError(f"{p}: no such workload-classes file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{p}: cannot read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise WorkloadError(f"{p}: not valid TOML: {exc}") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "") -> WorkloadConfig:
        where = f"{source}: " if source else ""
        known_top = {"workload", "scheduler", "background"}
        extra = set(data) - known_top
        if extra:
            raise WorkloadError(
                f"{where}unknown section(s) {sorted(extra)}; expected [[workload]], "
                "[scheduler], [background]"
            )
        items = data.get("workload", [])
        if not isinstance(items, list):
            raise WorkloadError(f"{where}'workload' must be an array of tables ([[workload]])")
        workloads = tuple(_workload(item, i, where) for i, item in enumerate(items))
        sched = _table(data, "scheduler", where)
        bg = _table(data, "background", where)
        _only(sched, {"hold", "batch_max_wait", "allow_tags", "renice"}, f"{where}[scheduler]")
        renice = sched.get("renice")
        if renice is not None and (isinstance(renice, bool) or not isinstance(renice, int)):
            raise WorkloadError(f"{where}renice must be a whole number from 1 to 19")
        _only(bg, {"mpl", "idle_wait", "pressure_bound"}, f"{where}[background]")
        return cls(
            workloads=workloads,
            hold=_number(sched, "hold", where, 0.002, low=0.0),
            batch_max_wait=_optional_number(sched, "batch_max_wait", where, 30.0),
            allow_tags=bool(sched.get("allow_tags", True)),
            renice=renice,
            background_mpl=int(_number(bg, "mpl", where, 1, low=1)),
            idle_wait=_optional_number(bg, "idle_wait", where, None),
            pressure_bound=_optional_number(bg, "pressure_bound", where, None),
            source=source,
        )

    def describe(self) -> list[dict[str, Any]]:
        """Every workload as the admin API shows it."""
        out = []
        for name in self.names:
            w = self.workload(name)
            out.append(
                {
                    "name": w.name,
                    "weight": w.weight,
                    "priority": w.tier.label,
                    "match": dict(w.match),
                    "mpl": w.mpl,
                    "threads": w.threads,
                    "memory_share": w.memory_share,
                    "queue_timeout": w.queue_timeout,
                    "max_wait": w.max_wait,
                }
            )
        return out


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{where}[{key}] must be a table")
    return value


def _only(table: Mapping[str, Any], keys: set[str], where: str) -> None:
    extra = set(table) - keys
    if extra:
        raise WorkloadError(f"{where}: unknown key(s) {sorted(extra)}; known: {sorted(keys)}")


def _number(
    table: Mapping[str, Any], key: str, where: str, default: float, *, low: float | None = None
) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{where}{key} must be a number, not {value!r}")
    if low is not None and value < low:
        raise WorkloadError(f"{where}{key} must be at least {low:g}, not {value!r}")
    return float(value)


def _optional_number(
    table: Mapping[str, Any], key: str, where: str, default: float | None
) -> float | None:
    if key not in table:
        return default
    value = table[key]
    if value is False or value == "none":
        return None
    return _number(table, key, where, 0.0, low=0.0)


_WORKLOAD_KEYS = {
    "name",
    "weight",
    "priority",
    "match",
    "mpl",
    "threads",
    "memory_share",
    "queue_timeout",
    "max_wait",
}


def _workload(item: Any, i: int, where: str) -> Workload:
    if not isinstance(item, Mapping):
        raise WorkloadError(f"{where}workload #{i + 1} must be a table")
    name = item.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,63}", name):
        raise WorkloadError(
            f"{where}workload #{i + 1}: name must be 1–63 letters, digits, '_', '.' or '-', "
            f"not {name!r}"
        )
    at = f"{where}workload {name!r}: "
    _only(item, _WORKLOAD_KEYS, at.rstrip(": "))
    weight = _number(item, "weight", at, 1.0)
    if weight <= 0:
        raise WorkloadError(f"{at}weight must be positive, not {weight:g}")
    try:
        tier = Tier.parse(str(item.get("priority", "interactive")))
    except WorkloadError as exc:
        raise WorkloadError(f"{at}{exc}") from None
    match = item.get("match", {})
    if not isinstance(match, Mapping):
        raise WorkloadError(f'{at}match must be a table, e.g. {{ user = "app*" }}')
    bad = set(match) - set(_MATCH_KEYS)
    if bad:
        raise WorkloadError(f"{at}match on {sorted(bad)}: only {list(_MATCH_KEYS)}")
    for k, v in match.items():
        if not isinstance(v, str):
            raise WorkloadError(f"{at}match.{k} must be a string (a glob pattern)")
    limits: dict[str, Any] = {}
    for key in ("mpl", "threads"):
        if key in item:
            value = item[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"{at}{key} must be a whole number ≥ 1, not {value!r}")
            limits[key] = value
    if "memory_share" in item:
        share = _number(item, "memory_share", at, 1.0)
        if not 0 < share <= 1:
            raise WorkloadError(f"{at}memory_share must be in (0, 1], not {share:g}")
        limits["memory_share"] = share
    for key in ("queue_timeout", "max_wait"):
        if key in item:
            limits[key] = _number(item, key, at, 0.0, low=0.0)
    return Workload(
        name=name,
        weight=weight,
        tier=tier,
        match=tuple(sorted((str(k), str(v)) for k, v in match.items())),
        **limits,
    )


# -- background work in predicted idle periods -------------------------------------------------


@dataclass(slots=True)
class IdlePredictor:
    """When background work may start: the dynamic policy of Busy-Bee (Mi, Riska, Smirni, Riedel).

    The foreground's *busy periods* (from the first foreground statement to the moment none is
    queued or in service) are measured in statements. Over a window of recent busy periods,
    the 90th percentile of their lengths separates *long* from *short*; the *cluster window
    size* CWS is the smallest lag L with Σ_{l ≤ L} P(busy period l later is long | this one is
    long) ≥ 0.8 (at most 20). After a long busy period the next CWS idle periods are used
    *conservatively* (background waits ``idle_wait`` into the idle period: only long idle
    periods carry background work); otherwise *aggressively* (at once). ``idle_wait`` is the
    configured one, or learned: the median idle period seen (half of the idle periods are
    shorter: a background statement started then would delay the next busy period).

    Pure: the scheduler tells it of busy/idle transitions with the time.
    """

    window: int = 200  # busy periods kept
    idle_wait_fixed: float | None = None
    lengths: deque[int] = field(default_factory=lambda: deque(maxlen=200))
    idles: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    threshold: int = 4  # a busy period of at least this many statements is long
    cws: int = 1
    cluster_left: int = 0  # idle periods still to use conservatively
    busy: bool = False
    current: int = 0  # statements in the current busy period
    idle_since: float = 0.0
    _updates: int = 0

    def __post_init__(self) -> None:
        self.lengths = deque(maxlen=self.window)
        self.idles = deque(maxlen=self.window)

    @property
    def idle_wait(self) -> float:
        if self.idle_wait_fixed is not None:
            return self.idle_wait_fixed
        if not self.idles:
            return 0.0
        ordered = sorted(self.idles)
        return ordered[len(ordered) // 2]

    @property
    def conservative(self) -> bool:
        return self.cluster_left > 0

    def arrival(self, now: float) -> None:
        """A foreground statement arrived."""
        if not self.busy:
            self.busy = True
            self.current = 0
            if self.idle_since > 0 or self.lengths:
                self.idles.append(max(0.0, now - self.idle_since))
            if self.cluster_left > 0:
                self.cluster_left -= 1
        self.current += 1

    def idle(self, now: float) -> None:
        """The foreground has nothing queued or in service any more."""
        if not self.busy:
            return
        self.busy = False
        self.idle_since = now
        self.lengths.append(self.current)
        if self.current >= self.threshold:
            self.cluster_left = self.cws
        self._updates += 1
        if self._updates >= 20:
            self._updates = 0
            self._recharacterize()

    def start_at(self) -> float | None:
        """When background may start in the current idle period (None: busy now)."""
        if self.busy:
            return None
        return self.idle_since + (self.idle_wait if self.conservative else 0.0)

    def _recharacterize(self) -> None:
        lengths = list(self.lengths)
        if len(lengths) < 10:
            return
        ordered = sorted(lengths)
        self.threshold = max(2, ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)])
        long = [n >= self.threshold for n in lengths]
        self.cws = _cluster_window(long)


def _cluster_window(long: Iterable[bool], horizon: int = 20, mass: float = 0.8) -> int:
    """CWS (Busy-Bee Eq. 1): the smallest lag whose cumulated P(lag-th next is long | long)
    reaches ``mass``; ``horizon`` when it never does."""
    flags = list(long)
    starts = [i for i, f in enumerate(flags) if f]
    total = 0.0
    for lag in range(1, horizon + 1):
        pairs = [flags[i + lag] for i in starts if i + lag < len(flags)]
        if pairs:
            total += sum(pairs) / len(pairs)
        if total >= mass:
            return lag
    return horizon
