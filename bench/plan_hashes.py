"""A fingerprint of every plan in a grid of planning cases, to show that a change to a planner
(or to how MemGraphs are written) leaves its MemGraphs the same (CHANGELOG.md: the
integer-indexed planner).

    python bench/plan_hashes.py > new.txt                 # in the changed install
    OLD/bin/python bench/plan_hashes.py > old.txt         # in the install it replaces
    diff old.txt new.txt                                  # nothing: the same plans

Each line names a case (workload, machine, memory as a multiple of the tightest feasible,
planner spec) and gives the first 12 hex digits of the SHA-1 of its MemGraph's node-link
JSON, as written and then with its keys sorted (the same for two writers that order a node's
fields differently), or the planner's error.  640 cases: 8 workloads, ``p100x4`` and
``a100x8`` at 1.0x, 1.1x, 1.5x and 10x, and BuildMemGraph with each victim policy, ``ahead``,
``reserve``, ``order`` and ``retry`` changed in turn, ``levelwise`` and ``cotrain`` (about
40 s compiled).  ``--roofline`` prices every machine's kernels by the roofline, as every
preset did before the fitted model (docs/cost-model.md): its lines are those of an older install.
The machines' host memory is unlimited, as it was before machines had ``host_memory``
(docs/host-memory.md): the plans then are the same byte for byte.
Run it outside the repository so that the install, not the source tree, is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json

from offloadlab.core.errors import PlanError
from offloadlab.core.machine import Machine, machine_from_spec
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.workloads import build_workload
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity

WORKLOADS = (
    "random:vertices=3000,gpus=4,seed=1",
    "random:vertices=3000,gpus=4,seed=2,host_fraction=1",
    "random:vertices=2000,gpus=2,seed=3,transfer_fraction=0.3,input_fraction=0.3",
    "llama-prefill:model=tiny,seq=64,batch=2,gpus=2,block=16",
    "llama-lora-train:model=tiny,seq=64,batch=2,gpus=1,block=32",
    "matmul-chain:layers=6,gpus=2",
    "training-chain",
    "gpt2-train:depth=6,iterations=2",
)
MACHINES = ("p100x4", "a100x8")
FACTORS = (1.0, 1.1, 1.5, 10.0)
PLANNERS = ("buildmemgraph", "buildmemgraph:victim=cost", "buildmemgraph:victim=lru",
            "buildmemgraph:ahead=false", "buildmemgraph:reserve=0",
            "buildmemgraph:order=levels", "buildmemgraph:order=topological",
            "buildmemgraph:retry=false", "levelwise", "cotrain")


def fingerprint(graph: TaskGraph, machine: str, factor: float, planner: str,
                cost: str | None = None) -> str:
    """The first 12 hex digits of the SHA-1 of the case's MemGraph JSON with its keys sorted, or
    its PlanError; ``cost`` overrides the machine's cost model."""
    spec = f"{machine}:gpu_memory={int(min_capacity(graph) * factor)}"
    spec += f",cost={cost}" if cost else ""
    if "host_memory" in {f.name for f in dataclasses.fields(Machine)}:   # an install before
        spec += ",host_memory=unlimited"                                  # it has none
    try:
        mg = plan(graph, machine_from_spec(spec), planner)
    except PlanError as exc:
        return f"PlanError {str(exc)[:60]}"
    text = json.dumps(json.loads(mg.to_json()), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roofline", action="store_true",
                        help="price every machine's kernels by the roofline (cost=roofline)")
    args = parser.parse_args()
    for workload in WORKLOADS:
        graph = build_workload(workload)
        for machine, factor, planner in itertools.product(MACHINES, FACTORS, PLANNERS):
            print(workload, machine, factor, planner,
                  fingerprint(graph, machine, factor, planner,
                              "roofline" if args.roofline else None), flush=True)


if __name__ == "__main__":
    main()
