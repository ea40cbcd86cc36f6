"""The planner protocol and registry: ``offloadlab plan --planner NAME[:key=value,...]``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..core.errors import SpecError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.spec import apply_options, parse_spec
from ..core.taskgraph import TaskGraph

Planner = Callable[..., MemGraph]
"""``planner(graph: TaskGraph, machine: Machine, **options) -> MemGraph``.  Options are
keyword-only arguments with defaults, so that ``NAME:key=value`` specs can be checked and
coerced against them."""


Evaluate = Callable[[MemGraph, Machine], float]
"""How a planner that searches scores a candidate plan (seconds; lower is better).  The
planners cannot simulate (the simulator sits above them), so the caller passes one in,
usually :func:`offloadlab.simulator.makespan`."""

HOOKS = ("progress", "evaluate")
"""Keyword arguments :func:`plan` hands to the planners that take them; not options."""

PLANNERS: dict[str, Planner] = {}


def register(name: str) -> Callable[[Planner], Planner]:
    """Decorator adding a planner function to the registry under ``name``."""
    def deco(fn: Planner) -> Planner:
        PLANNERS[name] = fn
        return fn
    return deco


def planner_options(name: str) -> dict[str, object]:
    """The options a planner takes, with their defaults."""
    params = inspect.signature(get_planner(name)).parameters
    return {p.name: p.default for p in params.values()
            if p.kind is p.KEYWORD_ONLY and p.name not in HOOKS}


def get_planner(name: str) -> Planner:
    if name not in PLANNERS:
        raise SpecError(f"unknown planner {name!r}; known: {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name]


def check_spec(spec: str) -> None:
    """Raise :class:`SpecError` if ``spec`` names no planner or an option it does not take
    (or a value of the wrong type), before any work is done."""
    name, raw = parse_spec(spec)
    get_planner(name)
    apply_options(planner_options(name), raw, f"planner {name!r}")


def plan(graph: TaskGraph, machine: Machine, spec: str = "buildmemgraph",
         progress: Callable[[int], None] | None = None, evaluate: Evaluate | None = None,
         **options) -> MemGraph:
    """Plan ``graph`` on ``machine`` with the planner ``spec`` (``NAME[:key=value,...]``);
    keyword ``options`` override the spec's.  ``progress(done)``, if given, hears now and then
    how many of the TaskGraph's vertices are planned, from planners that take a ``progress``
    keyword (BuildMemGraph and the planners built on it); ``evaluate`` scores candidate plans
    for planners that search (``buildmemgraph:search=N``)."""
    name, raw = parse_spec(spec)
    planner = get_planner(name)
    merged = apply_options(planner_options(name), raw, f"planner {name!r}")
    unknown = sorted(set(options) - set(merged))
    if unknown:
        raise SpecError(f"planner {name!r}: unknown option(s) {', '.join(unknown)}")
    merged.update(options)
    takes = inspect.signature(planner).parameters
    for key, hook in (("progress", progress), ("evaluate", evaluate)):
        if hook is not None and key in takes:
            merged[key] = hook
    mg = planner(graph, machine, **merged)
    mg.stamp_tensors(graph)
    return mg
