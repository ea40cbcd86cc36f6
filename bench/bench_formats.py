"""Writing and reading a MemGraph as node-link JSON and as Parquet, by size: where Parquet's
write + read beats JSON's (``formats.PARQUET_VERTICES``, docs/formats.md).

    python bench/bench_formats.py                           # 1k-100k TaskGraph vertices
    python bench/bench_formats.py --vertices 2000,5000 --repeat 5
    python bench/bench_formats.py --workload llama-lora-train:model=7b,seq=1024,batch=8,gpus=8 \
        --machine a100x8 --repeat 1

For each size, the benchmark DAG (``random`` with every input in host RAM, 4 GPUs of an
a100x8 with 1.5x the tightest memory, as ``bench_cli.py`` plans it) is planned once; then each
write and each read runs in a fresh process, as ``plan`` and ``simulate`` do, and its seconds
include importing what the format needs (pyarrow for Parquet) but not Python's start-up. It
prints the best of ``--repeat`` rounds per cell, the files' sizes, and which format's write +
read is faster.  ``--in-process`` times them in this process instead, imports left out (the
best of ``--repeat`` rounds, at least 2).  ``--workload`` plans any workload spec instead, on
``--machine`` as that spec gives it.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time

CHILD = """import pickle, sys
sys.path.insert(0, sys.argv[4])
from bench_formats import in_process
what, path, pickled = sys.argv[1:4]
mg = None
if what == "write":
    with open(pickled, "rb") as f:
        mg = pickle.load(f)
print(in_process(what, path, mg))
"""


def seconds(what: str, path: str, pickled: str) -> float:
    """Seconds of one ``write`` or ``read`` of ``path`` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", CHILD, what, path, pickled,
                           os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise SystemExit(f"bench_formats: {what} {path}: {lines[-1]}")
    return float(done.stdout)


def in_process(what: str, path: str, mg: object) -> float:
    """Seconds of one ``write`` of ``mg`` to ``path`` or ``read`` of it, in this process
    (the fresh processes of :func:`seconds` run it too)."""
    from offloadlab.core import formats
    start = time.perf_counter()
    if what == "write":
        formats.write_memgraph(mg, path)
    else:
        formats.read_memgraph(path)
    return time.perf_counter() - start


def counts(text: str) -> list[int]:
    """``--vertices``: positive integers, comma-separated."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, comma-separated, got "
                                         f"{text!r}")
    return values


def positive(text: str) -> int:
    """``--repeat``: a positive integer."""
    values = counts(text)
    if len(values) > 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return values[0]


def main() -> None:
    from offloadlab.core.errors import OffloadlabError

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=counts, default=[1000, 3000, 10000, 30000, 100000],
                   help="TaskGraph vertices, comma-separated")
    p.add_argument("--repeat", type=positive, default=3)
    p.add_argument("--in-process", action="store_true",
                   help="time in this process, imports left out")
    p.add_argument("--workload", help="a workload spec to plan instead of the benchmark DAG")
    p.add_argument("--machine", default="a100x8",
                   help="with --workload: the machine spec to plan on (a100x8)")
    args = p.parse_args()
    try:
        run(args)
    except OffloadlabError as exc:
        p.exit(2, f"bench_formats: {exc}\n")


def run(args: argparse.Namespace) -> None:
    """The table, a row per size (or the one ``--workload``)."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity

    print("| TaskGraph vertices | MemGraph vertices | JSON write + read (s) | "
          "Parquet write + read (s) | JSON / Parquet size | faster |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for n in [0] if args.workload else args.vertices:
            if args.workload:
                graph, machine = build_workload(args.workload), args.machine
                n = len(graph)
            else:
                graph = build_workload(f"random:vertices={n},gpus=4,seed=1,host_fraction=1")
                machine = f"a100x8:gpus=4,gpu_memory={int(min_capacity(graph) * 1.5)}"
            mg = plan(graph, machine_from_spec(machine))
            pickled = os.path.join(tmp, "mg.pickle")
            with open(pickled, "wb") as f:
                pickle.dump(mg, f)
            cells, sums, sizes = [], {}, {}
            for fmt in ("json", "parquet"):
                path = os.path.join(tmp, f"mg.{fmt}")
                if args.in_process:
                    write = min(in_process("write", path, mg) for _ in range(max(args.repeat, 2)))
                    read = min(in_process("read", path, mg) for _ in range(max(args.repeat, 2)))
                else:
                    write = min(seconds("write", path, pickled) for _ in range(args.repeat))
                    read = min(seconds("read", path, pickled) for _ in range(args.repeat))
                sums[fmt], sizes[fmt] = write + read, os.path.getsize(path)
                cells.append(f"{write:.3f} + {read:.3f} = {write + read:.3f}")
            faster = min(sums, key=sums.__getitem__)
            print(f"| {n:,} | {len(mg):,} | {cells[0]} | {cells[1]} | "
                  f"{sizes['json'] / sizes['parquet']:.1f} | {faster} |", flush=True)


if __name__ == "__main__":
    main()
