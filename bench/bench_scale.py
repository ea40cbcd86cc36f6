"""How each stage of the pipeline scales with the number of vertices (issue 16's table).

    python bench/bench_scale.py                                   # docs/results/performance.md
    python bench/bench_scale.py --vertices 10000,100000 --factors 1.5 --workloads host
    python bench/bench_scale.py --points paper                    # the papers' graphs (long)
    python bench/bench_scale.py --points lora7b-8,random8-200k --plan-only

For every workload, machine, memory factor and size, two fresh processes do what the two
commands users run do: the first (``offloadlab plan``) builds the workload, plans it with
``buildmemgraph``, verifies the MemGraph and writes it (node-link JSON, or with ``--format
parquet`` a Parquet table); the second (``offloadlab simulate``) reads it, verifies it again
and simulates it (``dynamic``), one stage after the other, so that each stage's cost shows
(the commands verify beside writing or simulating, in a child process:
``offloadlab/lab/beside.py``).  Each stage's seconds and microseconds per TaskGraph vertex are
reported, with each process's peak resident memory.  GPU memory is ``factor`` times the
tightest feasible capacity (:func:`min_capacity`, not timed) on the machine's GPUs.
Workloads: ``host`` is the benchmark DAG (``random`` with ``host_fraction=1``, every input in
host RAM); ``default`` is the ``random`` workload with its default options (half the inputs
live on GPUs).

``--points`` runs named graphs at the machine preset's own memory instead of the grid (opt-in:
minutes each): TURNIP's LoRA training points of ``turnip-lora`` (``lora7b-8``, ``lora7b-16``,
``lora7b-32``: 7B at 1K tokens and batch 8, 16, 32; ``lora65b-8``: 65B at batch 8; 0.38-1.6M
vertices) and the 8-GPU random DAG (``random8-200k``: ``random:vertices=200000,gpus=8``), all
on ``a100x8``; ``paper`` names them all.  It prints a Markdown table: each stage's seconds,
its microseconds per TaskGraph vertex and the process's peak resident memory when the stage
ends (the peak so far: a stage's own peak when it is the highest yet).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
from typing import Any

from timing import in_fresh_process, stopwatch

WORKLOADS = {"host": "host_fraction=1", "default": ""}
STAGES = ("build", "plan", "verify", "write", "read", "verify2", "simulate")
LORA = "llama-lora-train:model={},seq=1024,batch={},gpus=8"
POINTS = {"lora7b-8": LORA.format("7b", 8), "lora7b-16": LORA.format("7b", 16),
          "lora7b-32": LORA.format("7b", 32), "lora65b-8": LORA.format("65b", 8),
          "random8-200k": "random:vertices=200000,gpus=8"}
"""``--points``: name -> workload spec, planned on ``a100x8`` as the preset has it."""


def workload_spec(workload: str, machine: str, vertices: int) -> str:
    """The ``random`` workload ``workload`` (:data:`WORKLOADS`) of ``vertices`` vertices on
    the GPUs of the preset ``machine``."""
    from offloadlab.core.machine import machine_from_spec

    extra = WORKLOADS[workload]
    gpus = machine_from_spec(machine).gpus
    return f"random:vertices={vertices},gpus={gpus}" + (f",{extra}" if extra else "")


def sized_machine(machine: str, graph: Any, factor: float) -> Any:
    """The preset ``machine`` with ``factor`` times the tightest feasible GPU memory for
    ``graph`` (:func:`min_capacity`)."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.planner.buildmemgraph import min_capacity

    return machine_from_spec(f"{machine}:gpu_memory={int(min_capacity(graph) * factor)}")


def peak_mib() -> float:
    """This process's peak resident memory so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def staged(row: dict):
    """:func:`stopwatch`'s ``lap`` that also notes the peak resident memory at each stage's
    end (``STAGE_rss_mib``)."""
    lap = stopwatch(row)

    def staged_lap(stage: str | None) -> None:
        lap(stage)
        if stage is not None:
            row[f"{stage}_rss_mib"] = peak_mib()
    return staged_lap


def plan_process(spec: str, machine: str, factor: float | None, path: str) -> dict:
    """What ``offloadlab plan`` does, stage by stage, in this process, for the workload
    ``spec`` on the preset ``machine`` (with ``factor`` times the tightest feasible memory,
    or, None, the preset's own); writes ``path``."""
    from offloadlab.core import formats
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan

    row: dict = {}
    lap = staged(row)
    graph = build_workload(spec)
    lap("build")
    m = machine_from_spec(machine) if factor is None else sized_machine(machine, graph, factor)
    lap(None)
    mg = plan(graph, m, "buildmemgraph")
    lap("plan")
    verify(mg, graph, m)
    lap("verify")
    formats.write_memgraph(mg, path)
    lap("write")
    row.update(vertices=len(graph), memgraph=len(mg), offloads=mg.count("offload"),
               plan_rss_mib=peak_mib())
    return row


def simulate_process(path: str) -> dict:
    """What ``offloadlab simulate`` does, stage by stage, in this process."""
    from offloadlab.core import formats
    from offloadlab.core.machine import Machine
    from offloadlab.core.verify import verify
    from offloadlab.simulator import simulate

    row: dict = {}
    lap = staged(row)
    mg = formats.read_memgraph(path)
    lap("read")
    m = Machine.from_dict(mg.graph["machine"])
    verify(mg, machine=m)
    lap("verify2")
    result = simulate(mg, m)
    lap("simulate")
    row.update(makespan=result.makespan, simulate_rss_mib=peak_mib())
    return row


def point(spec: str, machine: str, factor: str, timeout: float, simulated: bool = True,
          fmt: str = "json") -> tuple[dict | None, str]:
    """Both processes of one point (the first alone unless ``simulated``), the MemGraph file
    in format ``fmt``, the machine's memory ``factor`` times the tightest ("": the preset's):
    their rows merged, or (None, why one failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"mg.{fmt}")
        row, why = in_fresh_process(__file__, f"plan|{spec}|{machine}|{factor}|{path}", timeout)
        if row is None:
            return None, f"plan: {why}"
        if simulated:
            more, why = in_fresh_process(__file__, f"simulate|{path}", timeout)
            if more is None:
                return None, f"simulate: {why}"
            row.update(more)
    return row, ""


def print_points(names: list[str], stages: tuple[str, ...], timeout: float, simulated: bool,
                 fmt: str) -> None:
    """The ``--points`` table, a row per point as it finishes."""
    print("| point | TaskGraph | MemGraph | " + " | ".join(
        f"{s}: s, µs/vertex, peak" for s in stages) + " |")
    print("|" + " --- |" * (3 + len(stages)))
    for name in names:
        row, why = point(POINTS[name], "a100x8", "", timeout, simulated, fmt)
        if row is None:
            print(f"| {name} | {why} |" + " |" * (1 + len(stages)), flush=True)
            continue
        n = row["vertices"]
        cells = [f"{row[s]:.2f} s, {row[s] / n * 1e6:.1f}, {row[f'{s}_rss_mib'] / 1024:.2f} GiB"
                 for s in stages]
        print(f"| {name} | {n:,} | {row['memgraph']:,} | " + " | ".join(cells) + " |",
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", default="10000,100000,1000000")
    p.add_argument("--factors", default="1.1,1.5,10,100")
    p.add_argument("--workloads", default="host,default")
    p.add_argument("--machines", default="p100x4,a100x8")
    p.add_argument("--timeout", type=float, default=900, help="seconds per process (900)")
    p.add_argument("--plan-only", action="store_true",
                   help="run the first process (build, plan, verify, write) alone")
    p.add_argument("--format", choices=("json", "parquet"), default="json",
                   help="the MemGraph file written and read (json: node-link JSON)")
    p.add_argument("--points", help="named graphs instead of the grid, comma-separated: "
                                    f"{', '.join(POINTS)}, or paper (all of them)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        which, *fields = args.one.split("|")
        if which == "plan":
            spec, m, f, path = fields
            print(json.dumps(plan_process(spec, m, float(f) if f else None, path)))
        else:
            print(json.dumps(simulate_process(fields[0])))
        return
    stages = STAGES[:4] if args.plan_only else STAGES
    if args.points:
        names = list(POINTS) if args.points == "paper" else args.points.split(",")
        unknown = [name for name in names if name not in POINTS]
        if unknown:
            p.error(f"--points: unknown {', '.join(unknown)}; use {', '.join(POINTS)} or paper")
        print_points(names, stages, args.timeout, not args.plan_only, args.format)
        return
    print(f"{'workload':8} {'machine':7} {'factor':>6} {'vertices':>9} {'memgraph':>9} "
          + " ".join(f"{s:>14}" for s in stages) + f" {'plan RSS':>9}"
          + ("" if args.plan_only else f" {'sim RSS':>9}"))
    print(" " * 43 + " ".join(f"{'s (us/vertex)':>14}" for _ in stages))
    for w in args.workloads.split(","):
        for m in args.machines.split(","):
            for f in args.factors.split(","):
                for n in args.vertices.split(","):
                    row, why = point(workload_spec(w, m, int(n)), m, f, args.timeout,
                                     not args.plan_only, args.format)
                    if row is None:
                        print(f"{w:8} {m:7} {f:>6} {n:>9} {why}", flush=True)
                        continue
                    cells = " ".join(f"{row[s]:6.2f} ({row[s] / row['vertices'] * 1e6:5.1f})"
                                     for s in stages)
                    peaks = [row["plan_rss_mib"]] + ([] if args.plan_only
                                                     else [row["simulate_rss_mib"]])
                    print(f"{w:8} {m:7} {f:>6} {n:>9} {row['memgraph']:>9} {cells} "
                          + " ".join(f"{peak:>5.0f} MiB" for peak in peaks), flush=True)


if __name__ == "__main__":
    main()
