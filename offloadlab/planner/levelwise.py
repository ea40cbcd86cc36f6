"""The bulk-synchronous, levelwise baseline of DISCO Fig. 2 (ZeRO-Inference-like).

Vertices are grouped into levels (longest path from the inputs).  A level's host-resident
weights are all loaded before any of its kernels runs, and the next level's loads start only
after the whole level has completed.  Memory is assigned by BuildMemGraph's allocator without
allocation ahead, in level order; the barriers are added as memory edges.
"""

from __future__ import annotations

from ..core.devices import HOST
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .buildmemgraph import BuildMemGraph, serial_order
from .registry import register


def levels(graph: TaskGraph) -> list[list[str]]:
    """Non-input vertices by level: 0 reads only inputs, level k reads some level k-1 vertex."""
    level: dict[str, int] = {}
    for t in serial_order(graph, "topological"):
        task = graph[t]
        if task.kind != "input":
            level[t] = 1 + max((level[u] for u in task.inputs if u in level), default=-1)
    out: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for t in graph.tasks:
        if t in level:
            out[level[t]].append(t)
    return out


@register("levelwise")
def levelwise(graph: TaskGraph, machine: Machine, *, victim: str = "belady") -> MemGraph:
    """Levelwise processing: load a level's weights, run the level, repeat (DISCO Fig. 2)."""
    machine.check_devices(graph.gpus())
    by_level = levels(graph)
    first_level: dict[str, int] = {}
    for k, vertices in enumerate(by_level):
        for t in vertices:
            for u in graph[t].inputs:
                if graph[u].device == HOST:
                    first_level.setdefault(u, k)
    order: list[str] = []
    for k, vertices in enumerate(by_level):      # a level's weights, then its vertices
        order.extend(u for u, first in first_level.items() if first == k)
        order.extend(vertices)
    builder = BuildMemGraph(graph, machine, order, victim, ahead=False)
    mg = builder.run()
    for i, (t, dev) in enumerate(builder.items):
        if t not in first_level:
            continue
        k = first_level[t]
        load = builder.item_writer[i]
        for w in by_level[k]:
            mg.add_edge(load, w, "memory")
        for w in by_level[k - 1] if k else ():
            mg.add_edge(w, load, "memory")
    mg.graph.update(planner="levelwise", taskgraph=graph.name, options=dict(victim=victim),
                    machine=machine.to_dict())
    return mg
