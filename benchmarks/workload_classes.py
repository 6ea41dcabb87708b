"""Workload classes on the real engine: fair shares between tenants, interactive over batch,
and background work in idle periods — each against the same load without workload classes.

    python -m benchmarks.workload_classes [--tpch 1] [--mpl 2] [--repetitions 3] \\
        [--scenarios fair,priority,background] [--duration 40]

One embedded DuckDB (TPC-H at ``--tpch``) behind the proxy, in this process; clients are
psycopg connections in threads, each tenant's with its own application_name, which the
workload config matches. Settings are interleaved within each repetition, in a balanced order;
a setting's workload config is swapped into the running proxy (``gate.set_workloads``;
"no classes" is a config with no workload: every statement is ``default``'s, one FCFS queue;
the baselines are the load without classes under no admission at all ("none") and FCFS pools
of 1, 2 and 4, "fcfs@2" being the bench's MPL; the other settings run at ``--mpl``).

**fair** — tenants gold (weight 2) and silver (weight 1), 8 closed-loop clients each running
TPC-H queries 1, 3, 6, 12, 14 with fresh parameters; a third tenant, bronze (weight 1, 8
clients), joins at 60 % of the run. The scheduler's tenants are read every 0.1 s: the
service a tenant receives is its statements in service integrated over time (statement-seconds,
the unit the MPL divides). Printed: per 10 s window sliding by 1 s after the first 10 s, the
measured share ratio gold/silver and the fairness index F = Σ_i |w_i − w'_i| (Wang & Merchant;
w: the weights of the tenants present, normalised); bronze's share over the 2 s after it joins
and its time to first admission. Targets: ratio within 5 % of 2, F ≤ 0.05, bronze at its
share within 2 s.

**priority** — an interactive tenant (open Poisson arrivals of Q6 and Q14, at 20 % of the
load by their D_r measured in the run) beside a batch tenant saturating (8 closed clients of
Q1, Q9, Q18, Q21). Settings: the interactive alone; both without classes; both with batch in
the batch tier; both with batch in the batch tier and ``mpl = MPL − 1`` (a batch limit that
keeps a slot for interactive work). Target: interactive mean R ≤ 1.2 × alone.

**background** — a foreground open load (Poisson, Q1, Q3, Q6, Q12, Q14) at ρ = 0.6 by the
D_r measured in the run, and a background tenant of 2 closed clients running Q9 and Q18 back to
back. Settings: foreground alone, background alone, both without classes, both with the
background tier (admitted only when the foreground is idle). Targets: foreground mean R with
background ≤ 1.05 × alone; background completions ≥ 50 % of alone.

Cells read ``mean ± half-width of the 95 % t-interval over repetitions [least, most]``.
Numbers are per this machine (2 cores shared with the load generator): read them side by
side, not as absolutes.
"""

from __future__ import annotations

import argparse
import queue
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg

from admission.scheduler import Limits
from admission.sim.study import Estimate
from admission.workloads import Tier, Workload, WorkloadConfig
from lab.bench import run_order
from lab.target import Target, open_target
from workloads.arrivals import poisson
from workloads.tpch.queries import Dialect, random_query

DIALECT: list[Dialect] = ["duckdb"]  # the backend's (main sets it)
FAIR_QUERIES = (1, 3, 6, 12, 14)
INTERACTIVE_QUERIES = (6, 14)
BATCH_QUERIES = (1, 9, 18, 21)
FOREGROUND_QUERIES = (1, 3, 6, 12, 14)
BACKGROUND_QUERIES = (9, 18)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Record:
    tenant: str
    query: int
    arrival: float
    end: float
    ok: bool


@dataclass
class Recorder:
    rows: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, row: Record) -> None:
        with self.lock:
            self.rows.append(row)

    def of(self, tenant: str, since: float = 0.0, until: float = float("inf")) -> list[Record]:
        return [r for r in self.rows if r.tenant == tenant and since <= r.arrival < until]


def _connect(target: Target, app: str) -> psycopg.Connection:
    return psycopg.connect(target.conninfo, autocommit=True, application_name=app)


def _run(conn: psycopg.Connection, sql: str) -> bool:
    try:
        conn.execute(sql).fetchall()
        return True
    except psycopg.Error:
        return False


def closed_client(
    target: Target,
    tenant: str,
    queries: Sequence[int],
    sf: float,
    seed: int,
    start: float,
    stop: float,
    rec: Recorder,
) -> None:
    rng = random.Random(seed)
    with _connect(target, tenant) as conn:
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        while time.monotonic() < stop:
            q = rng.choice(queries)
            sql = random_query(q, rng, DIALECT[0], sf)
            t0 = time.monotonic()
            ok = _run(conn, sql)
            rec.add(Record(tenant, q, t0, time.monotonic(), ok))


def open_load(
    target: Target,
    tenant: str,
    queries: Sequence[int],
    sf: float,
    rate: float,
    seed: int,
    start: float,
    stop: float,
    rec: Recorder,
    connections: int = 8,
) -> list[threading.Thread]:
    """Poisson arrivals at ``rate``/s from ``start`` to ``stop`` on a pool of connections; a
    statement's response time counts from its scheduled arrival (a busy pool is not hidden)."""
    rng = random.Random(seed)
    offsets = poisson(rate, stop - start, rng)
    work: queue.Queue[tuple[float, int, str] | None] = queue.Queue()

    def feeder() -> None:
        for off in offsets:
            at = start + off
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            q = rng.choice(queries)
            work.put((at, q, random_query(q, rng, DIALECT[0], sf)))
        for _ in range(connections):
            work.put(None)

    def worker() -> None:
        with _connect(target, tenant) as conn:
            while (item := work.get()) is not None:
                at, q, sql = item
                ok = _run(conn, sql)
                rec.add(Record(tenant, q, at, time.monotonic(), ok))

    threads = [threading.Thread(target=feeder, daemon=True)]
    threads += [threading.Thread(target=worker, daemon=True) for _ in range(connections)]
    for th in threads:
        th.start()
    return threads


class Sampler:
    """Every ``every`` s: each tenant's busy seconds so far — its completed statements'
    service plus what those in service have had — read from the proxy's scheduler on its
    loop, with the loop's clock (the integral of its statements in service, exact at each
    reading; a window's service is the difference of two readings)."""

    def __init__(self, target: Target, every: float = 0.1) -> None:
        self.target, self.every = target, every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[float, dict[str, float]]:
        gate = self.target.proxy.gate

        def read() -> tuple[float, dict[str, float]]:
            now = gate.now
            rows = gate.scheduler.tenant_stats(now)
            return now, {r["tenant"]: r["busy_seconds"] for r in rows}

        return self.target.proxy.call(read)  # type: ignore[no-any-return]

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(self._read())

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def service(self, since: float, until: float) -> dict[str, float]:
        """Statement-seconds in service per tenant over [since, until) (between the readings
        nearest inside the window)."""
        inside = [(t, busy) for t, busy in self.samples if since <= t < until]
        if len(inside) < 2:
            return {}
        (_, first), (_, last) = inside[0], inside[-1]
        return {n: last[n] - first.get(n, 0.0) for n in last}


RENICE: list[int | None] = [None]  # --renice (main sets it)
BASELINES = ("none", "fcfs@1", "fcfs@2", "fcfs@4")  # no classes: no admission, FCFS pools


def _renice_of(setting: str) -> tuple[str, int | None]:
    """A setting without its "+renice", and the niceness it asks for (None: none)."""
    if setting.endswith("+renice"):
        return setting.removesuffix("+renice"), RENICE[0]
    return setting, None


def _limits_for(target: Target, setting: str, mpl: int) -> None:
    """The MPL a setting runs at: none (no admission), fcfs@N (a pool of N), else ``mpl``."""
    if setting == "none":
        limits = Limits()
    elif setting.startswith("fcfs@"):
        limits = Limits(mpl=int(setting.removeprefix("fcfs@")))
    else:
        limits = Limits(mpl=mpl)
    target.proxy.call(lambda: target.proxy.gate.set_limits(limits))


def _config(*workloads: Workload, renice: int | None = None) -> WorkloadConfig:
    return WorkloadConfig(workloads=tuple(workloads), renice=renice)


def _match(name: str) -> tuple[tuple[str, str], ...]:
    return (("application_name", name),)


def measure_demands(
    target: Target, queries: Sequence[int], sf: float, runs: int = 3
) -> dict[int, float]:
    """D_r: each query alone through the proxy, ``runs`` times (after one warm-up), mean."""
    rng = random.Random(7)
    out: dict[int, float] = {}
    with _connect(target, "probe") as conn:
        for q in queries:
            _run(conn, random_query(q, rng, DIALECT[0], sf))
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                _run(conn, random_query(q, rng, DIALECT[0], sf))
                times.append(time.perf_counter() - t0)
            out[q] = statistics.mean(times)
    return out


# -- fair ------------------------------------------------------------------------------------


FAIR = {"gold": 2.0, "silver": 1.0, "bronze": 1.0}


def fair_run(
    target: Target, classes: bool, sf: float, duration: float, seed: int, demands: dict[int, float]
) -> dict[str, float]:
    cfg = (
        _config(*(Workload(n, weight=w, match=_match(n)) for n, w in FAIR.items()))
        if classes
        else _config()
    )
    target.proxy.call(lambda: target.proxy.gate.set_workloads(cfg))
    rec = Recorder()
    t0 = time.monotonic() + 1.0
    stop = t0 + duration
    join = t0 + 0.6 * duration
    threads = []
    for i, name in enumerate(FAIR):
        begin = join if name == "bronze" else t0
        for c in range(8):
            seed_c = seed * 1000 + i * 100 + c
            threads.append(
                threading.Thread(
                    target=closed_client,
                    args=(target, name, FAIR_QUERIES, sf, seed_c, begin, stop, rec),
                    daemon=True,
                )
            )
    sampler = Sampler(target).start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    sampler.stop()

    def work(since: float, until: float) -> dict[str, float]:
        """Σ D_r of the statements completed in the window, per tenant (no scheduler needed)."""
        out: dict[str, float] = {}
        for r in rec.rows:
            if r.ok and since <= r.end < until:
                out[r.tenant] = out.get(r.tenant, 0.0) + demands[r.query]
        return out

    two = {"gold": 2.0, "silver": 1.0}
    ratios, f_two, f_three, w_ratios, wf_two = [], [], [], [], []
    for start in range(10, int(0.6 * duration) - 10 + 1):
        a, b = t0 + start, t0 + start + 10
        got = sampler.service(a, b)
        if got.get("silver"):
            ratios.append(got.get("gold", 0.0) / got["silver"])
            f_two.append(_fairness(got, two))
        done = work(a, b)
        if done.get("silver"):
            w_ratios.append(done.get("gold", 0.0) / done["silver"])
            wf_two.append(_fairness(done, two))
    for start in range(int(0.6 * duration) + 2, int(duration) - 10 + 1):
        got = sampler.service(t0 + start, t0 + start + 10)
        if got.get("bronze"):
            f_three.append(_fairness(got, FAIR))
    first = min((r.end for r in rec.of("bronze")), default=float("nan")) - join
    nan = float("nan")
    return {
        "slots: gold/silver mean": statistics.mean(ratios) if ratios else nan,
        "slots: gold/silver min": min(ratios) if ratios else nan,
        "slots: gold/silver max": max(ratios) if ratios else nan,
        "slots: F max (2 tenants)": max(f_two) if f_two else nan,
        "slots: F max (3 tenants)": max(f_three) if f_three else nan,
        "slots: bronze 0–2 s": _share(sampler.service(join, join + 2.0), "bronze"),
        "slots: bronze 2–6 s": _share(sampler.service(join + 2.0, join + 6.0), "bronze"),
        "work: gold/silver mean": statistics.mean(w_ratios) if w_ratios else nan,
        "work: gold/silver min": min(w_ratios) if w_ratios else nan,
        "work: gold/silver max": max(w_ratios) if w_ratios else nan,
        "work: F max (2 tenants)": max(wf_two) if wf_two else nan,
        "work: bronze 0–2 s": _share(work(join, join + 2.0), "bronze"),
        "bronze first done (s)": first,
        "statements/s": len([r for r in rec.rows if r.ok]) / duration,
        "errors": float(len([r for r in rec.rows if not r.ok])),
    }


def _share(got: dict[str, float], name: str) -> float:
    total = sum(got.values())
    return got[name] / total if total and name in got else float("nan")


def _fairness(got: dict[str, float], weights: dict[str, float]) -> float:
    """F = Σ_i |w_i − w'_i| over the tenants of ``weights`` (both normalised)."""
    total = sum(got.get(n, 0.0) for n in weights)
    wsum = sum(weights.values())
    if not total:
        return float("nan")
    return sum(abs(weights[n] / wsum - got.get(n, 0.0) / total) for n in weights)


# -- priority --------------------------------------------------------------------------------


def priority_run(
    target: Target,
    setting: str,
    sf: float,
    duration: float,
    rate: float,
    mpl: int,
    seed: int,
) -> dict[str, float]:
    web = Workload("web", match=_match("web"))
    setting, renice = _renice_of(setting)
    if setting == "tiers":
        cfg = _config(web, Workload("etl", tier=Tier.BATCH, match=_match("etl")), renice=renice)
    elif setting == "tiers+cap":
        cfg = _config(
            web,
            Workload("etl", tier=Tier.BATCH, mpl=max(1, mpl - 1), match=_match("etl")),
            renice=renice,
        )
    else:
        cfg = _config()
    target.proxy.call(lambda: target.proxy.gate.set_workloads(cfg))
    _limits_for(target, setting, mpl)
    interactive = OpenLoad("web", INTERACTIVE_QUERIES, rate, on=True)
    batch = ClosedLoad("etl", BATCH_QUERIES, 8, on=setting != "alone")
    responses, etl_per_s = open_beside_closed(target, interactive, batch, sf, duration, seed)
    return {
        "web_mean": statistics.mean(responses) if responses else float("nan"),
        "web_p95": _quantile(responses, 0.95),
        "web_n": float(len(responses)),
        "etl_per_s": etl_per_s,
    }


@dataclass(frozen=True)
class OpenLoad:
    tenant: str
    queries: Sequence[int]
    rate: float
    on: bool


@dataclass(frozen=True)
class ClosedLoad:
    tenant: str
    queries: Sequence[int]
    clients: int
    on: bool


def open_beside_closed(
    target: Target, open_: OpenLoad, closed: ClosedLoad, sf: float, duration: float, seed: int
) -> tuple[list[float], float]:
    """An open load beside a closed one (either may be off) for ``duration`` s: the open
    statements' response times and the closed tenant's completions per second, both after
    the first 3 s."""
    rec = Recorder()
    t0 = time.monotonic() + 1.0
    stop = t0 + duration
    threads: list[threading.Thread] = []
    if open_.on:
        threads += open_load(
            target, open_.tenant, open_.queries, sf, open_.rate, seed, t0, stop, rec
        )
    for c in range(closed.clients if closed.on else 0):
        args = (target, closed.tenant, closed.queries, sf, seed * 1000 + c, t0, stop, rec)
        threads.append(threading.Thread(target=closed_client, args=args, daemon=True))
        threads[-1].start()
    for th in threads:
        th.join()
    rows = [r for r in rec.of(open_.tenant, t0 + 3.0) if r.ok]
    done = [r for r in rec.rows if r.tenant == closed.tenant and r.ok and r.end >= t0 + 3.0]
    return [r.end - r.arrival for r in rows], len(done) / (duration - 3.0)


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- background ------------------------------------------------------------------------------


def background_run(
    target: Target, setting: str, sf: float, duration: float, rate: float, mpl: int, seed: int
) -> dict[str, float]:
    fg = Workload("app", match=_match("app"))
    setting, renice = _renice_of(setting)
    if setting == "classes":
        background = Workload("export", tier=Tier.BACKGROUND, match=_match("export"))
        cfg = _config(fg, background, renice=renice)
    else:
        cfg = _config()
    target.proxy.call(lambda: target.proxy.gate.set_workloads(cfg))
    _limits_for(target, setting, mpl)
    app = OpenLoad("app", FOREGROUND_QUERIES, rate, on=setting != "bg-alone")
    export = ClosedLoad("export", BACKGROUND_QUERIES, 2, on=setting != "fg-alone")
    responses, bg_per_s = open_beside_closed(target, app, export, sf, duration, seed)
    return {
        "fg_mean": statistics.mean(responses) if responses else float("nan"),
        "fg_p95": _quantile(responses, 0.95),
        "fg_n": float(len(responses)),
        "bg_per_s": bg_per_s,
    }


# -- driver ----------------------------------------------------------------------------------


def _fmt(values: Sequence[float], digits: int = 3) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    est = Estimate.of(values)
    return (
        f"{est.mean:.{digits}f} ± {est.ci or 0.0:.{digits}f} "
        f"[{min(values):.{digits}f}, {max(values):.{digits}f}]"
    )


def _interleaved(
    settings: Sequence[str], reps: int, run: Callable[[str, int], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {s: [] for s in settings}
    for rep in range(reps):
        for setting in run_order(settings, 11, rep):
            _say(f"  repetition {rep + 1}/{reps}: {setting}")
            results[setting].append(run(setting, rep + 1))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tpch", type=float, default=1.0, help="TPC-H scale factor")
    parser.add_argument("--mpl", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per run")
    parser.add_argument("--scenarios", default="fair,priority,background")
    parser.add_argument("--policy", default="fcfs", help="the policy within a tenant")
    parser.add_argument(
        "--backend",
        default="duckdb",
        help="duckdb (embedded), postgres (a temporary PostgreSQL cluster started here) or "
        "postgresql://… (TPC-H is loaded into it)",
    )
    parser.add_argument(
        "--renice",
        type=int,
        default=None,
        help="PostgreSQL: run batch and background statements' backends at this niceness "
        "(adds the settings 'tiers+cap+renice' and 'classes+renice')",
    )
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - {"fair", "priority", "background"}
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}")
    sf, reps, duration, mpl = args.tpch, args.repetitions, args.duration, args.mpl
    cluster = None
    backend = args.backend
    if backend == "postgres":
        from testing.pgcluster import start_cluster

        cluster = start_cluster()
        backend = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
    if backend != "duckdb":
        DIALECT[0] = "postgres"
    RENICE[0] = args.renice
    _say(f"loading TPC-H SF {sf:g} into {backend} …")
    target = open_target(
        backend, sf, limits=Limits(mpl=mpl), workloads=WorkloadConfig(), policy=args.policy
    )
    try:
        demands = measure_demands(
            target, sorted({*FAIR_QUERIES, *INTERACTIVE_QUERIES, *BATCH_QUERIES}), sf
        )
        _say("D_r (s, alone, mean of 3): " + ", ".join(f"Q{q} {d:.3f}" for q, d in demands.items()))
        print(
            f"# workload classes, TPC-H SF {sf:g}, MPL {mpl}, {reps} repetitions, "
            f"{duration:g} s runs"
        )
        if "fair" in scenarios:
            _say("fair: gold (weight 2) and silver (1), bronze (1) joins at 60 %")
            res = _interleaved(
                ["classes", "no classes"],
                reps,
                lambda s, r: fair_run(target, s == "classes", sf, duration, r, demands),
            )
            print(
                "\n## fair shares, 10 s windows sliding by 1 s after the first 10 s "
                "(slots: statement-seconds in service, read every 0.1 s; work: Σ D_r "
                "of the statements completed)"
            )
            print(f"{'':28}" + "".join(f"{s:>34}" for s in res))
            for k in res["classes"][0]:
                cells = "".join(f"{_fmt([r[k] for r in rows]):>34}" for rows in res.values())
                print(f"{k:28}{cells}")
            print(
                "targets: gold/silver within 5 % of 2 in every 10 s window; F ≤ 0.05; "
                "bronze at 0.25 within 2 s"
            )
        if "priority" in scenarios:
            d_short = statistics.mean(demands[q] for q in INTERACTIVE_QUERIES)
            rate = 0.2 / d_short  # ρ = λ · D: 20 % of the load
            _say(
                f"priority: interactive at {rate:.1f}/s (20 % by D_r {d_short:.3f} s), "
                "batch saturating"
            )
            pres = _interleaved(
                ["alone", *BASELINES, "tiers", "tiers+cap"]
                + (["tiers+cap+renice"] if args.renice else []),
                reps,
                lambda s, r: priority_run(target, s, sf, duration, rate, mpl, r),
            )
            print(
                f"\n## interactive over batch (interactive {rate:.1f}/s = 20 % load; "
                "batch 8 clients)"
            )
            alone = [r["web_mean"] for r in pres["alone"]]
            print(f"{'setting':14}{'web mean R':>30}{'web p95':>30}{'× alone':>30}{'batch/s':>30}")
            for s, rows in pres.items():
                ratio = [r["web_mean"] / a for r, a in zip(rows, alone, strict=True)]
                print(
                    f"{s:14}{_fmt([r['web_mean'] for r in rows]):>30}"
                    f"{_fmt([r['web_p95'] for r in rows]):>30}{_fmt(ratio, 2):>30}"
                    f"{_fmt([r['etl_per_s'] for r in rows], 2):>30}"
                )
            print("target: interactive mean R ≤ 1.2 × alone")
        if "background" in scenarios:
            fg_d = {
                q: demands.get(q) or measure_demands(target, [q], sf)[q] for q in FOREGROUND_QUERIES
            }
            rate = 0.6 / statistics.mean(fg_d.values())
            _say(f"background: foreground {rate:.1f}/s (ρ 0.6 by D_r), background 2 clients")
            bres = _interleaved(
                ["fg-alone", "bg-alone", *BASELINES, "classes"]
                + (["classes+renice"] if args.renice else []),
                reps,
                lambda s, r: background_run(target, s, sf, duration, rate, mpl, r),
            )
            print(f"\n## background in idle periods (foreground {rate:.1f}/s, ρ = 0.6 by D_r)")
            fg_alone = [r["fg_mean"] for r in bres["fg-alone"]]
            bg_alone = [r["bg_per_s"] for r in bres["bg-alone"]]
            print(
                f"{'setting':14}{'fg mean R':>30}{'× alone':>26}{'fg p95':>30}"
                f"{'bg/s':>26}{'× alone':>26}"
            )
            for s, rows in bres.items():
                fr = [r["fg_mean"] / a for r, a in zip(rows, fg_alone, strict=True)]
                br = [r["bg_per_s"] / a for r, a in zip(rows, bg_alone, strict=True)]
                print(
                    f"{s:14}{_fmt([r['fg_mean'] for r in rows]):>30}{_fmt(fr, 2):>26}"
                    f"{_fmt([r['fg_p95'] for r in rows]):>30}"
                    f"{_fmt([r['bg_per_s'] for r in rows], 2):>26}{_fmt(br, 2):>26}"
                )
            print("targets: foreground mean R ≤ 1.05 × alone; background ≥ 0.5 × alone")
    finally:
        target.close()
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
