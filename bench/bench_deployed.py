"""BuildMemGraph against the offload schemes users deploy, on the problems of issue 45's goal
(docs/results/deployed.md).

    PYTHONPATH=. python bench/bench_deployed.py                          # the tables (markdown)
    PYTHONPATH=. python bench/bench_deployed.py --docs docs/results/deployed.md
    PYTHONPATH=. python bench/bench_deployed.py --only mlp --factors 2
    PYTHONPATH=. python bench/bench_deployed.py --only "llama-lora-train 7B" \\
        --docs docs/results/deployed.md          # that problem's part of the page only

Each problem is a TaskGraph and a machine: ``gpt2-train`` on a V100, ``llama-lora-train``
(7B) on ``a100x8``'s GPUs, ``llama-prefill`` (13B) and ``llama-generate`` (7B, a prompt of 128
tokens and two decode steps) on one of ``a100x8``'s GPUs, and three models
traced from PyTorch for one training step (what ``offloadlab import-torch --train`` does: the
MLP, the ResNet-18-shaped CNN and the GPT-2-shaped transformer of
``offloadlab/data/models/export.py``; needs torch) on a V100.  Its GPUs get ``factor`` times
the least memory BuildMemGraph plans in (:func:`~offloadlab.planner.buildmemgraph.min_capacity`)
for each ``--factors``, and :func:`~offloadlab.lab.compare.compare_planners` plans, verifies
and simulates (``dynamic``) every registered planner there: the papers' planners, the deployed
schemes (those that do not apply to the problem refuse it in one line) and the problem's lower
bound.  A cell is the simulated makespan in seconds, ``-`` where the planner does not apply
to the problem (:data:`NOT_APPLICABLE`), ``OOM`` where it refused otherwise: for want of GPU
memory (each refusal's line goes to stderr); the summary gives BuildMemGraph's makespan over
each deployed scheme's (below 1: BuildMemGraph is faster) and over the bound.  With
``--only`` and ``--docs`` the page keeps the other problems' tables and summary rows as they
are, and the problems run replace theirs (or follow them).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from timing import replace_docs_block

DEPLOYED = ("torch-compile-offload", "torchtune-offload", "zero-offload", "fsdp-cpu-offload",
            "accelerate-offload", "flexgen")
PROBLEMS: dict[str, tuple[str, str]] = {
    "gpt2-train": ("gpt2-train", "v100"),
    "llama-lora-train 7B": ("llama-lora-train:model=7b", "a100x8:gpus=1"),
    "llama-prefill 13B": ("llama-prefill:model=13b", "a100x8:gpus=1"),
    "llama-generate 7B": ("llama-generate:model=7b,seq=128,gen=2", "a100x8:gpus=1"),
    "mlp": ("torch:mlp", "v100"),
    "resnet18": ("torch:resnet18", "v100"),
    "gpt2 (traced)": ("torch:gpt2", "v100"),
}
"""label -> (workload spec, or ``torch:NAME`` for a model of export.py traced for training;
machine spec)."""
FACTORS = (1.5, 4.0, 16.0)
BEGIN, END = "<!-- bench_deployed: begin -->", "<!-- bench_deployed: end -->"


def taskgraph(workload: str):
    """The problem's TaskGraph: a built-in workload, or a model traced from PyTorch."""
    if workload.startswith("torch:"):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "offloadlab" / "data"
                               / "models"))
        from export import export  # needs torch
        return export(workload.removeprefix("torch:"), "train", 1)
    from offloadlab.core.workloads import build_workload
    return build_workload(workload)


def one(label: str, factor: float) -> list[dict]:
    """compare_planners' rows for one problem at ``factor`` times its tightest memory."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.lab.compare import compare_planners
    from offloadlab.planner import PLANNERS
    from offloadlab.planner.buildmemgraph import min_capacity

    workload, machine_text = PROBLEMS[label]
    graph = taskgraph(workload)
    memory = int(min_capacity(graph) * factor)
    machine = machine_from_spec(f"{machine_text},gpu_memory={memory}" if ":" in machine_text
                                else f"{machine_text}:gpu_memory={memory}")
    table = compare_planners(graph, machine, sorted(PLANNERS), milp_time_limit=10.0,
                             workload=workload)
    return [dict(row, label=label, factor=factor, memory=memory)
            for row in table.to_dict("records")]


NOT_APPLICABLE = re.compile(r"plans (training steps|LLaMA inference)|is not a training "
                            r"(workload|step)")
"""A planner's refusal of a problem it does not plan (any other refusal is for memory)."""


def cell(row: dict) -> str:
    if row["outcome"] == "ok":
        return f"{row['makespan']:.4g}"
    return "-" if NOT_APPLICABLE.search(str(row["error"])) else "OOM"


Section = tuple[list[str], list[str]]
"""A problem's part of the page: its table's lines and its rows of the summary."""
SUMMARY = ["BuildMemGraph's makespan over each deployed scheme's that plans the problem (below "
           "1: BuildMemGraph is faster) and over the lower bound:", "",
           "| problem | memory | over the deployed schemes | over the bound |",
           "| --- | --- | --- | ---: |"]


def sections(rows: list[dict], factors: tuple[float, ...]) -> tuple[dict[str, Section],
                                                                     list[str]]:
    """Each problem's table (planners x memories) and summary rows, and the refusals."""
    parts: dict[str, Section] = {}
    notes: list[str] = []
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        memories = {r["factor"]: r["memory"] for r in mine}
        out = [f"**{label}** (`{PROBLEMS[label][0]}` on `{PROBLEMS[label][1]}`)", "",
               "| planner | " + " | ".join(f"{f:g}x: {memories[f] / 2**20:,.0f} MiB"
                                             for f in factors) + " |",
               "| --- |" + " ---: |" * len(factors)]
        by = {(r["planner"], r["factor"]): r for r in mine}
        for planner in dict.fromkeys(r["planner"] for r in mine):
            out.append(f"| {planner} | " + " | ".join(cell(by[planner, f]) for f in factors)
                       + " |")
            notes += [f"{label} {f:g}x {planner}: {by[planner, f]['error']}" for f in factors
                      if by[planner, f]["outcome"] != "ok"]
        bound = {f: by["buildmemgraph", f]["problem_bound"] for f in factors}
        out += ["| lower bound | " + " | ".join(f"{bound[f]:.4g}" for f in factors) + " |", ""]
        summary = []
        for f in factors:
            ours = by["buildmemgraph", f]
            if ours["outcome"] != "ok":
                continue
            cells = {p: cell(by[p, f]) for p in DEPLOYED if (p, f) in by}
            ratios = [f"{p} {ours['makespan'] / by[p, f]['makespan']:.2f}"
                      for p, c in cells.items() if c not in ("-", "OOM")]
            short = [p for p, c in cells.items() if c == "OOM"]
            gains = ", ".join(ratios) or "none plans it"
            gains += f" (OOM: {', '.join(short)})" if short else ""
            summary.append(f"| {label} | {f:g}x | {gains} | {ours['makespan'] / bound[f]:.2f} |")
        parts[label] = out, summary
    return parts, notes


def page_sections(page: str) -> dict[str, Section]:
    """The problems' parts of a page's block that :func:`markdown` wrote, in its order."""
    lines = page.partition(BEGIN)[2].partition(END)[0].splitlines()
    summary = lines.index(SUMMARY[0]) if SUMMARY[0] in lines else len(lines)
    starts = [k for k in range(summary) if lines[k].startswith("**")] + [summary]
    parts: dict[str, Section] = {}
    for start, end in zip(starts, starts[1:]):
        label = lines[start][2:].split("**")[0]
        parts[label] = lines[start:end], [line for line in lines[summary:]
                                          if line.startswith(f"| {label} |")]
    return parts


def markdown(parts: dict[str, Section]) -> str:
    """The tables, one per problem, then the summary."""
    out = [line for table, _ in parts.values() for line in table]
    return "\n".join(out + SUMMARY + [row for _, rows in parts.values() for row in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", choices=sorted(PROBLEMS),
                    help="one problem (repeatable)")
    ap.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS),
                    help="GPU memory as multiples of BuildMemGraph's tightest")
    ap.add_argument("--docs", help="a page whose block between the bench_deployed markers to "
                    "replace")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    try:
        factors = tuple(float(f) for f in args.factors.split(","))
    except ValueError:
        factors = ()
    if not factors or not all(math.isfinite(f) and f >= 1 for f in factors):
        ap.error(f"--factors: numbers >= 1 separated by commas, got {args.factors!r}")
    points = [(label, f) for label in args.only or PROBLEMS for f in factors]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [row for part in pool.map(one, *zip(*points)) for row in part]
    parts, notes = sections(rows, factors)
    print(markdown(parts))
    for note in notes:
        print(note, file=sys.stderr)
    if args.docs:
        if args.only:       # the other problems' parts stay as the page has them
            parts = page_sections(Path(args.docs).read_text()) | parts
        if not replace_docs_block(Path(args.docs), BEGIN, END, markdown(parts)):
            return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench_deployed: interrupted", file=sys.stderr)
        sys.exit(130)
