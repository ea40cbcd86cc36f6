"""TURNIP's planner: BuildMemGraph (:mod:`.buildmemgraph`) registered as ``buildmemgraph``.

The registered entry point lives in this pure-Python module, beside the algorithm rather
than in it, so that its docstring (what ``offloadlab list`` shows) survives the compiled
build, where mypyc drops the docstrings of compiled functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .buildmemgraph import BuildMemGraph, serial_order
from .registry import Evaluate, register

PORTFOLIO: tuple[tuple[str, bool, str], ...] = (
    ("cost", True, "given"), ("belady", True, "given"), ("cost", False, "given"),
    ("belady", False, "given"), ("cost", True, "topological"),
    ("belady", True, "topological"), ("lru", True, "given"), ("cost", False, "topological"))
"""The settings ``search=N`` tries after the given ones: (victim, ahead, order)."""


@register("buildmemgraph")
def buildmemgraph(graph: TaskGraph, machine: Machine, *, victim: str = "cost",
                  ahead: bool = True, order: str | Sequence[str] = "given", search: int = 1,
                  progress: Callable[[int], None] | None = None,
                  evaluate: Evaluate | None = None) -> MemGraph:
    """TURNIP's BuildMemGraph (Figs. 8-9) with a real offset allocator on each GPU.

    ``victim``: ``cost`` (evict what moves fewest bytes per item until its next use),
    ``belady`` (evict what is used furthest in the future, as in the paper) or ``lru``;
    ``ahead``: allocate as far ahead of execution as memory allows (off: just before
    execution); ``order``: the serial order V (``given``, ``topological`` or a list of ids);
    ``search``: plan with these settings and up to N-1 others (victim, ahead, order), simulate
    each and keep the fastest.
    """
    if type(search) is not int or not 1 <= search <= 1 + len(PORTFOLIO):
        raise PlanError(f"buildmemgraph: search must be an integer from 1 to "
                        f"{1 + len(PORTFOLIO)}, got {search!r}")
    machine.check_devices(graph.gpus())
    if search == 1:
        return _plan(graph, machine, victim, ahead, order, progress)
    if evaluate is None:
        raise PlanError("buildmemgraph: search needs to simulate each plan: pass "
                        "evaluate=offloadlab.simulator.makespan (the CLI does)")
    settings = [(victim, ahead, order)]
    settings += [s for s in PORTFOLIO if s != settings[0]][:search - 1]
    best: tuple[float, MemGraph] | None = None
    for k, (victim_k, ahead_k, order_k) in enumerate(settings):
        mg = _plan(graph, machine, victim_k, ahead_k, order_k, progress if k == 0 else None)
        mg.graph["options"]["search"] = search
        seconds = evaluate(mg, machine)
        if best is None or seconds < best[0]:
            best = seconds, mg
    assert best is not None
    return best[1]


def _plan(graph: TaskGraph, machine: Machine, victim: str, ahead: bool,
          order: str | Sequence[str], progress: Callable[[int], None] | None) -> MemGraph:
    tasks = graph.tasks
    ids = [t for t in serial_order(graph, order) if tasks[t].kind != "input"]
    mg = BuildMemGraph(graph, machine, ids, victim, ahead, progress).run()
    mg.graph.update(planner="buildmemgraph", taskgraph=graph.name,
                    options=dict(victim=victim, ahead=ahead,
                                 order=order if isinstance(order, str) else "explicit"),
                    machine=machine.to_dict())
    return mg
