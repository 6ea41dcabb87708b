"""The README's policy tables, in Markdown, from `admission bench --save` results.

python -m benchmarks.policies_table out/policies/light.json out/policies/medium.json …
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _cell(summary: dict[str, float | None], key: str) -> str:
    value, ci = summary[key], summary.get(f"{key}_ci")
    if value is None:
        return "–"
    return f"{value:.3g}" + (f" ± {ci:.2g}" if ci is not None else "")


def table(path: Path) -> str:
    result = json.loads(path.read_text())
    lines = [
        f"**{result['mix'].capitalize()}** (TPC-H SF {result['tpch']:g}, {result['clients']} "
        f"clients, MPL {result['mpl'] or '∞'}, {result['repetitions']} × {result['duration']:g} s)",
        "",
        "| policy | throughput /s | mean R (s) | p95 R (s) | p99 R (s) | weighted slowdown |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in result["policies"].items():
        cells = [
            _cell(s, k)
            for k in (
                "throughput",
                "mean_response",
                "p95_response",
                "p99_response",
                "weighted_slowdown",
            )
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        raise SystemExit(__doc__)
    print("\n\n".join(table(p) for p in paths))


if __name__ == "__main__":
    main()
