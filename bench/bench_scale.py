"""How each stage of the pipeline scales with the number of vertices (issue 16's table).

    python bench/bench_scale.py                                   # docs/results/performance.md
    python bench/bench_scale.py --vertices 10000,100000 --factors 1.5 --workloads host

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


def plan_process(workload: str, machine: str, factor: float, vertices: int, path: str) -> dict:
    """What ``offloadlab plan`` does, stage by stage, in this process; writes ``path``."""
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan

    spec = workload_spec(workload, machine, vertices)
    row: dict = {}
    lap = stopwatch(row)
    graph = build_workload(spec)
    lap("build")
    m = sized_machine(machine, graph, factor)
    lap(None)
    mg = plan(graph, m, "buildmemgraph")
    lap("plan")
    verify(mg, graph, m)
    lap("verify")
    mg.write(path)
    lap("write")
    row.update(memgraph=len(mg), offloads=mg.count("offload"),
               plan_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


def simulate_process(path: str) -> dict:
    """What ``offloadlab simulate`` does, stage by stage, in this process."""
    from offloadlab.core.machine import Machine
    from offloadlab.core.memgraph import MemGraph
    from offloadlab.core.verify import verify
    from offloadlab.simulator import simulate

    row: dict = {}
    lap = stopwatch(row)
    mg = MemGraph.read(path)
    lap("read")
    m = Machine.from_dict(mg.graph["machine"])
    verify(mg, machine=m)
    lap("verify2")
    result = simulate(mg, m)
    lap("simulate")
    row.update(makespan=result.makespan,
               simulate_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


def point(workload: str, machine: str, factor: str, vertices: str, timeout: float,
          simulated: bool = True, fmt: str = "json") -> tuple[dict | None, str]:
    """Both processes of one point (the first alone unless ``simulated``), the MemGraph file
    in format ``fmt``: their rows merged, or (None, why one failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"mg.{fmt}")
        row, why = in_fresh_process(
            __file__, f"plan|{workload}|{machine}|{factor}|{vertices}|{path}", timeout)
        if row is None:
            return None, f"plan: {why}"
        if simulated:
            more, why = in_fresh_process(__file__, f"simulate|{path}", timeout)
            if more is None:
                return None, f"simulate: {why}"
            row.update(more)
    return {**row, "vertices": int(vertices)}, ""


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
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        which, *fields = args.one.split("|")
        if which == "plan":
            w, m, f, n, path = fields
            print(json.dumps(plan_process(w, m, float(f), int(n), path)))
        else:
            print(json.dumps(simulate_process(fields[0])))
        return
    stages = STAGES[:4] if args.plan_only else STAGES
    print(f"{'workload':8} {'machine':7} {'factor':>6} {'vertices':>9} {'memgraph':>9} "
          + " ".join(f"{s:>14}" for s in stages) + f" {'plan RSS':>9}"
          + ("" if args.plan_only else f" {'sim RSS':>9}"))
    print(" " * 43 + " ".join(f"{'s (us/vertex)':>14}" for _ in stages))
    for w in args.workloads.split(","):
        for m in args.machines.split(","):
            for f in args.factors.split(","):
                for n in args.vertices.split(","):
                    row, why = point(w, m, f, n, args.timeout, not args.plan_only,
                                     args.format)
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
