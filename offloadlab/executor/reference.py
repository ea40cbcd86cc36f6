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
    """The value of every output of ``graph`` (a vertex nobody reads), by vertex id.

    Parameters
    ----------
    graph : TaskGraph
        The computation, evaluated with NumPy.

    Returns
    -------
    dict of str to numpy.ndarray

    Raises
    ------
    KernelError
        A kernel refuses its inputs, naming the vertex.
    """
    check_runnable(graph)
    with threadpool_limits(1, user_api="blas"):
        return _evaluate(graph)


def reference_spread(graph: TaskGraph, reference: dict[str, np.ndarray]) -> dict[str, float]:
    """How far rounding alone moves each float output.

    The largest ``|reference - exact|`` over its elements, ``exact`` being the same
    evaluation with every float tensor in float64.  A backend that sums in another order (a
    GPU's reductions) lands elsewhere, by about as much: the spread is large where an output
    is ill-conditioned, as the sine of a sum of many terms is (measured: up to 4e-4 on
    ``random:vertices=200``; 0.37 on a training chain whose 1-element output folds 64 million
    elements), past a fixed tolerance of 1e-4.  The largest over the output, not each
    element's own, since another order errs where NumPy's happened not to (folding those sums
    in NumPy's other order gave errors up to 1.4 times the largest spread, in elements whose
    own spread was far smaller).  :func:`~offloadlab.executor.check_outputs` widens its
    tolerance by four times it.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    reference : dict of str to numpy.ndarray
        Its :func:`reference_outputs`.

    Returns
    -------
    dict of str to float
        The spread of each float output.
    """
    check_runnable(graph)
    with threadpool_limits(1, user_api="blas"):
        exact = _evaluate(graph, widen=True)
    return {t: float(np.max(np.abs(value.astype(np.float64) - exact[t]), initial=0.0))
            for t, value in reference.items() if value.dtype.kind == "f"}


def _evaluate(graph: TaskGraph, widen: bool = False) -> dict[str, np.ndarray]:
    """:func:`reference_outputs`' evaluation; with ``widen``, every float tensor float64."""
    succ = graph.succ
    outputs = set(graph.outputs())
    left = {t: len(readers) for t, readers in succ.items()}
    values: dict[str, np.ndarray] = {}
    for t in graph.topological_order():
        task = graph[t]
        shape = tensor_shape(task.shape, task.dtype, task.bytes)
        dtype = np.float64 if widen and np.dtype(task.dtype).kind == "f" else task.dtype
        if task.kind == "input":
            values[t] = initial_value(t, shape, task.dtype).astype(dtype, copy=False)
        elif task.kind == "transfer":
            values[t] = values[task.inputs[0]].copy()
        else:
            out = np.empty(shape, dtype)
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
    """The TaskGraph a MemGraph computes.

    Its task vertices, each reading the tasks whose tensors its inputs hold (through
    offloads, reloads and loads).

    Parameters
    ----------
    memgraph : MemGraph
        The plan.

    Returns
    -------
    TaskGraph
    """
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
