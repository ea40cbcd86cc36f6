"""BuildMemGraph against levelwise and the paper's Belady rule (issue 17's table).

    python bench/bench_quality.py                       # docs/results/quality.md
    python bench/bench_quality.py --factors 1.1 --planners "buildmemgraph;levelwise" --csv out.csv

Every workload is planned at ``factor`` times the tightest feasible GPU memory
(:func:`min_capacity`) on ``p100x4`` with as many GPUs as the workload uses, verified and
simulated with ``dynamic`` dispatch.  Each row: simulated makespan, host<->GPU bytes moved, the
MemGraph's lower bound (:func:`offloadlab.core.bound.lower_bound`), planning seconds; the
summary compares each planner with ``levelwise`` (``loss`` > 0: slower than levelwise) and the
default's bytes with the paper's rule (:data:`PAPER`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

FACTORS = (1.0, 1.1, 1.5, 3.0, 10.0)
PAPER = "buildmemgraph:victim=belady,reserve=0,retry=false"
"""The paper's BuildMemGraph: Belady's rule, allocation as far ahead as memory allows."""
PLANNERS = ("levelwise", "buildmemgraph", PAPER)


def workloads() -> list[str]:
    """Every workload the toolkit has, at sizes that plan in seconds, and every traced model."""
    from offloadlab.core.workloads.models import GPUS, MODELS, MODES
    return ["matmul-chain:layers=8,gpus=2", "matmul-chain:layers=16,gpus=1", "tp-matmul",
            "random:vertices=300,gpus=1,seed=0", "random:vertices=300,gpus=2,seed=1",
            "random:vertices=300,gpus=2,seed=2,host_fraction=1",
            "gpt2-train:depth=12", "bert-train:depth=12", "training-chain",
            *(f"model:name={n},mode={m},gpus={g}" for n in MODELS for m in MODES for g in GPUS),
            "llama-prefill:model=tiny", "llama-prefill:model=tiny,gpus=2",
            "llama-lora-train:model=tiny", "llama-lora-train:model=tiny,gpus=2"]


def one(spec: str, factor: float, planner: str) -> dict:
    from dataclasses import replace

    from offloadlab.core import formats
    from offloadlab.core.bound import lower_bound
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity
    from offloadlab.simulator import makespan, simulate

    graph = formats.taskgraph_from_json(spec) if spec.endswith(".json") else build_workload(spec)
    machine = replace(machine_from_spec("p100x4"), gpus=max(1, len(graph.gpus())),
                      gpu_memory=int(min_capacity(graph) * factor))
    row: dict = dict(workload=spec, factor=factor, planner=planner)
    start = time.perf_counter()
    try:
        mg = plan(graph, machine, planner, evaluate=makespan)
    except Exception as e:   # noqa: BLE001 - a planner that cannot fit gets a row saying so
        row["error"] = str(e)
        return row
    row["plan_s"] = time.perf_counter() - start
    verify(mg, graph, machine)
    row.update(makespan=simulate(mg, machine).makespan, moved=mg.host_bytes(),
               bound=lower_bound(mg, machine))
    return row


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", help="workload specs or TaskGraph files separated by ';' "
                    "(default: every workload)")
    ap.add_argument("--factors", default=",".join(map(str, FACTORS)))
    ap.add_argument("--planners", default=";".join(PLANNERS), help="';'-separated specs")
    ap.add_argument("--csv", help="also write every row here")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args(argv)
    specs = args.workloads.split(";") if args.workloads else workloads()
    factors = [float(f) for f in args.factors.split(",")]
    planners = args.planners.split(";")
    points = [(s, f, p) for s in specs for f in factors for p in planners]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, *zip(*points)))
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
    ok = df[df.get("error", pd.Series(index=df.index, dtype=object)).isna()]
    wide = ok.pivot_table(index=["workload", "factor"], columns="planner",
                          values=["makespan", "moved"], aggfunc="first")
    base = wide["makespan"]["levelwise"]
    out = pd.DataFrame(index=wide.index)
    for p in planners:
        if p == "levelwise" or p not in wide["makespan"]:
            continue
        out[f"loss {p}"] = (wide["makespan"][p] / base - 1).round(3)
    if PAPER in wide["moved"] and "buildmemgraph" in wide["moved"]:
        belady = wide["moved"][PAPER]
        out["bytes vs belady"] = (wide["moved"]["buildmemgraph"] / belady.where(belady > 0)
                                  ).round(3)
    gap = ok[ok.planner == "buildmemgraph"].set_index(["workload", "factor"])
    out["gap to bound"] = (gap.makespan / gap.bound - 1).round(3)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    print(out.to_string())
    if "error" in df:
        for _, r in df[df.error.notna()].iterrows():
            print(f"{r.workload} {r.factor} {r.planner}: {r.error}", file=sys.stderr)
    if {"loss buildmemgraph", f"loss {PAPER}"} <= set(out):
        print()
        print(summary(out).to_string())


def family(spec: str) -> str:
    """``model:name=gpt2,mode=train,gpus=2`` -> ``gpt2 train``; other specs -> their name."""
    if spec.startswith("model:"):
        options = dict(kv.split("=") for kv in spec[len("model:"):].split(","))
        return f"{options['name']} {options['mode']}"
    return spec.split(":")[0]


def summary(out):
    """Per workload family: settings, buildmemgraph's and the Belady rule's makespan over
    levelwise's (median, max, how many more than 5% slower), bytes over Belady's, gap."""
    import pandas as pd
    ours, paper = out["loss buildmemgraph"] + 1, out[f"loss {PAPER}"] + 1
    frame = pd.DataFrame({"family": [family(w) for w, _ in out.index], "ours": ours.values,
                          "paper": paper.values, "bytes": out["bytes vs belady"].values,
                          "gap": out["gap to bound"].values})
    by = frame.groupby("family", sort=False)
    table = pd.DataFrame({
        "settings": by.size(),
        "vs levelwise median": by.ours.median(), "max": by.ours.max(),
        "slower >5%": by.ours.apply(lambda s: int((s > 1.05).sum())),
        "belady vs levelwise max": by.paper.max(),
        "belady slower >5%": by.paper.apply(lambda s: int((s > 1.05).sum())),
        "bytes vs belady median": by.bytes.median(), "bytes max": by.bytes.max(),
        "gap to bound median": by.gap.median()})
    total = {"settings": len(frame), "vs levelwise median": frame.ours.median(),
             "max": frame.ours.max(), "slower >5%": int((frame.ours > 1.05).sum()),
             "belady vs levelwise max": frame.paper.max(),
             "belady slower >5%": int((frame.paper > 1.05).sum()),
             "bytes vs belady median": frame.bytes.median(), "bytes max": frame.bytes.max(),
             "gap to bound median": frame.gap.median()}
    table.loc["all"] = pd.Series(total)
    return table.round(3)


if __name__ == "__main__":
    main()
