"""A machine-speed reference: a short, fixed probe of the cores, taken before and after training.

The probe is a fixed DuckDB aggregate over a generated table (the same rows and the same result
on every machine), run on all the machine's cores, timed a few times; the speed is rows per
second of the **median** try. Why this probe:

* **Parallel, like the statements it stands for.** A single-threaded probe misses a load that
  takes one of two cores (measured: a Python loop read the same speed with one busy process
  beside it while a TPC-H-like DuckDB aggregate took 1.3× as long; this probe took 1.36×).
  With two busy processes the aggregate took 2.0× and the probe 2.03×.
* **The median, not the best try.** The best of five hides a sustained load (a try that ran
  while the other process was descheduled); the median follows it.
* **In a process of its own** (``measure``): in the training process the proxy's event loop
  and the sampler share the machine with it in ways a fresh process does not.

It takes about half a second. Training takes it before the isolation runs and after the
concurrent run, stores both in the model (``speed: {before, after, unit}``) and warns when they
differ by more than 10 %: the machine's speed changed while it measured (another load started,
the CPU's clock was lowered), and the D_r, U_r and Q_r of the model rest on a machine that was
not the same throughout.

Rescaling (``rescale``, ``admission model rescale``): service demands scale inversely with
speed, so a D_r measured where the probe gave ``speed_there`` becomes, where it gives
``speed_here``, ``D_r × speed_there / speed_here``. A model trained on a machine twice as fast
predicts twice the D_r here. This assumes CPU-bound statements and machines alike in cores and
memory: fork sizes f_r, U_r, Q_r and the A^c_r counts are ratios of the machine to itself and
are kept as they are.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from admission.model import EtaModel

__all__ = ["UNIT", "SpeedReading", "measure", "probe", "rescale"]

UNIT = "probe rows/s (DuckDB, all cores, median of 5)"
_ROWS = 8_000_000  # one try: ~25 ms on two current cores
_SQL = "select sum(hash(i) % 1000) from probe"
_EXPECTED: int | None = None  # the result, the same everywhere (computed once per process)


@dataclass(frozen=True)
class SpeedReading:
    speed: float  # rows per second, the median try
    tries: tuple[float, ...]  # every try's rows per second


def probe(tries: int = 5, clock: Callable[[], float] = time.perf_counter) -> SpeedReading:
    """Run the fixed aggregate ``tries`` times (after one unrecorded run that warms the
    table); the median try's rows per second."""
    import duckdb

    global _EXPECTED
    con = duckdb.connect()
    try:
        con.execute(f"create table probe as select i from range({_ROWS}) t(i)")
        first = con.execute(_SQL).fetchone()
        if _EXPECTED is None:
            _EXPECTED = first[0] if first else None
        rates = []
        for _ in range(tries):
            started = clock()
            result = con.execute(_SQL).fetchone()
            elapsed = max(clock() - started, 1e-9)
            if result is None or result[0] != _EXPECTED:  # pragma: no cover - broken engine
                raise RuntimeError("the speed probe gave a different result")
            rates.append(_ROWS / elapsed)
    finally:
        con.close()
    return SpeedReading(statistics.median(rates), tuple(rates))


def measure(tries: int = 5) -> SpeedReading:
    """``probe`` in a fresh Python process (see the module docstring); in this process if that
    one cannot be started."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "training.speed", str(tries)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        rates = tuple(float(word) for word in done.stdout.split())
        if len(rates) == tries:
            return SpeedReading(statistics.median(rates), rates)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return probe(tries)


def rescale(model: EtaModel, here: float) -> EtaModel:
    """``model``'s time quantities put on a machine whose probe gives ``here`` (rows/s): D_r,
    its interval, D_r as trained and the fork profile's phases × speed_there / ``here``, with
    speed_there the mean of the model's before and after. The model's speed becomes
    ``here``. ValueError when the model carries no speed of this probe's unit."""
    from admission.model import Phase, Speed

    if here <= 0:
        raise ValueError(f"the speed must be positive, not {here}")
    if model.speed is None:
        raise ValueError("the model carries no machine speed (trained before it was measured)")
    if model.speed.unit != UNIT:
        raise ValueError(
            f"the model's speed is in {model.speed.unit!r}, not {UNIT!r}: another probe, the "
            "two do not compare (train the model again to rescale it)"
        )
    there = (model.speed.before + model.speed.after) / 2
    factor = there / here

    def scaled(x: float | None) -> float | None:
        return None if x is None else x * factor

    classes = tuple(
        c.model_copy(
            update={
                "D": c.D * factor,
                "D_low": scaled(c.D_low),
                "D_high": scaled(c.D_high),
                "D_trained": scaled(c.D_trained),
                "phases": tuple(
                    Phase(threads=p.threads, duration=p.duration * factor) for p in c.phases
                ),
            }
        )
        for c in model.classes
    )
    default = model.default
    if default is not None:
        default = default.model_copy(update={"D": default.D * factor})
    note = (
        f"rescaled from a machine at {there:,.0f} to one at {here:,.0f} {UNIT} (D_r × {factor:.3g})"
    )
    return model.model_copy(
        update={
            "classes": classes,
            "default": default,
            "speed": Speed(before=here, after=here, unit=UNIT),
            "notes": f"{model.notes}; {note}" if model.notes else note,
            "eta": {},
            "orders": {},
        }
    )


if __name__ == "__main__":  # what ``measure`` runs: every try's rate on one line
    print(*probe(int(sys.argv[1]) if len(sys.argv) > 1 else 5).tries)
