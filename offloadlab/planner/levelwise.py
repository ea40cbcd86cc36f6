"""The bulk-synchronous, levelwise baseline of DISCO Fig. 2 (ZeRO-Inference-like).

Vertices are grouped into levels (longest path from the inputs).  A level's host-resident
weights are all loaded before any of its kernels runs, and the next level's loads start only
after the whole level has completed.  Memory is assigned by BuildMemGraph's allocator without
allocation ahead, in level order; the barriers are added as memory edges, in linear size: on
each GPU a level's loads form a chain (in planner order, the order its link runs them in), the
chain's head waits for every vertex of the previous level and every vertex of the level waits
for each chain's tail.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.devices import HOST
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .buildmemgraph import BuildMemGraph
from .registry import Hooks, Options, option, register
from .residents import check_victim


def levels(graph: TaskGraph) -> list[list[str]]:
    """Non-input vertices by level: the topological generations of the graph without its inputs.

    Level 0 reads only inputs, level k reads some level k-1 vertex: the longest path to each
    vertex, in one pass over a topological order.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Returns
    -------
    list of list of str
        Each level in the TaskGraph's order.
    """
    tasks = graph.tasks
    level: dict[str, int] = {}
    for t in graph.topological_order():
        task = tasks[t]
        if task.kind != "input":
            level[t] = 1 + max([level[u] for u in task.inputs if u in level], default=-1)
    by_level: list[list[str]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for t in tasks:
        if t in level:
            by_level[level[t]].append(t)
    return by_level


@dataclass(frozen=True)
class LevelwiseOptions(Options):
    victim: str = option("belady", "which resident to evict when a level's tensors do not fit: "
                                   "belady, cost or lru (BuildMemGraph's policies)")

    def __post_init__(self) -> None:
        check_victim(self.victim)


def load_levels(graph: TaskGraph, by_level: list[list[str]]) -> dict[str, int]:
    """Each host-resident input's first level: levelwise loads it before that level.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    by_level : list of list of str
        Its :func:`levels`.

    Returns
    -------
    dict of str to int
        Input to level.
    """
    first_level: dict[str, int] = {}
    for k, vertices in enumerate(by_level):
        for t in vertices:
            for u in graph[t].inputs:
                if graph[u].device == HOST:
                    first_level.setdefault(u, k)
    return first_level


def _order(by_level: list[list[str]], first_level: dict[str, int]) -> list[str]:
    weights: list[list[str]] = [[] for _ in by_level]
    for u, k in first_level.items():
        weights[k].append(u)
    return [t for k, vertices in enumerate(by_level) for t in (*weights[k], *vertices)]


def level_order(graph: TaskGraph) -> list[str]:
    """The levelwise serial order: level by level, each level's host-resident inputs first.

    BuildMemGraph loads a host tensor listed in its order there.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Returns
    -------
    list of str
        Every vertex once.
    """
    by_level = levels(graph)
    return _order(by_level, load_levels(graph, by_level))


@register("levelwise", LevelwiseOptions)
def levelwise(graph: TaskGraph, machine: Machine, options: LevelwiseOptions,
              hooks: Hooks) -> MemGraph:
    """Levelwise processing: load a level's weights, run the level, repeat (DISCO Fig. 2).

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine the plan must fit.
    options : LevelwiseOptions
        The planner's options.
    hooks : Hooks
        Progress and, for planners that search, the evaluator.

    Returns
    -------
    MemGraph
        The plan; :func:`~offloadlab.planner.registry.plan` closes it.

    Raises
    ------
    PlanError
        The graph does not fit the machine's memory.
    """
    by_level = levels(graph)
    first_level = load_levels(graph, by_level)
    order = _order(by_level, first_level)
    builder = BuildMemGraph(graph, machine, order, options.victim, ahead=False,
                            progress=hooks.progress)
    mg = builder.run()
    chains: list[dict[str, list[str]]] = [{} for _ in by_level]   # level -> GPU -> its loads
    for i, slot in enumerate(builder.items):
        t, dev = builder.names(slot)
        if t in first_level:
            chains[first_level[t]].setdefault(dev, []).append(builder.item_writer[i])
    for k, per_gpu in enumerate(chains):
        for loads in per_gpu.values():
            for w in by_level[k - 1] if k else ():
                mg.add_edge(w, loads[0], "memory")
            for a, b in zip(loads, loads[1:]):
                mg.add_edge(a, b, "memory")
            for w in by_level[k]:
                mg.add_edge(loads[-1], w, "memory")
    return mg
