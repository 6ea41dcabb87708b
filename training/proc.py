"""Reading threads and CPU time from Linux's /proc (SPEC §3).

A task (a process or a thread) is *in execution* when its state is R: running or runnable.
Its CPU time comes from ``schedstat`` (nanoseconds) where the kernel keeps it, else from
``stat``'s utime + stime (clock ticks, 10 ms).

Two probes:

* ``PostgresProbe`` follows statements by their backend's pid (the proxy knows which backend runs
  which statement): the backend and its parallel workers — the postmaster's children whose
  command line reads ``parallel worker for PID <backend>``.
* ``ThreadProbe`` counts the threads of this process that belong to the database (the embedded
  DuckDB runs here).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

__all__ = [
    "PostgresProbe",
    "TaskReading",
    "ThreadProbe",
    "children",
    "process_tree_cpu",
    "read_task",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class TaskReading:
    running: bool  # state R
    cpu: float  # seconds since the task started
    ppid: int
    children_cpu: float  # of reaped children (cutime + cstime), seconds
    started: int = 0  # clock ticks after boot: a pid used again names another process


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)  # os-level calls: about 3× cheaper than open()
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def read_task(path: str) -> TaskReading | None:
    """``path`` is /proc/PID or /proc/PID/task/TID; None when the task is gone."""
    try:
        stat = _read(f"{path}/stat")
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    try:
        ns = int(_read(f"{path}/schedstat").split()[0])
        if ns:
            cpu = ns / 1e9
    except (OSError, ValueError, IndexError):
        pass
    return TaskReading(
        running=fields[0] == b"R",
        cpu=cpu,
        ppid=int(fields[1]),
        children_cpu=(int(fields[13]) + int(fields[14])) / CLK_TCK,
        started=int(fields[19]),
    )


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:  # may exceed one read
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class PostgresProbe:
    """Backends and their parallel workers, by the backend's pid."""

    def __init__(self) -> None:
        self.postmaster: int | None = None
        self.children: list[int] = []  # the postmaster's, at the last ``workers``
        self._leader_of: dict[int, int | None] = {}  # child pid → leader pid (None: not a worker)

    def workers(self) -> dict[int, list[int]]:
        """Parallel workers alive now, by their leader's pid."""
        out: dict[int, list[int]] = {}
        if self.postmaster is None:
            return out
        kids = self.children = children(self.postmaster)
        alive = set(kids)
        for pid in kids:
            if pid in self._leader_of:
                leader = self._leader_of[pid]
            else:
                leader, titled = _worker_leader(pid)
                if titled:  # a fresh fork still shows the postmaster's command line
                    self._leader_of[pid] = leader
            if leader is not None:
                out.setdefault(leader, []).append(pid)
        for pid in [p for p in self._leader_of if p not in alive]:
            del self._leader_of[pid]  # pids are reused: forget the dead
        return out

    def read(self, leader: int) -> TaskReading | None:
        reading = read_task(f"/proc/{leader}")
        if reading is not None and self.postmaster is None:
            self.postmaster = reading.ppid
        return reading


def _worker_leader(pid: int) -> tuple[int | None, bool]:
    """The leader's pid if ``pid`` is a parallel worker, and whether the process has set its
    title yet ("postgres: …"); until it has, what it will become is unknown."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None, False
    marker = "parallel worker for PID "
    at = cmdline.find(marker)
    if at < 0:
        return None, cmdline.startswith("postgres: ")
    digits = cmdline[at + len(marker) :].split()[0]
    return (int(digits) if digits.isdigit() else None), True


def process_tree_cpu(root: int) -> float:
    """CPU seconds of ``root``, its live children, and the children it has reaped: what a
    server such as PostgreSQL (the postmaster and its processes) has consumed so far."""
    top = read_task(f"/proc/{root}")
    if top is None:
        return 0.0
    total = top.cpu + top.children_cpu
    for child in children(root):
        reading = read_task(f"/proc/{child}")
        if reading is not None:
            total += reading.cpu
    return total


class ThreadProbe:
    """The database's threads inside this process: every thread that is not a Python thread
    (DuckDB's own workers) and the Python threads whose name starts with ``keep`` (the pool
    that calls into DuckDB); the event loop, clients and the sampler are left out."""

    def __init__(self, keep: str = "duckdb") -> None:
        self.keep = keep
        self.base = f"/proc/{os.getpid()}/task"

    def excluded(self) -> set[int]:
        return {
            t.native_id
            for t in threading.enumerate()
            if t.native_id is not None and not t.name.startswith(self.keep)
        }

    def read(self) -> tuple[int, float]:
        """(threads in execution, their total CPU seconds so far) over the database's threads."""
        exclude = self.excluded()
        running, cpu = 0, 0.0
        for name in os.listdir(self.base):
            if int(name) in exclude:
                continue
            reading = read_task(f"{self.base}/{name}")
            if reading is not None:
                running += reading.running
                cpu += reading.cpu
        return running, cpu
