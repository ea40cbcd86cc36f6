"""Simulator throughput: MemGraph vertices simulated per second.

    python bench/bench_simulate.py                         # random 100k-vertex MemGraph, 4 GPUs
    python bench/bench_simulate.py --vertices 300000 --policy fixed --noise 0.1
    python bench/bench_simulate.py plan.json --machine a100x8

With a MemGraph JSON path, the machine is ``--machine`` if given, else the one stored in the
MemGraph's ``graph.machine`` (a Machine dict), else the ``a100x8`` preset.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from offloadlab.core.machine import GiB, MiB, Machine, machine_from_spec
from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.simulator import simulate


def random_memgraph(n: int, gpus: int = 4, seed: int = 0) -> MemGraph:
    """A random DAG of about ``n`` vertices: per-GPU chains of kernels reading recent tensors,
    with loads of host inputs, offloads and later reloads, GPU->GPU transfers, a few CPU ops
    and memory edges.  Every GPU output gets its own location (no reuse)."""
    rng = random.Random(seed)
    mg = MemGraph({"planner": "bench-random"})
    top = [0] * gpus
    recent: list[list[str]] = [[] for _ in range(gpus)]  # tensors living on each GPU
    offloaded: list[list[str]] = [[] for _ in range(gpus)]

    def add(kind, device, size, home=None, inputs=(), **kw):
        loc = None
        if home is not None:
            g = int(home[3:])
            loc, top[g] = Loc(home, top[g], size), top[g] + size
        v = mg.add_vertex(MemVertex(f"v{len(mg)}", kind, device, size, loc,
                                    inputs=tuple(inputs), **kw))
        for u in inputs:
            mg.add_edge(u, v.id, "data")
        if len(mg) > 10 and rng.random() < 0.05:
            mg.add_edge(f"v{rng.randrange(max(0, len(mg) - 200), len(mg) - 1)}", v.id, "memory")
        if home is not None:
            recent[int(home[3:])].append(v.id)
        return v.id

    for g in range(gpus):
        x = add("input", "host", 4 * MiB)
        add("load", f"gpu{g}", 4 * MiB, f"gpu{g}", (x,), of=x)
    while len(mg) < n:
        g = rng.randrange(gpus)
        gpu = f"gpu{g}"
        pick = rng.random()
        window = recent[g][-8:]
        if pick < 0.65:
            reads = rng.sample(window, min(len(window), rng.choice((1, 2, 2, 3))))
            add("compute", gpu, rng.choice((1, 2, 4)) * MiB, gpu, reads, op="mix",
                flops=rng.uniform(1e9, 5e10))
        elif pick < 0.75:
            u = rng.choice(window)
            offloaded[g].append(add("offload", gpu, mg[u].bytes, inputs=(u,), of=u))
        elif pick < 0.85 and offloaded[g]:
            o = offloaded[g].pop(rng.randrange(len(offloaded[g])))
            add("reload", gpu, mg[o].bytes, gpu, (o,), of=mg[o].of)
        elif pick < 0.93 and gpus > 1:
            h = rng.choice([i for i in range(gpus) if i != g])
            u = rng.choice(window)
            add("transfer", f"{gpu}->gpu{h}", mg[u].bytes, f"gpu{h}", (u,), task=u)
        elif pick < 0.97:
            x = add("input", "host", 4 * MiB)
            add("load", gpu, 4 * MiB, gpu, (x,), of=x)
        else:
            add("compute", "cpu", 1 * MiB, inputs=(), op="mix", flops=rng.uniform(1e8, 1e9))
    return mg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("memgraph", nargs="?", help="a MemGraph JSON file (default: random)")
    parser.add_argument("--vertices", type=int, default=100_000)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--machine", help="machine spec, e.g. a100x8 or v100:duplex=0.5")
    parser.add_argument("--policy", default="dynamic")
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--streams", type=int)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    t0 = time.perf_counter()
    if args.memgraph:
        mg = MemGraph.from_json(args.memgraph)
        stored = mg.graph.get("machine")
        machine = (machine_from_spec(args.machine) if args.machine
                   else Machine.from_dict(stored) if isinstance(stored, dict)
                   else machine_from_spec("a100x8"))
    else:
        mg = random_memgraph(args.vertices, args.gpus)
        base = machine_from_spec(args.machine or "a100x8")
        machine = replace(base, gpus=max(base.gpus, args.gpus), gpu_memory=2**20 * GiB)
    print(f"{len(mg)} vertices, {sum(len(s) for s in mg.succ.values())} edges "
          f"(built/read in {time.perf_counter() - t0:.2f} s); machine {machine.name}, "
          f"duplex {machine.duplex}, host bus {machine.host_bus_bandwidth:g} B/s")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = simulate(mg, machine, policy=args.policy, noise=args.noise,
                          streams=args.streams)
        wall = time.perf_counter() - t0
        print(f"{args.policy}: makespan {result.makespan:.4f} s simulated in {wall:.2f} s "
              f"-> {len(mg) / wall:,.0f} vertices/s")


if __name__ == "__main__":
    main()
