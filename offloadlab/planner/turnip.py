"""TURNIP's planner: BuildMemGraph (:mod:`.buildmemgraph`) registered as ``buildmemgraph``.

The registered entry point lives in this pure-Python module, beside the algorithm rather
than in it, so that its docstring (what ``offloadlab list`` shows) survives the compiled
build, where mypyc drops the docstrings of compiled functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.bound import lower_bound
from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .buildmemgraph import BuildMemGraph, OverBudget, serial_order
from .levelwise import level_order
from .registry import Hooks, Options, option, register
from .residents import check_victim

PORTFOLIO: tuple[dict[str, Any], ...] = (
    {"reserve": 0.0}, {"victim": "cost"}, {"order": "levels"}, {"ahead": False},
    {"victim": "cost", "reserve": 0.0}, {"order": "topological"}, {"retry": False},
    {"victim": "lru"})
"""The settings ``search=N`` tries after the given ones, each as the options it changes."""


REFETCH = 0.05
"""The share of a plan's host<->GPU bytes which, evicted by repacks, makes ``retry`` plan again
in levels order, and, brought back to a GPU after evictions, with the paper's unbounded
look-ahead."""


ORDERS = ("given", "topological", "levels")
"""The serial orders a spec may name."""


@dataclass(frozen=True)
class BuildMemGraphOptions(Options):
    victim: str = option("belady", "which resident to evict: belady (the paper's furthest next "
                                   "use, fewest bytes to offload among equals), cost (fewest "
                                   "bytes moved per item until its next use) or lru")
    ahead: bool = option(True, "allocate ahead of execution (false: just before execution)")
    reserve: float = option(1.0, "allocate ahead only while each GPU keeps this many times "
                                 "the most one vertex holds there free (0: as far as memory "
                                 "allows, as the paper)")
    order: str | Sequence[str] = option("given", "the serial order V: given, topological, "
                                                 "levels (levelwise's order), or (from "
                                                 "Python) a list of vertex ids")
    retry: bool = option(True, "if repacking GPUs evicted over 5% of the bytes moved, plan "
                               "again in levels order; if evictions brought back over 5%, "
                               "plan again with reserve=0; keep a plan moving fewer bytes "
                               "with no higher lower bound")
    search: int = option(1, f"plan with these settings and up to N-1 others, simulate each "
                            f"and keep the fastest (1-{1 + len(PORTFOLIO)})")

    def __post_init__(self) -> None:
        check_victim(self.victim)
        if isinstance(self.order, str) and self.order not in ORDERS:
            raise PlanError(f"buildmemgraph: unknown order {self.order!r}; use "
                            f"{', '.join(ORDERS)} or (from Python) a list of vertex ids")
        if not 0 <= self.reserve < float("inf"):
            raise PlanError(f"buildmemgraph: reserve must be a finite number >= 0, got "
                            f"{self.reserve!r}")
        if type(self.search) is not int or not 1 <= self.search <= 1 + len(PORTFOLIO):
            raise PlanError(f"buildmemgraph: search must be an integer from 1 to "
                            f"{1 + len(PORTFOLIO)}, got {self.search!r}")

    def recorded(self) -> dict[str, object]:
        """The options as the MemGraph records them; an explicit order as ``"explicit"``.

        Returns
        -------
        dict of str to object
        """
        return {"victim": self.victim, "ahead": self.ahead, "reserve": self.reserve,
                "order": self.order if isinstance(self.order, str) else "explicit",
                "retry": self.retry}


@register("buildmemgraph", BuildMemGraphOptions)
def buildmemgraph(graph: TaskGraph, machine: Machine, options: BuildMemGraphOptions,
                  hooks: Hooks) -> MemGraph:
    """TURNIP's BuildMemGraph (Figs. 8-9) with a real offset allocator on each GPU, allocation
    ahead bounded by what executing needs, and a second plan (in levelwise's serial order, or
    with the paper's unbounded look-ahead) where the first evicted much by repacking a GPU or
    brought much back after evictions.

    With ``search`` > 1 it plans with its settings and up to N-1 others from
    :data:`PORTFOLIO`, scores each with ``hooks.evaluate`` and keeps the fastest, recording
    the winner's settings.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine the plan must fit.
    options : BuildMemGraphOptions
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
    if options.search == 1:
        return plan_once(graph, machine, options, hooks)
    if hooks.evaluate is None:
        raise PlanError("buildmemgraph: search needs to simulate each plan: pass "
                        "evaluate=offloadlab.simulator.makespan (the CLI does)")
    others = [replace(options, search=1, **change) for change in PORTFOLIO]
    settings = [replace(options, search=1)]
    settings += [s for s in others if s != settings[0]][:options.search - 1]
    best: tuple[float, MemGraph] | None = None
    for k, candidate in enumerate(settings):
        mg = plan_once(graph, machine, candidate, hooks if k == 0 else Hooks())
        mg.graph["options"] = {**mg.graph["options"], "search": options.search}
        seconds = hooks.evaluate(mg, machine)
        if best is None or seconds < best[0]:
            best = seconds, mg
    assert best is not None
    return best[1]


def plan_once(graph: TaskGraph, machine: Machine, options: BuildMemGraphOptions,
              hooks: Hooks) -> MemGraph:
    """One BuildMemGraph plan with ``options`` (``search`` aside), recording its settings.

    The planners built on BuildMemGraph (``cotrain``) plan through it too.  With ``retry``, a
    plan whose repacks (a GPU cleared because its pinned tensors fragment it) evicted more
    than :data:`REFETCH` of the bytes it moves is planned again in ``levels`` order, and one
    that brought back more than that after evictions is planned again with the paper's
    unbounded look-ahead (``reserve=0``); another plan is kept only if it moves fewer bytes
    and its lower bound (:func:`~offloadlab.core.bound.lower_bound`) is no higher, and the
    MemGraph's options then say ``retried`` with what changed.  Another plan is abandoned as
    soon as it has moved as many bytes as the best so far.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine the plan must fit.
    options : BuildMemGraphOptions
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
    builder = _builder(graph, machine, options, hooks.progress)
    mg = builder.run()
    mg.graph["options"] = options.recorded()
    if not options.retry:
        return mg
    changes: list[dict[str, Any]] = []
    moved = builder.moved
    if builder.repacked > REFETCH * moved and not (isinstance(options.order, str)
                                                    and options.order == "levels"):
        changes.append({"order": "levels"})
    if options.reserve and builder.refetched > REFETCH * moved:
        changes.append({"reserve": 0.0})
    del builder                      # its allocators and residents: make room for the retries
    best, best_bound = mg, None
    for change in changes:
        try:
            other = _builder(graph, machine, replace(options, retry=False, **change), None,
                             budget=moved).run()
        except OverBudget:
            continue                 # it moves at least as many bytes: it would not be kept
        if best_bound is None:
            best_bound = lower_bound(best, machine)
        other_bound = lower_bound(other, machine)
        if other_bound <= best_bound:
            best, moved, best_bound = other, other.host_bytes(), other_bound
            best.graph["options"] = {**mg.graph["options"], "retried": change}
    return best


def _builder(graph: TaskGraph, machine: Machine, options: BuildMemGraphOptions,
             progress: Callable[[int], None] | None, budget: int | None = None
             ) -> BuildMemGraph:
    """A BuildMemGraph run in the serial order ``options`` names, not yet started."""
    if isinstance(options.order, str) and options.order == "levels":
        ids = level_order(graph)
    else:
        tasks = graph.tasks
        ids = [t for t in serial_order(graph, options.order) if tasks[t].kind != "input"]
    return BuildMemGraph(graph, machine, ids, options.victim, options.ahead, progress,
                         options.reserve, budget)
