"""Hugging Face Accelerate's CPU offload, registered as ``accelerate-offload``.

Source: huggingface/accelerate@16cb6eb80dd9aa8b4df1a63ef57863e455d53b83,
``src/accelerate/big_modeling.py`` (``cpu_offload``) and ``src/accelerate/hooks.py``
(``attach_align_device_hook``, ``AlignDevicesHook``: ``pre_forward`` and ``post_forward``).
Model (:class:`~.emit.Emitter`): each weight is loaded on demand just before its reader and
dropped after its module's forward, on every forward call (each token of a generation), kept
for the backward where autograd saves it, loaded again under activation checkpointing.  What
the hooks do and how they are modelled: docs/deployed.md ("accelerate-offload").
"""

from __future__ import annotations

from ...core.devices import HOST
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import MemGraph
from ...core.taskgraph import TaskGraph
from ..buildmemgraph import serial_order
from ..registry import Hooks, Options, register
from .emit import Emitter, Slot
from .step import step_of

NAME = "accelerate-offload"


def applies(graph: TaskGraph) -> None:
    """Refuse a graph with no host-resident input a GPU reads, or an operator on the CPU.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Raises
    ------
    PlanError
        Saying why.
    """
    if not any(graph[u].kind == "input" and graph[u].device == HOST
               for t in graph if t.kind != "input" and t.read_device != HOST for u in t.inputs):
        raise PlanError(f"{NAME} moves weights from host RAM: TaskGraph {graph.name!r} has no "
                        f"host-resident input that a GPU reads")
    on_cpu = next((t.id for t in graph if t.kind == "compute" and t.read_device == HOST), None)
    if on_cpu is not None:
        raise PlanError(f"{NAME} runs every module on its GPU: vertex {on_cpu!r} of "
                        f"{graph.name!r} runs on the CPU")


@register(NAME, Options, applies=applies)
def accelerate_offload(graph: TaskGraph, machine: Machine, options: Options,
                       hooks: Hooks) -> MemGraph:
    """Hugging Face Accelerate's cpu_offload (an offloading AlignDevicesHook on every module):
    each module's weights are copied to its GPU just before its forward, with no prefetch, and
    dropped after it (kept for the backward where autograd saved them), on every call: a
    generation's decode steps each call the model, and so load every weight again
    (``AlignDevicesHook.pre_forward`` and ``post_forward``, accelerate ``src/accelerate/hooks.py``).

    Parameters
    ----------
    graph : TaskGraph
        A computation whose GPUs read host-resident weights, no operator on the CPU.
    machine : Machine
        The machine it runs on.
    options : Options
        None: the scheme has no options.
    hooks : Hooks
        Progress and, for planners that search, the evaluator.

    Returns
    -------
    MemGraph

    Raises
    ------
    PlanError
        Where the scheme runs out of memory on a GPU, naming the GPU, the vertex and the bytes.
    """
    schedule = [t for t in serial_order(graph, "given") if graph[t].kind != "input"]
    em = Emitter(NAME, graph, machine, schedule)
    drops = _recomputed(graph, em)
    for i, slots in _calls(graph, em).items():
        mine = drops.setdefault(i, [])
        mine += [s for s in slots if s not in mine]
    for i, t in enumerate(schedule):
        em.run(t)
        for slot in drops.get(i, ()):
            if slot in em.resident:
                em.free(slot)
        em.release(i)
        if hooks.progress is not None and not i & 4095:
            hooks.progress(i)
    return em.finish()


def _recomputed(graph: TaskGraph, em: Emitter) -> dict[int, list[Slot]]:
    """Under activation checkpointing (a backward vertex of category ``workspace``: the
    forward recomputed): for each position, the weights whose forward pass ends there and that
    the backward reads again."""
    backward = step_of(graph).backward
    drops: dict[int, list[Slot]] = {}
    if not any(graph[t].category == "workspace" for t in backward):
        return drops
    for slot, positions in em.readers.items():
        if graph[slot[0]].kind != "input" or graph[slot[0]].device != HOST:
            continue
        forward = [i for i in positions if em.schedule[i] not in backward]
        if forward and len(forward) < len(positions):
            drops.setdefault(forward[-1], []).append(slot)
    return drops


def _calls(graph: TaskGraph, em: Emitter) -> dict[int, list[Slot]]:
    """On a generation: for each position, the host weights whose reading in the model's
    current forward call ends there and that a later call reads again.

    A forward call ends where the next token is chosen (an ``argmax`` vertex: greedy decoding
    picks it outside the model); a vertex's call is the most token choices on a path to it."""
    if not any(t.op == "argmax" for t in graph):
        return {}
    call: dict[str, int] = {}                       # the schedule is topological
    for t in em.schedule:
        call[t] = max((call.get(u, 0) + (graph[u].op == "argmax") for u in graph[t].inputs),
                      default=0)
    drops: dict[int, list[Slot]] = {}
    for slot, positions in em.readers.items():
        if graph[slot[0]].kind != "input" or graph[slot[0]].device != HOST:
            continue
        for i, j in zip(positions, positions[1:]):
            if call[em.schedule[i]] != call[em.schedule[j]]:
                drops.setdefault(i, []).append(slot)
    return drops
