"""The steps of ``bench/gpu_check.sh`` (run that).  Each step appends rows to ``--rows``, a
JSON-lines file of ``{"check", "ok", "result", "data"}``; ``report`` gathers them.

    python bench/gpu_check.py device --backend B --rows FILE    # the device and its memory
    python bench/gpu_check.py copies --backend B --rows FILE    # executor vs plain copies
    python bench/gpu_check.py dispatch --backend B --rows FILE  # makespan / vertices, tiny adds
    python bench/gpu_check.py validate --backend B --workload SPEC --machine FILE --label L \
        --plot PNG --rows FILE                                  # simulated vs measured
    python bench/gpu_check.py row --rows FILE --check C --result R [--failed] [--data JSON]
    python bench/gpu_check.py report --rows FILE --backend B --seconds S --json FILE

Copies: ``--mib`` MiB (256; 64 on numpy) host->GPU, GPU->host, and both at once, ``--repeat``
times each, once plain (pinned ``cudaMemcpyAsync`` timed with CUDA events; ``np.copyto`` on
numpy) and once as the loads and offloads of a MemGraph run by the executor (read off the trace:
bytes / (end - start)); each figure is the median over the copies; the goal is executor >= 90%
of plain.  Validate plans the workload at the tightest GPU memory plus 5% of the rest,
where both planners must offload (a plan that offloads nothing tests nothing: the row fails);
beside the plot it writes each planner's MemGraph (``STEM-PLANNER.json``) and its simulated and
measured traces (``STEM-PLANNER-traces.csv``), to study a gap off the machine.
Heavy imports happen inside the steps, so ``row`` and ``report`` need only the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

GOAL = 0.9
SLACK = 0.05          # validate's GPU memory: tightest + SLACK * (everything - tightest)
PLANNERS = ("buildmemgraph", "levelwise")


def _row(rows: Path, check: str, result: str, ok: bool = True, data: Any = None) -> None:
    with rows.open("a") as f:
        f.write(json.dumps({"check": check, "ok": ok, "result": result, "data": data}) + "\n")


# -- the device -----------------------------------------------------------------------------
def _largest_allocation(cuda, free: int) -> int:
    """The largest single ``cudaMalloc`` that succeeds, to 64 MiB (a binary search in steps
    of 64 MiB: ``low`` steps succeed, ``high`` steps fail)."""
    step = 64 << 20
    low, high = 0, free // step + 1
    while high - low > 1:
        mid = (low + high) // 2
        try:
            block = cuda.Memory(mid * step)
        except cuda.runtime.CUDARuntimeError:
            high = mid
        else:
            del block
            low = mid
    return low * step


def cmd_device(args: argparse.Namespace) -> None:
    if args.backend == "numpy":
        from offloadlab.core.budget import ram_available
        data = {"cpus": os.cpu_count(), "ram_available": ram_available(),
                "python": platform.python_version(), "machine": platform.machine()}
        _row(args.rows, "device", f"{data['cpus']} CPUs, "
             f"{(data['ram_available'] or 0) / 2**30:.1f} GiB RAM available", data=data)
        return
    import cupy
    cuda = cupy.cuda
    runtime = cuda.runtime
    count = runtime.getDeviceCount()
    gpus = []
    for d in range(count):
        with cuda.Device(d):
            props = runtime.getDeviceProperties(d)
            free, total = runtime.memGetInfo()
            gpus.append({"index": d, "name": props["name"].decode(), "total": total,
                         "free_after_context": free,
                         "largest_allocation": _largest_allocation(cuda, free),
                         "peers": [p for p in range(count)
                                   if p != d and runtime.deviceCanAccessPeer(d, p)]})
    data = {"cupy": cupy.__version__, "cuda_runtime": runtime.runtimeGetVersion(),
            "driver": runtime.driverGetVersion(), "gpus": gpus,
            "python": platform.python_version()}
    for g in gpus:
        _row(args.rows, f"device gpu{g['index']}",
             f"{g['name']}: {g['total'] / 2**20:.0f} MiB, {g['free_after_context'] / 2**20:.0f} "
             f"MiB free after the context, largest cudaMalloc {g['largest_allocation'] / 2**20:.0f}"
             f" MiB; CuPy {cupy.__version__}", data=data)


# -- copies ---------------------------------------------------------------------------------
def plain_rates(backend: str, nbytes: int, repeat: int, h2d: bool,
                d2h: bool) -> dict[str, float]:
    """Median bytes/s of ``repeat`` plain copies per direction (pinned ``cudaMemcpyAsync``,
    each direction on its own stream, both at once when both are asked; ``np.copyto``)."""
    import numpy as np
    active = [d for d, on in (("h2d", h2d), ("d2h", d2h)) if on]
    if backend == "numpy":
        src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        np.copyto(dst, src)
        spans = []
        for _ in range(repeat * len(active)):
            t = time.perf_counter()
            np.copyto(dst, src)
            spans.append(time.perf_counter() - t)
        return {d: nbytes / statistics.median(spans) for d in active}
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


def copies_memgraph(nbytes: int, repeat: int, h2d: bool, d2h: bool):
    """``repeat`` loads of a host tensor and/or offloads of a GPU tensor, each load to its own
    location on gpu0 (no memory edges: nothing is overwritten)."""
    from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
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


def executor_rates(backend: str, nbytes: int, repeat: int, h2d: bool,
                   d2h: bool) -> dict[str, float]:
    """Median bytes/s of the executor's loads ("h2d") and offloads ("d2h"), unpaced."""
    from offloadlab.core.machine import Machine
    from offloadlab.executor import execute
    machine = Machine(gpus=1, gpu_memory=2 * (repeat + 1) * nbytes, streams=1)
    mg = copies_memgraph(nbytes, repeat, h2d, d2h)
    trace = execute(mg, machine, backend=backend, policy="fixed", rate_limit=False).trace
    rates = {}
    for direction, kind in (("h2d", "load"), ("d2h", "offload")):
        rows = trace[trace["kind"] == kind]
        if len(rows):
            rates[direction] = float((rows["bytes"] / (rows["end"] - rows["start"])).median())
    return rates


def cmd_copies(args: argparse.Namespace) -> None:
    mib = args.mib or (256 if args.backend == "cupy" else 64)
    nbytes = mib << 20
    for name, h2d, d2h in (("alone", True, False), ("alone", False, True),
                           ("duplex", True, True)):
        executor_rates(args.backend, nbytes, 1, h2d, d2h)     # warm-up: pinning, first launch
        plain = plain_rates(args.backend, nbytes, args.repeat, h2d, d2h)
        ours = executor_rates(args.backend, nbytes, args.repeat, h2d, d2h)
        for direction in plain:
            ratio = ours[direction] / plain[direction]
            verdict = "ok" if ratio >= GOAL else f"BELOW the {100 * GOAL:.0f}% goal"
            if args.backend == "numpy":      # memcpy on a shared core: for the record only
                verdict = "numpy: no goal"
            _row(args.rows, f"copy {direction} {name} ({mib} MiB)",
                 f"plain {plain[direction] / 1e9:.2f} GB/s, executor "
                 f"{ours[direction] / 1e9:.2f} GB/s, {100 * ratio:.1f}% ({verdict})",
                 ok=ratio >= GOAL or args.backend == "numpy",
                 data={"plain": plain[direction], "executor": ours[direction]})


# -- dispatch -------------------------------------------------------------------------------
def tiny_chain(n: int):
    """``n`` one-element adds on gpu0, each reading the previous one."""
    from offloadlab.core.taskgraph import TaskGraph
    g = TaskGraph(name="tiny-adds")
    prev = g.add_input("x", 4, home="gpu0", shape=(1,)).id
    for k in range(n):
        prev = g.add_compute(f"a{k}", "add", [prev], "gpu0", 4, flops=1.0, shape=(1,)).id
    return g


def cmd_dispatch(args: argparse.Namespace) -> None:
    from offloadlab.core.machine import Machine
    from offloadlab.executor import execute
    from offloadlab.planner import plan
    n = args.vertices or (20_000 if args.backend == "cupy" else 2_000)
    machine = Machine(gpus=1, gpu_memory=8 * (n + 1))
    mg = plan(tiny_chain(n), machine, "buildmemgraph")
    execute(plan(tiny_chain(100), machine, "buildmemgraph"), machine, backend=args.backend)
    result = execute(mg, machine, backend=args.backend)
    kernel = float((result.trace["end"] - result.trace["start"]).median())
    _row(args.rows, f"dispatch: chain of {n} one-element adds",
         f"{result.makespan / n * 1e6:.1f} us per vertex (makespan {result.makespan:.3g} s; "
         f"median kernel {kernel * 1e6:.1f} us)",
         data={"vertices": n, "makespan": result.makespan, "median_kernel": kernel})


# -- validate -------------------------------------------------------------------------------
def aligned_workload(spec: str):
    """The workload with every flat tensor rounded up to whole elements of its dtype, so that
    the planners' packed offsets are aligned (a CUDA kernel faults on a misaligned load)."""
    import numpy as np

    from offloadlab.core.taskgraph import TaskGraph
    from offloadlab.core.workloads import build_workload
    graph = build_workload(spec)
    aligned = TaskGraph(name=graph.name, meta=dict(graph.meta))
    for t in graph.tasks.values():
        size = np.dtype(t.dtype).itemsize
        aligned.add(t if t.shape is not None else replace(t, bytes=-(-t.bytes // size) * size))
    return aligned


def cmd_validate(args: argparse.Namespace) -> int:
    import pandas as pd

    from offloadlab.core.formats import memgraph_suffix, write_memgraph
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.lab.plots import gantt
    from offloadlab.lab.validate import validate_memgraph
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity
    from offloadlab.simulator import makespan

    graph = aligned_workload(args.workload)
    tight = min_capacity(graph)
    total = sum(t.bytes for t in graph)
    memory = int(tight + SLACK * max(total - tight, 0))
    machine = replace(machine_from_spec(args.machine), gpu_memory=memory)
    failed = 0
    traces = {}
    for planner in PLANNERS:
        mg = plan(graph, machine, planner, evaluate=makespan)
        moved = {k: mg.count(k) for k in ("offload", "reload", "load")}
        check = f"validate {args.label} {planner}"
        if not moved["offload"]:
            _row(args.rows, check, f"FAILED: no offload at {memory} bytes", ok=False)
            failed += 1
            continue
        v = validate_memgraph(mg, machine, graph, planner, runs=args.runs,
                              backend=args.backend)
        busy = {row.component: row.error for row in v.table.itertuples()
                if row.component.startswith("busy ")}
        worst = max(busy.items(), key=lambda kv: abs(kv[1]), default=("-", 0.0))
        ok = v.correct
        failed += not ok
        _row(args.rows, check,
             f"simulated {v.simulated['end'].max():.4g} s, measured "
             f"{v.measured['end'].max():.4g} s, error {100 * v.error:+.1f}%; worst busy "
             f"{worst[0][5:]} {100 * worst[1]:+.1f}%; {moved['offload']} offloads, "
             f"{moved['reload']} reloads, {moved['load']} loads at {memory / 2**20:.1f} MiB"
             + ("" if v.correct else "; outputs WRONG"), ok=ok,
             data={"workload": args.workload, "gpu_memory": memory, **moved, **v.row()})
        stem = Path(args.plot).with_suffix("")      # what was run and measured, to study later
        write_memgraph(mg, f"{stem}-{planner}{memgraph_suffix(len(mg))}")
        pd.concat([v.simulated, v.measured]).to_csv(f"{stem}-{planner}-traces.csv", index=False)
        traces[f"{planner}: simulated"] = v.simulated
        traces[f"{planner}: measured ({args.backend}), error {100 * v.error:+.1f}%"] = \
            v.measured
    if traces:
        gantt(traces, args.plot, title=f"{args.label} at {memory / 2**20:.1f} MiB: simulated "
                                       f"vs measured ({args.backend})")
    return 1 if failed else 0


# -- rows and the report --------------------------------------------------------------------
def cmd_row(args: argparse.Namespace) -> None:
    data = json.loads(Path(args.data).read_text()) if args.data else None
    _row(args.rows, args.check, args.result, ok=not args.failed, data=data)


def cmd_report(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line]
    ok = bool(rows) and all(r["ok"] for r in rows)
    report = {"backend": args.backend, "seconds": args.seconds, "ok": ok,
              "host": platform.node(), "python": platform.python_version(), "rows": rows}
    Path(args.json).write_text(json.dumps(report, indent=1))
    width = max((len(r["check"]) for r in rows), default=5)
    print(f"{'check':<{width}}  ok  result")
    print(f"{'-' * width}  --  {'-' * 6}")
    for r in rows:
        print(f"{r['check']:<{width}}  {'ok' if r['ok'] else '!!'}  {r['result']}")
    print(f"gpu_check --backend {args.backend}: {'all ok' if ok else 'SOME CHECKS FAILED'} "
          f"in {args.seconds} s")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str, backend: bool = True) -> argparse.ArgumentParser:
        s = sub.add_parser(name)
        s.add_argument("--rows", type=Path, required=True)
        if backend:
            s.add_argument("--backend", choices=("cupy", "numpy"), default="cupy")
        return s

    add("device")
    s = add("copies")
    s.add_argument("--mib", type=int, default=0)
    s.add_argument("--repeat", type=int, default=4)
    s = add("dispatch")
    s.add_argument("--vertices", type=int, default=0)
    s = add("validate")
    s.add_argument("--workload", required=True)
    s.add_argument("--machine", required=True)
    s.add_argument("--label", required=True)
    s.add_argument("--plot", required=True)
    s.add_argument("--runs", type=int, default=3)
    s = add("row", backend=False)
    s.add_argument("--check", required=True)
    s.add_argument("--result", required=True)
    s.add_argument("--failed", action="store_true")
    s.add_argument("--data")
    s = add("report")
    s.add_argument("--seconds", type=int, required=True)
    s.add_argument("--json", required=True)
    args = p.parse_args()
    steps = {"device": cmd_device, "copies": cmd_copies, "dispatch": cmd_dispatch,
             "validate": cmd_validate, "row": cmd_row, "report": cmd_report}
    return steps[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
