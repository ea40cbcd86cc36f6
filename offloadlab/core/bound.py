"""Durations from the cost model, and a lower bound on any MemGraph's makespan.

Whatever the dispatch policy, a run of a MemGraph takes at least

- its **critical path**: the longest chain of data and memory edges, each vertex taking its
  duration alone on its resources (sharing an engine or the duplex factor only slow it), and
- each **resource's busy time**: a GPU's kernels share its engine, so together they take at
  least the sum of their durations; a link direction runs one copy at a time; a host bus
  moves at most its bandwidth.

The bound is the larger of the two (issue 17: a planner's gap to it says how much room is left;
:func:`offloadlab.ilp` gives a tighter bound where the MILP applies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .machine import Machine
from .memgraph import MemGraph, MemVertex


def durations(memgraph: MemGraph, machine: Machine,
              vertices: Sequence[MemVertex] | None = None) -> list[float]:
    """Seconds each vertex (of ``vertices``, default the MemGraph's) takes alone; a kernel
    touches its output and its inputs' bytes."""
    vertices = list(memgraph) if vertices is None else vertices
    sizes = {v.id: v.bytes for v in memgraph}
    return [machine.duration(v.kind, v.device, v.bytes, v.flops,
                             v.bytes + sum([sizes[u] for u in v.inputs])
                             if v.kind == "compute" else 0, v.time, v.op)
            for v in vertices]


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
    """The critical path and every resource's busy time of ``memgraph`` on ``machine``."""
    vertices = sorted(memgraph, key=lambda v: v.order)
    duration = durations(memgraph, machine, vertices)
    finish: dict[str, float] = {}
    pred = memgraph.pred
    if any(memgraph[u].order > v.order for v in vertices for u in pred[v.id]):
        import networkx as nx
        position = {t: i for i, t in enumerate(nx.topological_sort(memgraph.to_networkx()))}
        ranked = sorted(range(len(vertices)), key=lambda i: position[vertices[i].id])
    else:
        ranked = list(range(len(vertices)))
    for i in ranked:
        v = vertices[i]
        finish[v.id] = duration[i] + max([finish[u] for u in pred[v.id]], default=0.0)
    busy: dict[str, float] = {}
    for v, d in zip(vertices, duration):
        for name in machine.resources(v.kind, v.device):
            if name.startswith("bus:"):
                d = v.bytes / machine.host_bus_bandwidth
            busy[name] = busy.get(name, 0.0) + d
    return Bound(max(finish.values(), default=0.0), busy)


def lower_bound(memgraph: MemGraph, machine: Machine) -> float:
    """Seconds no run of ``memgraph`` on ``machine`` can beat (see the module's docstring)."""
    return bound(memgraph, machine).value
