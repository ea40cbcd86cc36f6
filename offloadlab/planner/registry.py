"""The planner contract and registry: ``offloadlab plan --planner NAME[:key=value,...]``.

A planner is a function ``run(graph, machine, options, hooks) -> MemGraph`` registered under a
name with its options: a frozen dataclass (:class:`Options`) whose fields all have defaults,
each with a one-line ``doc`` in its metadata, and whose ``__post_init__`` refuses bad values.
:func:`plan` does what every planner shares: it parses the spec into the options, checks that
the planner applies to the graph (if it declares ``applies``) and that the machine has the
graph's GPUs, runs the planner, refuses a plan whose host peak in its own order exceeds the
machine's ``host_memory`` (docs/host-memory.md), and closes the MemGraph (the planner's
name, the TaskGraph's, the options and the machine in ``graph``; each tensor's shape and dtype
on the vertices that write or move it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Protocol

from ..core.errors import HostMemoryError, SpecError
from ..core.host import host_overflow, planned_host_peak
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.registry import Registry, summary
from ..core.spec import apply_options, parse_spec
from ..core.taskgraph import TaskGraph

Evaluate = Callable[[MemGraph, Machine], float]
"""How a planner that searches scores a candidate plan (seconds; lower is better).  The
planners cannot simulate (the simulator sits above them), so the caller passes one in,
usually :func:`offloadlab.simulator.makespan`."""


def option(default: Any, doc: str) -> Any:
    """A field of a planner's :class:`Options`: its default and what it does.

    Parameters
    ----------
    default : object
        The option's default.
    doc : str
        What it does, in one line (``offloadlab list planners``).

    Returns
    -------
    dataclasses.Field
    """
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Options:
    """A planner's options (none here; planners with options subclass it)."""

    def recorded(self) -> dict[str, object]:
        """The options as the MemGraph records them (``graph["options"]``).

        Returns
        -------
        dict of str to object
        """
        return asdict(self)


@dataclass(frozen=True)
class Hooks:
    """What :func:`plan` hands to a planner besides its options: ``progress(done)`` hears now
    and then how many TaskGraph vertices are planned; ``evaluate`` scores candidate plans for
    planners that search."""

    progress: Callable[[int], None] | None = None
    evaluate: Evaluate | None = None


class Run(Protocol):
    def __call__(self, graph: TaskGraph, machine: Machine, options: Any, hooks: Hooks
                 ) -> MemGraph: ...


@dataclass(frozen=True)
class Planner:
    """A registered planner: its name, what runs it, its options' class, its description
    (the run function's docstring) and, for planners that plan only some graphs, ``applies``,
    which raises :class:`~offloadlab.core.errors.PlanError` saying why for the others."""

    name: str
    run: Run
    options: type[Options]
    doc: str
    applies: Callable[[TaskGraph], object] | None = None


PLANNERS: Registry[Planner] = Registry(
    "planner", sort=True, doc=lambda p: summary(p.doc),
    options=lambda p: {f.name: f.default for f in fields(p.options)})
"""The planners by name (:mod:`offloadlab.core.registry`), each registered by :func:`register`
where it is defined; ``offloadlab.planner`` imports every module of the package."""


def register(name: str, options: type[Options] = Options,
             applies: Callable[[TaskGraph], object] | None = None) -> Callable[[Run], Run]:
    """Decorator adding a planner function to :data:`PLANNERS` under ``name``.

    Parameters
    ----------
    name : str
        The planner's name in specs.
    options : type
        Its options' class, an :class:`Options` whose every field is made by :func:`option`.
    applies : callable, optional
        For a planner that plans only some graphs: raises
        :class:`~offloadlab.core.errors.PlanError` saying why for the others.

    Returns
    -------
    callable
        The decorator; it returns the planner function unchanged.
    """
    for f in fields(options):
        assert f.default is not MISSING and "doc" in f.metadata, (name, f.name)

    def deco(run: Run) -> Run:
        PLANNERS[name] = Planner(name, run, options, inspect.getdoc(run) or "", applies)
        return run
    return deco


def get_planner(name: str) -> Planner:
    """The planner registered as ``name``.

    Parameters
    ----------
    name : str
        A planner's name.

    Returns
    -------
    Planner

    Raises
    ------
    SpecError
        Listing the planners, if none is ``name``.
    """
    return PLANNERS[name]


def planner_options(name: str) -> dict[str, object]:
    """The options a planner takes, with their defaults.

    Parameters
    ----------
    name : str
        A planner's name.

    Returns
    -------
    dict of str to object

    Raises
    ------
    SpecError
        Listing the planners, if none is ``name``.
    """
    return dict(PLANNERS.entry(name).options)


def parse_options(spec: str, **overrides: object) -> tuple[Planner, Options]:
    """The planner a spec names and its options.

    Parameters
    ----------
    spec : str
        ``NAME[:key=value,...]``.
    **overrides
        Options that win over the spec's.

    Returns
    -------
    (Planner, Options)

    Raises
    ------
    SpecError
        An unknown planner, option or value.
    PlanError
        A value the planner's options refuse.
    """
    name, raw = parse_spec(spec)
    planner = get_planner(name)
    merged = apply_options(planner_options(name), raw, f"planner {name!r}")
    unknown = sorted(set(overrides) - set(merged))
    if unknown:
        raise SpecError(f"planner {name!r}: unknown option(s) {', '.join(unknown)}")
    merged.update(overrides)
    return planner, planner.options(**merged)


def check_spec(spec: str) -> None:
    """Check a planner spec before any work is done.

    Parameters
    ----------
    spec : str
        ``NAME[:key=value,...]``.

    Raises
    ------
    SpecError
        ``spec`` names no planner, or an option it does not take, or a bad value.
    PlanError
        A value the planner's options refuse.
    """
    parse_options(spec)


def plan(graph: TaskGraph, machine: Machine, spec: str = "buildmemgraph",
         progress: Callable[[int], None] | None = None, evaluate: Evaluate | None = None,
         **options: object) -> MemGraph:
    """Plan ``graph`` on ``machine``: a MemGraph that places every tensor (TURNIP Sec. 4).

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The GPUs, their memory and the links the plan must fit.
    spec : str
        The planner and its options, ``NAME[:key=value,...]`` (``offloadlab list`` shows
        every planner and option).
    progress : callable, optional
        ``progress(done)`` hears now and then how many TaskGraph vertices are planned
        (BuildMemGraph and the planners built on it report it).
    evaluate : callable, optional
        Scores candidate plans, for planners that search (``buildmemgraph:search=N``).
    **options
        Override the spec's options.

    Returns
    -------
    MemGraph
        The plan, stamped with the planner, its options and the TaskGraph's content hash.

    Raises
    ------
    SpecError
        An unknown planner, option or value, or a GPU the machine lacks.
    PlanError
        The planner cannot fit ``graph`` into ``machine``'s memory, or does not apply to it.
    HostMemoryError
        The plan holds more in host RAM at once, run in its own order, than
        ``machine.host_memory`` (:func:`offloadlab.core.host.planned_host_peak`; a PlanError).

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> graph = build_workload("training-chain")
    >>> plan(graph, machine_from_spec("v100:gpu_memory=1.5GB")).counts()
    {'input': 7, 'load': 7, 'compute': 48, 'offload': 11, 'reload': 12}
    """
    planner, chosen = parse_options(spec, **options)
    if planner.applies is not None:
        planner.applies(graph)
    machine.check_devices(graph.gpus())
    mg = planner.run(graph, machine, chosen, Hooks(progress, evaluate))
    if machine.host_memory is not None:
        over = host_overflow(planned_host_peak(mg), machine.host_memory)
        if over is not None:
            raise HostMemoryError(f"planner {planner.name!r}: its plan runs {over} (in the "
                                  f"plan's own order)")
    recorded = mg.graph.pop("options", None)        # a planner may record what it chose
    extras = dict(mg.graph)
    mg.graph.clear()
    mg.graph.update(planner=planner.name, taskgraph=graph.name,
                    options=chosen.recorded() if recorded is None else recorded,
                    machine=machine.to_dict(), taskgraph_hash=graph.content_hash(), **extras)
    mg.stamp_tensors(graph)
    return mg
