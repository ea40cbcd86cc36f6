"""Colossal-AI Gemini's heterogeneous memory manager, registered as ``gemini``.

The source is the page "Meet Gemini: The Heterogeneous Memory Manager of Colossal-AI"
(``shared/papers/colossalai-gemini-memory-manager.txt``); model and non-model data, the scope
and the departures from it: docs/gemini.md.  The package's modules: :mod:`.chunks` (the
chunks), :mod:`.search` (the chunk size search), :mod:`.manager` (the manager's iteration),
:mod:`.layout` (the offline layout), :mod:`.options`.
"""

from __future__ import annotations

from dataclasses import replace

from ...core.devices import CPU
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import MemGraph
from ...core.ops import UPDATE_OPS
from ...core.taskgraph import TaskGraph
from ..registry import Hooks, register
from .chunks import Chunk, Program, parameters, program, trace
from .layout import locate, pack
from .manager import Copy, Manager
from .options import GeminiOptions
from .search import search

__all__ = ["Chunk", "Copy", "GeminiOptions", "Manager", "Program", "gemini", "parameters",
           "program"]


def _applies(graph: TaskGraph) -> None:
    if not any(t.kind == "compute" and t.op in UPDATE_OPS and t.device != CPU for t in graph):
        raise PlanError(f"gemini plans training steps: TaskGraph {graph.name!r} has no "
                        f"optimizer update ({', '.join(UPDATE_OPS)}) on a GPU")
    on_cpu = next((t.id for t in graph if t.kind == "compute" and t.device == CPU), None)
    if on_cpu is not None:
        raise PlanError(f"gemini runs every operator on its GPU: vertex {on_cpu!r} of "
                        f"{graph.name!r} runs on the CPU")


def _fitted(graph: TaskGraph, machine: Machine, options: GeminiOptions, prog: Program,
            peaks: dict[tuple[int, str], int], hooks: Hooks) -> Manager:
    """The planned iteration whose layout fits: laid out offline within the largest budget
    per GPU (to 1/64 of its memory) whose layout fits, the whole memory or, stepping down by
    the layout's excess and then bisecting, less (GPUs are independent: each one's plan
    depends on its budget alone); where no budget gives a plan, within the whole memory, laid
    out as it decides (:class:`~.manager.Victims`)."""
    try:
        return within_budgets(graph, machine, options, prog, peaks, hooks)
    except PlanError:
        planned = Manager(graph, machine, options, prog, peaks, located=True)
        planned.run(hooks)
        return planned


def within_budgets(graph: TaskGraph, machine: Machine, options: GeminiOptions, prog: Program,
                   peaks: dict[tuple[int, str], int], hooks: Hooks) -> Manager:
    """:func:`_fitted`'s offline layout within the largest budgets whose layout fits.

    Parameters
    ----------
    graph : TaskGraph
        The training step.
    machine : Machine
        The machine.
    options : GeminiOptions
        The planner's options.
    prog : Program
        The chunked program.
    peaks : dict
        ``(operator, gpu)`` -> the warm-up's non-model peak.
    hooks : Hooks
        Its ``progress``.

    Returns
    -------
    Manager
        The planned iteration, laid out within those budgets.
    """
    cap = machine.gpu_memory
    budget = dict.fromkeys(machine.gpu_names(), cap)
    fits: dict[str, int] = {}        # per GPU: the largest budget tried whose layout fits
    fails: dict[str, int] = {}       # per GPU: the smallest budget tried whose layout does not
    while True:
        planned = Manager(graph, machine, options, prog, peaks, dict(budget))
        planned.run(hooks)
        need = pack([c for k, c in enumerate(planned.events) if k == c.born])
        settled = True
        for dev, n in need.items():
            (fits if n <= cap else fails)[dev] = budget[dev]
            if n > cap and fits.get(dev, -1) >= budget[dev]:
                del fits[dev]       # no longer fits where it did: step down again
            if dev not in fails:
                continue
            if dev not in fits:
                budget[dev] -= max(n - cap, cap // 64)
            elif fails[dev] - fits[dev] > cap // 64:
                budget[dev] = (fits[dev] + fails[dev]) // 2
            else:
                budget[dev] = fits[dev]
            settled = settled and n <= cap and budget[dev] == fits[dev]
        if settled:
            return planned


@register("gemini", GeminiOptions, applies=_applies)
def gemini(graph: TaskGraph, machine: Machine, options: GeminiOptions, hooks: Hooks) -> MemGraph:
    """Colossal-AI Gemini: chunks of model data paged in on demand in program order, room made
    for each operator's warm-up-sampled non-model peak by evicting the chunk needed latest.

    Parameters
    ----------
    graph : TaskGraph
        A training step: an optimizer update on a GPU, no operator on the CPU.
    machine : Machine
        The machine it runs on.
    options : GeminiOptions
        The chunk size and its search, the warm-up's share, eviction and prefetch.
    hooks : Hooks
        Its ``progress`` follows the planned passes.

    Returns
    -------
    MemGraph
        The plan; ``graph["chunks"]``, ``graph["spills"]``, ``graph["prefetched"]``,
        ``graph["layout"]`` and, when searched, ``graph["chunk_size"]`` describe it.

    Raises
    ------
    PlanError
        Naming the operator that does not fit with any chunk size, or that cannot run even
        with every HOLD chunk and every non-model tensor it does not use in host RAM.
    """
    traced = trace(graph)
    chunk_size = options.chunk_size
    if options.search_range:
        chunk_size = search(graph, traced, machine.gpu_memory, chunk_size, options.search_range,
                            options.search_interval, options.grad_chunks)
    prog = program(graph, chunk_size, traced, options.grad_chunks)
    warmup = Manager(graph, machine, options, prog)
    warmup.run()
    try:
        planned = _fitted(graph, machine, options, prog, warmup.peaks, hooks)
    except PlanError:
        if not options.max_prefetch:
            raise
        # prefetch is best effort: where its layout does not fit, load on demand
        planned = _fitted(graph, machine, replace(options, max_prefetch=0), prog, warmup.peaks,
                          hooks)
    planned.mg.graph["prefetched"] = planned.options.max_prefetch > 0
    if planned.memory is None:
        locate(planned, machine.gpu_memory)
    else:
        planned.mg.graph["layout"] = "as placed"
    planned.mg.graph["chunks"] = len(prog.chunks)
    if options.search_range:
        planned.mg.graph["chunk_size"] = chunk_size
    planned.mg.graph["spills"] = planned.spills
    return planned.mg
