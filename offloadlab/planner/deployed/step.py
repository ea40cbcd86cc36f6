"""What the deployed schemes need to know of a training step beyond the TaskGraph's vertices:
which vertex belongs to which iteration and pass, which weights are versions of one
parameter, and the CPU-movable optimizer updates."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.devices import HOST, is_gpu
from ...core.ops import UPDATE_OPS
from ...core.taskgraph import TaskGraph
from ..cotrain import on_cpu


@dataclass(frozen=True)
class Step:
    """The parts of a TaskGraph the schemes act on.

    ``iteration``: each non-input vertex's iteration (1 unless the graph unrolls several);
    ``backward``: the non-input vertices after their iteration's forward pass and loss;
    ``parameter``: each parameter tensor (a host-resident weight, or the new version an
    optimizer update writes) mapped to its first version, the host input; ``updates``: the
    optimizer updates (``adam_update``/``sgd_update``) on a GPU, which may run on the CPU."""

    iteration: dict[str, int]
    backward: frozenset[str]
    parameter: dict[str, str]
    updates: tuple[str, ...]


def step_of(graph: TaskGraph) -> Step:
    """The :class:`Step` of ``graph``: an unrolled training chain (``meta["chain"]``) by its
    vertices' names (``F1@2``: iteration 2), whose backward vertices are ``G``, ``B`` and the
    updates ``w``; any other graph one iteration whose forward pass is its first
    ``meta["forward"]`` compute vertices (all of them if it does not say)."""
    iteration: dict[str, int] = {}
    backward: set[str] = set()
    chain = "chain" in graph.meta
    forward = graph.meta.get("forward")
    seen = 0
    for t in graph:
        if t.kind == "input":
            continue
        if chain:
            kind, _, at = t.id.partition("@")
            iteration[t.id] = int(at)
            if kind[:1] in ("G", "B", "w"):
                backward.add(t.id)
            continue
        iteration[t.id] = 1
        if forward is not None and seen >= forward:
            backward.add(t.id)
        seen += t.kind == "compute"
    parameter: dict[str, str] = {}
    for t in graph:
        if t.kind == "input" and t.device == HOST:
            parameter[t.id] = t.id
        elif t.kind == "compute" and t.op in UPDATE_OPS and t.inputs[0] in parameter:
            parameter[t.id] = parameter[t.inputs[0]]
    updates = tuple(t.id for t in graph if t.kind == "compute" and t.op in UPDATE_OPS
                    and is_gpu(t.device))
    return Step(iteration, frozenset(backward), parameter, updates)


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
