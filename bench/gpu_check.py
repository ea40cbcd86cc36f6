"""The measurements of ``bench/gpu_check.sh`` (run that; each subcommand appends rows
``check<TAB>result`` to ``--rows``).

    python bench/gpu_check.py copies --rows FILE     # plain cudaMemcpyAsync vs executor copies
    python bench/gpu_check.py dispatch --rows FILE   # makespan / vertices, chain of tiny adds
    python bench/gpu_check.py taskgraph --workload SPEC --out FILE  # aligned TaskGraph JSON
    python bench/gpu_check.py validated --json FILE --label NAME --rows FILE  # validate's rows
    python bench/gpu_check.py table --rows FILE      # print the rows as one table

Copies: ``--mib`` MiB (256) host->GPU, GPU->host, and both at once, ``--repeat`` times (4) each,
once as plain ``cudaMemcpyAsync`` between pinned host memory and the GPU timed with CUDA events,
once as load and offload vertices of a MemGraph run by the executor on the cupy backend (read
off the trace: bytes / (end - start)).  Each figure is the median over the copies; the goal is
executor >= 90% of plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from offloadlab.core.machine import Machine, MiB
from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.workloads import build_workload
from offloadlab.executor import execute
from offloadlab.planner import plan

GOAL = 0.9


def _row(rows: Path, check: str, result: str) -> None:
    with rows.open("a") as f:
        f.write(f"{check}\t{result}\n")


# -- copies ---------------------------------------------------------------------------------
def plain_rates(nbytes: int, repeat: int, h2d: bool, d2h: bool) -> dict[str, float]:
    """Median bytes/s of ``repeat`` pinned ``cudaMemcpyAsync`` per direction, each direction
    on its own stream (both at once when both are asked)."""
    import cupy
    cuda = cupy.cuda

    def pinned() -> np.ndarray:
        return np.frombuffer(cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)

    host_src, host_dst = pinned(), pinned()
    device = cupy.empty(2 * nbytes, cupy.uint8)
    host_src.fill(1)
    device.fill(2)
    work = {"h2d": (device.data.ptr, host_src.ctypes.data),
            "d2h": (host_dst.ctypes.data, device.data.ptr + nbytes)}
    active = [d for d, on in (("h2d", h2d), ("d2h", d2h)) if on]
    streams = {d: cuda.Stream(non_blocking=True) for d in active}
    events = {d: [(cuda.Event(), cuda.Event()) for _ in range(repeat)] for d in active}
    cuda.Device().synchronize()
    for r in range(repeat):
        for d in active:
            start, end = events[d][r]
            start.record(streams[d])
            dst, src = work[d]
            cuda.runtime.memcpyAsync(dst, src, nbytes, cuda.runtime.memcpyDefault,
                                     streams[d].ptr)
            end.record(streams[d])
    cuda.Device().synchronize()
    return {d: statistics.median(nbytes / (cuda.get_elapsed_time(s, e) / 1e3)
                                 for s, e in events[d]) for d in active}


def copies_memgraph(nbytes: int, repeat: int, h2d: bool, d2h: bool) -> MemGraph:
    """``repeat`` loads of a host tensor and/or offloads of a GPU tensor, each load to its own
    location on gpu0 (no memory edges: nothing is overwritten)."""
    mg = MemGraph({"planner": "gpu_check"})
    shape = (nbytes // 4,)
    top = 0

    def add(id: str, kind: str, device: str, inputs: tuple[str, ...] = (),
            on_gpu: bool = False) -> None:
        nonlocal top
        loc = None
        if on_gpu:
            loc, top = Loc("gpu0", top, nbytes), top + nbytes
        mg.add_vertex(MemVertex(id, kind, device, nbytes, loc=loc,
                                task=id if kind == "input" else None,
                                of=inputs[0] if inputs else None, inputs=inputs,
                                order=len(mg), shape=shape))
        mg.add_edges(inputs, id)

    if h2d:
        add("w", "input", "host")
    if d2h:
        add("a", "input", "gpu0", on_gpu=True)
    for r in range(repeat):
        if h2d:
            add(f"load{r}", "load", "gpu0", ("w",), on_gpu=True)
        if d2h:
            add(f"offload{r}", "offload", "gpu0", ("a",))
    return mg


def executor_rates(nbytes: int, repeat: int, h2d: bool, d2h: bool) -> dict[str, float]:
    """Median bytes/s of the executor's loads ("h2d") and offloads ("d2h")."""
    machine = Machine(gpus=1, gpu_memory=2 * (repeat + 1) * nbytes, streams=1)
    mg = copies_memgraph(nbytes, repeat, h2d, d2h)
    trace = execute(mg, machine, backend="cupy", policy="fixed").trace
    rates = {}
    for direction, kind in (("h2d", "load"), ("d2h", "offload")):
        rows = trace[trace["kind"] == kind]
        if len(rows):
            rates[direction] = float((rows["bytes"] / (rows["end"] - rows["start"])).median())
    return rates


def cmd_copies(args: argparse.Namespace) -> None:
    nbytes = args.mib * MiB
    for name, h2d, d2h in (("alone", True, False), ("alone", False, True),
                           ("duplex", True, True)):
        executor_rates(nbytes, 1, h2d, d2h)                 # warm-up: pinning, first launch
        plain = plain_rates(nbytes, args.repeat, h2d, d2h)
        ours = executor_rates(nbytes, args.repeat, h2d, d2h)
        for direction in plain:
            ratio = ours[direction] / plain[direction]
            _row(args.rows, f"copy {direction} {name} ({args.mib} MiB)",
                 f"plain {plain[direction] / 1e9:.2f} GB/s, executor "
                 f"{ours[direction] / 1e9:.2f} GB/s, {100 * ratio:.1f}% "
                 f"({'ok' if ratio >= GOAL else f'BELOW the {100 * GOAL:.0f}% goal'})")


# -- dispatch -------------------------------------------------------------------------------
def tiny_chain(n: int) -> TaskGraph:
    """``n`` one-element adds on gpu0, each reading the previous one."""
    g = TaskGraph(name="tiny-adds")
    prev = g.add_input("x", 4, home="gpu0", shape=(1,)).id
    for k in range(n):
        prev = g.add_compute(f"a{k}", "add", [prev], "gpu0", 4, flops=1.0, shape=(1,)).id
    return g


def cmd_dispatch(args: argparse.Namespace) -> None:
    graph = tiny_chain(args.vertices)
    machine = Machine(gpus=1, gpu_memory=8 * (args.vertices + 1))
    mg = plan(graph, machine, "buildmemgraph")
    execute(plan(tiny_chain(100), machine, "buildmemgraph"), machine, backend="cupy")  # warm-up
    result = execute(mg, machine, backend="cupy")
    kernel = float((result.trace["end"] - result.trace["start"]).median())
    _row(args.rows, f"dispatch: chain of {args.vertices} one-element adds",
         f"{result.makespan / args.vertices * 1e6:.1f} us per vertex (makespan "
         f"{result.makespan:.3g} s; median kernel {kernel * 1e6:.1f} us)")


# -- validate -------------------------------------------------------------------------------
def cmd_taskgraph(args: argparse.Namespace) -> None:
    """The workload with every flat tensor rounded up to whole float32 elements, so that the
    planners' packed offsets are 4-byte aligned (a CUDA kernel faults on a misaligned load)."""
    graph = build_workload(args.workload)
    aligned = TaskGraph(name=graph.name, meta=dict(graph.meta))
    for t in graph.tasks.values():
        size = np.dtype(t.dtype).itemsize
        aligned.add(t if t.shape is not None else replace(t, bytes=-(-t.bytes // size) * size))
    Path(args.out).write_text(aligned.to_json())


def cmd_validated(args: argparse.Namespace) -> None:
    for r in json.loads(Path(args.json).read_text()):
        _row(args.rows, f"validate {args.label} {r['planner']}",
             f"simulated {r['sim_makespan']:.4g} s, measured {r['measured_makespan']:.4g} s, "
             f"error {100 * r['error']:+.1f}%" + ("" if r.get("correct", True)
                                                  else ", outputs WRONG"))


def cmd_table(args: argparse.Namespace) -> None:
    rows = [line.split("\t", 1) for line in args.rows.read_text().splitlines() if line]
    width = max((len(check) for check, _ in rows), default=len("check"))
    print(f"{'check':<{width}}  result")
    print(f"{'-' * width}  {'-' * 6}")
    for check, result in rows:
        print(f"{check:<{width}}  {result}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("copies")
    s.add_argument("--rows", type=Path, required=True)
    s.add_argument("--mib", type=int, default=256)
    s.add_argument("--repeat", type=int, default=4)
    s = sub.add_parser("dispatch")
    s.add_argument("--rows", type=Path, required=True)
    s.add_argument("--vertices", type=int, default=20_000)
    s = sub.add_parser("taskgraph")
    s.add_argument("--workload", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("validated")
    s.add_argument("--json", required=True)
    s.add_argument("--label", required=True)
    s.add_argument("--rows", type=Path, required=True)
    s = sub.add_parser("table")
    s.add_argument("--rows", type=Path, required=True)
    args = p.parse_args()
    {"copies": cmd_copies, "dispatch": cmd_dispatch, "taskgraph": cmd_taskgraph,
     "validated": cmd_validated, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
