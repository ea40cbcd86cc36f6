"""Whole command-line processes, start-up included (issue 16's goal: 50,000 vertices/s each).

    python bench/bench_cli.py                       # the benchmark's 100k-vertex DAG
    python bench/bench_cli.py --vertices 30000 --repeat 1 --formats parquet

Runs ``offloadlab plan`` on the benchmark DAG (``random`` with every input in host RAM, 4 GPUs
of an a100x8 whose memory is 1.5x the tightest feasible) and then ``offloadlab simulate`` on
the MemGraph it wrote, each as its own process with verification on (as users run them), and
reports the best wall time of ``--repeat`` runs in TaskGraph vertices planned per second and
MemGraph vertices simulated per second, with ``offloadlab --version`` as the start-up floor;
once per MemGraph file format (``--formats``: node-link JSON, the default, and Parquet).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from offloadlab.core.memgraph import MemGraph
from offloadlab.core.workloads import build_workload
from offloadlab.planner.buildmemgraph import min_capacity


def timed(argv: list[str], repeat: int) -> float:
    """Best wall time of ``repeat`` runs of ``python -m offloadlab ARGV``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "offloadlab", *argv], check=True,
                       stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=100_000)
    p.add_argument("--factor", type=float, default=1.5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--formats", default="json,parquet",
                   help="MemGraph file formats, comma-separated (json,parquet)")
    args = p.parse_args()
    workload = f"random:vertices={args.vertices},gpus=4,seed=1,host_fraction=1"
    tight = min_capacity(build_workload(workload))
    machine = f"a100x8:gpus=4,gpu_memory={int(tight * args.factor)}"
    with tempfile.TemporaryDirectory() as tmp:
        startup = timed(["--version"], args.repeat)
        print(f"workload   {workload} on {machine}")
        print(f"start-up   {startup:.2f} s (offloadlab --version)")
        for fmt in args.formats.split(","):
            out = os.path.join(tmp, f"mg.{fmt}")
            plan_s = timed(["plan", "--workload", workload, "--machine", machine, "--out", out],
                           args.repeat)
            sim_s = timed(["simulate", out], args.repeat)
            memgraph = len(MemGraph.read(out))
            print(f"plan       {plan_s:.2f} s = {args.vertices / plan_s:,.0f} TaskGraph "
                  f"vertices/s (build, plan, verify, write {fmt}; best of {args.repeat})")
            print(f"simulate   {sim_s:.2f} s = {memgraph / sim_s:,.0f} MemGraph vertices/s "
                  f"({memgraph} vertices: read {fmt}, verify, simulate; best of "
                  f"{args.repeat}; file {os.path.getsize(out) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
