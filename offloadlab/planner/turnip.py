"""TURNIP's planner: BuildMemGraph (:mod:`.buildmemgraph`) registered as ``buildmemgraph``.

The registered entry point lives in this pure-Python module, beside the algorithm rather
than in it, so that its docstring (what ``offloadlab list`` shows) survives the compiled
build, where mypyc drops the docstrings of compiled functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .buildmemgraph import BuildMemGraph, check_victim, serial_order
from .registry import Hooks, Options, option, register

PORTFOLIO: tuple[tuple[str, bool, str], ...] = (
    ("cost", True, "given"), ("belady", True, "given"), ("cost", False, "given"),
    ("belady", False, "given"), ("cost", True, "topological"),
    ("belady", True, "topological"), ("lru", True, "given"), ("cost", False, "topological"))
"""The settings ``search=N`` tries after the given ones: (victim, ahead, order)."""


@dataclass(frozen=True)
class BuildMemGraphOptions(Options):
    victim: str = option("cost", "which resident to evict: cost (fewest bytes moved per item "
                                 "until its next use), belady (the paper's furthest next use) "
                                 "or lru")
    ahead: bool = option(True, "allocate as far ahead of execution as memory allows (false: "
                               "just before execution)")
    order: str | Sequence[str] = option("given", "the serial order V: given, topological, or "
                                                 "(from Python) a list of vertex ids")
    search: int = option(1, f"plan with these settings and up to N-1 others, simulate each "
                            f"and keep the fastest (1-{1 + len(PORTFOLIO)})")

    def __post_init__(self) -> None:
        check_victim(self.victim)
        if type(self.search) is not int or not 1 <= self.search <= 1 + len(PORTFOLIO):
            raise PlanError(f"buildmemgraph: search must be an integer from 1 to "
                            f"{1 + len(PORTFOLIO)}, got {self.search!r}")

    def recorded(self) -> dict[str, object]:
        return {"victim": self.victim, "ahead": self.ahead,
                "order": self.order if isinstance(self.order, str) else "explicit"}


@register("buildmemgraph", BuildMemGraphOptions)
def buildmemgraph(graph: TaskGraph, machine: Machine, options: BuildMemGraphOptions,
                  hooks: Hooks) -> MemGraph:
    """TURNIP's BuildMemGraph (Figs. 8-9) with a real offset allocator on each GPU.

    With ``search`` > 1 it plans with its settings and up to N-1 others from
    :data:`PORTFOLIO` (victim, ahead, order), scores each with ``hooks.evaluate`` and keeps
    the fastest, recording the winner's settings.
    """
    if options.search == 1:
        return _plan(graph, machine, options, hooks)
    if hooks.evaluate is None:
        raise PlanError("buildmemgraph: search needs to simulate each plan: pass "
                        "evaluate=offloadlab.simulator.makespan (the CLI does)")
    first = (options.victim, options.ahead, options.order)
    settings = [first] + [s for s in PORTFOLIO if s != first][:options.search - 1]
    best: tuple[float, MemGraph] | None = None
    for k, (victim, ahead, order) in enumerate(settings):
        candidate = BuildMemGraphOptions(victim, ahead, order)
        mg = _plan(graph, machine, candidate, hooks if k == 0 else Hooks())
        mg.graph["options"] = {**candidate.recorded(), "search": options.search}
        mg.stamp_tensors(graph)         # dtypes price its kernels, as in the plan returned
        seconds = hooks.evaluate(mg, machine)
        if best is None or seconds < best[0]:
            best = seconds, mg
    assert best is not None
    return best[1]


def _plan(graph: TaskGraph, machine: Machine, options: BuildMemGraphOptions,
          hooks: Hooks) -> MemGraph:
    tasks = graph.tasks
    ids = [t for t in serial_order(graph, options.order) if tasks[t].kind != "input"]
    return BuildMemGraph(graph, machine, ids, options.victim, options.ahead,
                         hooks.progress).run()
