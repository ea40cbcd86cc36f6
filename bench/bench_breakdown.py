"""Where a simulated run's time goes (issue 43): a GPU's seconds per op class and per kernel
shape, the copies, and each resource's busy time, beside the makespan.

    python bench/bench_breakdown.py --workload llama-lora-train:model=7b,seq=1024,batch=8,gpus=8
    python bench/bench_breakdown.py --workload llama-lora-train:model=7b,seq=1024,batch=8,gpus=8 \\
        --machine a100x8:cost=roofline --top 5

The workload is planned with ``--planner`` on ``--machine``, verified and simulated with dynamic
dispatch.  Each vertex counts at the seconds it takes alone on its resources
(:func:`offloadlab.core.bound.durations`: in the trace, kernels sharing a GPU's streams stretch
each other), summed over the GPUs and divided by their number; kernels by the fitted model's op
class (:func:`offloadlab.core.kernel_model.op_class`, on any machine), copies by kind.  The
numbers behind docs/results/reproductions.md ("Why the batch-8 steps take about half the
paper's time").
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's offloadlab


def breakdown(workload: str, machine: str, planner: str) -> tuple[dict, dict, dict]:
    """The run's makespan and busy times, and ``{row: [vertices, seconds, flops]}`` by class
    and by op and shape, each vertex at its own duration."""
    from offloadlab.core.bound import durations
    from offloadlab.core.kernel_model import op_class
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.ops import op_name
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.simulator import simulate

    m = machine_from_spec(machine)
    graph = build_workload(workload)
    mg = plan(graph, m, planner)
    verify(mg, graph, m)
    result = simulate(mg, m)
    classes: dict = defaultdict(lambda: [0, 0.0, 0.0])
    shapes: dict = defaultdict(lambda: [0, 0.0, 0.0])
    for v, seconds in zip(mg, durations(mg, m)):
        if v.kind == "input":
            continue
        kernel = v.kind == "compute"
        for table, key in ((classes, op_class(v.op) if kernel else v.kind),
                           (shapes, f"{op_name(v.op)} {v.shape}" if kernel else v.kind)):
            row = table[key]
            row[0] += 1
            row[1] += seconds
            row[2] += v.flops
    run = dict(makespan=result.makespan, gpus=m.gpus, busy=result.busy)
    return run, dict(classes), dict(shapes)


def table(rows: dict, gpus: int, top: int | None = None) -> list[str]:
    """A markdown table of ``rows``, most seconds first."""
    lines = ["| row | vertices a GPU | seconds a GPU | TFLOP/s |", "| --- | ---: | ---: | ---: |"]
    ranked = sorted(rows.items(), key=lambda item: -item[1][1])
    for key, (n, seconds, flops) in ranked[:top]:
        rate = f"{flops / seconds / 1e12:.2f}" if seconds and flops else ""
        lines.append(f"| {key} | {n / gpus:,.0f} | {seconds / gpus:.4f} | {rate} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, help="a workload spec")
    p.add_argument("--machine", default="a100x8", help="a machine spec (a100x8)")
    p.add_argument("--planner", default="buildmemgraph", help="a planner spec (buildmemgraph)")
    p.add_argument("--top", type=int, default=12, help="op and shape rows shown (12)")
    args = p.parse_args()
    run, classes, shapes = breakdown(args.workload, args.machine, args.planner)
    gpus = run["gpus"]
    print(f"{args.workload} on {args.machine}, {args.planner}: makespan {run['makespan']:.4f} s")
    print("busy seconds: " + ", ".join(f"{name} {seconds:.3f}"
                                       for name, seconds in sorted(run["busy"].items())
                                       if "->" not in name))
    links = [seconds for name, seconds in run["busy"].items() if "->" in name]
    if links:
        print(f"busiest GPU-to-GPU link: {max(links):.3f}")
    print("\n" + "\n".join(table(classes, gpus)))
    print("\n" + "\n".join(table(shapes, gpus, args.top)))


if __name__ == "__main__":
    main()
