"""Simulated against measured after calibration, on the numpy backend (run by hand).

    python bench/bench_validate.py [--runs 3] [--link 0.5e9] [--quick]

Calibrates the numpy backend (copies paced to ``--link`` bytes/s each way, from the p100x4
preset with one GPU: this 2-core machine emulates one GPU faithfully, see README, Executor),
then for each workload and GPU memory level plans with ``levelwise`` and ``buildmemgraph``,
simulates on the calibrated machine and runs the MemGraph ``--runs`` times under ``dynamic``
dispatch.  Prints per setting the simulated and the median measured makespan, the error, the
largest error among the components (busy time per resource, mean duration per vertex kind),
and buildmemgraph's gain over levelwise, simulated and measured.

Workloads: the DISCO matmul chain on one GPU (a 16 MiB weight per layer loaded from host RAM,
whose transfer takes about as long as its matmul at 0.5 GB/s), with room for 2, 3 and 6
weights; random DAGs of ``mix`` kernels of 2-8 MiB (each at least about a millisecond) at 1.2x,
1.5x and 3x the tightest feasible memory, for two seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import pandas as pd

from offloadlab.core.machine import MiB, machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.executor.calibrate import calibrate
from offloadlab.lab.validate import validate
from offloadlab.planner.buildmemgraph import min_capacity

PLANNERS = ["levelwise", "buildmemgraph"]


def settings(quick: bool):
    layers = 8 if quick else 16
    chain = build_workload(f"matmul-chain:layers={layers},gpus=1,batch=512,hidden=2048")
    for weights in ((2, 6) if quick else (2, 3, 6)):      # activations take 2 x 4 MiB
        yield f"matmul-chain, {weights} weights fit", chain, (16 * weights + 8) * MiB
    for seed in ((1,) if quick else (1, 2)):
        dag = build_workload(f"random:vertices={60 if quick else 150},gpus=1,seed={seed},"
                             f"min_bytes={2 * MiB},max_bytes={8 * MiB}")
        for factor in ((1.2, 3.0) if quick else (1.2, 1.5, 3.0)):
            yield f"random seed {seed}, {factor}x tightest", dag, int(factor * min_capacity(dag))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--link", type=float, default=0.5e9, help="bytes/s each way (0.5e9)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    base = machine_from_spec(f"p100x4:gpus=1,h2d_bandwidth={args.link},d2h_bandwidth={args.link}")
    machine = calibrate(base, "numpy", quick=args.quick).machine
    print(f"calibrated: matmul {machine.gpu_flops / 1e9:.3g} GFLOP/s, mix "
          f"{[r[1:] for r in machine.op_rates if r[0] == 'mix'][0]} B/s written/read, h2d "
          f"{machine.h2d_bandwidth / 1e9:.3g} GB/s, d2h {machine.d2h_bandwidth / 1e9:.3g} GB/s, "
          f"duplex {machine.duplex:.2f}, kernel latency {machine.kernel_latency * 1e6:.0f} us")
    rows = []
    for label, graph, memory in settings(args.quick):
        print(f"{label} ...", file=sys.stderr)
        m = replace(machine, gpu_memory=memory)
        for r in validate(graph, m, PLANNERS, runs=args.runs):
            worst = r.table[r.table["component"] != "makespan"]
            worst = worst[worst["measured"] > 0.01 * r.table["measured"].iloc[0]]
            top = worst.loc[worst["error"].abs().idxmax()]
            rows.append({"setting": label, "planner": r.planner,
                         "simulated": r.table["simulated"].iloc[0],
                         "measured": r.table["measured"].iloc[0], "error": r.error,
                         "worst component": f"{top['component']} {100 * top['error']:+.0f}%",
                         "correct": r.correct})
    table = pd.DataFrame(rows)
    gains = []
    for label, pair in table.groupby("setting", sort=False):
        lw, bm = (pair[pair["planner"] == p].iloc[0] for p in PLANNERS)
        gains.append({"setting": label,
                      "gain simulated": 1 - bm["simulated"] / lw["simulated"],
                      "gain measured": 1 - bm["measured"] / lw["measured"]})
    shown = table.copy()
    shown["error"] = shown["error"].map(lambda e: f"{100 * e:+.1f}%")
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print()
    print("buildmemgraph's gain over levelwise (1 - its makespan / levelwise's):")
    print(pd.DataFrame(gains).to_string(index=False, float_format=lambda x: f"{100 * x:+.1f}%"))
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
