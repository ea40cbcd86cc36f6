"""The planner protocol and registry: ``offloadlab plan --planner NAME[:key=value,...]``."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from ..core.errors import SpecError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.spec import apply_options, parse_spec
from ..core.taskgraph import TaskGraph


Planner = Callable[..., MemGraph]
"""``planner(graph: TaskGraph, machine: Machine, **options) -> MemGraph``.  Options are
keyword-only arguments with defaults, so that ``NAME:key=value`` specs can be checked and
coerced against them."""


PLANNERS: dict[str, Planner] = {}


def register(name: str) -> Callable[[Planner], Planner]:
    """Decorator adding a planner function to the registry under ``name``.

    A planner compiled with mypyc (README, The compiled build) has no ``__doc__``: the registry
    then holds it wrapped in a :class:`CompiledPlanner`, whose ``__doc__`` is read from the
    module's source, so that ``offloadlab list`` describes it as in the pure-Python build."""
    def deco(fn: Planner) -> Planner:
        PLANNERS[name] = fn if inspect.isfunction(fn) or fn.__doc__ else CompiledPlanner(fn)
        return fn
    return deco


class CompiledPlanner:
    # a compiled planner function, called through, with the docstring of its source (a class
    # docstring here would be replaced by the __doc__ property below)

    def __init__(self, fn: Planner):
        self.__wrapped__ = fn        # inspect.signature(self) is fn's
        self.__name__ = self.__qualname__ = getattr(fn, "__name__", "")
        self.__module__ = getattr(fn, "__module__", "")
        self._doc: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> MemGraph:
        return self.__wrapped__(*args, **kwargs)

    @property
    def __doc__(self) -> str:  # type: ignore[override]
        if self._doc is None:
            self._doc = source_docstring(self.__module__, self.__name__) or ""
        return self._doc

    def __repr__(self) -> str:
        return f"<compiled planner {self.__module__}.{self.__name__}>"


def source_docstring(module: str, function: str) -> str | None:
    """The docstring of the top-level ``function`` in the ``.py`` source of ``module`` (which
    the wheel ships beside a compiled module), or ``None`` if there is none to read."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if not path:
        return None
    source = Path(path).with_name(module.rpartition(".")[2] + ".py")
    try:
        tree = ast.parse(source.read_bytes(), str(source))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return ast.get_docstring(node)
    return None


def planner_options(name: str) -> dict[str, object]:
    """The options a planner takes, with their defaults."""
    params = inspect.signature(get_planner(name)).parameters
    return {p.name: p.default for p in params.values()
            if p.kind is p.KEYWORD_ONLY and p.name != "progress"}


def get_planner(name: str) -> Planner:
    if name not in PLANNERS:
        raise SpecError(f"unknown planner {name!r}; known: {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name]


def plan(graph: TaskGraph, machine: Machine, spec: str = "buildmemgraph",
         progress: Callable[[int], None] | None = None, **options) -> MemGraph:
    """Plan ``graph`` on ``machine`` with the planner ``spec`` (``NAME[:key=value,...]``);
    keyword ``options`` override the spec's.  ``progress(done)``, if given, hears now and then
    how many of the TaskGraph's vertices are planned, from planners that take a ``progress``
    keyword (BuildMemGraph and the planners built on it)."""
    name, raw = parse_spec(spec)
    planner = get_planner(name)
    merged = apply_options(planner_options(name), raw, f"planner {name!r}")
    unknown = sorted(set(options) - set(merged))
    if unknown:
        raise SpecError(f"planner {name!r}: unknown option(s) {', '.join(unknown)}")
    merged.update(options)
    if progress is not None and "progress" in inspect.signature(planner).parameters:
        merged["progress"] = progress
    mg = planner(graph, machine, **merged)
    mg.stamp_tensors(graph)
    return mg
