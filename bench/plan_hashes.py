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
``--lora`` fingerprints TURNIP's LoRA points instead (``turnip-lora``: 7B at 1K tokens, batch 8,
16 and 32, and 65B at batch 8, on ``a100x8`` as the experiment plans them, with
``buildmemgraph`` and ``levelwise``; 0.4-1.6M vertices, minutes each): the SHA-1 of the
node-link JSON file as written, which also fixes the order of the vertices and edges.
``--deployed`` fingerprints the deployed schemes instead (docs/deployed.md): each with its
defaults and with the options that change its moves, and ``buildmemgraph``, on
bench_deployed.py's problems at its memories and at 64x BuildMemGraph's least, where
ZeRO-Offload, FSDP and Accelerate plan the LoRA 7B step to its end, then on two small
``llama-generate`` problems at those multiples of BuildMemGraph's least (the SHA-1 of the
node-link JSON, or the planner's error in full; about 15 minutes; the traced models need
torch); ``--only PROBLEM`` (repeatable) fingerprints only those problems.
``--gemini`` fingerprints ``gemini`` instead (docs/gemini.md): the training workloads of
``tests/test_gemini.py`` and this grid's, on ``p100x4`` at 1.0x, 1.1x, 1.5x, 4x and 10x,
with a chunk size of a few parameters (the test's), and with ``eviction=lru``,
``max_prefetch=2``, the chunk size searched with gradient chunks, and the default warm-up
share (its warm-up evicts) in turn.
Run it outside the repository so that the install, not the source tree, is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import sys
import tempfile

from offloadlab.core import formats
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
LORA = tuple(f"llama-lora-train:model={model},seq=1024,batch={batch},gpus=8"
             for model, batch in (("7b", 8), ("7b", 16), ("7b", 32), ("65b", 8)))
LORA_PLANNERS = ("buildmemgraph", "levelwise")
MACHINES = ("p100x4", "a100x8")
FACTORS = (1.0, 1.1, 1.5, 10.0)
DEPLOYED_FACTORS = (1.5, 4.0, 16.0, 64.0)
DEPLOYED = ("torch-compile-offload",
            "torch-compile-offload:activation_reload_prefetch=false",
            "torch-compile-offload:activation_offload_separate_stream=false",
            "torchtune-offload", "torchtune-offload:use_streams=false,max_fwd_stash_size=1",
            "zero-offload", "zero-offload:overlap_comm=true,dpu=true,reduce_bucket_size=1000000",
            "fsdp-cpu-offload", "fsdp-cpu-offload:min_num_params=1000000,limit_all_gathers=false",
            "accelerate-offload", "flexgen", "flexgen:w_gpu_percent=50,cache_gpu_percent=100,"
            "act_gpu_percent=100", "buildmemgraph")
GENERATION = ("llama-generate:model=tiny,seq=32,gen=3",
              "llama-generate:model=tiny,seq=48,block=16,batch=2,gen=2")
"""Generations the deployed schemes fingerprint on one GPU of ``a100x8`` (``--deployed``)."""
GEMINI = (
    ("model:name=mlp,mode=train,gpus=1", "gemini:chunk_size=2MiB"),
    ("model:name=gpt2,mode=train,gpus=2", "gemini:chunk_size=4MiB"),
    ("model:name=bert,mode=train,gpus=1", "gemini:chunk_size=4MiB"),
    ("model:name=resnet18,mode=train,gpus=2", "gemini:chunk_size=4MiB"),
    ("model:name=llama,mode=train,gpus=3", "gemini:chunk_size=4MiB"),
    ("training-chain:w=400KB;300KB;400KB;500KB,a=100KB;60KB;100KB;80KB,uF=0.1;0.1;0.1;0.1,"
     "uB=0.2;0.2;0.2;0.2", "gemini:chunk_size=1"),
    ("gpt2-train:depth=3,batch=1,seq=8,weight_bytes=300000,iterations=2", "gemini:chunk_size=1"),
    ("bert-train:depth=3,batch=1,seq=8,weight_bytes=300000,iterations=2", "gemini:chunk_size=1"),
    ("llama-lora-train:model=tiny,seq=64,batch=2,gpus=1,block=32", "gemini:chunk_size=4KiB"),
    ("gpt2-train:depth=6,iterations=2", "gemini:chunk_size=1MiB"),
)
GEMINI_FACTORS = (1.0, 1.1, 1.5, 4.0, 10.0)
GEMINI_OPTIONS = (",warmup_share=1", ",warmup_share=1,eviction=lru",
                  ",warmup_share=1,max_prefetch=2",
                  ",warmup_share=1,search_range=4MiB,grad_chunks=true", "")
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
    text = json.dumps(json.loads(formats.to_json(mg)), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def file_fingerprint(graph: TaskGraph, machine: str, planner: str) -> str:
    """The first 12 hex digits of the SHA-1 of the MemGraph's node-link JSON file as written,
    read back a block at a time, or its PlanError."""
    try:
        mg = plan(graph, machine_from_spec(machine), planner)
    except PlanError as exc:
        return f"PlanError {str(exc)[:60]}"
    digest = hashlib.sha1()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mg.json")
        formats.write_memgraph(mg, path)
        del mg
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def deployed_problems() -> dict[str, tuple[str, str]]:
    """bench_deployed.py's problems and the generations: label -> (workload, machine)."""
    from bench_deployed import PROBLEMS  # beside this script

    return PROBLEMS | {w: (w, "a100x8:gpus=1") for w in GENERATION}


def deployed(only: list[str] | None = None) -> None:
    """Print the fingerprint of every deployed scheme's plan on bench_deployed.py's problems
    and the generations, or those ``only`` names (the SHA-1 of the node-link JSON as written),
    or its error in full."""
    from bench_deployed import taskgraph  # beside this script

    for label, (workload, machine) in deployed_problems().items():
        if only and label not in only:
            continue
        graph = taskgraph(workload)
        least = min_capacity(graph)
        for factor, planner in itertools.product(DEPLOYED_FACTORS, DEPLOYED):
            spec = f"{machine}{',' if ':' in machine else ':'}gpu_memory={int(least * factor)}"
            try:
                text = formats.to_json(plan(graph, machine_from_spec(spec), planner))
                out = hashlib.sha1(text.encode()).hexdigest()[:12]
            except PlanError as exc:
                out = f"PlanError {exc}"
            print(label, factor, planner, out, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roofline", action="store_true",
                        help="price every machine's kernels by the roofline (cost=roofline)")
    parser.add_argument("--lora", action="store_true",
                        help="fingerprint TURNIP's LoRA points instead (minutes each)")
    parser.add_argument("--deployed", action="store_true",
                        help="fingerprint the deployed schemes on bench_deployed's problems")
    parser.add_argument("--only", action="append", metavar="PROBLEM",
                        help="with --deployed: only this problem (a label of bench_deployed.py "
                        "or a generation of GENERATION; repeatable)")
    parser.add_argument("--gemini", action="store_true", help="fingerprint gemini instead")
    args = parser.parse_args()
    if args.only:
        unknown = [p for p in args.only if p not in deployed_problems()]
        if not args.deployed or unknown:
            parser.error(f"--only needs --deployed and one of {sorted(deployed_problems())}, "
                         f"got {args.only!r}")
    if args.deployed:
        deployed(args.only)
        return
    if args.gemini:
        for workload, spec in GEMINI:
            graph = build_workload(workload)
            for factor, options in itertools.product(GEMINI_FACTORS, GEMINI_OPTIONS):
                print(workload, factor, spec + options,
                      fingerprint(graph, "p100x4", factor, spec + options), flush=True)
        return
    if args.lora:
        for workload in LORA:
            graph = build_workload(workload)
            for planner in LORA_PLANNERS:
                print(workload, "a100x8", planner, file_fingerprint(graph, "a100x8", planner),
                      flush=True)
            del graph
        return
    for workload in WORKLOADS:
        graph = build_workload(workload)
        for machine, factor, planner in itertools.product(MACHINES, FACTORS, PLANNERS):
            print(workload, machine, factor, planner,
                  fingerprint(graph, machine, factor, planner,
                              "roofline" if args.roofline else None), flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("plan_hashes: interrupted", file=sys.stderr)
        sys.exit(130)
