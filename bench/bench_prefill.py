"""Seconds to build, plan, verify and simulate LLaMA prefill and LoRA training at the papers'
sizes (issue 19).

    python bench/bench_prefill.py                          # docs/results/performance.md (a100x8)
    python bench/bench_prefill.py --machines p100x4 --seqs 1024,32768 --models 65b
    python bench/bench_prefill.py --workload llama-lora-train --models 65b --seqs 1024 \\
        --batches 8                                         # TURNIP's 65B LoRA point

Each point runs in a fresh process: ``WORKLOAD:model=M,seq=S,batch=B,gpus=G`` (``llama-prefill``
or ``llama-lora-train``; G the machine's GPUs, the default ``block``) is built, planned with
``--planner`` (``buildmemgraph``) on the machine preset, verified and simulated (``dynamic``);
the row gives each stage's seconds, the TaskGraph's and MemGraph's vertices, the offloads, the
simulated time (to first token, or of the training step) and the process's peak resident
memory.  A plan that cannot fit prints ``no plan`` and why.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

from timing import in_fresh_process, stopwatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's offloadlab
STAGES = ("build", "plan", "verify", "simulate")


def one(workload: str, model: str, seq: int, batch: int, machine: str, planner: str) -> dict:
    """Every stage once in this process: a row."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.simulator import simulate

    m = machine_from_spec(machine)
    row: dict = dict(model=model, seq=seq, batch=batch, machine=machine, planner=planner)
    lap = stopwatch(row)
    graph = build_workload(f"{workload}:model={model},seq={seq},batch={batch},gpus={m.gpus}")
    lap("build")
    row.update(taskgraph=len(graph), block=graph.meta["block"])
    mg = plan(graph, m, planner)
    lap("plan")
    verify(mg, graph, m)
    lap("verify")
    result = simulate(mg, m)
    lap("simulate")
    row.update(memgraph=len(mg), offloads=mg.count("offload"), loads=mg.count("load"),
               makespan=result.makespan,
               peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("llama-prefill", "llama-lora-train"),
                   default="llama-prefill")
    p.add_argument("--models", default="7b,65b")
    p.add_argument("--seqs", default="1024,4096,16384,32768")
    p.add_argument("--batches", default="1")
    p.add_argument("--machines", default="a100x8")
    p.add_argument("--planner", default="buildmemgraph")
    p.add_argument("--timeout", type=float, default=600, help="seconds per process (600)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        workload, model, seq, batch, machine, planner = args.one.split("|")
        print(json.dumps(one(workload, model, int(seq), int(batch), machine, planner)))
        return
    time = "TTFT s" if args.workload == "llama-prefill" else "step s"
    print(f"{'model':5} {'seq':>6} {'batch':>5} {'machine':7} {'block':>5} {'taskgraph':>9} "
          f"{'memgraph':>9} {'offloads':>8} {'loads':>6} "
          + " ".join(f"{s + ' s':>10}" for s in STAGES) + f" {time:>8} {'peak RSS':>9}")
    for machine in args.machines.split(","):
        for model in args.models.split(","):
            for batch in args.batches.split(","):
                for seq in args.seqs.split(","):
                    head = f"{model:5} {seq:>6} {batch:>5} {machine:7}"
                    point = "|".join((args.workload, model, seq, batch, machine, args.planner))
                    r, why = in_fresh_process(__file__, point, args.timeout)
                    if r is None:
                        print(f"{head} {why if why.startswith('timed out') else 'no plan: ' + why}",
                              flush=True)
                        continue
                    print(f"{head} {r['block']:>5} {r['taskgraph']:>9} {r['memgraph']:>9} "
                          f"{r['offloads']:>8} {r['loads']:>6} "
                          + " ".join(f"{r[s]:>10.2f}" for s in STAGES)
                          + f" {r['makespan']:>8.2f} {r['peak_rss_mib']:>5.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
