"""Does a run catch a broken plan?  The race detector and the adversarial policy, measured
(docs/races.md; run by hand).

    python bench/bench_races.py [--seeds 100] [--valid-seeds 20] [--per-plan 2] [--quick]

The corpus: small workloads (the DISCO matmul chain, tensor-parallel matmuls, a random DAG, a
training chain, a GPT-2 training step), each planned by two or three planners at a memory
where they offload.  A broken plan is one of them less one memory edge whose removal alone
breaks rule 3 (:func:`offloadlab.executor.races.racy_edges`: the overwriter may then run
before a reader of the bytes it overwrites), ``--per-plan`` edges per plan, chosen at random
(seed 0).  Each broken plan runs ``--seeds`` times on the numpy backend, unverified, as
``offloadlab run --no-verify --policy P --check`` runs it, under ``adversarial``, ``random``
and ``dynamic`` dispatch; a run counts as reported if it raises :class:`RaceError`, and, as
``--check`` also compares outputs, as wrong if its outputs differ from the reference.  For
comparison the old check alone (no detector, ``--poison``, outputs compared) runs under
``random`` and ``adversarial``.  Then every plan of the corpus, unbroken, runs
``--valid-seeds`` times under ``adversarial`` with the detector: any report there is a false
one.

Prints one table row per broken plan and policy and the totals; exits 1 if a goal is missed
(every broken plan reported in at least 95% of its adversarial runs, no false report).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import pandas as pd

from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.executor import RaceError, check_outputs, execute, reference_outputs
from offloadlab.executor.races import racy_edges
from offloadlab.planner import plan

CHAIN = "w=400KB;300KB;400KB;500KB,a=100KB;60KB;100KB;80KB,uF=0.1;0.1;0.1;0.1,uB=0.2;0.2;0.2;0.2"
CORPUS = [
    ("matmul-chain:layers=3,batch=64,hidden=256", "disco-example:gpu_memory=400KB",
     ("buildmemgraph",)),
    ("tp-matmul:n=64", "p100x4:gpus=3,gpu_memory=64KB", ("buildmemgraph", "levelwise")),
    ("random:vertices=60,gpus=2,min_bytes=4096,max_bytes=65536,seed=5",
     "p100x4:gpus=2,gpu_memory=300KB", ("buildmemgraph", "levelwise")),
    (f"training-chain:{CHAIN}", "v100:gpu_memory=1600KB",
     ("buildmemgraph", "greedy-offload", "l2l")),
    ("gpt2-train:depth=3,batch=1,seq=8,weight_bytes=300000,iterations=2",
     "v100:gpu_memory=900KB", ("buildmemgraph", "levelwise")),
]
"""(workload, machine, planners): small enough to run thousands of times, tight enough that
every plan offloads or reloads (the matmul chain's levelwise plan has no racy edge)."""


def plans(quick: bool = False):
    """Every plan of the corpus: (name, TaskGraph, Machine, MemGraph)."""
    for workload, machine, planners in CORPUS[:3] if quick else CORPUS:
        graph = build_workload(workload)
        m = machine_from_spec(machine)
        for planner in planners:
            yield f"{workload.split(':')[0]}/{planner}", graph, m, plan(graph, m, planner)


def broken_plans(per_plan: int = 2, quick: bool = False):
    """The broken plans: (name, TaskGraph, Machine, MemGraph less the edge, edge)."""
    for name, graph, m, mg in plans(quick):
        edges = racy_edges(mg, m)
        for u, v in random.Random(0).sample(edges, min(per_plan, len(edges))):
            broken = plan_copy(mg)
            del broken.succ[u][v], broken.pred[v][u]
            yield f"{name} -({u} -> {v})", graph, m, broken, (u, v)


def plan_copy(mg):
    """A copy of ``mg`` whose edges can be changed without changing ``mg``'s."""
    from copy import copy
    twin = copy(mg)
    twin.succ = {u: dict(t) for u, t in mg.succ.items()}
    twin.pred = {v: dict(s) for v, s in mg.pred.items()}
    return twin


def outcome(mg, m, reference, policy: str, seed: int, detect: bool) -> str:
    """``reported``, ``wrong`` or ``correct``: one unverified run."""
    try:
        result = execute(mg, m, policy=policy, seed=seed, rate_limit=False, verify=False,
                         check_races=detect, poison=not detect)
    except RaceError:
        return "reported"
    return "correct" if check_outputs(result.outputs, reference) is None else "wrong"


RUNS = [("adversarial", True), ("random", True), ("dynamic", True),
        ("adversarial", False), ("random", False)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--valid-seeds", type=int, default=20)
    parser.add_argument("--per-plan", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="three workloads, 20 seeds")
    args = parser.parse_args()
    seeds = 20 if args.quick else args.seeds
    began = time.perf_counter()
    rows = []
    references: dict[int, dict] = {}
    for name, graph, m, mg, _ in broken_plans(args.per_plan, args.quick):
        reference = references.setdefault(id(graph), reference_outputs(graph))
        for policy, detect in RUNS:
            seen = [outcome(mg, m, reference, policy, s, detect) for s in range(seeds)]
            rows.append({"plan": name, "policy": policy,
                         "check": "detector" if detect else "poison+outputs",
                         "runs": seeds, "reported": seen.count("reported"),
                         "wrong": seen.count("wrong")})
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 200, "display.max_colwidth", 90, "display.max_rows", 500)
    print(table.to_string(index=False))
    totals = table.groupby(["policy", "check"], sort=False)[["runs", "reported", "wrong"]].sum()
    totals["caught %"] = (100 * (totals["reported"] + totals["wrong"]) / totals["runs"]).round(1)
    worst = table[(table.policy == "adversarial") & (table.check == "detector")]
    print(f"\n{worst.shape[0]} broken plans, {seeds} seeds each")
    print(totals.to_string())
    print(f"worst broken plan under adversarial + detector: "
          f"{worst.reported.min()} of {seeds} runs reported")
    false = valid = 0
    for name, graph, m, mg in plans(args.quick):
        reference = references.setdefault(id(graph), reference_outputs(graph))
        for s in range(args.valid_seeds):
            valid += 1
            result = outcome(mg, m, reference, "adversarial", s, True)
            if result != "correct":
                false += 1
                print(f"FALSE REPORT: {name}, seed {s}: {result}")
    print(f"valid plans: {valid} adversarial runs with the detector, {false} reported or wrong")
    print(f"({time.perf_counter() - began:.0f} s)")
    ok = worst.reported.min() >= 0.95 * seeds and false == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
