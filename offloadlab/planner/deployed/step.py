"""What the deployed schemes need to know of a training step beyond its anatomy
(:mod:`offloadlab.core.anatomy`): which tensors are versions of one parameter, the optimizer
updates that may run on the CPU, and the order an eager training loop runs them in."""

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

    ``backward``: the compute vertices after the forward pass (the backward pass and the
    updates; none in a graph with no training step); ``parameter``: each parameter tensor (a
    host-resident weight, or a new version an update writes) mapped to its first version, the
    host input; ``updates``: the optimizer updates (``adam_update``/``sgd_update``) on a GPU,
    which the verifier lets run on the CPU."""

    backward: frozenset[str]
    parameter: dict[str, str]
    updates: tuple[str, ...]


def step_of(graph: TaskGraph) -> Step:
    """The :class:`Step` of ``graph``.

    The forward pass and the weights are :mod:`offloadlab.core.anatomy`'s (every compute
    vertex is forward in a graph that does not say; an input of unknown category counts as a
    weight, only the batch is known not to be one).

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Returns
    -------
    Step
    """
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
    return Step(backward, parameter, updates)


@dataclass(frozen=True)
class Schedule:
    """A training loop's order: ``placed`` is the TaskGraph with the updates on the CPU,
    ``order`` its non-input vertices as the loop runs them, ``iteration`` each one's training
    iteration (from 1)."""

    placed: TaskGraph
    order: list[str]
    iteration: dict[str, int]


def cpu_step(graph: TaskGraph, step: Step) -> Schedule:
    """``graph`` with its optimizer updates on the CPU, run as an eager training loop runs them.

    Each update in the ``optimizer.step()`` after its iteration's backward, which comes before
    the first vertex reading an updated weight (or at the end), the updates in the order the
    forward first reads their weights (the optimizer's parameter order).

    Parameters
    ----------
    graph : TaskGraph
        A training step.
    step : Step
        Its anatomy: ``step.updates`` move to the CPU.

    Returns
    -------
    Schedule
    """
    moved = set(step.updates)
    placed = TaskGraph(name=graph.name, meta=dict(graph.meta))
    first: dict[str, int] = {}                       # tensor -> its first reader's position
    for i, t in enumerate(graph):
        placed.add(on_cpu(t) if t.id in moved else t)
        for u in t.inputs:
            first.setdefault(u, i)

    def param_order(u: str) -> int:
        weight = graph[u].inputs[0]
        return first.get(step.parameter.get(weight, weight), 0)

    order: list[str] = []
    iteration: dict[str, int] = {}

    def optimizer_step(pending: dict[str, None], now: int) -> None:
        for u in sorted(pending, key=param_order):  # ties in program order
            order.append(u)
            iteration[u] = now

    pending: dict[str, None] = {}
    now = 1
    for t in graph:
        if t.kind == "input":
            continue
        if t.id in moved:
            pending[t.id] = None
            continue
        if not pending.keys().isdisjoint(t.inputs):  # it reads an updated weight
            optimizer_step(pending, now)
            pending, now = {}, now + 1
        order.append(t.id)
        iteration[t.id] = now
    optimizer_step(pending, now)
    return Schedule(placed, order, iteration)
