"""Why verifying grows by more than its operations from 10k to 1M vertices (issue 16's last
goal): what the verifier does per vertex, against what the machine's memory charges for the
least a verifier must touch.

    python bench/bench_growth.py                               # default, a100x8, 1.5x
    python bench/bench_growth.py --workload host --factor 100 --vertices 10000,1000000

For each size, in a fresh process, the workload is built and planned with ``buildmemgraph``
(as ``bench_scale.py`` does; planning is timed once, or best of several at small sizes), and
then, with the garbage collector paused (as the verifier pauses it), each the best of at least
three runs, in microseconds per TaskGraph vertex:

- ``verify`` and its parts: the one pass (``scan``), rule 3, rule 2;
- the operations the verifier's work is made of, counted per TaskGraph vertex: MemGraph
  vertices, edges, writers of GPU memory, previous writers found by rule 3's overwrites, and
  the intervals rule 3's maps hold at the end (``intervals``, per GPU);
- floors, each a part of what any verifier of this MemGraph must do, at its least: ``walk``
  goes through every edge in the vertices' successor dicts; ``lookup`` also finds each
  edge's target vertex by its id; ``gather`` is the order check's reading with the MemGraph
  held in arrays (each edge's target order gathered by NumPy, no Python per edge); ``sweep`` is rule
  3's interval maps alone (the overwrites, driven from a Python loop); and, for reading,
  ``insert`` makes a dict per vertex and files every edge, given in the file's order, in its
  target's.

The last rows give each figure at each size over the size before, and at the largest over
the smallest.  Operations that stay flat per vertex while their time grows are the memory
hierarchy's cost, not the algorithm's.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable
from typing import TypeVar

from bench_scale import WORKLOADS, sized_machine, workload_spec
from timing import best_of, in_fresh_process

T = TypeVar("T")
TIMES = ("plan", "verify", "scan", "rule3", "rule2", "walk", "lookup", "gather", "sweep",
         "insert")
COUNTS = ("memgraph", "edges", "writers", "previous", "intervals")


def measure(workload: str, machine: str, factor: float, vertices: int) -> dict:
    """One size, in this process: seconds of each timed part, and the counts."""
    import numpy as np

    from offloadlab.core import verify as V
    from offloadlab.core.intervals import LastWriter
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan

    graph = build_workload(workload_spec(workload, machine, vertices))
    m = sized_machine(machine, graph, factor)
    row: dict = {}
    row["plan"], mg = best_of(max(1, min(5, 100_000 // vertices)),
                              lambda: plan(graph, m, "buildmemgraph"))
    gc.collect()
    gc.freeze()
    gc.disable()        # from here on as verify runs: the collector paused

    def timed(fn: Callable[[], T]) -> tuple[float, T]:
        return best_of(max(3, 100_000 // vertices), fn)

    row["verify"], _ = timed(lambda: V.verify(mg, graph, m))
    row["scan"], scan = timed(lambda: V._Scan(mg, m.gpu_memory))
    writers = list(scan.writers)                # in the MemGraph's order, which rule 3 sorts
    row["rule3"], _ = timed(lambda: V._rule3_no_races(mg, list(writers)))
    row["rule2"], _ = timed(lambda: V._rule2_data_edges(mg, graph))

    vertices_of, succ = mg.vertices, mg.succ

    def walk() -> None:
        for targets in succ.values():
            for _ in targets:
                pass

    def lookup() -> None:
        for targets in succ.values():
            for w in targets:
                vertices_of[w]

    row["walk"], _ = timed(walk)
    row["lookup"], _ = timed(lookup)
    index = {v: i for i, v in enumerate(vertices_of)}
    order = np.array([v.order for v in vertices_of.values()], dtype=np.int64)
    targets = np.array([index[w] for out in succ.values() for w in out], dtype=np.int64)
    row["gather"], _ = timed(lambda: order[targets])

    intervals = sorted((v.order, v.loc.device, v.loc.offset, v.loc.end)
                     for v in vertices_of.values() if v.loc is not None)

    def sweep() -> tuple[int, dict[str, LastWriter[int]]]:
        maps: dict[str, LastWriter[int]] = {}
        previous = 0
        for k, (_, device, start, end) in enumerate(intervals):
            bytes_of = maps.get(device)
            if bytes_of is None:
                bytes_of = maps[device] = LastWriter()
            previous += len(bytes_of.overwrite(start, end, k))
        return previous, maps

    row["sweep"], (previous, maps) = timed(sweep)
    pairs = [(u, w) for u, out in succ.items() for w in out]

    def insert() -> None:
        pred: dict[str, dict[str, str]] = {v: {} for v in vertices_of}
        for u, w in pairs:
            pred[w][u] = "data"

    row["insert"], _ = timed(insert)
    row.update(memgraph=len(mg), edges=len(targets), writers=len(intervals), previous=previous,
               intervals=sum(len(b) for lw in maps.values() for b in lw.blocks)
               / max(len(maps), 1),
               build="compiled" if V.__file__.endswith(".so") else "pure Python")
    return row


def size(n: int) -> str:
    """``n`` vertices in a few characters: 10k, 1M."""
    for unit, name in ((10**6, "M"), (10**3, "k")):
        if n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", default="10000,100000,1000000")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="default")
    p.add_argument("--machine", default="a100x8")
    p.add_argument("--factor", type=float, default=1.5,
                   help="GPU memory, times the tightest feasible (1.5)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per size (900)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        w, m, f, n = args.one.split("|")
        print(json.dumps(measure(w, m, float(f), int(n))))
        return
    rows = []
    for n in args.vertices.split(","):
        row, why = in_fresh_process(
            __file__, f"{args.workload}|{args.machine}|{args.factor}|{n}", args.timeout)
        if row is None:
            sys.exit(f"bench_growth: {n} vertices: {why}")
        rows.append((int(n), row))
    print(f"{args.workload}, {args.machine}, {args.factor}x, {rows[0][1]['build']} build; "
          f"µs (times) and operations (counts) per TaskGraph vertex, best of several runs")
    print(f"{'vertices':>9}" + "".join(f"{c:>10}" for c in TIMES + COUNTS))
    for n, row in rows:
        cells = [row[c] / n * 1e6 for c in TIMES] + [row[c] / n for c in COUNTS[:-1]]
        print(f"{n:>9}" + "".join(f"{x:10.3g}" for x in cells) + f"{row['intervals']:10.0f}")
    pairs = list(zip(rows, rows[1:])) + ([(rows[0], rows[-1])] if len(rows) > 2 else [])
    for (small, first), (large, last) in pairs:
        ratios = [f"{last[c] / large / (first[c] / small):9.2f}x" if first[c] else f"{'-':>10}"
                  for c in TIMES + COUNTS[:-1]]
        ratios.append(f"{last['intervals'] / first['intervals']:9.2f}x" if first["intervals"]
                      else f"{'-':>10}")
        print(f"{f'{size(large)}/{size(small)}':>9}" + "".join(ratios))


if __name__ == "__main__":
    main()
