"""CoTrain's split of the parameter update between GPU and CPU (CoTrain, Algorithm 1 and its
task scheduler's SEPARATION), registered as ``cotrain``.

The optimizer updates of the layers past the first ``k`` run on the CPU as soon as their
gradients are complete, while the GPU computes the gradients of the layers before them; the
graph is then planned by BuildMemGraph.  The separation distance ``k``, what a layer is, and
how the CPU's updates are priced, planned and verified: docs/planners.md, CoTrain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..core.cycle import TrainingChain
from ..core.devices import CPU, is_gpu
from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.ops import DTYPES, UPDATE_OPS
from ..core.taskgraph import Task, TaskGraph
from .registry import Hooks, Options, option, register
from .turnip import BuildMemGraphOptions, plan_once


@dataclass(frozen=True)
class CoTrainOptions(Options):
    k: int = option(-1, "layers (optimizer updates, in forward order) updated on the GPU; the "
                        "rest run on the CPU; -1: the slides' separation distance "
                        "(t_bwd + t_update) / (2 t_update)")

    def __post_init__(self) -> None:
        if type(self.k) is not int or self.k < -1:
            raise PlanError(f"cotrain: k must be an integer >= 0 (or -1 for the separation "
                            f"distance), got {self.k!r}")


def layers(graph: TaskGraph) -> list[list[str]]:
    """The update vertices on a GPU by layer, in forward order.

    On an unrolled training chain layer i's update in every iteration; otherwise each update
    is a layer, the last one the TaskGraph adds (the first weight, whose gradient comes last)
    first.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    list of list of str
    """
    updates = [t.id for t in graph if t.kind == "compute" and t.op in UPDATE_OPS
               and is_gpu(t.device)]
    if "chain" in graph.meta:
        chain = TrainingChain.from_taskgraph(graph)
        iterations = range(1, graph.meta.get("iterations", 0) + 1)
        return [[u for t in iterations if (u := chain.vertex("w", i, t)) in graph.tasks]
                for i in range(1, chain.L + 1)]
    return [[u] for u in reversed(updates)]


def applies(graph: TaskGraph) -> None:
    """Refuse a graph with no optimizer update on a GPU: cotrain plans training steps.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Raises
    ------
    PlanError
        Saying why.
    """
    if not any(layers(graph)):
        raise PlanError(f"cotrain plans training steps: TaskGraph {graph.name!r} has no "
                        f"optimizer update ({', '.join(UPDATE_OPS)}) on a GPU")


def separation(graph: TaskGraph, machine: Machine, by_layer: list[list[str]]) -> int:
    """The slides' k = (t_BWD + t_UPDATE) / (2 t_UPDATE), rounded up, at most the layers.

    t_BWD is the backward pass's GPU time per layer (the vertices after the forward pass and
    the loss, less the updates), t_UPDATE a layer's update on the CPU.

    Parameters
    ----------
    graph : TaskGraph
        A training step.
    machine : Machine
        Prices both.
    by_layer : list of list of str
        Its :func:`layers`.

    Returns
    -------
    int
    """
    backward = _backward(graph)
    per_layer = len(by_layer)
    t_bwd = sum(machine.task_seconds(graph, graph[t]) for t in backward) / per_layer
    moved = [on_cpu(graph[u]) for layer in by_layer for u in layer[:1]]
    t_update = sum(machine.task_seconds(graph, t) for t in moved) / per_layer
    if t_update <= 0:
        return 0                                   # free on the CPU: update everything there
    return min(per_layer, math.ceil((t_bwd + t_update) / (2 * t_update)))


def _backward(graph: TaskGraph) -> list[str]:
    """The backward pass's compute vertices (not the updates)."""
    compute = [t for t in graph if t.kind == "compute" and t.op not in UPDATE_OPS]
    if "chain" in graph.meta:
        return [t.id for t in compute if t.op in ("layer_backward", "weight_grad")]
    if "forward" in graph.meta:
        return [t.id for t in compute[graph.meta["forward"]:]]
    raise PlanError(f"cotrain: TaskGraph {graph.name!r} does not say where its forward pass "
                    f"ends (meta['forward']); give k=")


def on_cpu(t: Task) -> Task:
    """An update vertex moved to the CPU, priced there by its flop per element.

    Parameters
    ----------
    t : Task
        The update vertex.

    Returns
    -------
    Task
        A copy on the CPU.
    """
    elements = t.bytes // DTYPES[t.dtype]
    assert t.op is not None
    return replace(t, device=CPU, flops=UPDATE_OPS[t.op] * elements, time=None)


@register("cotrain", CoTrainOptions, applies=applies)
def cotrain(graph: TaskGraph, machine: Machine, options: CoTrainOptions,
            hooks: Hooks) -> MemGraph:
    """CoTrain: the optimizer updates of the layers past the first k run on the CPU while
    the GPU continues the backward pass; planned by BuildMemGraph.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine the plan must fit.
    options : CoTrainOptions
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
    by_layer = layers(graph)
    k = separation(graph, machine, by_layer) if options.k == -1 else min(options.k,
                                                                          len(by_layer))
    moved = {u for layer in by_layer[k:] for u in layer}
    placed = TaskGraph(name=graph.name, meta=dict(graph.meta))
    for t in graph:
        placed.add(on_cpu(t) if t.id in moved else t)
    mg = plan_once(placed, machine, BuildMemGraphOptions(order=placed.topological_order()),
                   hooks)
    mg.graph.update(options={"k": k}, cpu_updates=sorted(moved))
    return mg
