"""TURNIP's planner: BuildMemGraph (:mod:`.buildmemgraph`) registered as ``buildmemgraph``.

The registered entry point lives in this pure-Python module, beside the algorithm rather
than in it, so that its docstring (what ``offloadlab list`` shows) survives the compiled
build, where mypyc drops the docstrings of compiled functions.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .buildmemgraph import BuildMemGraph, serial_order
from .registry import register


@register("buildmemgraph")
def buildmemgraph(graph: TaskGraph, machine: Machine, *, victim: str = "belady",
                  ahead: bool = True, order: str | Sequence[str] = "given",
                  progress: Callable[[int], None] | None = None) -> MemGraph:
    """TURNIP's BuildMemGraph (Figs. 8-9) with a real offset allocator on each GPU.

    ``victim``: ``belady`` (evict what is used furthest in the future, as in the paper) or
    ``lru``; ``ahead``: allocate as far ahead of execution as memory allows (off: just before
    execution); ``order``: the serial order V (``given``, ``topological`` or a list of ids).
    """
    if victim not in ("belady", "lru"):
        raise PlanError(f"unknown victim policy {victim!r}: use 'belady' or 'lru'")
    machine.check_devices(graph.gpus())
    tasks = graph.tasks
    ids = [t for t in serial_order(graph, order) if tasks[t].kind != "input"]
    mg = BuildMemGraph(graph, machine, ids, victim, ahead, progress).run()
    mg.graph.update(planner="buildmemgraph", taskgraph=graph.name,
                    options=dict(victim=victim, ahead=ahead,
                                 order=order if isinstance(order, str) else "explicit"),
                    machine=machine.to_dict())
    return mg
