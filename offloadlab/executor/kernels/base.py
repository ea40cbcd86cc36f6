"""What every kernel module shares: the kernel type and registry, viewing tensors in their buffers,
the scratch layout, and looking a vertex's kernel up."""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np

from ...core.errors import GraphError
from ...core.ops import GENERIC, OPS, OpError, op_name, parse_op
from ...core.registry import Registry

Array = Any   # numpy.ndarray or cupy.ndarray
KernelFn = Callable[[Any, Array, Sequence[Array], Array], None]
F = TypeVar("F", bound=Callable[..., None])


ADAM_LR, ADAM_EPS = 1e-3, 1e-8


SGD_LR = 1e-2


NORM_EPS = 1e-5


class KernelError(GraphError):
    """A vertex cannot run: its op has no kernel, or its tensors do not fit the op."""


@dataclass(frozen=True)
class Kernel:
    """An op's implementation and the scratch bytes it needs for given tensors."""

    fn: KernelFn
    scratch: Callable[[Array, Sequence[Array]], int] = lambda out, args: 0


KERNELS: Registry[Kernel] = Registry("kernel", error=KernelError, listed="known ops", sort=True,
                                    within=OPS)
"""Each op's kernel, registered against the op's name (:data:`~offloadlab.core.ops.OPS`);
every op but ``generic`` has one (tests/test_registry.py)."""


def kernel_for(op: str, scratch: Callable[[Array, Sequence[Array]], int] | None = None
               ) -> Callable[[F], F]:
    """Register the decorated function as the kernel of op ``op`` (which
    :data:`~offloadlab.core.ops.OPS` must name), needing ``scratch(out, args)`` bytes of
    workspace (none if not given)."""
    def deco(fn: F) -> F:
        KERNELS[op] = Kernel(fn) if scratch is None else Kernel(fn, scratch)
        return fn
    return deco


def tensor_shape(shape: Sequence[int] | None, dtype: str, nbytes: int) -> tuple[int, ...]:
    """The shape a tensor of ``nbytes`` is viewed with: its own, or flat."""
    if shape is None:
        return (nbytes // np.dtype(dtype).itemsize,)
    return tuple(int(n) for n in shape)


def view(buffer: Array, offset: int, shape: tuple[int, ...], dtype: str) -> Array:
    """The tensor at byte ``offset`` of the 1-D byte array ``buffer``."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    return buffer[offset:offset + size].view(dtype).reshape(shape)


def initial_value(vertex: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The value of input ``vertex``, seeded by the vertex id so that every run and the
    reference see the same inputs: uniform in [-1, 1), matrices scaled to variance 1/rows so
    that a chain of matmuls keeps its scale (integers in [-8, 8))."""
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


def accumulate(xp, out: Array, x: Array, scratch: Array) -> None:
    """``out += fit(x)``, flat: ``x`` folded onto ``out`` when longer, tiled when shorter.
    A fold of up to :data:`FOLD_ROWS` rows of ``out``'s length adds them one by one in place;
    more rows are summed in one reduction into ``scratch`` (:func:`fold_bytes`) first, so
    that a tiny output of a long input costs no Python loop per row (a 1-element output of a
    400 KB input took 100k iterations)."""
    out, x = out.reshape(-1), x.reshape(-1)
    n, m = out.size, x.size
    if n == 0 or m == 0:
        return
    # each output slice is bound once: CuPy copies an input that overlaps ``out`` unless it
    # is the very same object
    if m >= n:
        rows = m // n
        if rows > FOLD_ROWS:
            folded = scratch[:out.nbytes].view(out.dtype)
            xp.sum(x[:rows * n].reshape(rows, n), axis=0, out=folded)
            xp.add(out, folded, out=out)
        else:
            for j in range(0, rows * n, n):
                part = x[j:j + n]
                xp.add(out, part, out=out)
        if m > rows * n:
            part = x[rows * n:]
            head = out[:part.size]
            xp.add(head, part, out=head)
    else:
        reps = n // m
        tiled = out[:reps * m].reshape(reps, m)
        xp.add(tiled, x, out=tiled)
        if n > reps * m:
            tail = out[reps * m:]
            xp.add(tail, x[:n - reps * m], out=tail)


def same(op: str, out: Array, args: Sequence[Array], count: int | None = None) -> None:
    if count is not None and len(args) != count:
        raise KernelError(f"{op} takes {count} input(s), got {len(args)}")
    for x in args:
        if x.shape != out.shape:
            raise KernelError(f"{op}: input shape {x.shape} differs from output shape {out.shape}")


FOLD_ROWS = 16    # folds of more rows than this are one reduction (:func:`accumulate`)


def matmul_shards(xp, out: Array, left: Sequence[Array], right: Array,
                   scratch: Array) -> None:
    """``out = hstack(left) @ right``: each column shard of the left operand meets its rows of
    ``right``; the products after the first are summed through ``scratch``, and a block of
    ``right`` that is a strided slice is first copied into ``scratch`` (:func:`dense`)."""
    row = 0
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if len(left) > 1 else None
    spare = scratch[aligned(out.nbytes) if len(left) > 1 else 0:]
    for k, x in enumerate(left):
        block = dense(xp, right[row:row + x.shape[1]], spare)
        row += x.shape[1]
        if k == 0:
            xp.matmul(x, block, out=out)
        else:
            xp.matmul(x, block, out=partial)
            xp.add(out, partial, out=out)


ALIGN = 256     # bytes: a scratch buffer after another starts at a multiple of this


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGN`: where a buffer after it starts."""
    return -(-nbytes // ALIGN) * ALIGN


def is_strided(x: Array) -> bool:
    """A 2-D operand that is neither C- nor F-contiguous, which CuPy's matmul would copy into
    a fresh allocation before calling cuBLAS."""
    return not (x.flags.c_contiguous or x.flags.f_contiguous)


def dense(xp, x: Array, scratch: Array) -> Array:
    """``x``, or a C-contiguous copy of it at the start of ``scratch`` if it is strided."""
    if not is_strided(x):
        return x
    copy = scratch[:x.nbytes].view(x.dtype).reshape(x.shape)
    xp.copyto(copy, x)
    return copy


def shard_bytes(left: Sequence[Array], right: Array) -> int:
    """Scratch of :func:`matmul_shards`: the partial product's, then room for the largest
    strided block of ``right``."""
    row, block = 0, 0
    for x in left:
        piece = right[row:row + x.shape[1]]
        row += x.shape[1]
        if is_strided(piece):
            block = max(block, piece.nbytes)
    return block


def fold_bytes(out: Array, args: Sequence[Array]) -> int:
    """Scratch of :func:`accumulate`: one output's worth where an input folds onto it in
    one reduction."""
    return out.nbytes if any(x.size > FOLD_ROWS * max(out.size, 1) for x in args) else 0


def as_rows(x: Array) -> Array:
    """``x`` as a 2-D array of rows (the last axis), 1 row if flat."""
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def row_bytes(out: Array, args: Sequence[Array]) -> int:
    return 2 * as_rows(out).shape[0] * out.dtype.itemsize


def row_scratch(scratch: Array, out: Array) -> tuple[Array, Array]:
    """Two columns of one value per row of ``out``, in ``scratch``."""
    rows, size = as_rows(out).shape[0], out.dtype.itemsize
    both = scratch[:2 * rows * size].view(out.dtype).reshape(2, rows, 1)
    return both[0], both[1]


def compute_dtype(out: Array) -> Any:
    return np.float64 if out.dtype == np.float64 else np.float32


def check_runnable(vertices: Iterable[Any]) -> None:
    """KernelError naming the first compute vertex (of a TaskGraph or MemGraph) whose op is
    ``generic:...``: priced from its shapes alone, it has no kernel, so the executor refuses
    the graph before it sets anything up."""
    for v in vertices:
        if v.kind == "compute" and v.op is not None and op_name(v.op) == GENERIC:
            raise KernelError(f"vertex {v.id!r}: op {v.op!r} is priced from its shapes alone "
                              f"(import-torch --generic) and has no kernel: the executor cannot "
                              f"run this graph (plan and simulate it instead)")


def kernel(op: str | None, vertex: str) -> Kernel:
    """The kernel of ``op`` (its parameters bound, for ``NAME:key=value`` ops); KernelError
    naming ``vertex`` and the known ops if there is none."""
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
