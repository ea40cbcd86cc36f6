"""Gemini against BuildMemGraph on the 8 training workloads of ``tests/test_gemini.py``, from
the tightest memory BuildMemGraph plans in to generous memory (issue 43's goal).

    PYTHONPATH=. python bench/bench_gemini.py                        # the table (markdown)
    PYTHONPATH=. python bench/bench_gemini.py --docs docs/gemini.md  # and the page's table

Each workload is planned on ``p100x4`` GPUs (as many as it uses) with ``factor`` times
:func:`~offloadlab.planner.buildmemgraph.min_capacity` (the least memory BuildMemGraph plans
in; ``generous``: 1 TiB) by ``buildmemgraph`` and by ``gemini`` with the test's chunk size,
and with the chunk size searched and gradient chunks (the test's ``SEARCH``), each without
prefetch and with ``max_prefetch=PREFETCH``; each plan is verified and simulated
(``dynamic``).  A cell is the makespan in ms and, for Gemini, its ratio to BuildMemGraph's
(below 1: Gemini is faster), or the planner's error.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_gemini import CASES, IDS, SEARCH  # noqa: E402
from timing import replace_docs_block  # noqa: E402

FACTORS: tuple[float, ...] = (1.0, 1.1, 1.5, 2.0, 4.0, float("inf"))
PREFETCH = 4
BEGIN, END = "<!-- bench_gemini: begin -->", "<!-- bench_gemini: end -->"


def specs(gemini: str) -> list[str]:
    return ["buildmemgraph", gemini, f"{gemini},max_prefetch={PREFETCH}", gemini + SEARCH,
            f"{gemini}{SEARCH},max_prefetch={PREFETCH}"]


def one(workload: str, factor: float, planner: str) -> tuple[float | None, str]:
    """The plan's simulated makespan (s) and its error (empty if it planned)."""
    from dataclasses import replace

    from offloadlab.core.errors import PlanError
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity
    from offloadlab.simulator import makespan

    graph = build_workload(workload)
    memory = 1 << 40 if factor == float("inf") else int(min_capacity(graph) * factor)
    machine = replace(machine_from_spec("p100x4"), gpus=max(1, len(graph.gpus())),
                      gpu_memory=memory)
    try:
        mg = plan(graph, machine, planner)
    except PlanError as e:
        return None, str(e)
    verify(mg, graph, machine)
    return makespan(mg, machine), ""


def table(jobs: int) -> tuple[str, list[str]]:
    """The markdown table and the errors."""
    points = [(w, f, p) for w, g in CASES for f in FACTORS for p in specs(g)]
    with ProcessPoolExecutor(jobs) as pool:
        results = dict(zip(points, pool.map(one, *zip(*points))))
    lines = [f"| workload | memory | buildmemgraph | gemini | gemini, max_prefetch={PREFETCH} "
             f"| gemini, searched | gemini, searched, max_prefetch={PREFETCH} |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    errors = []
    for (workload, gemini), name in zip(CASES, IDS):
        for factor in FACTORS:
            cells = []
            base = results[workload, factor, "buildmemgraph"][0]
            for p in specs(gemini):
                time, error = results[workload, factor, p]
                if time is None:
                    cells.append("refused")
                    errors.append(f"{name} {factor}x {p}: {error}")
                elif p == "buildmemgraph" or base is None:
                    cells.append(f"{1000 * time:.3f}")
                else:
                    cells.append(f"{1000 * time:.3f} ({time / base:.2f})")
            memory = "generous" if factor == float("inf") else f"{factor:g}x"
            lines.append(f"| {name} | {memory} | " + " | ".join(cells) + " |")
    return "\n".join(lines), errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", help="a page whose table between the bench_gemini markers to "
                    "replace")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    text, errors = table(args.jobs)
    print(text)
    for error in errors:
        print(error, file=sys.stderr)
    if args.docs and not replace_docs_block(Path(args.docs), BEGIN, END, text):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
