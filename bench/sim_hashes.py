"""A fingerprint of every simulated run in a grid of cases, to show that a change to the
simulator (or to the memory accounting) leaves its results the same.

    python bench/sim_hashes.py > new.txt                  # in the changed install
    OLD/bin/python bench/sim_hashes.py > old.txt          # in the install it replaces
    diff old.txt new.txt                                  # nothing: the same runs

Each case plans a workload on a machine (``buildmemgraph``, memory 1.5x the tightest
feasible) and simulates it under a policy, a noise level and a seed.  Each line names the case
and gives the makespan (``repr``), the host peak, then the first 12 hex digits of the SHA-1 of
each of: the trace (its CSV, every float as ``repr``), the memory in use over time, the peaks
and the busy seconds per resource, and of the Chrome trace that ``simulate --chrome`` writes
(with its memory counters); or the error the run raised.  ``--memgraph FILE`` (repeatable)
adds the cases of a MemGraph file on the machine it stores (e.g. the 100k benchmark's or a
LoRA plan; under the ``dynamic`` and ``fixed`` policies, with and without noise).  Run it
outside the repository so that the install, not the source tree, is measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json

from offloadlab.core.formats import read_memgraph
from offloadlab.core.machine import Machine, machine_from_spec
from offloadlab.core.memgraph import MemGraph
from offloadlab.core.trace import to_chrome_trace
from offloadlab.core.workloads import build_workload
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import makespan_and_host_peak, simulate

WORKLOADS = (
    "random:vertices=2000,gpus=4,seed=1",
    "random:vertices=2000,gpus=4,seed=2,host_fraction=1",
    "random:vertices=1500,gpus=2,seed=3,transfer_fraction=0.3,input_fraction=0.3",
    "llama-prefill:model=tiny,seq=64,batch=2,gpus=2,block=16",
    "llama-lora-train:model=tiny,seq=64,batch=2,gpus=1,block=32",
    "matmul-chain:layers=6,gpus=2",
    "gpt2-train:depth=6,iterations=2",
)
MACHINES = ("p100x4", "a100x8", "a100x8:duplex=0.7,engine=fifo",
            "p100x4:host_bus_bandwidth=8e9,gpus_per_bus=2")
RUNS = (("dynamic", 0.0, 0), ("fixed", 0.0, 0), ("random", 0.0, 3), ("dynamic", 0.3, 1),
        ("random", 0.2, 7))
FILE_RUNS = (("dynamic", 0.0, 0), ("fixed", 0.0, 0), ("dynamic", 0.3, 1))


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def fingerprint(mg: MemGraph, machine: Machine, policy: str, noise: float, seed: int) -> str:
    try:
        result = simulate(mg, machine, policy=policy, noise=noise, seed=seed)
        fast = makespan_and_host_peak(mg, machine, policy=policy, noise=noise, seed=seed)
    except Exception as exc:    # noqa: BLE001 - the error is part of the fingerprint
        return f"{type(exc).__name__}: {exc}"
    trace = result.trace.to_csv(index=False, float_format="%r")
    memory = result.memory.to_csv(index=False, float_format="%r")
    numbers = json.dumps([result.peak_memory, result.busy], sort_keys=True)
    chrome = json.dumps(to_chrome_trace(result.trace, result.memory), sort_keys=True)
    return (f"{result.makespan!r} host={result.host_peak} fast={fast[0]!r},{fast[1]} "
            f"trace={digest(trace)} memory={digest(memory)} numbers={digest(numbers)} "
            f"chrome={digest(chrome)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memgraph", action="append", default=[], metavar="FILE",
                   help="also simulate this MemGraph file on its stored machine")
    args = p.parse_args()
    for workload in WORKLOADS:
        graph = build_workload(workload)
        for spec in MACHINES:
            machine = machine_from_spec(f"{spec}{',' if ':' in spec else ':'}"
                                        f"gpu_memory={int(min_capacity(graph) * 1.5)}")
            mg = plan(graph, machine)
            for policy, noise, seed in RUNS:
                print(f"{workload} | {spec} | {policy} noise={noise} seed={seed} | "
                      f"{fingerprint(mg, machine, policy, noise, seed)}", flush=True)
    for path in args.memgraph:
        mg = read_memgraph(path)
        machine = Machine.from_dict(mg.graph["machine"])
        for policy, noise, seed in FILE_RUNS:
            print(f"{path} | {policy} noise={noise} seed={seed} | "
                  f"{fingerprint(mg, machine, policy, noise, seed)}", flush=True)


if __name__ == "__main__":
    main()
