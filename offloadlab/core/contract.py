"""The execution contract of a MemGraph on a Machine, built once for the simulator and the
executor alike (docs/design.md, Execution semantics).

Vertices are numbered by planner order.  A vertex may start when its ``waiting`` count of
predecessors (data and memory edges alike) has dropped to zero and the resources it ``holds``
are free: its engine (a GPU's compute engine, a link direction, a GPU->GPU link, the CPU) and,
for host copies on a machine with host buses, its bus after the engine.  Each resource runs the
vertices of its ``sequence``; a GPU's compute engine has ``streams`` slots, any other resource
one.  How long a vertex runs and which ready vertex goes first are left to the caller (the
cost model and :mod:`offloadlab.core.dispatch`).  The data edges, as two integer arrays, are
what the memory accounting (:mod:`offloadlab.core.memory`) needs of the run's edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, is_

import numpy as np

from .devices import is_gpu
from .machine import Machine
from .memgraph import MemGraph, MemVertex


@dataclass(eq=False)
class Contract:
    """A MemGraph's run structure as integer lists indexed by vertex number.

    Attributes
    ----------
    vertices : the vertices in planner order (vertex ``i`` is ``vertices[i]``).
    succ : each vertex's successors.
    waiting : each vertex's number of predecessors.
    holds : the resources each vertex holds while it runs: ``()`` for an input (it needs
        none and finishes the moment it is ready), ``(engine,)``, or ``(engine, bus)``.
    sequences : each resource's vertices, in planner order.
    data : the data edges as ``(sources, targets)`` arrays of vertex numbers (int64), by
        source, then in the order of the source's successors.
    """

    vertices: list[MemVertex]
    succ: list[list[int]]
    waiting: list[int]
    holds: list[tuple[str, ...]]
    sequences: dict[str, list[int]]
    data: tuple[np.ndarray, np.ndarray]


def contract(memgraph: MemGraph, machine: Machine) -> Contract:
    """The run structure of ``memgraph`` on ``machine``.

    Parameters
    ----------
    memgraph : MemGraph
        The plan to run.
    machine : Machine
        The machine it runs on, whose resources each vertex holds.

    Returns
    -------
    Contract
        The vertices in order, their successors, waits, resources and data edges.

    Raises
    ------
    SpecError
        A vertex on a device the machine lacks (:meth:`Machine.check_devices`).
    """
    machine.check_devices({d for device in {v.device for v in memgraph}
                           for d in device.split("->")})
    vertices = sorted(memgraph, key=attrgetter("order"))
    n = len(vertices)
    index = {v.id: i for i, v in enumerate(vertices)}
    out = _out_edges(memgraph, vertices)
    count = np.fromiter(map(len, out), np.int64, n)
    flat = list(map(index.__getitem__, chain.from_iterable(out)))   # the index's own ints
    targets = np.array(flat, dtype=np.int64)
    sources = np.repeat(np.arange(n, dtype=np.int64), count)
    bounds = [0, *np.cumsum(count).tolist()]
    succ = [flat[a:b] for a, b in zip(bounds, bounds[1:])]
    waiting = np.bincount(targets, minlength=n).tolist()
    is_data = np.array(list(chain.from_iterable(map(dict.values, out))), dtype=object) == "data"
    cache: dict[tuple[str, str], tuple[str, ...]] = {}
    holds: list[tuple[str, ...]] = []
    sequences: dict[str, list[int]] = {}
    for i, v in enumerate(vertices):
        key = (v.kind, v.device)
        held = cache.get(key)
        if held is None:
            held = cache[key] = machine.resources(*key)
        holds.append(held)
        for name in held:
            sequences.setdefault(name, []).append(i)
    return Contract(vertices, succ, waiting, holds, sequences,
                    (sources[is_data], targets[is_data]))


def _out_edges(memgraph: MemGraph, vertices: list[MemVertex]) -> list[dict[str, str]]:
    """Each vertex's out-edges (target id -> kind), in the order of ``vertices``: the
    MemGraph's own dicts, found by id unless its vertices are already in that order."""
    succ = memgraph.succ
    if len(succ) == len(vertices) and all(map(is_, succ, (v.id for v in vertices))):
        return list(succ.values())
    return [succ[v.id] for v in vertices]


def slots(resource: str, streams: int) -> int:
    """How many vertices ``resource`` runs at once: ``streams`` on a GPU's compute engine,
    one on a link, a bus or the CPU.

    Parameters
    ----------
    resource : str
        A resource name (:meth:`Machine.resources`).
    streams : int
        The streams of a GPU's compute engine.

    Returns
    -------
    int
        The vertices it runs at once.
    """
    return streams if is_gpu(resource) else 1
