"""Build and solve times of the Section 6 MILP lower bound on GPT-2-like chains.

    python bench/bench_ilp.py                                  # L = 36, 74, 144; CBC and HiGHS
    python bench/bench_ilp.py --depths 144 --solvers highs --time-limit 60
    python bench/bench_ilp.py --gpu-memory 16e9 --workspace 2e9 --bandwidth 12e9

Layers come from ``transformer_chain("gpt2", L, batch, seq, dtype_bytes)`` (v100 cost model, fp32 by
default); the MILP gets ``M_GPU = gpu-memory - workspace`` bytes, too little for all weights from
L = 36 on, so weights must be offloaded.  A solver that is not installed is reported and skipped.
"""

from __future__ import annotations

import argparse
import importlib.util

from offloadlab.core.workloads.training import transformer_chain
from offloadlab.ilp import lower_bound


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[36, 74, 144])
    ap.add_argument("--solvers", nargs="+", default=["cbc", "highs"], choices=["cbc", "highs"])
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--gpu-memory", type=float, default=16e9, help="bytes")
    ap.add_argument("--workspace", type=float, default=2e9,
                    help="bytes kept for the recomputed intermediate activations")
    ap.add_argument("--bandwidth", type=float, default=12e9, help="bytes/s, both directions")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype-bytes", type=int, default=4,
                    help="bytes per weight and activation value (4: even L = 36 must offload)")
    args = ap.parse_args(argv)
    memory = int(args.gpu_memory - args.workspace)
    print(f"M_GPU = {memory / 1e9:.2f} GB, beta = {args.bandwidth / 1e9:g} GB/s, "
          f"time limit {args.time_limit:g} s")
    print(f"{'L':>4} {'solver':>6} {'vars':>7} {'cons':>7} {'build s':>8} {'solve s':>8} "
          f"{'status':>10} {'sum u s':>9} {'bound s':>9} {'idle %':>7} {'weights GB':>10}")
    for depth in args.depths:
        chain = transformer_chain("gpt2", depth, batch=args.batch, seq=args.seq,
                                  dtype_bytes=args.dtype_bytes)
        for solver in args.solvers:
            if solver == "highs" and importlib.util.find_spec("highspy") is None:
                print(f"{depth:>4} {solver:>6}  skipped: pip install offloadlab[highs]")
                continue
            r = lower_bound(chain, memory, args.bandwidth, solver=solver,
                            time_limit=args.time_limit)
            idle = 100 * (r.bound / chain.sum_u - 1)
            print(f"{depth:>4} {solver:>6} {r.variables:>7} {r.constraints:>7} "
                  f"{r.build_time:>8.2f} {r.solve_time:>8.2f} {r.status:>10} "
                  f"{chain.sum_u:>9.4f} {r.bound:>9.4f} {idle:>7.3f} {sum(chain.w) / 1e9:>10.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
