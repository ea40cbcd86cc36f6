"""How long Beaumont et al.'s greedy takes on a deep network (the paper: under a minute for
128 layers).

    python bench/bench_greedy.py                  # GPT-2-like, 128 layers, batch 16, 16 GB
    python bench/bench_greedy.py --layers 256 --batch 32 --memory 24GB --planner l2l

Times ``schedule_for`` (Algorithm 1's selection and Algorithm 2's analytic schedule, every
cutting point tried) on a Megatron-LM GPT-2 chain (hidden 3072, seq 128) priced on the
``v100`` preset, best of ``--repeat`` runs, and, with ``--memgraph``, the planner that lays
the schedule out as the MemGraph of ``--iterations`` unrolled iterations.  Exits with status 1
if the schedule takes longer than ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import sys

from timing import best_of

from offloadlab.core.machine import machine_from_spec
from offloadlab.core.spec import parse_bytes
from offloadlab.core.workloads.training import transformer_chain
from offloadlab.planner import plan
from offloadlab.planner.weight_offload import schedule_for


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--memory", default="16GB", help="GPU memory (e.g. 16GB, 12e9)")
    p.add_argument("--planner", default="greedy-offload")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget", type=float, default=1.0, help="seconds allowed for the schedule")
    p.add_argument("--memgraph", action="store_true", help="also time the MemGraph planner")
    p.add_argument("--iterations", type=int, default=3)
    args = p.parse_args()

    chain = transformer_chain("gpt2", args.layers, args.batch, 128)
    machine = machine_from_spec(f"v100:gpu_memory={parse_bytes(args.memory)}")
    seconds, schedule = best_of(args.repeat, lambda: schedule_for(args.planner, chain, machine))
    print(f"{args.planner}: {chain.name}, {sum(chain.w) / 1e9:.1f} GB of weights in "
          f"{machine.gpu_memory / 1e9:.1f} GB; {len(schedule.selection)} choices selected, "
          f"cutting point {schedule.cut}, iteration {schedule.iteration_time:.3f} s "
          f"(Σu {chain.sum_u:.3f} s)")
    print(f"schedule_for: {seconds:.3f} s (best of {args.repeat})")
    if args.memgraph:
        graph = chain.to_taskgraph(args.iterations)
        seconds_mg, mg = best_of(args.repeat, lambda: plan(graph, machine, args.planner))
        print(f"planner ({args.iterations} iterations, {len(mg)} MemGraph vertices): "
              f"{seconds_mg:.3f} s")
    if seconds > args.budget:
        print(f"over budget: {seconds:.3f} s > {args.budget} s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
