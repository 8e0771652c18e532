"""Run the benchmarks and write ``bench/results/latest.md`` and ``latest.json`` (or the
names ``--summary`` gives)."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

SUITES = [
    "execution",
    "transfer",
    "chat",
    "operator",
    "concurrency",
    "faults",
    "ha",
    "session_start",
    "fairness",
    "storage",
    "e2b",
    "tracing",
    "egress",
]
# Run only when named: tracing runs the chat and execution suites twice per round.
OPT_IN = {"tracing"}
RESULTS = Path(__file__).resolve().parent / "results"


def table(figures) -> str:
    lines = [
        "| measure | p50 | p99 | baseline | baseline p50 | ratio p50 | goal |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        lines.append(
            f"| {f.name} | {f.p50:.2f} {f.unit} | {f.p99:.2f} {f.unit} | "
            f"{f.baseline_name} | {f.baseline_p50:.2f} {f.unit} | {f.ratio:.3f} | "
            f"{f.goal} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="few repetitions (CI smoke)")
    parser.add_argument(
        "--sessions",
        type=int,
        help="operator: only the scale figures, with this many sessions (e.g. 10000)",
    )
    parser.add_argument(
        "--summary",
        default="latest",
        help="name of the summary files in bench/results (NAME.md, NAME.json); the test "
        "command runs groups of suites side by side, each with its own",
    )
    parser.add_argument(
        "suites", nargs="*", help=f"any of {', '.join(SUITES)} (default: all but tracing)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(sorted(unknown))}; choose from {SUITES}")
    args.suites = args.suites or [s for s in SUITES if s not in OPT_IN]
    figures = []
    for name in args.suites:
        started = time.monotonic()
        module = importlib.import_module(f"bench.{name}")
        scaled = args.sessions and name == "operator"
        got = module.run(args.quick, sessions=args.sessions) if scaled else module.run(args.quick)
        figures.extend(got)
        print(f"{name}: {len(got)} figures in {time.monotonic() - started:.1f}s", flush=True)
    md = table(figures)
    print(md)
    RESULTS.mkdir(exist_ok=True)
    meta = {
        "quick": args.quick,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (RESULTS / f"{args.summary}.md").write_text(md + "\n")
    (RESULTS / f"{args.summary}.json").write_text(
        json.dumps(
            {"meta": meta, "figures": [{**asdict(f), "ratio": f.ratio} for f in figures]}, indent=2
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
