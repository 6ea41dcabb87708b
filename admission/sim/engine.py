"""The simulation engine: a fork/join network of processor-sharing cores behind the scheduler.

Theory of operation
-------------------
Jobs arrive at the admission queue (closed network: after an exponential think time; open
network: a Poisson stream) and are handed to the very same ``Scheduler`` the live proxy uses.
An admitted job runs its phases in turn: in phase i it forks f_i tasks, each routed to one of M
cores with per-core demand d_i (deterministic, or exponential with that mean). A phase ends when
all of its tasks have finished (join); after the last phase the job leaves and thinks.

Cores are processor-sharing: with n tasks present each progresses at rate 1/n. Each core keeps a
*virtual time* V that grows at rate 1/n; a task arriving at virtual time V with demand d finishes
when V reaches V + d, so a core is a heap of finish times and only its earliest finish is an
event. Each task arrival or departure costs O(log n).

The scheduler sees N_c = class-c tasks in service (``update_tasks`` on every task completion)
and frees the thread budget task by task: each finished task of a job's last phase gives back
one unit; what a job still holds is freed when it leaves. For single-phase jobs (the thesis'
synthetic workloads) that is exactly the FCR of thesis §5.5.2.

Statistics are taken after a warm-up: per class the CPU-seconds completed (U_r), the time
integral of tasks in execution (Q_r), the tasks in execution at each admission (A^c_r), response
times, and the time integral of jobs in the system (for Little's law). Time is virtual; nothing
here reads a clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from admission.model import EtaModel
from admission.mpl import MplController
from admission.policies import Policy
from admission.scheduler import DUE_FACTOR, Job, Limits, Scheduler
from admission.sim.workload import Workload, populations
from admission.workloads import WorkloadConfig

__all__ = ["ROUTINGS", "SERVICE", "RunResult", "SimConfig", "simulate"]

ROUTINGS = ("random", "round-robin", "least-loaded")
SERVICE = ("deterministic", "exponential")
_BATCH = 8192


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One experiment's parameters (thesis defaults: N = 30, M = 64, N_fcr = 100, Z = 5)."""

    cores: int = 64
    jobs: int = 30
    mix: tuple[float, ...] = (0.6, 0.2, 0.2)
    think: float = 5.0
    fcr: int | None = 100
    memory: int | None = None  # the memory budget (bytes of the classes' M_r in service)
    mpl: int | None = None
    backfill: bool = False
    max_wait: float | None = None
    queue_timeout: float | None = None
    due_factor: float | None = DUE_FACTOR  # latency policy: due after due_factor × D_r
    lifo_after: float | None = None  # adaptive LIFO under overload (see Limits)
    release_after: float | None = None  # a job in service this long leaves the MPL (see Limits)
    short_lane: float | None = None  # the short lane (Limits): None the policy's own, 0 none
    routing: str = "random"
    service: str = "deterministic"
    # per class, None or (p, m): a job of the class is, with probability p, m times as long as
    # its others (every task of every phase), its mean kept at the class's: a class of mostly
    # short statements with rare long ones (a range query that now and then covers the table)
    tails: tuple[tuple[float, float] | None, ...] | None = None
    class_per_cycle: bool = False
    arrival_rate: float | None = None  # set: an open network with Poisson arrivals
    # tune the MPL while it runs (admission.mpl), from ``mpl`` (or the cores): every tenth of
    # the mean D_r the controller hears whether the MPL was saturated, the work completed and
    # the work arrived
    mpl_auto: bool = False
    completions: int = 20_000
    warmup: int = 2_000
    # tenants and tiers (admission.workloads): the config, and each class's tenant (its jobs
    # are that tenant's statements; None: no tenants)
    workloads: WorkloadConfig | None = None
    tenants: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError(f"cores must be at least 1, not {self.cores}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        if self.service not in SERVICE:
            raise ValueError(f"service must be one of {', '.join(SERVICE)}, not {self.service!r}")
        if self.think < 0 or self.completions < 1 or self.warmup < 0:
            raise ValueError("think ≥ 0, completions ≥ 1 and warmup ≥ 0 are required")
        if self.arrival_rate is None and self.jobs < 1:
            raise ValueError(f"a closed network needs at least one job, not {self.jobs}")
        if self.arrival_rate is not None and self.arrival_rate <= 0:
            raise ValueError(f"arrival rate must be positive, not {self.arrival_rate}")
        if self.mpl_auto and self.mpl is not None and self.mpl < 1:
            raise ValueError(f"an MPL to start tuning from must be at least 1, not {self.mpl}")
        for tail in self.tails or ():
            if tail is not None and not (0 < tail[0] < 1 and tail[1] > 0):
                raise ValueError(f"a class's tail (p, m) needs 0 < p < 1 and m > 0, not {tail}")

    def limits(self) -> Limits:
        return Limits(
            mpl=(self.mpl or self.cores) if self.mpl_auto else self.mpl,
            threads=self.fcr,
            memory=self.memory,
            backfill=self.backfill,
            max_wait=self.max_wait,
            queue_timeout=self.queue_timeout,
            due_factor=self.due_factor,
            lifo_after=self.lifo_after,
            release_after=self.release_after,
            short_lane=self.short_lane,
        )


@dataclass(slots=True)
class RunResult:
    """Raw measurements of one replication (after warm-up)."""

    classes: list[str]
    duration: float
    completions: list[int]
    response_times: list[np.ndarray]
    waits: list[float]  # mean admission-queue wait per class
    U: list[float]
    Q: list[float]
    A_matrix: list[list[float]]  # A[r][c]: mean class-r tasks in execution at class-c admissions
    A: list[float]  # A_r: the same over admissions of any class
    admissions: list[int]
    jobs_in_system: float  # time average, for Little's law
    task_completions: int
    aged: int = 0
    timed_out: int = 0
    released: int = 0  # statements that gave their MPL slot back (release_after)
    extra: dict[str, float] = field(default_factory=dict)
    mpl_mean: float | None = None  # with mpl_auto: the MPL held, time-averaged after warm-up
    tenants: list[dict[str, float]] = field(default_factory=list)  # per tenant, after warm-up
    # per class, each measured job's time from admission to completion (what the live proxy's
    # learning measures as a statement's service time)
    service_times: list[np.ndarray] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return sum(self.completions) / self.duration

    def class_throughput(self) -> list[float]:
        return [n / self.duration for n in self.completions]

    def mean_response(self) -> float:
        return float(np.concatenate(self.response_times).mean())


class _Exp:
    """Batched standard-exponential draws from one generator (numpy per call is slow)."""

    __slots__ = ("buf", "i", "rng")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.buf: list[float] = []
        self.i = _BATCH

    def __call__(self) -> float:
        if self.i >= len(self.buf):
            self.buf, self.i = self.rng.standard_exponential(_BATCH).tolist(), 0
        x: float = self.buf[self.i]
        self.i += 1
        return x


def simulate(
    workload: Workload,
    config: SimConfig,
    model: EtaModel,
    policy: str | Policy,
    rng: np.random.Generator,
) -> RunResult:
    """Run one replication and return its measurements."""
    names = [c.name for c in workload.classes]
    if list(model.fingerprints[: len(names)]) != names:
        raise ValueError("the model's classes must be the workload's, in the same order")
    if len(config.mix) != len(names):
        raise ValueError(f"the mix has {len(config.mix)} shares for {len(names)} classes")
    if config.tails is not None and len(config.tails) != len(names):
        raise ValueError(f"{len(config.tails)} tails given for {len(names)} classes")
    return _Engine(workload, config, model, policy, rng).run()


class _Engine:
    def __init__(
        self,
        workload: Workload,
        config: SimConfig,
        model: EtaModel,
        policy: str | Policy,
        rng: np.random.Generator,
    ) -> None:
        self.w, self.cfg, self.rng = workload, config, rng
        self.k = len(workload.classes)
        self.a_sum = [[0.0] * self.k for _ in range(self.k)]
        self.a_count = [0] * self.k
        self.measuring = False
        self.scheduler = Scheduler(
            model, policy, config.limits(), on_grant=self._on_grant, workloads=config.workloads
        )
        if config.tenants is not None and len(config.tenants) != self.k:
            raise ValueError(f"{len(config.tenants)} tenants given for {self.k} classes")
        self.controller: MplController | None = None
        if config.mpl_auto:
            demand = float(np.mean([model.classes[i].D for i in range(self.k)]))
            start = self.scheduler.limits.mpl or config.cores
            window = 4 * demand  # (virtual time: the controller's seconds scaled by D_r)
            self.controller = MplController(
                start,
                high=max(start, config.jobs, 4 * config.cores),
                window=window,
                # (quick samples — 250 completions in a quarter window — would need an MPL
                # over 60 here: a window scaled to the statements' length is already short)
                quick_window=window / 4,
                stale=300 * window,  # the proxy's ratios: 600 s, 0.5 s and 60 s to 2 s
                demand_window=30 * window,
            )
            self.control_every = demand / 10

    def _on_grant(self, job: Job, tasks: Sequence[int]) -> None:
        if self.measuring:
            c = job.klass.index
            row = self.a_sum[c]
            for r in range(self.k):
                row[r] += tasks[r]
            self.a_count[c] += 1

    def run(self) -> RunResult:  # one hot loop, kept in one frame for speed
        cfg, rng, k_classes = self.cfg, self.rng, self.k
        sched = self.scheduler
        fps = [c.name for c in self.w.classes]
        tenant_of = list(cfg.tenants) if cfg.tenants is not None else [None] * k_classes
        phases = [c.phases for c in self.w.classes]
        n_cores = cfg.cores
        expo = _Exp(rng)
        exponential_service = cfg.service == "exponential"
        mix = np.asarray(cfg.mix, dtype=float) / sum(cfg.mix)
        # per class (p, short scale, long scale) of its tail: the scales keep the mean at 1
        tail_of = [
            None
            if t is None
            else (t[0], 1 / (1 - t[0] + t[0] * t[1]), t[1] / (1 - t[0] + t[0] * t[1]))
            for t in (cfg.tails or (None,) * k_classes)
        ]

        def draw_class() -> int:
            return int(rng.choice(k_classes, p=mix))

        # cores: task count, virtual time, time of last update, heap of (finish V, seq, job, d)
        core_n = [0] * n_cores
        core_v = [0.0] * n_cores
        core_t = [0.0] * n_cores
        core_heap: list[list[tuple[float, int, int, float]]] = [[] for _ in range(n_cores)]
        core_ver = [0] * n_cores
        route_buf: list[int] = []
        route_i = 0
        rr = 0
        routing = cfg.routing

        events: list[
            tuple[float, int, int, int]
        ] = []  # (time, seq, core | -1 arrival | -2 tick | -3 MPL control, x)
        seq = 0

        # jobs: class, phase, tasks left in phase, arrival time
        open_net = cfg.arrival_rate is not None
        if open_net:
            job_cls: list[int] = []
        elif cfg.class_per_cycle:
            job_cls = [draw_class() for _ in range(cfg.jobs)]
        else:
            pops = populations(cfg.jobs, cfg.mix)
            job_cls = [c for c, n in enumerate(pops) for _ in range(n)]
        n_jobs = len(job_cls)
        job_phase = [0] * n_jobs
        job_left = [0] * n_jobs
        job_arrival = [0.0] * n_jobs
        job_started = [0.0] * n_jobs
        job_scale = [1.0] * n_jobs  # this run's length over its class's (tails)
        for j in range(n_jobs):
            t0 = cfg.think * expo() if cfg.think > 0 else 0.0
            heapq.heappush(events, (t0, seq, -1, j))
            seq += 1
        controller = self.controller
        control_work = 0.0  # Σ D_r of the jobs completed since the last control event
        control_done = 0  # and how many
        control_arrived = 0.0  # Σ D_r of the jobs submitted since then
        control_saturated = False  # the gate's state at the last control event (as the proxy)
        demand_of = [self.scheduler.model.classes[i].D for i in range(k_classes)]
        mpl_area = 0.0  # time integral of the MPL in force, while measuring
        mpl_last = 0.0
        if controller is not None:
            heapq.heappush(events, (self.control_every, seq, -3, 0))
            seq += 1
        if open_net:
            assert cfg.arrival_rate is not None
            rate = cfg.arrival_rate
            heapq.heappush(events, (expo() / rate, seq, -1, -1))
            seq += 1

        # statistics
        tasks_now = [0] * k_classes
        q_area = [0.0] * k_classes
        q_last = [0.0] * k_classes
        work = [0.0] * k_classes
        responses: list[list[float]] = [[] for _ in range(k_classes)]
        services: list[list[float]] = [[] for _ in range(k_classes)]
        wait_sum = [0.0] * k_classes
        in_system = 0
        sys_area = 0.0
        sys_last = 0.0
        t_start = 0.0
        done = 0
        measured_tasks = 0
        target = cfg.warmup + cfg.completions
        tick_at = float("inf")
        timed_out_count = 0
        aged_at_start = released_at_start = 0
        tenants_at_start: dict[str, dict[str, float]] = {}
        t = 0.0

        def start(job: Job, now: float) -> None:
            nonlocal seq, route_i, route_buf, rr
            j = job.id
            assert isinstance(j, int)
            c = job_cls[j]
            if self.measuring:
                wait_sum[c] += now - job_arrival[j]
            job_started[j] = now
            tail = tail_of[c]
            if tail is not None:
                job_scale[j] = tail[2] if rng.random() < tail[0] else tail[1]
            f, d = phases[c][0]
            job_phase[j] = 0
            job_left[j] = f
            fork(j, c, f, d * job_scale[j], now)

        def fork(j: int, c: int, f: int, d: float, now: float) -> None:
            nonlocal seq, route_i, route_buf, rr
            q_area[c] += tasks_now[c] * (now - q_last[c])
            q_last[c] = now
            tasks_now[c] += f
            for _ in range(f):
                if routing == "random":
                    if route_i >= len(route_buf):
                        route_buf, route_i = rng.integers(0, n_cores, _BATCH).tolist(), 0
                    k = route_buf[route_i]
                    route_i += 1
                elif routing == "round-robin":
                    k = rr
                    rr = (rr + 1) % n_cores
                else:
                    k = core_n.index(min(core_n))
                n = core_n[k]
                if n:
                    core_v[k] += (now - core_t[k]) / n
                core_t[k] = now
                dd = d * expo() if exponential_service else d
                heap = core_heap[k]
                heapq.heappush(heap, (core_v[k] + dd, seq, j, dd))
                n += 1
                core_n[k] = n
                ver = core_ver[k] + 1
                core_ver[k] = ver
                # rounding may put the earliest finish a hair before now
                due = now + (heap[0][0] - core_v[k]) * n
                heapq.heappush(events, (due if due > now else now, seq, k, ver))
                seq += 1

        def schedule_tick(now: float) -> None:
            nonlocal tick_at, seq
            deadline = sched.next_deadline()
            if deadline is not None and deadline != tick_at:
                tick_at = max(deadline, now)
                heapq.heappush(events, (tick_at, seq, -2, 0))
                seq += 1

        def reap_timeouts(now: float) -> None:
            nonlocal timed_out_count, in_system, sys_area, sys_last, seq
            for job in sched.take_timed_out():
                j = job.id
                assert isinstance(j, int)
                timed_out_count += self.measuring
                sys_area += in_system * (now - sys_last)
                sys_last = now
                in_system -= 1
                if not open_net:
                    heapq.heappush(events, (now + cfg.think * expo(), seq, -1, j))
                    seq += 1

        timers = sched.timed
        heappop, heappush = heapq.heappop, heapq.heappush
        while done < target and events:
            t, _, k, x = heappop(events)
            if k >= 0:  # a task finishes on core k
                if x != core_ver[k]:
                    continue
                heap = core_heap[k]
                fin, _, j, dd = heappop(heap)
                n = core_n[k] - 1
                core_n[k] = n
                core_v[k] = fin
                core_t[k] = t
                if n:
                    due = t + (heap[0][0] - fin) * n
                    heappush(events, (due if due > t else t, seq, k, x))
                    seq += 1
                c = job_cls[j]
                q_area[c] += tasks_now[c] * (t - q_last[c])
                q_last[c] = t
                tasks_now[c] -= 1
                if self.measuring:
                    work[c] += dd
                    measured_tasks += 1
                left = job_left[j] - 1
                job_left[j] = left
                ph = job_phase[j]
                last = ph == len(phases[c]) - 1
                if left:
                    granted = sched.update_tasks(j, left, 1 if last else 0, t)
                elif not last:
                    ph += 1
                    job_phase[j] = ph
                    f, d = phases[c][ph]
                    job_left[j] = f
                    sched.update_tasks(j, f, 0, t)
                    fork(j, c, f, d * job_scale[j], t)
                    granted = []
                else:
                    granted = sched.complete(j, t)
                    if controller is not None:
                        control_work += demand_of[c]
                        control_done += 1
                    sys_area += in_system * (t - sys_last)
                    sys_last = t
                    in_system -= 1
                    done += 1
                    if self.measuring:
                        responses[c].append(t - job_arrival[j])
                        services[c].append(t - job_started[j])
                    elif done == cfg.warmup:  # warm-up over: start measuring now
                        self.measuring = True
                        t_start = sys_last = t
                        sys_area = 0.0
                        q_area = [0.0] * k_classes
                        q_last = [t] * k_classes
                        aged_at_start = sched.stats.aged
                        released_at_start = sched.stats.released
                        mpl_last = t
                        tenants_at_start = {r["tenant"]: r for r in sched.tenant_stats()}
                    if not open_net:
                        if cfg.class_per_cycle:
                            job_cls[j] = draw_class()
                        think = cfg.think * expo() if cfg.think > 0 else 0.0
                        heappush(events, (t + think, seq, -1, j))
                        seq += 1
                for job in granted:
                    start(job, t)
            elif k == -1:  # an arrival at the admission queue
                if x < 0:  # open network: a new job, and the next arrival
                    x = len(job_cls)
                    job_cls.append(draw_class())
                    job_phase.append(0)
                    job_left.append(0)
                    job_arrival.append(t)
                    job_started.append(t)
                    job_scale.append(1.0)
                    heappush(events, (t + expo() / rate, seq, -1, -1))
                    seq += 1
                c = job_cls[x]
                job_arrival[x] = t
                sys_area += in_system * (t - sys_last)
                sys_last = t
                in_system += 1
                if controller is not None:
                    control_arrived += demand_of[c]
                for job in sched.submit(x, fps[c], t, fork=phases[c][0][0], tenant=tenant_of[c]):
                    start(job, t)
            elif k == -3:  # the adaptive MPL looks
                assert controller is not None
                mpl = sched.limits.mpl or 0
                moved = controller.observe(
                    t,
                    self.control_every,
                    control_saturated,
                    control_work,
                    control_done,
                    arrived=control_arrived,
                    in_system=sched.queued + sched.running,
                    cpu=sum(1 for x in core_n if x) / n_cores,  # (busy now: a sample of the share)
                )
                control_work, control_done, control_arrived = 0.0, 0, 0.0
                if moved is not None:
                    if self.measuring:
                        mpl_area += mpl * (t - mpl_last)
                        mpl_last = t
                    for job in sched.set_limits(replace(sched.limits, mpl=moved), t):
                        start(job, t)
                limit = sched.limits.mpl or 0
                counted = sched.running - sched.released_in_service  # (release_after)
                control_saturated = sched.queued > 0 and counted >= limit
                heappush(events, (t + self.control_every, seq, -3, 0))
                seq += 1
            else:  # aging / timeout deadline
                tick_at = float("inf")
                for job in sched.tick(t):
                    start(job, t)
            if timers:
                reap_timeouts(t)
                schedule_tick(t)

        duration = t - t_start
        if not self.measuring or duration <= 0:
            raise ValueError(
                f"the run ended before its warm-up ({cfg.warmup} completions) was over; "
                "lower --warmup or check that jobs can be admitted at all"
            )
        for c in range(k_classes):
            q_area[c] += tasks_now[c] * (t - q_last[c])
        sys_area += in_system * (t - sys_last)
        mpl_mean = None
        if controller is not None:
            mpl_mean = (mpl_area + (sched.limits.mpl or 0) * (t - mpl_last)) / duration
        admissions = self.a_count
        total_adm = sum(admissions)
        a_matrix = [
            [self.a_sum[c][r] / admissions[c] if admissions[c] else 0.0 for c in range(k_classes)]
            for r in range(k_classes)
        ]
        a_any = [
            sum(self.a_sum[c][r] for c in range(k_classes)) / total_adm if total_adm else 0.0
            for r in range(k_classes)
        ]
        completions = [len(r) for r in responses]
        return RunResult(
            classes=fps,
            duration=duration,
            completions=completions,
            response_times=[np.asarray(r) for r in responses],
            service_times=[np.asarray(r) for r in services],
            waits=[wait_sum[c] / max(1, admissions[c]) for c in range(k_classes)],
            U=[work[c] / (duration * n_cores) for c in range(k_classes)],
            Q=[q_area[c] / duration for c in range(k_classes)],
            A_matrix=a_matrix,
            A=a_any,
            admissions=list(admissions),
            jobs_in_system=sys_area / duration,
            task_completions=measured_tasks,
            aged=sched.stats.aged - aged_at_start,
            timed_out=timed_out_count,
            released=sched.stats.released - released_at_start,
            mpl_mean=mpl_mean,
            tenants=_tenant_delta(sched.tenant_stats(), tenants_at_start),
        )


def _tenant_delta(
    now: list[dict[str, float]], start: dict[str, dict[str, float]]
) -> list[dict[str, float]]:
    """Per tenant, what accrued after warm-up: admitted, completed, service and wait."""
    out = []
    for row in now:
        before = start.get(str(row["tenant"]), {})
        out.append(
            {
                **row,
                **{
                    key: row[key] - before.get(key, 0)
                    for key in ("admitted", "completed", "service_seconds", "wait_seconds")
                },
            }
        )
    return out
