"""The kernels of the ops of :mod:`offloadlab.core.ops`, written once against an array module.

A kernel is ``fn(xp, out, args, scratch)``: ``xp`` is ``numpy`` or ``cupy``, ``out`` the
vertex's planned location viewed with its shape and dtype, ``args`` its inputs in argument
order, and ``scratch`` a 1-D byte workspace of the stream it runs on (allocated once at
start-up, at least :func:`scratch_bytes` long).  Kernels write ``out`` in place (``out=``) and
allocate nothing on the device.  The reference evaluation (:mod:`.reference`) runs the same
functions on fresh arrays, so the executor's answers can be compared with it.

The synthetic ops of the random and training workloads (``mix``, ``layer_forward``,
``layer_backward``, ``weight_grad``) read every element of every input and fold or tile each
onto the output's length: ``out = sin(1/2 + sum_i fit(x_i))``.  They stand for the real layer
math in cost and in data flow, so a race on any byte of an input shows in the output.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import GraphError
from ..core.ops import OPS

Array = Any   # numpy.ndarray or cupy.ndarray
KernelFn = Callable[[Any, Array, Sequence[Array], Array], None]

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


# -- tensors --------------------------------------------------------------------------------
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


# -- helpers ------------------------------------------------------------------------------
def _accumulate(xp, out: Array, x: Array) -> None:
    """``out += fit(x)``, flat: ``x`` folded onto ``out`` when longer, tiled when shorter."""
    out, x = out.reshape(-1), x.reshape(-1)
    n, m = out.size, x.size
    if n == 0 or m == 0:
        return
    # each output slice is bound once: CuPy copies an input that overlaps ``out`` unless it
    # is the very same object
    if m >= n:
        for j in range(0, m, n):
            part = x[j:j + n]
            head = out[:part.size]
            xp.add(head, part, out=head)
    else:
        reps = n // m
        tiled = out[:reps * m].reshape(reps, m)
        xp.add(tiled, x, out=tiled)
        if n > reps * m:
            tail = out[reps * m:]
            xp.add(tail, x[:n - reps * m], out=tail)


def _same(op: str, out: Array, args: Sequence[Array], count: int | None = None) -> None:
    if count is not None and len(args) != count:
        raise KernelError(f"{op} takes {count} input(s), got {len(args)}")
    for x in args:
        if x.shape != out.shape:
            raise KernelError(f"{op}: input shape {x.shape} differs from output shape {out.shape}")


def _rows(x: Array) -> Array:
    """``x`` as a 2-D array of rows (the last axis), 1 row if flat."""
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def _row_bytes(out: Array, args: Sequence[Array]) -> int:
    return 2 * _rows(out).shape[0] * out.dtype.itemsize


def _row_scratch(scratch: Array, out: Array) -> tuple[Array, Array]:
    """Two columns of one value per row of ``out``, in ``scratch``."""
    rows, size = _rows(out).shape[0], out.dtype.itemsize
    both = scratch[:2 * rows * size].view(out.dtype).reshape(2, rows, 1)
    return both[0], both[1]


# -- kernels ------------------------------------------------------------------------------
def combine(xp, out, args, scratch) -> None:
    """``out = sin(1/2 + sum_i fit(x_i))`` (the synthetic ops)."""
    out.fill(0.5)
    for x in args:
        _accumulate(xp, out, x)
    xp.sin(out, out=out)


def matmul(xp, out, args, scratch) -> None:
    """``hstack(args[:-1]) @ args[-1]``: the left operand may come as column shards."""
    if len(args) < 2:
        raise KernelError(f"matmul takes 2 or more inputs, got {len(args)}")
    *left, right = args
    if out.ndim != 2 or right.ndim != 2 or any(x.ndim != 2 for x in left):
        raise KernelError("matmul needs 2-D shapes on its inputs and output (give the "
                          "TaskGraph's vertices a shape)")
    if sum(x.shape[1] for x in left) != right.shape[0] or \
            any(x.shape[0] != out.shape[0] for x in left) or right.shape[1] != out.shape[1]:
        raise KernelError(f"matmul: shapes {[x.shape for x in left]} x {right.shape} do not "
                          f"give {out.shape}")
    row = 0
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if len(left) > 1 else None
    for k, x in enumerate(left):
        block = right[row:row + x.shape[1]]
        row += x.shape[1]
        if k == 0:
            xp.matmul(x, block, out=out)
        else:
            xp.matmul(x, block, out=partial)
            xp.add(out, partial, out=out)


def add(xp, out, args, scratch) -> None:
    """Elementwise sum (inputs of other lengths are folded or tiled onto the output)."""
    out.fill(0)
    for x in args:
        _accumulate(xp, out, x)


def mul(xp, out, args, scratch) -> None:
    """Elementwise product of inputs of the output's shape."""
    _same("mul", out, args)
    out.fill(1)
    for x in args:
        xp.multiply(out, x, out=out)


def relu(xp, out, args, scratch) -> None:
    _same("relu", out, args, 1)
    xp.maximum(args[0], 0, out=out)


def copy(xp, out, args, scratch) -> None:
    _same("copy", out, args, 1)
    xp.copyto(out, args[0])


def gelu(xp, out, args, scratch) -> None:
    """tanh approximation: ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    _same("gelu", out, args, 1)
    x = args[0]
    xp.multiply(x, x, out=out)
    xp.multiply(out, 0.044715, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, math.sqrt(2 / math.pi), out=out)
    xp.tanh(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, 0.5, out=out)


def silu(xp, out, args, scratch) -> None:
    """``x * sigmoid(x)``."""
    _same("silu", out, args, 1)
    x = args[0]
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.divide(x, out, out=out)


def softmax(xp, out, args, scratch) -> None:
    """Row-wise softmax over the last axis, stabilised by the row maximum."""
    _same("softmax", out, args, 1)
    x, y = _rows(args[0]), _rows(out)
    r, _ = _row_scratch(scratch, out)
    xp.max(x, axis=1, keepdims=True, out=r)
    xp.subtract(x, r, out=y)
    xp.exp(y, out=y)
    xp.sum(y, axis=1, keepdims=True, out=r)
    xp.divide(y, r, out=y)


def rmsnorm(xp, out, args, scratch) -> None:
    """``x / sqrt(mean(x^2) + eps) * g`` over the last axis (``g``, the gain, optional)."""
    _same("rmsnorm", out, args[:1])
    x, y = _rows(args[0]), _rows(out)
    r, _ = _row_scratch(scratch, out)
    xp.multiply(x, x, out=y)
    xp.mean(y, axis=1, keepdims=True, out=r)
    xp.add(r, NORM_EPS, out=r)
    xp.sqrt(r, out=r)
    xp.divide(x, r, out=y)
    _gain(xp, y, args[1:])


def layernorm(xp, out, args, scratch) -> None:
    """``(x - mean) / sqrt(var + eps) * g`` over the last axis (``g``, the gain, optional);
    ``var = mean(x^2) - mean^2``."""
    _same("layernorm", out, args[:1])
    x, y = _rows(args[0]), _rows(out)
    mean, r = _row_scratch(scratch, out)
    xp.mean(x, axis=1, keepdims=True, out=mean)
    xp.multiply(x, x, out=y)
    xp.mean(y, axis=1, keepdims=True, out=r)
    square = y[:, :1]
    xp.multiply(mean, mean, out=square)
    xp.subtract(r, square, out=r)
    xp.add(r, NORM_EPS, out=r)
    xp.sqrt(r, out=r)
    xp.subtract(x, mean, out=y)
    xp.divide(y, r, out=y)
    _gain(xp, y, args[1:])


def _gain(xp, y, gain: Sequence[Array]) -> None:
    if gain:
        g = gain[0].reshape(-1)
        if g.size != y.shape[1]:
            raise KernelError(f"norm gain has {g.size} elements, rows have {y.shape[1]}")
        xp.multiply(y, g, out=y)


def adam_update(xp, out, args, scratch) -> None:
    """One Adam step on ``w`` from its gradient ``g`` with fresh moments (``m = g``,
    ``v = g^2`` after bias correction): ``w - lr * g / (|g| + eps)``."""
    _same("adam_update", out, args, 2)
    w, g = args
    xp.abs(g, out=out)
    xp.add(out, ADAM_EPS, out=out)
    xp.divide(g, out, out=out)
    xp.multiply(out, -ADAM_LR, out=out)
    xp.add(out, w, out=out)


def sgd_update(xp, out, args, scratch) -> None:
    """``w - lr * g``."""
    _same("sgd_update", out, args, 2)
    w, g = args
    xp.multiply(g, -SGD_LR, out=out)
    xp.add(out, w, out=out)


KERNELS: dict[str, Kernel] = {
    "matmul": Kernel(matmul, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "add": Kernel(add),
    "mul": Kernel(mul),
    "relu": Kernel(relu),
    "gelu": Kernel(gelu),
    "silu": Kernel(silu),
    "softmax": Kernel(softmax, _row_bytes),
    "rmsnorm": Kernel(rmsnorm, _row_bytes),
    "layernorm": Kernel(layernorm, _row_bytes),
    "adam_update": Kernel(adam_update),
    "sgd_update": Kernel(sgd_update),
    "copy": Kernel(copy),
    "layer_forward": Kernel(combine),
    "layer_backward": Kernel(combine),
    "weight_grad": Kernel(combine),
    "mix": Kernel(combine),
}
assert set(KERNELS) == set(OPS), "every op of core.ops needs a kernel"


def kernel(op: str | None, vertex: str) -> Kernel:
    """The kernel of ``op``; KernelError naming ``vertex`` and the known ops if there is none."""
    found = KERNELS.get(op or "")
    if found is None:
        raise KernelError(f"vertex {vertex!r}: no kernel for op {op!r}; known ops: "
                          f"{', '.join(sorted(KERNELS))}")
    return found
