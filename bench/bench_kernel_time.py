"""Where a kernel's time inside a plan goes, against the conditions calibrate times it in
(run by hand).

    python bench/bench_kernel_time.py [--rounds 5] [--link 0.5e9] [--kernels 24] [--quick]

For each workload and planner of ``bench_validate.py`` (planned on a machine calibrated with
``--quick``, or ``--machine FILE``), up to ``--kernels`` compute vertices of the plan, evenly
spread over it, are timed four ways, in interleaved rounds (the order shuffled in each) so that
a loaded machine's load falls on every way alike:

- ``plan``: inside the plan, run as ``validate`` runs it (copies paced to ``--link``);
- ``unpaced``: inside the plan with unpaced copies (no copy thread pacing beside the kernels);
- ``shared``: each kernel twice, back to back, on the same inputs; the second one timed (warm
  inputs: how calibrate timed its repeats before each read inputs of its own);
- ``own``: each kernel twice, each on inputs of its own; the second one timed.

Each kernel is timed by the wall clock (as the executor times it) and by its lane thread's
CPU time (``time.thread_time``: the time the thread ran, not the time it waited for a core or
for the GIL).  Prints, per setting, each way's kernel seconds (the median over rounds of their
sum) relative to ``own``'s, by wall clock and by CPU time, the share of ``plan``'s and
``own``'s wall-clock time their thread did not run, and the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import replace

import pandas as pd
from bench_validate import PLANNERS, settings
from timing import markdown

from offloadlab.core.machine import Machine, machine_from_spec
from offloadlab.core.memgraph import MemGraph
from offloadlab.executor import execute
from offloadlab.executor.calibrate import KernelGraph, calibrate
from offloadlab.executor.kernels import tensor_shape
from offloadlab.executor.numpy_backend import NumpyBackend
from offloadlab.planner import plan
from offloadlab.simulator import makespan

WAYS = ("plan", "unpaced", "shared", "own")
CPU: dict[float, float] = {}     # a kernel's start (seconds since the run began) -> CPU time


def _timed_with_cpu():
    """The numpy backend's timer, also noting each kernel's thread CPU time by its start."""
    timed = NumpyBackend.timed

    def wrapped(self, stream, work):
        before = time.thread_time()
        start, end = timed(self, stream, work)
        if stream is None:                      # a kernel (copies run on a copy engine)
            CPU[start] = time.thread_time() - before
        return start, end
    return wrapped


def _shape(v) -> tuple[int, ...]:
    return tensor_shape(v.shape, v.dtype, v.bytes)


def pairs(mg: MemGraph, ids: list[str], shared: bool) -> MemGraph:
    """Each of ``ids``' kernels twice (``<id>#0``, ``<id>#1``) on gpu0, on the same inputs
    or each on inputs of its own."""
    b = KernelGraph()
    for vid in ids:
        v = mg[vid]
        args: tuple[str, ...] = ()
        for r in range(2):
            if r == 0 or not shared:
                args = tuple(b.add(f"{vid}#{r}/in{k}", "input", "gpu0", _shape(mg[u]),
                                   at="gpu0", dtype=mg[u].dtype)
                             for k, u in enumerate(v.inputs))
            b.add(f"{vid}#{r}", "compute", "gpu0", _shape(v), args, v.op, v.flops, at="gpu0",
                  dtype=v.dtype)
    return b.mg


def timed_kernels(mg: MemGraph, machine: Machine, names: dict[str, str],
                  **options) -> tuple[float, float]:
    """Run ``mg`` once; the wall-clock and CPU seconds of the kernels ``names`` maps (the
    vertex -> the plan's vertex it stands for), summed."""
    CPU.clear()
    trace = execute(mg, machine, **options).trace
    rows = trace[trace["vertex"].isin(list(names))]
    return float((rows["end"] - rows["start"]).sum()), float(sum(CPU[s] for s in rows["start"]))


def measure(mg: MemGraph, machine: Machine, count: int, rounds: int) -> dict[str, list]:
    """Each way's (wall, cpu) kernel seconds per round."""
    kernels = [v.id for v in mg if v.kind == "compute"]
    step = max(1, len(kernels) // count)
    ids = kernels[::step][:count]
    alone = replace(machine, gpu_memory=2**62, streams=1)
    runs = {
        "plan": (mg, machine, {i: i for i in ids}, {}),
        "unpaced": (mg, machine, {i: i for i in ids}, {"rate_limit": False}),
        "shared": (pairs(mg, ids, True), alone, {f"{i}#1": i for i in ids}, {"policy": "fixed"}),
        "own": (pairs(mg, ids, False), alone, {f"{i}#1": i for i in ids}, {"policy": "fixed"}),
    }
    for graph, m, names, options in runs.values():       # warm-up
        timed_kernels(graph, m, names, **options)
    out: dict[str, list] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in random.sample(WAYS, len(WAYS)):
            graph, m, names, options = runs[way]
            out[way].append(timed_kernels(graph, m, names, **options))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--link", type=float, default=0.5e9, help="bytes/s each way (0.5e9)")
    parser.add_argument("--kernels", type=int, default=24, help="kernels per plan (24)")
    parser.add_argument("--machine", help="a calibrated machine file (default: calibrate)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    random.seed(0)
    if args.machine:
        machine = machine_from_spec(args.machine)
    else:
        base = machine_from_spec(f"p100x4:gpus=1,h2d_bandwidth={args.link},"
                                 f"d2h_bandwidth={args.link}")
        machine = calibrate(base, "numpy", quick=True).machine
    NumpyBackend.timed = _timed_with_cpu()             # type: ignore[method-assign]
    rows, loads = [], [f"{os.getloadavg()[0]:.2f}"]
    for label, graph, memory, _ in settings(args.quick):
        print(f"{label} ...", file=sys.stderr)
        m = replace(machine, gpu_memory=memory)
        for planner in PLANNERS:
            mg = plan(graph, m, planner, evaluate=makespan)
            for v in mg:
                v.time = None
            got = measure(mg, m, args.kernels, args.rounds)
            wall = {w: statistics.median(x for x, _ in got[w]) for w in WAYS}
            cpu = {w: statistics.median(c for _, c in got[w]) for w in WAYS}
            row: dict[str, object] = {"setting": label, "planner": planner}
            for w in WAYS[:-1]:
                row[f"{w} wall"] = f"{wall[w] / wall['own']:.3f}"
                row[f"{w} cpu"] = f"{cpu[w] / cpu['own']:.3f}"
            for w in ("plan", "own"):
                row[f"{w} not running"] = f"{100 * (1 - cpu[w] / wall[w]):.1f}%"
            rows.append(row)
        loads.append(f"{os.getloadavg()[0]:.2f}")
    print(f"Command: `python bench/bench_kernel_time.py --rounds {args.rounds} --link "
          f"{args.link:g} --kernels {args.kernels}{' --quick' if args.quick else ''}`; load "
          f"average (1 min) before, after each workload: {', '.join(loads)} "
          f"({os.cpu_count()} cores). Kernel seconds relative to `own` (calibrate's "
          f"conditions), by wall clock and by CPU time:\n")
    print("\n".join(markdown(pd.DataFrame(rows))))


if __name__ == "__main__":
    main()
