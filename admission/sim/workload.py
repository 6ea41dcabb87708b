"""What the simulator runs: classes with fork/join phases, and the mix they come in.

A class is a list of phases (f_i tasks, each with per-core demand d_i). Synthetic workloads are
the thesis' Table 5.2; trace-driven classes come from a model file written by training (its
measured phases per class).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from admission.model import ClassProfile, EtaModel, Phase

__all__ = ["MIXES", "SYNTHETIC", "SimClass", "Workload", "populations", "synthetic"]


@dataclass(frozen=True, slots=True)
class SimClass:
    """One class: its phases as (tasks, per-task demand) pairs."""

    name: str
    phases: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError(f"class {self.name}: at least one phase is needed")
        for f, d in self.phases:
            if f < 1 or d < 0:
                raise ValueError(f"class {self.name}: phase ({f}, {d}) needs f ≥ 1 and d ≥ 0")

    @property
    def fork(self) -> int:
        """Nominal fork size f_{j,1}."""
        return self.phases[0][0]

    @property
    def work(self) -> float:
        """Core-seconds per job."""
        return sum(f * d for f, d in self.phases)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    classes: tuple[SimClass, ...]

    def model(
        self, cores: int, fcr: int | None, demands: Sequence[float] | None = None
    ) -> EtaModel:
        """A model naming these classes (D_r from ``demands`` or the phase lengths)."""
        profiles = tuple(
            ClassProfile(
                fingerprint=c.name,
                name=c.name,
                D=demands[i] if demands is not None else sum(d for _, d in c.phases),
                f=c.fork,
                phases=tuple(Phase(threads=f, duration=d) for f, d in c.phases),
            )
            for i, c in enumerate(self.classes)
        )
        return EtaModel(
            backend="simulator", dataset=self.name, cores=cores, fcr=fcr, classes=profiles
        )

    @classmethod
    def from_model(cls, model: EtaModel, name: str = "trace") -> Workload:
        """Trace-driven classes: the measured phases of each class in a trained model."""
        classes = []
        for c in model.classes:
            phases = tuple((p.threads, p.duration) for p in c.phases) or ((c.f, c.D),)
            classes.append(SimClass(c.name, phases))
        if not classes:
            raise ValueError("the model has no classes to simulate")
        return cls(name, tuple(classes))


# Thesis Table 5.2: (f, d) of SC1, SC2, SC3; one phase each.
SYNTHETIC: dict[str, tuple[tuple[int, float], ...]] = {
    "var-service": ((10, 2.0), (10, 5.0), (10, 10.0)),
    "var-para": ((5, 10.0), (10, 10.0), (15, 10.0)),
    "inv-increase": ((5, 10.0), (10, 5.0), (15, 2.0)),
    "lin-increase": ((5, 2.0), (10, 5.0), (15, 10.0)),
}

MIXES: dict[str, tuple[float, ...]] = {
    "I": (0.6, 0.2, 0.2),
    "II": (0.2, 0.6, 0.2),
    "III": (0.2, 0.2, 0.6),
}


def synthetic(name: str) -> Workload:
    try:
        spec = SYNTHETIC[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; choose one of {', '.join(SYNTHETIC)}"
        ) from None
    return Workload(name, tuple(SimClass(f"SC{i + 1}", ((f, d),)) for i, (f, d) in enumerate(spec)))


def populations(total: int, mix: Sequence[float]) -> list[int]:
    """N_r = N·p_r rounded by largest remainder, so that they sum to N exactly."""
    if total < 0 or not mix or any(p < 0 for p in mix) or sum(mix) <= 0:
        raise ValueError(f"need N ≥ 0 and a non-negative, non-zero mix, got {total}, {list(mix)}")
    weights = [p / sum(mix) for p in mix]
    exact = [total * w for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(mix)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts
