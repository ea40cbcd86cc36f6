"""Each compute vertex's kernel and the workspace it needs on its lane (docs/execution.md):
sized once per kernel signature on stand-in arrays that take no memory, plus room for the
output where it overlaps an input, so that it is computed aside and then copied."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.memgraph import MemVertex
from ..core.ops.arrays import aligned
from .kernels import KernelError, kernel


@dataclass
class Needs:
    """Per vertex (by position): its kernel (None but for compute vertices), whether its
    output overlaps an input, and its warm-up signature; per engine, the most workspace any
    of its kernels needs (``need``)."""

    kernel: list            # of Kernel, or None
    aliased: list[bool]
    signature: list[tuple | None]
    need: dict[str, int]


def needs(vertices: list[MemVertex], shape: list[tuple[int, ...]], inputs: list[list[int]],
          engines: list[str | None]) -> Needs:
    """The :class:`Needs` of ``vertices``, whose tensors have ``shape``, read ``inputs`` (by
    position) and run on ``engines``.

    Parameters
    ----------
    vertices : list of MemVertex
        The MemGraph's vertices, by position.
    shape : list of tuple of int
        Each one's tensor shape.
    inputs : list of list of int
        Each one's inputs, by position.
    engines : list of str or None
        The engine each runs on (None: a move, or the CPU).

    Returns
    -------
    Needs
        What they need.

    Raises
    ------
    KernelError
        A vertex's kernel refuses its shapes; the message names it.
    """
    n = len(vertices)
    out = Needs([None] * n, [False] * n, [None] * n, {})
    sized: dict[tuple, int] = {}     # (op, output and input shapes and dtypes) -> bytes
    for i, v in enumerate(vertices):
        if v.kind != "compute":
            continue
        k = kernel(v.op, v.id)
        signature = (v.op, shape[i], v.dtype,
                     *((shape[u], vertices[u].dtype) for u in inputs[i]))
        nbytes = sized.get(signature, -1)
        if nbytes < 0:
            result = _stand_in(shape[i], v.dtype)
            args = [_stand_in(shape[u], vertices[u].dtype) for u in inputs[i]]
            try:
                nbytes = sized[signature] = k.scratch(result, args)
            except (ValueError, TypeError, IndexError) as exc:
                raise KernelError(f"vertex {v.id!r} ({v.op}): {exc}") from None
        out.aliased[i] = v.loc is not None and any(_overlap(v, vertices[u]) for u in inputs[i])
        if out.aliased[i]:
            nbytes += aligned(math.prod(shape[i]) * np.dtype(v.dtype).itemsize)
        out.kernel[i] = k
        out.signature[i] = (signature, out.aliased[i])
        name = engines[i]
        assert name is not None
        out.need[name] = max(out.need.get(name, 0), nbytes)
    return out


def _stand_in(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` that takes no memory (for sizing
    scratch: its flags and its slices' flags are those of the real tensor's, never read)."""
    item = np.dtype(dtype).itemsize
    strides = tuple(item * math.prod(shape[k + 1:]) for k in range(len(shape)))
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides, writeable=False)


def _overlap(v: MemVertex, u: MemVertex) -> bool:
    """Whether the GPU locations of ``v`` and ``u`` share a byte."""
    a, b = v.loc, u.loc
    return b is not None and a is not None and a.device == b.device \
        and a.offset < b.end and b.offset < a.end
