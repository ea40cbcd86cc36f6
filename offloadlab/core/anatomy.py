"""The anatomy of a training step: its forward and backward passes, the activations the
backward reads (the tensors activation offloading moves), the weights, gradients, optimizer
state and updates (issue 45; the saved-tensor view of PyTorch's autograd).  The functions a
planner of a training step calls.

How each part is found, and how a view is read: docs/categories.md, The anatomy of a training
step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import GraphError
from .ops import UPDATE_OPS
from .taskgraph import UNKNOWN, TaskGraph


@dataclass(frozen=True)
class TrainingStep:
    """The parts of a training step, each a list of vertex ids in insertion order."""

    forward: list[str]
    backward: list[str]
    updates: list[str]
    saved: list[str]         # forward tensors a backward vertex reads, but the outputs
    outputs: list[str]       # forward tensors no forward vertex reads (the loss, ...)
    weights: list[str]
    gradients: list[str]
    optimizer_state: list[str]


def forward(graph: TaskGraph) -> list[str]:
    """The forward pass's compute vertices.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    list of str

    Raises
    ------
    GraphError
        The graph says nothing that tells (no ``meta["forward"]``, no training chain, no
        categories), or its ``meta["forward"]`` is malformed.
    """
    compute = [t for t in graph if t.kind == "compute"]
    if "forward" in graph.meta:
        count = graph.meta["forward"]
        if type(count) is not int or not 0 <= count <= len(compute):
            raise GraphError(f"TaskGraph {graph.name!r}: meta 'forward' (its forward pass's "
                             f"compute vertices) must be an integer from 0 to {len(compute)}, "
                             f"got {count!r:.40}")
        return [t.id for t in compute[:count]]
    if "chain" in graph.meta:
        return [t.id for t in compute if t.op == "layer_forward"]
    if any(t.category is not UNKNOWN for t in compute):
        return [t.id for t in compute if t.category == "activations"]
    raise GraphError(f"TaskGraph {graph.name!r} does not say where its forward pass ends "
                     f"(no meta 'forward', training chain or categories)")


def _passes(graph: TaskGraph) -> tuple[list[str], list[str], list[str]]:
    """The forward pass, the updates and the backward pass (:func:`forward`, :func:`updates`,
    :func:`backward`), each found once."""
    ahead = forward(graph)
    skip = set(ahead)
    changed = [t.id for t in graph if t.kind == "compute" and t.id not in skip
               and (t.op in UPDATE_OPS or t.category == "weights")]
    skip.update(changed)
    return ahead, changed, [t.id for t in graph if t.kind == "compute" and t.id not in skip]


def updates(graph: TaskGraph) -> list[str]:
    """The optimizer updates.

    ``adam_update``/``sgd_update`` vertices, and backward vertices writing weights (an
    update ``import-torch`` could only trace as ``mix``).

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    list of str
    """
    return _passes(graph)[1]


def backward(graph: TaskGraph) -> list[str]:
    """The backward pass's compute vertices: those after the forward pass but the updates.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    list of str

    Raises
    ------
    GraphError
        As :func:`forward`.
    """
    return _passes(graph)[2]


def _read_by(graph: TaskGraph, vertices: set[str]) -> set[str]:
    """The vertices one of ``vertices`` reads, directly or through transfers (copies)."""
    found: set[str] = set()
    succ = graph.succ
    for t in reversed(graph.tasks.values()):
        if any(r in vertices or (r in found and graph[r].kind == "transfer") for r in succ[t.id]):
            found.add(t.id)
    return found


def forward_tensors(graph: TaskGraph) -> list[str]:
    """The forward pass's tensors.

    Its compute vertices, the batch (inputs whose category is ``activations``) and the
    transfers copying either to a forward vertex on another GPU.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    list of str

    Raises
    ------
    GraphError
        As :func:`forward`.
    """
    ahead = set(forward(graph))
    return _forward_tensors(graph, ahead, _read_by(graph, ahead))


def _forward_tensors(graph: TaskGraph, ahead: set[str], read: set[str]) -> list[str]:
    """:func:`forward_tensors` given the forward pass and what it reads."""
    found: set[str] = set()
    for t in graph:
        if t.id in ahead or (t.kind == "input" and t.category == "activations") or (
                t.kind == "transfer" and t.inputs[0] in found and t.id in read):
            found.add(t.id)
    return [t for t in graph.tasks if t in found]


def saved(graph: TaskGraph) -> tuple[list[str], list[str]]:
    """The saved activations and the forward pass's outputs.

    The saved activations are the forward tensors a backward vertex reads, directly or
    through a transfer the backward makes, less the outputs; the outputs are the forward
    tensors but copies that no forward vertex reads.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    (list of str, list of str)
        The saved activations and the outputs.

    Raises
    ------
    GraphError
        As :func:`forward`.
    """
    ahead, _, behind = _passes(graph)
    in_forward = _read_by(graph, set(ahead))
    tensors = _forward_tensors(graph, set(ahead), in_forward)
    return _saved(graph, tensors, in_forward, _read_by(graph, set(behind)))


def _saved(graph: TaskGraph, tensors: list[str], in_forward: set[str], in_backward: set[str]
           ) -> tuple[list[str], list[str]]:
    """:func:`saved` given the forward tensors and what each pass reads."""
    outputs = [v for v in tensors if graph[v].kind != "transfer" and v not in in_forward]
    last = set(outputs)
    return [v for v in tensors if v not in last and v in in_backward], outputs


def category(graph: TaskGraph) -> dict[str, str | None]:
    """Each vertex's category.

    The TaskGraph's where it has one; else by structure (an update and the weight it reads:
    weights; the forward's tensors: activations; the backward's: gradients; a transfer: its
    source's), or None where neither tells (an input that no update reads, in a graph
    without categories).

    Parameters
    ----------
    graph : TaskGraph
        The graph.

    Returns
    -------
    dict of str to str or None
    Raises
    ------
    GraphError
        As :func:`forward`.
    """
    _, changed, behind = _passes(graph)
    return _category(graph, set(forward_tensors(graph)), set(behind), set(changed))


def _category(graph: TaskGraph, ahead: set[str], behind: set[str], changed: set[str]
              ) -> dict[str, str | None]:
    """:func:`category` given the forward's tensors, the backward and the updates."""
    trained = {graph[u].inputs[0] for u in changed if graph[u].inputs}
    found: dict[str, str | None] = {}
    for t in graph:
        found[t.id] = t.category if isinstance(t.category, str) else (
            "weights" if t.id in changed or t.id in trained else
            "activations" if t.id in ahead else "gradients" if t.id in behind else
            found[t.inputs[0]] if t.kind == "transfer" else None)
    return found


def training_step(graph: TaskGraph) -> TrainingStep:
    """The anatomy of ``graph`` as a training step.

    Parameters
    ----------
    graph : TaskGraph
        The graph.

    Returns
    -------
    TrainingStep

    Raises
    ------
    GraphError
        One line, if it is not one: no forward pass it can find, no backward pass, or no
        saved activation.
    """
    ahead, changed, behind = _passes(graph)
    if not ahead or not behind:
        raise GraphError(f"TaskGraph {graph.name!r} is not a training step: "
                         f"{len(ahead)} forward and {len(behind)} backward vertices")
    in_forward = _read_by(graph, set(ahead))
    tensors = _forward_tensors(graph, set(ahead), in_forward)
    keep, outputs = _saved(graph, tensors, in_forward, _read_by(graph, set(behind)))
    cats = _category(graph, set(tensors), set(behind), set(changed))
    return TrainingStep(ahead, behind, changed, keep, outputs,
                        [v for v, c in cats.items() if c == "weights"],
                        [v for v, c in cats.items() if c == "gradients"],
                        [v for v, c in cats.items() if c == "optimizer_state"])
