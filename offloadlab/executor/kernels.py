"""The executor's side of the ops' kernels (:mod:`offloadlab.core.ops`, where each op is
declared with its kernel): viewing tensors in their buffers, the inputs' values, and looking a
vertex's kernel up with its op's parameters bound.

The reference evaluation (:mod:`offloadlab.executor.reference`) runs the same kernels on fresh
arrays, so the executor's answers can be compared with it.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ..core.ops import GENERIC, KERNELS, Kernel, KernelError, OpError, op_name, parse_op

Array = Any   # numpy.ndarray or cupy.ndarray

__all__ = ["KERNELS", "Kernel", "KernelError", "check_runnable", "initial_value", "kernel",
           "tensor_shape", "view"]


def tensor_shape(shape: Sequence[int] | None, dtype: str, nbytes: int) -> tuple[int, ...]:
    """The shape a tensor of ``nbytes`` is viewed with: its own, or flat.

    Parameters
    ----------
    shape : sequence of int or None
        The vertex's shape, if it has one.
    dtype : str
        Its dtype.
    nbytes : int
        Its bytes.

    Returns
    -------
    tuple of int
        The shape.
    """
    if shape is None:
        return (nbytes // np.dtype(dtype).itemsize,)
    return tuple(int(n) for n in shape)


def view(buffer: Array, offset: int, shape: tuple[int, ...], dtype: str) -> Array:
    """The tensor at byte ``offset`` of the 1-D byte array ``buffer``.

    Parameters
    ----------
    buffer : Array
        An arena or the host block.
    offset : int
        Where the tensor starts.
    shape : tuple of int
        Its shape.
    dtype : str
        Its dtype.

    Returns
    -------
    Array
        A view of ``buffer``.
    """
    size = math.prod(shape) * np.dtype(dtype).itemsize
    return buffer[offset:offset + size].view(dtype).reshape(shape)


def initial_value(vertex: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The value of input ``vertex``, seeded by the vertex id so that every run and the
    reference see the same inputs: uniform in [-1, 1), matrices scaled to variance 1/rows so
    that a chain of matmuls keeps its scale (integers in [-8, 8)).

    Parameters
    ----------
    vertex : str
        The input vertex.
    shape : tuple of int
        The shape of its value.
    dtype : str
        Its dtype (floating or integer).

    Returns
    -------
    numpy.ndarray
        The value.

    Raises
    ------
    KernelError
        A dtype it cannot make values of.
    """
    rng = np.random.default_rng(zlib.crc32(vertex.encode()))
    kind = np.dtype(dtype).kind
    if kind == "f":
        scale = math.sqrt(3.0 / max(shape[-2], 1)) if len(shape) >= 2 else 1.0
        return (scale * rng.uniform(-1.0, 1.0, size=shape)).astype(dtype)
    if kind in "iu":
        return rng.integers(0 if kind == "u" else -8, 8, size=shape).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    raise KernelError(f"input {vertex!r}: cannot make values of dtype {dtype!r}")


def check_runnable(vertices: Iterable[Any]) -> None:
    """Refuse a graph with a ``generic:...`` op before the executor sets anything up.

    Priced from its shapes alone, such an op has no kernel.

    Parameters
    ----------
    vertices : iterable
        The vertices of a TaskGraph or MemGraph.

    Raises
    ------
    KernelError
        Naming the first compute vertex whose op is ``generic:...``.
    """
    for v in vertices:
        if v.kind == "compute" and v.op is not None and op_name(v.op) == GENERIC:
            raise KernelError(f"vertex {v.id!r}: op {v.op!r} is priced from its shapes alone "
                              f"(import-torch --generic) and has no kernel: the executor cannot "
                              f"run this graph (plan and simulate it instead)")


def kernel(op: str | None, vertex: str) -> Kernel:
    """The kernel of ``op``, its parameters bound for ``NAME:key=value`` ops.

    Parameters
    ----------
    op : str or None
        The vertex's op.
    vertex : str
        The vertex, named by the error.

    Returns
    -------
    Kernel
        The kernel.

    Raises
    ------
    KernelError
        No kernel for ``op``; the message names ``vertex`` and the known ops.
    """
    found = KERNELS.get(op or "")
    if found is not None:
        return found
    try:
        name, params = parse_op(op or "")
    except OpError:
        name, params = "", ()
    found = KERNELS.get(name)
    if found is None:
        raise KernelError(f"vertex {vertex!r}: no kernel for op {op!r}; known ops: "
                          f"{', '.join(KERNELS.names())}")
    return _bound(found, params)


@lru_cache(maxsize=4096)
def _bound(k: Kernel, params: tuple[tuple[str, int], ...]) -> Kernel:
    return Kernel(functools.partial(k.fn, **dict(params)), k.scratch)
