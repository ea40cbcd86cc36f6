"""The reference: a straightforward NumPy evaluation of a TaskGraph with unlimited memory.

docs/design.md rule 5: executing a correct MemGraph in any order that respects its edges yields the
outputs this evaluation computes.  It runs the executor's own kernels on fresh arrays, one
vertex at a time in topological order, and frees each tensor after its last reader, with BLAS
on one thread as the numpy backend's workers run it: OpenBLAS splits a matrix product's sums
differently on more threads, and the synthetic ops (``mix``: a sine of folded sums) amplify
that last-bit difference past the comparison's tolerance.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from ..core.memgraph import MOVE_KINDS, MemGraph
from ..core.taskgraph import Task, TaskGraph
from .kernels import KernelError, check_runnable, initial_value, kernel, tensor_shape


def reference_outputs(graph: TaskGraph) -> dict[str, np.ndarray]:
    """The value of every output of ``graph`` (a vertex nobody reads), by vertex id."""
    check_runnable(graph)
    with threadpool_limits(1, user_api="blas"):
        return _evaluate(graph)


def _evaluate(graph: TaskGraph) -> dict[str, np.ndarray]:
    """:func:`reference_outputs`' evaluation."""
    succ = graph.succ
    outputs = set(graph.outputs())
    left = {t: len(readers) for t, readers in succ.items()}
    values: dict[str, np.ndarray] = {}
    for t in graph.topological_order():
        task = graph[t]
        shape = tensor_shape(task.shape, task.dtype, task.bytes)
        if task.kind == "input":
            values[t] = initial_value(t, shape, task.dtype)
        elif task.kind == "transfer":
            values[t] = values[task.inputs[0]].copy()
        else:
            out = np.empty(shape, task.dtype)
            args = [values[u] for u in task.inputs]
            k = kernel(task.op, t)
            try:
                k.fn(np, out, args, np.empty(k.scratch(out, args), np.uint8))
            except (KernelError, ValueError, TypeError) as exc:
                raise KernelError(f"vertex {t!r} ({task.op}): {exc}") from None
            values[t] = out
        for u in dict.fromkeys(task.inputs):
            left[u] -= 1
            if not left[u] and u not in outputs:
                del values[u]
    return {t: values[t] for t in graph.outputs()}


def taskgraph_of(memgraph: MemGraph) -> TaskGraph:
    """The TaskGraph a MemGraph computes: its task vertices, each reading the tasks whose
    tensors its inputs hold (through offloads, reloads and loads)."""
    vertices = memgraph.vertices

    def tensor(u: str) -> str:
        v = vertices[u]
        return v.of if v.kind in MOVE_KINDS and v.of is not None else (v.task or u)

    g = TaskGraph(name=str(memgraph.graph.get("taskgraph", "")))
    for v in sorted(memgraph, key=lambda v: v.order):
        if v.kind not in MOVE_KINDS:
            g.add(Task(v.task or v.id, v.kind, v.device, v.bytes, tuple(map(tensor, v.inputs)),
                       v.op, v.flops, v.shape, v.dtype, v.time))
    return g
