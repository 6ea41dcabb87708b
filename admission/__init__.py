"""admission — the pure admission-control core.

An in-memory analytical database on a multicore server is at its best with a few queries at a
time, but which few matters: query classes differ in how many threads they fork and how much
work each thread does. This package decides *which* waiting statement runs next.

- ``classify_sql`` maps a statement to its class (its SQL skeleton).
- ``EtaModel`` holds what training measured per class (D_r, f_r, U_r, Q_r, A^c_r).
- ``admission.policies`` turns a model into an η matrix: −Q_r, −A^c_r, U_r, P_{r,c}, FCFS, SEPT.
- ``Scheduler`` queues jobs per class and admits them in policy order under a multiprogramming
  limit and a thread budget, with aging, queue timeouts, cancel and bypass.
- ``admission.sim`` drives the very same ``Scheduler`` in virtual time (a fork/join network of
  processor-sharing cores) for what-if studies.

Nothing in this package opens sockets, starts threads, sleeps or reads a clock: time is an
argument. The live proxy and the simulator are two drivers of one scheduler, so a policy is
implemented once.
"""

from admission.classify import QueryClass, classify_sql
from admission.model import ClassProfile, EtaModel, ModelError, Phase, Profile
from admission.policies import POLICIES, Policy, Priority, policy_by_name
from admission.scheduler import Event, Job, JobState, Limits, Scheduler

__all__ = [
    "POLICIES",
    "ClassProfile",
    "EtaModel",
    "Event",
    "Job",
    "JobState",
    "Limits",
    "ModelError",
    "Phase",
    "Policy",
    "Priority",
    "Profile",
    "QueryClass",
    "Scheduler",
    "classify_sql",
    "policy_by_name",
]
