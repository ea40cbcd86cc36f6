"""Durations from the cost model, and a lower bound on any MemGraph's makespan.

Whatever the dispatch policy, a run of a MemGraph takes at least

- its **critical path**: the longest chain of data and memory edges, each vertex taking its
  duration alone on its resources (sharing an engine or the duplex factor only slow it), and
- each **resource's busy time**: a GPU's kernels share its engine, so together they take at
  least the sum of their durations; a link direction runs one copy at a time; each host bus
  (one for all GPUs, or one per group behind a PCIe switch) moves at most its bandwidth.

The bound is the larger of the two (issue 17: a planner's gap to it says how much room is left;
:func:`offloadlab.ilp` gives a tighter bound where the MILP applies).  :func:`problem_bound`
applies the same to the least MemGraph any planner can produce for a TaskGraph, so that it
bounds every plan of the problem, and planners can be compared against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .devices import HOST, is_bus
from .errors import GraphError
from .machine import Machine
from .memgraph import MOVE_KINDS, MemGraph, MemVertex
from .ops import touched_bytes
from .taskgraph import TaskGraph


def durations(memgraph: MemGraph, machine: Machine,
              vertices: Sequence[MemVertex] | None = None) -> list[float]:
    """Seconds each vertex takes alone (:meth:`Machine.duration`).

    A kernel touches its output and its inputs' bytes
    (:func:`~offloadlab.core.ops.touched_bytes`) and is priced at the rate of the dtype it
    writes, once for all the kernels of the same op, device, sizes, flops and dtype (a
    model's layers repeat the same few shapes).  The copies, ``latency + bytes / bandwidth``
    (:meth:`Machine.copy_cost`), are priced as arrays, one per kind of copy.

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine whose cost model prices it.
    vertices : sequence of MemVertex, optional
        The vertices to price; by default the MemGraph's.

    Returns
    -------
    list of float
        Seconds, one per vertex.
    """
    import numpy as np  # not at import: planning needs none of it

    vertices = list(memgraph) if vertices is None else vertices
    seconds = np.zeros(len(vertices))
    copies: dict[str, list[int]] = {kind: [] for kind in MOVE_KINDS + ("transfer",)}
    byid = memgraph.vertices
    priced: dict[tuple, float] = {}     # a kernel's seconds by all that they depend on
    for i, v in enumerate(vertices):
        kind = v.kind
        if v.time is not None:
            seconds[i] = v.time
        elif kind in copies:
            copies[kind].append(i)
        elif kind == "compute":
            ins = tuple([byid[u].bytes for u in v.inputs])
            key = (v.op, v.device, v.bytes, v.flops, v.dtype, ins)
            price = priced.get(key)
            if price is None:
                price = priced[key] = machine.duration(
                    kind, v.device, v.bytes, v.flops, touched_bytes(v.op, v.bytes, ins),
                    None, v.op, v.dtype)
            seconds[i] = price
    for kind, at in copies.items():
        cost = machine.copy_cost(kind)
        if at and cost is not None:
            nbytes = np.array([vertices[i].bytes for i in at], dtype=np.float64)
            seconds[at] = cost[0] + nbytes / cost[1]
    return seconds.tolist()


@dataclass(frozen=True)
class Bound:
    """A lower bound on the makespan and its two parts; ``busy`` per resource."""

    critical_path: float
    busy: dict[str, float]

    @property
    def value(self) -> float:
        return max(self.critical_path, max(self.busy.values(), default=0.0))

    @property
    def limit(self) -> str:
        """What binds: ``critical path`` or the busiest resource's name."""
        name, busiest = max(self.busy.items(), key=lambda kv: kv[1], default=("", 0.0))
        return "critical path" if self.critical_path >= busiest else name


def bound(memgraph: MemGraph, machine: Machine) -> Bound:
    """The critical path and every resource's busy time of ``memgraph`` on ``machine``.

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine whose cost model prices it.

    Returns
    -------
    Bound
    """
    vertices = sorted(memgraph, key=lambda v: v.order)
    duration = durations(memgraph, machine, vertices)
    finish: dict[str, float] = {}
    pred = memgraph.pred
    if any(memgraph[u].order > v.order for v in vertices for u in pred[v.id]):
        import networkx as nx

        from .formats import to_networkx
        position = {t: i for i, t in enumerate(nx.topological_sort(to_networkx(memgraph)))}
        ranked = sorted(range(len(vertices)), key=lambda i: position[vertices[i].id])
    else:
        ranked = list(range(len(vertices)))
    for i in ranked:
        v = vertices[i]
        finish[v.id] = duration[i] + max([finish[u] for u in pred[v.id]], default=0.0)
    busy: dict[str, float] = {}
    for v, d in zip(vertices, duration):
        for name in machine.resources(v.kind, v.device):
            if is_bus(name):
                d = v.bytes / machine.host_bus_bandwidth
            busy[name] = busy.get(name, 0.0) + d
    return Bound(max(finish.values(), default=0.0), busy)


def lower_bound(memgraph: MemGraph, machine: Machine) -> float:
    """Seconds no run of ``memgraph`` on ``machine`` can beat (see the module's docstring).

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine whose cost model prices it.

    Returns
    -------
    float
        Seconds.
    """
    return bound(memgraph, machine).value


def least_memgraph(graph: TaskGraph) -> MemGraph:
    """What every MemGraph of ``graph`` contains, whatever the planner and the memory.

    Each TaskGraph vertex once, and, before the first vertex on a GPU that reads a tensor
    living in host RAM (a host input, a CPU vertex's output), one load of it onto that GPU;
    before the first CPU vertex that reads a GPU tensor, one offload of it.  No locations.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Returns
    -------
    MemGraph
    """
    least = MemGraph({"planner": "least", "taskgraph": graph.name})
    order = 0

    def add(v: MemVertex) -> str:
        nonlocal order
        v.order, order = order, order + 1
        least.add_vertex(v)
        return v.id

    moved: dict[tuple[str, str], str] = {}     # (tensor, where it is read) -> the copy
    for t in graph.topological_order():
        task = graph[t]
        sources = []
        for u in task.inputs:
            src, reads = graph[u], task.read_device
            if src.out_device == reads:
                sources.append(u)
                continue
            if (u, reads) not in moved:
                kind = "load" if reads != HOST else "offload"
                device = reads if reads != HOST else src.out_device
                moved[u, reads] = add(MemVertex(f"{kind}:{u}@{device}", kind, device,
                                                src.bytes, of=u, inputs=(u,)))
                least.add_edge(u, moved[u, reads], "data")
            sources.append(moved[u, reads])
        add(MemVertex(t, task.kind, task.device, task.bytes, task=t, op=task.op,
                      flops=task.flops, inputs=tuple(sources), time=task.time,
                      dtype=task.dtype))
        least.add_edges(sources, t, "data")
    return least


def problem_bound(graph: TaskGraph, machine: Machine, *, finite: bool = False) -> Bound:
    """A lower bound on the makespan of every MemGraph of ``graph`` on ``machine``.

    The :func:`bound` of its :func:`least_memgraph` (planners only add vertices and edges).

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine.
    finite : bool
        Refuse a bound that is not finite: no plan of the problem could finish.

    Returns
    -------
    Bound

    Raises
    ------
    GraphError
        With ``finite``, the bound is not finite (a rate so small, or flops, bytes or times
        so large, that a duration overflows).
    """
    best = bound(least_memgraph(graph), machine)
    if finite and not math.isfinite(best.value):
        raise GraphError(f"no plan of TaskGraph {graph.name!r} can finish: its lower bound is "
                         f"{best.value} s ({best.limit} binds); the vertices' times, flops or "
                         f"bytes are too large for the machine's rates")
    return best
