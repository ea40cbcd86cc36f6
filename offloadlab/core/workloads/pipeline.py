"""Pipeline placement: a one-GPU TaskGraph cut into contiguous stages, one GPU each."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import replace
from itertools import accumulate

from ..devices import HOST, gpu_name, is_gpu_name
from ..errors import GraphError, SpecError
from ..taskgraph import TaskGraph


def pipeline(graph: TaskGraph, gpus: int) -> TaskGraph:
    """``graph`` (its compute vertices on one GPU, in a topological insertion order) placed on
    ``gpus`` GPUs as a pipeline: the compute vertices, in insertion order, are cut into
    ``gpus`` contiguous non-empty stages of about equal flops, stage i on ``gpu{i}``.

    A vertex reading a tensor made on another GPU reads it through a transfer vertex
    ``"{tensor}>gpu{i}"`` (one per tensor and destination, added just before its first
    reader); tensors in host RAM are read directly (the planner loads them).

    A training step says in ``graph.meta["forward"]`` how many of its first compute vertices
    are the forward pass (and the loss); only those are cut into stages, and every later
    vertex (the backward pass, the updates) runs where the forward tensors and weights it
    reads live (the last stage among them; a vertex reading neither, where its inputs were
    made), so that a layer's backward runs on its forward's GPU as in pipeline-parallel
    training.

    Parameters
    ----------
    graph : TaskGraph
        The one-GPU graph.
    gpus : int
        The stages.

    Returns
    -------
    TaskGraph
        A new graph, placed; ``graph`` is unchanged.

    Raises
    ------
    SpecError
        ``gpus`` is not a positive integer, or more than the compute vertices.
    GraphError
        ``graph`` computes on several GPUs, has transfers, is not in a topological insertion
        order, or has a bad ``forward`` count.
    """
    if type(gpus) is not int or gpus < 1:
        raise SpecError(f"pipeline: gpus must be a positive integer, got {gpus!r}")
    compute = [t for t in graph if t.kind == "compute"]
    devices = {t.device for t in compute}
    if len(devices) > 1 or not all(map(is_gpu_name, devices)) or \
            any(t.kind == "transfer" for t in graph):
        raise GraphError(f"pipeline: needs a graph whose compute vertices share one GPU and "
                         f"that has no transfers; {graph.name!r} computes on {sorted(devices)}")
    if len(compute) < gpus:
        raise SpecError(f"pipeline: cannot cut {len(compute)} compute vertices into {gpus} stages")
    if graph.out_of_order() is not None:
        raise GraphError(f"pipeline: {graph.name!r} is not in a topological insertion order")
    forward = graph.meta.get("forward", len(compute))
    if type(forward) is not int or not gpus <= forward <= len(compute):
        raise GraphError(f"pipeline: meta 'forward' of {graph.name!r} must count at least "
                         f"{gpus} and at most its {len(compute)} compute vertices, got "
                         f"{forward!r}")
    stage = dict(zip((t.id for t in compute[:forward]),
                     stages([t.flops for t in compute[:forward]], gpus)))
    anchor = dict(stage)                # forward tensors and weights: where they are read
    for task in compute[:forward]:
        for u in task.inputs:
            anchor.setdefault(u, stage[task.id])
    for task in compute[forward:]:
        anchored = [anchor[u] for u in task.inputs if u in anchor]
        stage[task.id] = max(anchored or [stage.get(u, 0) for u in task.inputs] or [0])
    placed = TaskGraph(name=graph.name, meta=dict(graph.meta))
    for task in graph:
        if task.kind != "compute":
            placed.add(replace(task))
            continue
        device = gpu_name(stage[task.id])
        inputs = []
        for u in task.inputs:
            lives = placed[u].out_device
            if lives not in (HOST, device):
                moved = f"{u}>{device}"
                if moved not in placed.tasks:
                    placed.add_transfer(moved, u, device)
                u = moved
            inputs.append(u)
        placed.add(replace(task, device=device, inputs=tuple(inputs)))
    return placed


def stages(flops: list[float], n: int) -> list[int]:
    """The stage of each vertex: ``n`` contiguous non-empty runs of about equal flops (a
    vertex belongs to the stage its flops' midpoint falls in; when no vertex has flops, each
    counts as one).

    Parameters
    ----------
    flops : list of float
        Each vertex's flops, in order.
    n : int
        The stages, at most the vertices.

    Returns
    -------
    list of int
        Each vertex's stage.
    """
    if not any(flops):
        flops = [1.0] * len(flops)
    total = sum(flops)
    midpoints = [done - f / 2 for done, f in zip(accumulate(flops), flops)]
    cuts = [0]                          # the first vertex of each stage
    for k in range(1, n):
        first = bisect_left(midpoints, k * total / n)
        cuts.append(min(max(first, cuts[-1] + 1), len(flops) - (n - k)))
    cuts.append(len(flops))
    return [k for k in range(n) for _ in range(cuts[k], cuts[k + 1])]
