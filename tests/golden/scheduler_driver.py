"""A small data-driven test runner for the scheduler (in the style of CockroachDB's testdata).

A script is a sequence of commands, each followed by ``----`` and the output it must print:

    submit q1 A t=0
    ----
    grant q1(A)
    running: q1(A) | queued: - | N: A=10 B=0 | threads 10/20 | jobs 1/2

Lines starting with ``#`` are comments. ``model`` and ``A`` take indented input lines before
``----``. Run with ``GOLDEN_REWRITE=1`` to rewrite the expected output from the actual one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from admission import ClassProfile, EtaModel, Event, Limits, Scheduler
from admission.policies import policy_by_name
from admission.scheduler import DUE_FACTOR


@dataclass
class Case:
    command: str
    input: list[str]
    expected: list[str]
    actual: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


def parse(text: str) -> list[Case]:
    cases: list[Case] = []
    lines = text.splitlines()
    i = 0
    comments: list[str] = []
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            comments.append(line)
            i += 1
            continue
        command, inputs = line, []
        i += 1
        while i < len(lines) and lines[i] != "----":
            inputs.append(lines[i])
            i += 1
        i += 1  # skip ----
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        cases.append(Case(command, inputs, expected, comments=comments))
        comments = []
    return cases


def render(cases: list[Case]) -> str:
    out: list[str] = []
    for case in cases:
        out.extend(case.comments)
        out.append(case.command)
        out.extend(case.input)
        out.append("----")
        out.extend(case.actual)
        out.append("")
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


def _kv(words: list[str]) -> tuple[list[str], dict[str, str]]:
    pos, kv = [], {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            kv[k] = v
        else:
            pos.append(w)
    return pos, kv


def _num(value: str | None) -> float | None:
    return None if value is None or value == "none" else float(value)


def _int(value: str | None) -> int | None:
    return None if value is None or value == "none" else int(value)


class Driver:
    def __init__(self) -> None:
        self.model = EtaModel()
        self.a_rows: dict[str, list[float]] = {}
        self.scheduler: Scheduler | None = None
        self.events: list[Event] = []

    def run(self, case: Case) -> list[str]:
        words = case.command.split()
        verb, (pos, kv) = words[0], _kv(words[1:])
        handler = getattr(self, "do_" + verb.replace("-", "_"), None)
        if handler is None:
            raise ValueError(f"unknown golden command {verb!r}")
        try:
            return handler(pos, kv, case.input)
        except (ValueError, KeyError) as e:
            return [f"error: {e}"]

    # -- setup -----------------------------------------------------------------------------

    def do_model(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        """Input lines: ``NAME D=.. f=.. U=.. Q=.. [D_low=.. D_high=..]`` or ``A[NAME]: a1 a2 ...``
        (row r of A^c_r)."""
        classes, a_rows = [], {}
        for raw in lines:
            words = raw.split()
            if words[0].startswith("A[") and words[0].endswith("]:"):
                a_rows[words[0][2:-2]] = [float(x) for x in words[1:]]
                continue
            _, p = _kv(words[1:])
            classes.append(
                ClassProfile(
                    fingerprint=words[0],
                    name=words[0],
                    D=float(p.get("D", 1)),
                    f=int(p.get("f", 1)),
                    U=float(p.get("U", 0)),
                    Q=float(p.get("Q", 0)),
                    D_low=_num(p.get("D_low")),
                    D_high=_num(p.get("D_high")),
                )
            )
        a = tuple(tuple(a_rows[c.name]) for c in classes) if a_rows else ()
        self.model = EtaModel(classes=tuple(classes), A_matrix=a)
        return [f"{len(classes)} classes"]

    def do_eta(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        prio = policy_by_name(pos[0]).build(self.model)
        names = [c.name for c in self.model.classes]
        out = []
        for r, row in enumerate(prio.eta):
            cells = " ".join(f"{v:+.3f}" for v in row)
            out.append(f"{names[r]}: bias {prio.bias[r]:+.3f} | eta {cells}")
        return out

    def do_scheduler(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.events = []
        self.scheduler = Scheduler(
            self.model, kv.get("policy", "fcfs"), self._limits(pos, kv), self.events.append
        )
        return [self._state()]

    def _limits(self, pos: list[str], kv: dict[str, str]) -> Limits:
        return Limits(
            mpl=_int(kv.get("mpl")),
            threads=_int(kv.get("threads")),
            backfill="backfill" in pos,
            max_wait=_num(kv.get("max_wait")),
            queue_timeout=_num(kv.get("timeout")),
            due_factor=_num(kv["due"]) if "due" in kv else DUE_FACTOR,
            release_after=_num(kv.get("release")),
            short_lane=_num(kv.get("lane")),
        )

    # -- commands --------------------------------------------------------------------------

    @property
    def s(self) -> Scheduler:
        assert self.scheduler is not None, "the script must create a scheduler first"
        return self.scheduler

    def do_submit(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        fork = _int(kv.get("fork"))
        self.s.submit(pos[0], pos[1], float(kv["t"]), fork=fork, bypass="bypass" in pos)
        return self._report()

    def do_complete(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.s.complete(pos[0], float(kv["t"]))
        return self._report()

    def do_tasks(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.s.update_tasks(pos[0], int(kv["n"]), int(kv.get("release", 0)), float(kv["t"]))
        return self._report()

    def do_cancel(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.s.cancel(pos[0], float(kv["t"]))
        return self._report()

    def do_tick(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.s.tick(float(kv["t"]))
        return self._report()

    def do_policy(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.s.set_policy(pos[0], float(kv["t"]))
        return self._report()

    def do_limits(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        self.s.set_limits(self._limits(pos, kv), float(kv["t"]))
        return self._report()

    def do_scores(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        pairs = zip(self.s.class_names, self.s.scores(), strict=True)
        return [" ".join(f"{n}={v:+.3f}" for n, v in pairs)]

    def do_deadline(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        return [f"next deadline: {self.s.next_deadline()}"]

    def do_stats(self, pos: list[str], kv: dict[str, str], lines: list[str]) -> list[str]:
        st = self.s.stats
        return [
            " ".join(f"{k}={getattr(st, k)}" for k in st.__slots__)  # type: ignore[attr-defined]
        ]

    # -- printing --------------------------------------------------------------------------

    def _report(self) -> list[str]:
        lines = [self._event(e) for e in self.events if e.kind != "submit"]
        self.events.clear()
        return [*lines, self._state()]

    @staticmethod
    def _event(e: Event) -> str:
        detail = f" [{e.detail}]" if e.detail else ""
        return f"{e.kind} {e.job}({e.class_name}){detail}"

    def _state(self) -> str:
        s = self.s
        running = sorted(
            (j for j in s._jobs.values() if j.state.value == "running"), key=lambda j: j.seq
        )
        run = " ".join(f"{j.id}({j.class_name})" for j in running) or "-"
        queues = []
        for st in s._classes:
            live = [
                str(j.id)
                for lane in s._lanes
                for j in lane.queues[st.index]
                if j.state.value == "queued"
            ]
            if live:
                queues.append(f"{st.name}[{' '.join(live)}]")
        tasks = " ".join(f"{n}={t}" for n, t in zip(s.class_names, s.tasks_by_class(), strict=True))
        threads = s.limits.threads if s.limits.threads is not None else "inf"
        mpl = s.limits.mpl if s.limits.mpl is not None else "inf"
        return (
            f"running: {run} | queued: {' '.join(queues) or '-'} | N: {tasks or '-'}"
            f" | threads {s.threads_in_use}/{threads} | jobs {s.in_service}/{mpl}"
        )


def run_script(path: Path) -> tuple[str, str]:
    """Returns (expected text, actual text) for one script."""
    text = path.read_text()
    cases = parse(text)
    driver = Driver()
    for case in cases:
        case.actual = driver.run(case)
    return text, render(cases)
