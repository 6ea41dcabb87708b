"""The η model: per-class resource profiles learned in training, and the A^c_r matrix.

One versioned JSON file (SPEC §5) holds what training measured: per class the service demand
D_r, the nominal fork size f_r, the fork profile (phases), U_r, Q_r, A_r and counts, plus the
K×K matrix ``A[r][c] = A^c_r`` (mean class-r tasks in execution seen when a class-c job is
admitted). How sure training was rides along: D_r's 95 % interval and the isolation runs behind
it, the fork sizes those runs showed, whether the interval converged, Q_r's 95 % interval
(batch means of the concurrent run), and the machine's speed before and after training. These
fields are optional, so files written before them still load.
The η matrix of every policy is derived from those numbers (``admission.policies``) and
written beside them for people to read; on load it is recomputed and checked, so a file
whose η disagrees with its own profiles is rejected rather than silently half-used.

Classes the model has not seen get ``default`` (configurable; by default the median of the
known classes) and enter the A matrix with the PASTA approximation A^c_r ≈ Q_r.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ClassProfile",
    "EtaModel",
    "ModelError",
    "Phase",
    "Profile",
    "Speed",
]

FORMAT = "admission-eta-model"
# a statement's memory above this (1 PiB) is not a measurement: a model file holding it is refused
MAX_MEMORY = float(2**50)
FORMAT_VERSION = 2  # 2: memory (M, spill); a version-1 file still loads, its memory unknown
READABLE_VERSIONS = (1, 2)


log = logging.getLogger("admission.model")


class ModelError(ValueError):
    """A model file that cannot be used; the message names the file and the field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Phase(_Frozen):
    """A stretch of a job's execution with a constant number of active threads."""

    threads: int = Field(ge=1)
    duration: float = Field(ge=0)


class Profile(_Frozen):
    """What admission needs to know of a class (also the default for unknown classes)."""

    D: float = Field(ge=0, description="service demand: mean response time alone (s)")
    f: int = Field(ge=1, description="nominal fork size: threads in the first phase")
    U: float = Field(default=0.0, ge=0, description="mean CPU utilization, share of all cores")
    Q: float = Field(default=0.0, ge=0, description="time-averaged tasks in execution")
    A: float = Field(default=0.0, ge=0, description="mean tasks seen at admission instants")
    M: float | None = Field(
        default=None,
        ge=0,
        le=MAX_MEMORY,
        description="memory one statement takes at its peak (bytes), what admission reserves "
        "for it under a memory budget (None: not measured)",
    )


class ClassProfile(Profile):
    """One measured class."""

    fingerprint: str = Field(min_length=1)
    name: str = Field(min_length=1)
    sample_sql: str = ""
    phases: tuple[Phase, ...] = ()
    count: int = Field(default=0, ge=0, description="executions measured")
    D_low: float | None = Field(default=None, ge=0, description="95 % interval of D: low end")
    D_high: float | None = Field(default=None, ge=0, description="95 % interval of D: high end")
    D_runs: int = Field(default=0, ge=0, description="isolation runs D was measured from")
    D_tail: float | None = Field(
        default=None,
        ge=0,
        description="the service time 9 in 10 of the class's statements end within (measured "
        "live; None: not known): a statement that has run past twice it is one of the class's "
        "rare long ones (the short lane)",
    )
    Q_low: float | None = Field(default=None, ge=0, description="95 % interval of Q: low end")
    Q_high: float | None = Field(default=None, ge=0, description="95 % interval of Q: high end")
    U_low: float | None = Field(default=None, ge=0, description="95 % interval of U: low end")
    U_high: float | None = Field(default=None, ge=0, description="95 % interval of U: high end")
    f_runs: dict[int, int] = Field(
        default_factory=dict,
        description="fork size → isolation runs whose /proc samples showed it",
    )
    f_engine: dict[int, int] = Field(
        default_factory=dict,
        description="fork size → runs the database itself reported it for (DuckDB's profiler: "
        "CPU over wall time; PostgreSQL: 1 + parallel workers launched); where given, f is "
        "taken from it and f_runs is the cross-check",
    )
    f_source: str = Field(
        default="",
        description="where f was taken from: 'duckdb profiler', 'postgresql workers', "
        "'/proc samples' ('': not said, an older file)",
    )
    converged: bool | None = Field(
        default=None, description="whether D's interval got within ±5 % (None: not known)"
    )
    live: int = Field(
        default=0,
        ge=0,
        description="statements the live estimate of D follows (0: D is training's or the "
        "default profile's)",
    )
    profiled: int = Field(
        default=0,
        ge=0,
        description="windows of the live sampler that moved U, Q and A (0: training's or the "
        "default profile's)",
    )
    D_trained: float | None = Field(
        default=None,
        ge=0,
        description="D as training measured it, kept once a live estimate replaced it (the "
        "scale live times are put in, and what a reset goes back to)",
    )
    spill: float | None = Field(
        default=None, ge=0, description="bytes a statement spilled to disk, mean (None: unknown)"
    )
    cost: float | None = Field(
        default=None,
        ge=0,
        description="the database's own estimate of a statement's cost (EXPLAIN): until the "
        "class is measured, D is the known classes' D per unit of cost times this",
    )
    work_mem_units: float | None = Field(
        default=None,
        ge=0,
        le=1e6,
        description="PostgreSQL: how many times over work_mem a statement's memory may grow "
        "(its sorts once, hash tables hash_mem_multiplier times, each per process that runs "
        "it), what a work_mem grant is divided by (None: not known)",
    )

    @model_validator(mode="after")
    def _phases_match_fork_size(self) -> ClassProfile:
        if self.phases and self.phases[0].threads != self.f:
            raise ValueError(
                f"f is {self.f} but the first phase has {self.phases[0].threads} threads"
            )
        return self

    @model_validator(mode="after")
    def _interval_holds_estimate(self) -> ClassProfile:
        if self.D_low is not None and self.D_low > self.D:
            raise ValueError(f"D_low {self.D_low} is above D {self.D}")
        if self.D_high is not None and self.D_high < self.D:
            raise ValueError(f"D_high {self.D_high} is below D {self.D}")
        if self.Q_low is not None and self.Q_low > self.Q:
            raise ValueError(f"Q_low {self.Q_low} is above Q {self.Q}")
        if self.Q_high is not None and self.Q_high < self.Q:
            raise ValueError(f"Q_high {self.Q_high} is below Q {self.Q}")
        if self.U_low is not None and self.U_low > self.U:
            raise ValueError(f"U_low {self.U_low} is above U {self.U}")
        if self.U_high is not None and self.U_high < self.U:
            raise ValueError(f"U_high {self.U_high} is below U {self.U}")
        for name, runs in (("f_runs", self.f_runs), ("f_engine", self.f_engine)):
            if any(size < 1 or n < 1 for size, n in runs.items()):
                raise ValueError(f"{name} maps fork sizes ≥ 1 to run counts ≥ 1")
        if self.f_engine and self.f not in self.f_engine:
            raise ValueError(f"f is {self.f} but no run in f_engine showed it")
        if not self.f_engine and self.f_runs and self.f not in self.f_runs:
            raise ValueError(f"f is {self.f} but no isolation run in f_runs showed it")
        if self.f_runs and self.D_runs and sum(self.f_runs.values()) != self.D_runs:
            raise ValueError(
                f"f_runs counts {sum(self.f_runs.values())} runs but D_runs is {self.D_runs}"
            )
        return self

    @property
    def f_varies(self) -> bool:
        """Whether the runs f was taken from showed more than one fork size."""
        return len(self.f_engine or self.f_runs) > 1


class Speed(_Frozen):
    """The machine-speed reference taken before and after training (``training.speed``)."""

    before: float = Field(gt=0)
    after: float = Field(gt=0)
    unit: str = Field(min_length=1)

    @property
    def change(self) -> float:
        """The relative change from before to after (0.1: 10 % faster afterwards)."""
        return self.after / self.before - 1


class EtaModel(_Frozen):
    """Profiles of K classes and the K×K matrix A[r][c] = A^c_r, in class order."""

    format: str = FORMAT
    version: int = FORMAT_VERSION
    backend: str = "unknown"
    dataset: str = ""
    cores: int = Field(default=1, ge=1)
    mpl: int | None = Field(default=None, ge=1)
    fcr: int | None = Field(default=None, ge=1)
    sample_interval: float = Field(default=0.05, gt=0)
    notes: str = ""
    speed: Speed | None = None
    default: Profile | None = None
    classes: tuple[ClassProfile, ...] = ()
    A_matrix: tuple[tuple[float, ...], ...] = ()
    # 95 % intervals of A_matrix, entry by entry (empty: not measured)
    A_low: tuple[tuple[float, ...], ...] = ()
    A_high: tuple[tuple[float, ...], ...] = ()
    eta: dict[str, tuple[tuple[float, ...], ...]] = Field(default_factory=dict)
    # what each policy's η says, for people to read: the order it admits the classes in,
    # classes the measurements do not tell apart tied (``policies.base.priority_orders``);
    # recomputed on save, not read
    orders: dict[str, list[list[str]] | dict[str, list[list[str]]]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> EtaModel:
        if self.format != FORMAT:
            raise ValueError(f"format is {self.format!r}, expected {FORMAT!r}")
        if self.version not in READABLE_VERSIONS:
            raise ValueError(
                f"version {self.version} is not supported (this reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))})"
            )
        k = len(self.classes)
        seen: set[str] = set()
        for i, c in enumerate(self.classes):
            if c.fingerprint in seen:
                raise ValueError(f"classes[{i}].fingerprint {c.fingerprint!r} appears twice")
            seen.add(c.fingerprint)
        _check_square("A_matrix", self.A_matrix, k, allow_empty=True)
        for name, bound, sign in (("A_low", self.A_low, 1), ("A_high", self.A_high, -1)):
            if not bound:
                continue
            if not self.A_matrix:
                raise ValueError(f"{name} is given but A_matrix is not")
            _check_square(name, bound, k, allow_empty=False)
            for r, row in enumerate(bound):
                for col, v in enumerate(row):
                    a = self.A_matrix[r][col]
                    if v < 0:
                        raise ValueError(f"{name}[{r}][{col}] is negative")
                    if sign * (v - a) > 1e-9 * max(1.0, a):
                        side = "above" if sign > 0 else "below"
                        raise ValueError(f"{name}[{r}][{col}] is {v}, {side} A_matrix's {a}")
        for name, matrix in self.eta.items():
            _check_square(f"eta.{name}", matrix, k, allow_empty=False)
        return self

    # -- lookups ---------------------------------------------------------------------------

    @property
    def fingerprints(self) -> tuple[str, ...]:
        return tuple(c.fingerprint for c in self.classes)

    def index(self) -> dict[str, int]:
        return {c.fingerprint: i for i, c in enumerate(self.classes)}

    def a_matrix(self) -> tuple[tuple[float, ...], ...]:
        """A[r][c]; when training wrote none, the PASTA approximation A^c_r ≈ Q_r."""
        if self.A_matrix:
            return self.A_matrix
        return tuple(tuple(c.Q for _ in self.classes) for c in self.classes)

    def a_bounds(
        self,
    ) -> tuple[tuple[tuple[float, ...], ...] | None, tuple[tuple[float, ...], ...] | None]:
        """The low and high ends of A^c_r's 95 % intervals (None: not measured)."""
        k = len(self.classes)
        ok = self.A_matrix and len(self.A_low) == k and len(self.A_high) == k
        return (self.A_low, self.A_high) if ok else (None, None)

    def default_profile(self) -> Profile:
        """The profile an unseen class starts with."""
        if self.default is not None:
            return self.default
        if not self.classes:
            return Profile(D=1.0, f=1)
        med = statistics.median
        memories = [c.M for c in self.classes if c.M is not None]
        return Profile(
            D=med(c.D for c in self.classes),
            f=max(1, round(med(c.f for c in self.classes))),
            U=med(c.U for c in self.classes),
            Q=med(c.Q for c in self.classes),
            A=med(c.A for c in self.classes),
            M=med(memories) if memories else None,
        )

    @property
    def memory_known(self) -> bool:
        """Whether training measured memory (a version-1 file did not: every class's M is the
        default profile's, and a memory budget reserves nothing for them)."""
        return any(c.M is not None for c in self.classes)

    def with_class(self, fingerprint: str, name: str, sample_sql: str = "") -> EtaModel:
        """A copy with one more class, on the default profile (for classes seen live)."""
        d = self.default_profile()
        new = ClassProfile(
            fingerprint=fingerprint, name=name, sample_sql=sample_sql[:2000], **d.model_dump()
        )
        a = self.a_matrix()
        rows = [(*row, self.classes[r].Q) for r, row in enumerate(a)]
        rows.append(tuple(d.Q for _ in range(len(self.classes) + 1)))
        update: dict[str, object] = {
            "classes": (*self.classes, new),
            "A_matrix": tuple(rows),
            "eta": {},
            "orders": {},
        }
        low, high = self.a_bounds()
        if low is not None and high is not None:  # the new row and column: points, no interval
            update["A_low"] = tuple(
                (*low[r], rows[r][-1]) if r < len(low) else rows[r] for r in range(len(rows))
            )
            update["A_high"] = tuple(
                (*high[r], rows[r][-1]) if r < len(high) else rows[r] for r in range(len(rows))
            )
        return self.model_copy(update=update)

    # -- files -----------------------------------------------------------------------------

    def with_eta(self) -> EtaModel:
        """A copy whose ``eta`` holds every registered policy's matrix (what ``save`` writes)."""
        from admission.policies import POLICIES
        from admission.policies.base import priority_orders

        names = [c.name for c in self.classes]
        built = {n: p.build(self) for n, p in POLICIES.items()}
        return self.model_copy(
            update={
                "eta": {n: b.eta for n, b in built.items()},
                "orders": {n: priority_orders(names, b) for n, b in built.items()},
            }
        )

    def to_json(self) -> str:
        current = self.with_eta().model_copy(update={"version": FORMAT_VERSION})
        return json.dumps(current.model_dump(mode="json"), indent=1, allow_nan=False)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a crash leaves the old file or the new one, never half of one."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent or ".", prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(self.to_json())
                out.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> EtaModel:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelError(f"{source}: not valid JSON ({e})") from None
        except RecursionError:
            raise ModelError(f"{source}: not a model file (JSON nested too deeply)") from None
        if not isinstance(raw, dict):
            raise ModelError(f"{source}: expected a JSON object at the top level")
        try:
            model = cls.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            loc = first["loc"]
            if len(loc) > 1 and loc[0] == "classes" and isinstance(loc[1], int):
                entries = raw.get("classes") if isinstance(raw, dict) else None
                entry = entries[loc[1]] if isinstance(entries, list) else None
                name = entry.get("name") if isinstance(entry, dict) else None
                if isinstance(name, str):
                    where += f" (class {name})"
            more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
            raise ModelError(f"{source}: field {where}: {first['msg']}{more}") from None
        model._check_eta(source)
        if model.version < 2 and model.classes:
            log.warning(
                "%s: a model of format version %d has no memory measured: its classes take the "
                "default profile's (none), so a memory budget reserves nothing for them; train "
                "again to have it",
                source,
                model.version,
            )
        return model

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EtaModel:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ModelError(f"{path}: cannot read the model file ({e.strerror})") from None
        except UnicodeDecodeError:
            raise ModelError(f"{path}: not a model file (not UTF-8 text)") from None
        return cls.from_json(text, str(path))

    def _check_eta(self, source: str) -> None:
        """The η written in the file must be what its own profiles give."""
        from admission.policies import POLICIES

        for name, matrix in self.eta.items():
            if name not in POLICIES:
                raise ModelError(f"{source}: field eta.{name}: unknown policy")
            expected = POLICIES[name].build(self).eta
            for r, row in enumerate(matrix):
                for c, value in enumerate(row):
                    if not math.isclose(value, expected[r][c], rel_tol=1e-6, abs_tol=1e-9):
                        raise ModelError(
                            f"{source}: field eta.{name}[{r}][{c}] is {value} but the class "
                            f"profiles give {expected[r][c]}; the file was edited or is corrupt "
                            "(remove the eta section to have it recomputed)"
                        )


def _check_square(field: str, m: Sequence[Sequence[float]], k: int, *, allow_empty: bool) -> None:
    if allow_empty and not m:
        return
    if len(m) != k or any(len(row) != k for row in m):
        raise ValueError(f"{field} must be {k}×{k} (one row and column per class)")
    for r, row in enumerate(m):
        for c, v in enumerate(row):
            if not math.isfinite(v):
                raise ValueError(f"{field}[{r}][{c}] is not a finite number")
