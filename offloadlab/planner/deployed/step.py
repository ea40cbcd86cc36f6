"""What the deployed schemes need to know of a training step beyond its anatomy
(:mod:`offloadlab.core.anatomy`): which iteration each vertex belongs to, which tensors are
versions of one parameter, and the optimizer updates that may run on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

from ...core import anatomy
from ...core.devices import HOST, is_gpu
from ...core.errors import GraphError
from ...core.ops import UPDATE_OPS
from ...core.taskgraph import TaskGraph
from ..cotrain import on_cpu


@dataclass(frozen=True)
class Step:
    """The parts of a TaskGraph the schemes act on.

    ``iteration``: each non-input vertex's iteration (1 unless the graph unrolls several);
    ``backward``: the compute vertices after the forward pass (the backward pass and the
    updates; none in a graph with no training step); ``parameter``: each parameter tensor (a
    host-resident weight, or a new version an update writes) mapped to its first version, the
    host input; ``updates``: the optimizer updates (``adam_update``/``sgd_update``) on a GPU,
    which the verifier lets run on the CPU."""

    iteration: dict[str, int]
    backward: frozenset[str]
    parameter: dict[str, str]
    updates: tuple[str, ...]


def step_of(graph: TaskGraph) -> Step:
    """The :class:`Step` of ``graph``.  Iterations: an unrolled training chain's
    (``meta["chain"]``) by its vertices' names (``F1@2``: iteration 2), else one.  The forward
    pass and the weights: :mod:`offloadlab.core.anatomy`'s (every compute vertex is forward in
    a graph that does not say; an input of unknown category counts as a weight, only the batch
    is known not to be one)."""
    chain = "chain" in graph.meta
    iteration = {t.id: int(t.id.partition("@")[2]) if chain else 1
                 for t in graph if t.kind != "input"}
    try:
        ahead = set(anatomy.forward(graph))
        backward = frozenset(t.id for t in graph if t.kind == "compute" and t.id not in ahead)
        changed = anatomy.updates(graph)
    except GraphError:                              # no training step: all forward
        backward, changed = frozenset(), []
    category = anatomy.category(graph) if backward else {}
    parameter = {t.id: t.id for t in graph if t.kind == "input" and t.device == HOST
                 and category.get(t.id) != "activations"}
    for u in changed:
        if graph[u].inputs and graph[u].inputs[0] in parameter:
            parameter[u] = parameter[graph[u].inputs[0]]
    updates = tuple(t.id for t in graph if t.kind == "compute" and t.op in UPDATE_OPS
                    and is_gpu(t.device))
    return Step(iteration, backward, parameter, updates)


def cpu_step(graph: TaskGraph) -> tuple[TaskGraph, list[str]]:
    """``graph`` with its optimizer updates on the CPU, and its vertices in the order an eager
    training loop runs them: each iteration's GPU work, then its updates (in the order the
    forward first reads their weights, the optimizer's parameter order)."""
    step = step_of(graph)
    moved = set(step.updates)
    placed = TaskGraph(name=graph.name, meta=dict(graph.meta))
    first: dict[str, int] = {}                       # tensor -> its first reader's position
    for i, t in enumerate(graph):
        placed.add(on_cpu(t) if t.id in moved else t)
        for u in t.inputs:
            first.setdefault(u, i)
    order = list(graph.tasks)
    position = {t: i for i, t in enumerate(order)}

    def key(t: str) -> tuple[int, int, int]:
        if t not in moved:
            return step.iteration[t], 0, position[t]
        weight = step.parameter.get(graph[t].inputs[0], graph[t].inputs[0])
        return step.iteration[t], 1, first.get(weight, position[t])
    schedule = sorted((t for t in order if graph[t].kind != "input"), key=key)
    return placed, schedule
