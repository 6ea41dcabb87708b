"""The trace-driven simulator: the admission system in virtual time (thesis §5.5).

The same ``Scheduler`` object the live proxy uses decides admissions here; this package only
supplies the fork/join network of processor-sharing cores around it (``engine``), the
workloads (``workload``), the thesis' procedure of building η from an FCFS run and comparing
every policy over replications (``study``) and queueing-theory references (``theory``). Its
figures are drawn above the core, in ``lab.figures`` (matplotlib is no dependency of the core).
"""

from admission.sim.engine import ROUTINGS, RunResult, SimConfig, simulate
from admission.sim.workload import MIXES, SYNTHETIC, SimClass, Workload, populations, synthetic

__all__ = [
    "MIXES",
    "ROUTINGS",
    "SYNTHETIC",
    "RunResult",
    "SimClass",
    "SimConfig",
    "Workload",
    "populations",
    "simulate",
    "synthetic",
]
