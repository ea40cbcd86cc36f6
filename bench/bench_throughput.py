"""Planning and simulation throughput (issue 3's benchmark; results in docs/results/performance.md).

    python bench/bench_throughput.py                      # 100k-vertex random DAG, 4 GPUs
    python bench/bench_throughput.py --vertices 300000 --memory-factor 1.2 --policy fixed

Plans a ``random`` TaskGraph (inputs in host RAM) with ``buildmemgraph`` on an a100x8-like
machine whose GPU memory is ``--memory-factor`` times the tightest feasible capacity
(:func:`min_capacity`), then simulates the MemGraph.  Reports the best of ``--repeat`` runs in
TaskGraph vertices planned per second and MemGraph vertices simulated per second, and whether
the planner core ran as pure Python or compiled (docs/install.md, The compiled build).
"""

from __future__ import annotations

import argparse

from timing import best_of

from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.planner import buildmemgraph, plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import simulate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=100_000)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--memory-factor", type=float, default=1.5,
                   help="GPU memory as a multiple of the tightest feasible capacity")
    p.add_argument("--planner", default="buildmemgraph")
    p.add_argument("--policy", default="dynamic")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    graph = build_workload(f"random:vertices={args.vertices},gpus={args.gpus},seed={args.seed},"
                           f"host_fraction=1")
    tight = min_capacity(graph)
    machine = machine_from_spec(f"a100x8:gpus={args.gpus},"
                                f"gpu_memory={int(tight * args.memory_factor)}")
    plan_s, mg = best_of(args.repeat, lambda: plan(graph, machine, args.planner))
    sim_s, result = best_of(args.repeat, lambda: simulate(mg, machine, args.policy))
    compiled = buildmemgraph.__file__.endswith((".so", ".pyd"))
    build = "compiled (mypyc)" if compiled else "pure Python"
    print(f"planner    {build}, {buildmemgraph.__file__}")
    print(f"workload   random, {len(graph)} vertices, {args.gpus} GPUs, seed {args.seed}")
    print(f"memory     {machine.gpu_memory / 2**20:.1f} MiB per GPU "
          f"({args.memory_factor} x the tightest feasible {tight / 2**20:.1f} MiB)")
    print(f"memgraph   {len(mg)} vertices ({mg.count('offload')} offloads, "
          f"{mg.count('reload')} reloads, {mg.count('load')} loads), "
          f"{sum(1 for _ in mg.edges())} edges")
    print(f"planning   {plan_s:.2f} s = {len(graph) / plan_s:,.0f} TaskGraph vertices/s "
          f"({args.planner}, best of {args.repeat})")
    print(f"simulation {sim_s:.2f} s = {len(mg) / sim_s:,.0f} MemGraph vertices/s "
          f"({args.policy}, makespan {result.makespan:.3f} s, best of {args.repeat})")


if __name__ == "__main__":
    main()
