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

import functools
import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..core.errors import GraphError
from ..core.ops import FLOAT_DTYPES, GENERIC, OPS, OpError, op_name, parse_op
from ..core.registry import Registry

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
def _accumulate(xp, out: Array, x: Array, scratch: Array) -> None:
    """``out += fit(x)``, flat: ``x`` folded onto ``out`` when longer, tiled when shorter.
    A fold of up to :data:`FOLD_ROWS` rows of ``out``'s length adds them one by one in place;
    more rows are summed in one reduction into ``scratch`` (:func:`_fold_bytes`) first, so
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


def _same(op: str, out: Array, args: Sequence[Array], count: int | None = None) -> None:
    if count is not None and len(args) != count:
        raise KernelError(f"{op} takes {count} input(s), got {len(args)}")
    for x in args:
        if x.shape != out.shape:
            raise KernelError(f"{op}: input shape {x.shape} differs from output shape {out.shape}")


FOLD_ROWS = 16    # folds of more rows than this are one reduction (:func:`_accumulate`)


def _matmul_shards(xp, out: Array, left: Sequence[Array], right: Array,
                   scratch: Array) -> None:
    """``out = hstack(left) @ right``: each column shard of the left operand meets its rows of
    ``right``; the products after the first are summed through ``scratch``, and a block of
    ``right`` that is a strided slice is first copied into ``scratch`` (:func:`_dense`)."""
    row = 0
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if len(left) > 1 else None
    spare = scratch[aligned(out.nbytes) if len(left) > 1 else 0:]
    for k, x in enumerate(left):
        block = _dense(xp, right[row:row + x.shape[1]], spare)
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


def _strided(x: Array) -> bool:
    """A 2-D operand that is neither C- nor F-contiguous, which CuPy's matmul would copy into
    a fresh allocation before calling cuBLAS."""
    return not (x.flags.c_contiguous or x.flags.f_contiguous)


def _dense(xp, x: Array, scratch: Array) -> Array:
    """``x``, or a C-contiguous copy of it at the start of ``scratch`` if it is strided."""
    if not _strided(x):
        return x
    copy = scratch[:x.nbytes].view(x.dtype).reshape(x.shape)
    xp.copyto(copy, x)
    return copy


def _shard_bytes(left: Sequence[Array], right: Array) -> int:
    """Scratch of :func:`_matmul_shards`: the partial product's, then room for the largest
    strided block of ``right``."""
    row, block = 0, 0
    for x in left:
        piece = right[row:row + x.shape[1]]
        row += x.shape[1]
        if _strided(piece):
            block = max(block, piece.nbytes)
    return block


def _fold_bytes(out: Array, args: Sequence[Array]) -> int:
    """Scratch of :func:`_accumulate`: one output's worth where an input folds onto it in
    one reduction."""
    return out.nbytes if any(x.size > FOLD_ROWS * max(out.size, 1) for x in args) else 0


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
        _accumulate(xp, out, x, scratch)
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
    _matmul_shards(xp, out, left, right, scratch)


def add(xp, out, args, scratch) -> None:
    """Elementwise sum (inputs of other lengths are folded or tiled onto the output)."""
    out.fill(0)
    for x in args:
        _accumulate(xp, out, x, scratch)


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


def cast(xp, out, args, scratch) -> None:
    """``x`` converted to ``out``'s floating-point dtype, rounded to nearest (``astype``);
    ``x`` may have another shape with as many elements (read in order)."""
    if len(args) != 1 or args[0].size != out.size:
        raise KernelError(f"cast takes one input of the output's {out.size} elements, got "
                          f"{[x.shape for x in args]}")
    x = args[0]
    if {x.dtype.name, out.dtype.name} - set(FLOAT_DTYPES):
        raise KernelError(f"cast converts between {', '.join(FLOAT_DTYPES)}, not "
                          f"{x.dtype.name} to {out.dtype.name}")
    xp.copyto(out, x.reshape(out.shape))


def gelu(xp, out, args, scratch) -> None:
    """tanh approximation: ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    _same("gelu", out, args, 1)
    x = args[0]
    _gelu_tanh(xp, out, x)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, 0.5, out=out)


GELU_A, GELU_C = 0.044715, math.sqrt(2 / math.pi)


def _gelu_tanh(xp, t, x) -> None:
    """``t = tanh(c (x + a x^3))``, ``c = sqrt(2/pi)``, ``a = 0.044715``."""
    xp.multiply(x, x, out=t)
    xp.multiply(t, GELU_A, out=t)
    xp.add(t, 1.0, out=t)
    xp.multiply(t, x, out=t)
    xp.multiply(t, GELU_C, out=t)
    xp.tanh(t, out=t)


def gelu_backward(xp, out, args, scratch) -> None:
    """The derivative of :func:`gelu`'s formula times ``dy``: with ``t = tanh(u)``,
    ``u' = c (1 + 3a x^2)``, ``(1 + t)/2 + x (1 - t^2) u'/2 = (1 + t) (1 + x u' (1 - t)) / 2``."""
    _same("gelu_backward", out, args, 2)
    x, dy = args
    t = scratch[:out.nbytes].view(out.dtype).reshape(out.shape)
    _gelu_tanh(xp, t, x)
    xp.multiply(x, x, out=out)
    xp.multiply(out, 3 * GELU_A, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, GELU_C, out=out)               # x u'
    xp.subtract(1.0, t, out=t)
    xp.multiply(out, t, out=out)
    xp.add(out, 1.0, out=out)                       # 1 + x u' (1 - t)
    xp.subtract(2.0, t, out=t)                      # 1 + t, exact from 1 - t
    xp.multiply(out, t, out=out)
    xp.multiply(out, 0.5, out=out)
    xp.multiply(out, dy, out=out)


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
    _layernorm_stats(xp, x, y, mean, r)
    xp.subtract(x, mean, out=y)
    xp.divide(y, r, out=y)
    _gain(xp, y, args[1:])


def _layernorm_stats(xp, x, y, mean, r) -> None:
    """The row ``mean`` and ``r = sqrt(mean(x^2) - mean^2 + eps)`` of ``x``, ``y`` a
    workspace of its shape."""
    xp.mean(x, axis=1, keepdims=True, out=mean)
    xp.multiply(x, x, out=y)
    xp.mean(y, axis=1, keepdims=True, out=r)
    square = y[:, :1]
    xp.multiply(mean, mean, out=square)
    xp.subtract(r, square, out=r)
    xp.add(r, NORM_EPS, out=r)
    xp.sqrt(r, out=r)


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


def linear(xp, out, args, scratch) -> None:
    """``hstack(args[:-1]) @ args[-1]^T``: ``x W^T`` with ``W`` stored ``(out, in)``; the
    left operand may come as column shards (each then meets its columns of ``W``)."""
    if len(args) < 2:
        raise KernelError(f"linear takes 2 or more inputs, got {len(args)}")
    *left, w = args
    if out.ndim != 2 or w.ndim != 2 or any(x.ndim != 2 for x in left):
        raise KernelError("linear needs 2-D shapes on its inputs and output")
    if sum(x.shape[1] for x in left) != w.shape[1] or w.shape[0] != out.shape[1] or \
            any(x.shape[0] != out.shape[0] for x in left):
        raise KernelError(f"linear: shapes {[x.shape for x in left]} x {w.shape}^T do not "
                          f"give {out.shape}")
    _matmul_shards(xp, out, left, w.T, scratch)


def swiglu(xp, out, args, scratch) -> None:
    """``silu(gate) * up`` (LLaMA's MLP)."""
    _same("swiglu", out, args, 2)
    gate, up = args
    xp.negative(gate, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.divide(gate, out, out=out)
    xp.multiply(out, up, out=out)


def embedding(xp, out, args, scratch) -> None:
    """``table[ids]``, ids taken modulo the table's rows (NumPy's ``mode="wrap"``, which is
    also what CuPy's ``take`` does)."""
    if len(args) != 2:
        raise KernelError(f"embedding takes ids and a table, got {len(args)} inputs")
    ids, table = args
    if table.ndim != 2 or out.shape != (*ids.shape, table.shape[1]):
        raise KernelError(f"embedding: ids {ids.shape} into a table {table.shape} do not give "
                          f"{out.shape}")
    if xp is np:
        np.take(table, ids, axis=0, out=out, mode="wrap")
    else:
        xp.take(table, ids, axis=0, out=out)


def embedding_backward(xp, out, args, scratch) -> None:
    """``dtable``: zero, then each row of ``dy`` added at row ``id mod rows`` (repeated ids
    add up), the gradient of :func:`embedding`; the wrapped ids go to ``scratch``."""
    if len(args) != 2:
        raise KernelError(f"embedding_backward takes ids and dy, got {len(args)} inputs")
    ids, dy = args
    if ids.dtype.kind not in "iu":
        raise KernelError(f"embedding_backward: ids must be integers, got {ids.dtype}")
    if out.ndim != 2 or dy.shape != (*ids.shape, out.shape[1]):
        raise KernelError(f"embedding_backward: ids {ids.shape} and dy {dy.shape} do not give "
                          f"a table {out.shape}")
    rows = scratch[:ids.size * 8].view(np.int64)
    xp.remainder(ids.reshape(-1), out.shape[0], out=rows)
    out.fill(0)
    if xp is np:
        np.add.at(out, rows, dy.reshape(-1, out.shape[1]))
    else:
        import cupyx
        cupyx.scatter_add(out, rows, dy.reshape(-1, out.shape[1]))


ROPE_BASE = 10000.0


def _compute_dtype(out: Array) -> Any:
    return np.float64 if out.dtype == np.float64 else np.float32


def _counting(xp, v: Array) -> Array:
    """``v`` (1-D) filled with 1, 2, ..., len(v), allocating nothing: on NumPy by doubling
    (``v[k:2k] = v[:k] + k``, disjoint halves: a cumulative sum in place copies its input
    first); on CuPy, whose ``cumsum`` allocates, by an elementwise kernel of the index."""
    if xp is not np:
        _index_kernel(xp)(v)
        return v
    if v.size:
        v[0] = 1
    k = 1
    while k < v.size:
        step = min(k, v.size - k)
        np.add(v[:step], k, out=v[k:k + step])
        k += step
    return v


@functools.cache
def _index_kernel(xp) -> Any:
    """CuPy's ``v[i] = i + 1`` (compiled once per process, on first use: the executor runs
    every kernel once before the clock starts)."""
    return xp.ElementwiseKernel("", "T v", "v = (T)(i + 1)", "offloadlab_counting")


def _rotary_scratch(out: Array, args: Sequence[Array]) -> int:
    rows, half = _rows(out).shape[0], out.shape[-1] // 2
    return (rows + half + 2 * rows * half) * np.dtype(_compute_dtype(out)).itemsize + \
        rows * half * out.dtype.itemsize


def rotary(xp, out, args, scratch, offset: int = 0) -> None:
    """Rotary position embedding (Su et al. 2021) of rows at positions ``offset + r``, in the
    half-split layout of Hugging Face's LLaMA: with ``x = [x1, x2]`` and angles
    ``(offset + r) * base^(-2i/dh)``, ``out = [x1 cos - x2 sin, x2 cos + x1 sin]``, the angles
    in float32 (float64 for float64 tensors) as there."""
    _same("rotary", out, args, 1)
    if out.ndim != 2 or out.shape[1] % 2:
        raise KernelError(f"rotary needs (rows, head_dim) with an even head_dim, got {out.shape}")
    rows, dim = out.shape
    half = dim // 2
    ct = _compute_dtype(out)
    size = np.dtype(ct).itemsize
    at = 0

    def take(n: int, dtype: Any, item: int) -> Array:
        nonlocal at
        piece = scratch[at:at + n * item].view(dtype)
        at += n * item
        return piece

    pos = _counting(xp, take(rows, ct, size))
    xp.add(pos, offset - 1.0, out=pos)
    inv = _counting(xp, take(half, ct, size))
    xp.multiply(inv, -2.0 * math.log(ROPE_BASE) / dim, out=inv)     # i = 1..half
    xp.add(inv, 2.0 * math.log(ROPE_BASE) / dim, out=inv)           # -2(i-1) ln(base)/dim
    xp.exp(inv, out=inv)
    cos = take(rows * half, ct, size).reshape(rows, half)
    sin = take(rows * half, ct, size).reshape(rows, half)
    xp.multiply(pos[:, None], inv[None, :], out=sin)
    xp.cos(sin, out=cos)
    xp.sin(sin, out=sin)
    tmp = take(rows * half, out.dtype, out.dtype.itemsize).reshape(rows, half)
    x = args[0]
    x1, x2, o1, o2 = x[:, :half], x[:, half:], out[:, :half], out[:, half:]
    xp.multiply(x1, cos, out=o1)
    xp.multiply(x2, sin, out=tmp)
    xp.subtract(o1, tmp, out=o1)
    xp.multiply(x2, cos, out=o2)
    xp.multiply(x1, sin, out=tmp)
    xp.add(o2, tmp, out=o2)


def attn_scores(xp, out, args, scratch) -> None:
    """``Q K^T / sqrt(dh)`` for one head: a query block ``(bq, dh)`` against a key block
    ``(bk, dh)``."""
    if len(args) != 2:
        raise KernelError(f"attn_scores takes Q and K, got {len(args)} inputs")
    q, k = args
    if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1] or \
            out.shape != (q.shape[0], k.shape[0]):
        raise KernelError(f"attn_scores: {q.shape} x {k.shape}^T do not give {out.shape}")
    xp.matmul(q, k.T, out=out)
    xp.multiply(out, 1.0 / math.sqrt(q.shape[1]), out=out)


def _mask_bytes(rows: int, cols: int, ct: Any) -> int:
    size = np.dtype(ct).itemsize
    return rows * cols * (2 * size + 1) + (cols + 4 * rows) * size


class _Masked:
    """Buffers in a kernel's scratch for masked score blocks of up to ``rows x cols``: the
    block in the compute dtype, key-minus-query index differences, key and query counters,
    three row columns, and the mask (last, so that every float buffer stays aligned)."""

    def __init__(self, xp, scratch: Array, rows: int, cols: int, ct: Any) -> None:
        size = np.dtype(ct).itemsize
        n = rows * cols
        self.xp = xp
        floats = scratch[:(2 * n + cols + 4 * rows) * size].view(ct)
        self.t = floats[:n].reshape(rows, cols)
        self.diff = floats[n:2 * n].reshape(rows, cols)
        self.keys = floats[2 * n:2 * n + cols]
        self.queries = floats[2 * n + cols:2 * n + cols + rows].reshape(rows, 1)
        first = 2 * n + cols + rows
        self.cols = [floats[first + i * rows:first + (i + 1) * rows].reshape(rows, 1)
                     for i in range(3)]
        start = (2 * n + cols + 4 * rows) * size
        self.mask = scratch[start:start + n].view(np.bool_).reshape(rows, cols)

    def load(self, s: Array, q0: int, k0: int, fill: float) -> Array:
        """The block ``s`` in the compute dtype, ``fill`` where key ``k0 + c`` is past query
        ``q0 + r``; returns its view in scratch."""
        xp, (bq, bk) = self.xp, s.shape
        t = self.t.reshape(-1)[:bq * bk].reshape(bq, bk)
        xp.copyto(t, s)
        if k0 + bk - 1 > q0:                        # some key is past some query
            diff = self.diff.reshape(-1)[:bq * bk].reshape(bq, bk)
            mask = self.mask.reshape(-1)[:bq * bk].reshape(bq, bk)
            keys, queries = _counting(self.xp, self.keys[:bk]), self.queries[:bq]
            _counting(xp, queries.reshape(-1))
            xp.subtract(keys[None, :], queries, out=diff)       # c - r
            xp.greater(diff, q0 - k0, out=mask)
            xp.copyto(t, fill, where=mask)
        return t


def _key_offsets(k0: int, blocks: Sequence[Array]) -> list[int]:
    return np.cumsum([k0] + [b.shape[1] for b in blocks]).tolist()[:-1]


def softmax_stats(xp, out, args, scratch, q0: int = 0, k0: int = 0) -> None:
    """The causal softmax's statistics for a query block (rows at ``q0``...) over its key
    blocks (the inputs, keys ``k0``... in order): ``out[:, 0]`` the row maximum, ``out[:, 1]``
    the row sum of ``exp(s - max)``, keys past a query masked out (a block wholly past the
    query block is skipped)."""
    if not args or out.ndim != 2 or out.shape[1] != 2 or \
            any(a.ndim != 2 or a.shape[0] != out.shape[0] for a in args):
        raise KernelError(f"softmax_stats: score blocks {[a.shape for a in args]} do not give "
                          f"(rows, 2) statistics {out.shape}")
    rows = out.shape[0]
    work = _Masked(xp, scratch, rows, max(a.shape[1] for a in args), _compute_dtype(out))
    m, part, total = work.cols
    m.fill(-np.inf)
    total.fill(0)
    visible = [(b, kj) for b, kj in zip(args, _key_offsets(k0, args)) if kj <= q0 + rows - 1]
    for b, kj in visible:
        t = work.load(b, q0, kj, -np.inf)
        xp.max(t, axis=1, keepdims=True, out=part)
        xp.maximum(m, part, out=m)
    for b, kj in visible:
        t = work.load(b, q0, kj, -np.inf)
        xp.subtract(t, m, out=t)
        xp.exp(t, out=t)
        xp.sum(t, axis=1, keepdims=True, out=part)
        xp.add(total, part, out=total)
    xp.copyto(out[:, :1], m)
    xp.copyto(out[:, 1:], total)


def _stats_scratch(out: Array, args: Sequence[Array]) -> int:
    return _mask_bytes(out.shape[0], max(a.shape[1] for a in args), _compute_dtype(out))


def causal_softmax(xp, out, args, scratch, q0: int = 0, k0: int = 0) -> None:
    """A key block's probabilities ``exp(s - max) / sum`` from the row statistics (second
    input, :func:`softmax_stats`), zero where key ``k0 + c`` is past query ``q0 + r``."""
    if len(args) != 2:
        raise KernelError(f"causal_softmax takes a score block and its statistics, got "
                          f"{len(args)} inputs")
    s, stats = args
    if s.ndim != 2 or out.shape != s.shape or stats.shape != (s.shape[0], 2):
        raise KernelError(f"causal_softmax: scores {s.shape} with statistics {stats.shape} do "
                          f"not give {out.shape}")
    work = _Masked(xp, scratch, s.shape[0], s.shape[1], _compute_dtype(out))
    t = work.load(s, q0, k0, -np.inf)
    xp.subtract(t, stats[:, :1], out=t)
    xp.exp(t, out=t)
    xp.divide(t, stats[:, 1:], out=t)
    xp.copyto(out, t)


def _softmax_scratch(out: Array, args: Sequence[Array]) -> int:
    return _mask_bytes(args[0].shape[0], args[0].shape[-1], _compute_dtype(out))


def attn_values(xp, out, args, scratch) -> None:
    """``sum_j P_j V_j`` for one head: inputs ``P_0..P_{n-1}`` then ``V_0..V_{n-1}``."""
    n = len(args) // 2
    if not n or len(args) % 2:
        raise KernelError(f"attn_values takes probability blocks then as many value blocks, "
                          f"got {len(args)} inputs")
    for p, v in zip(args[:n], args[n:]):
        if p.ndim != 2 or v.ndim != 2 or p.shape[1] != v.shape[0] or \
                (p.shape[0], v.shape[1]) != out.shape:
            raise KernelError(f"attn_values: {p.shape} x {v.shape} do not give {out.shape}")
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if n > 1 else None
    spare = scratch[aligned(out.nbytes) if n > 1 else 0:]
    xp.matmul(args[0], _dense(xp, args[n], spare), out=out)
    for p, v in zip(args[1:n], args[n + 1:]):
        xp.matmul(p, _dense(xp, v, spare), out=partial)
        xp.add(out, partial, out=out)


def _values_bytes(out: Array, args: Sequence[Array]) -> int:
    """Scratch of :func:`attn_values`: the partial product's where there are several pairs,
    then room for the largest strided value block (:func:`linear_dx`'s column slices)."""
    n = len(args) // 2
    strided = max((v.nbytes for v in args[n:] if v.ndim == 2 and _strided(v)), default=0)
    return (aligned(out.nbytes) if n > 1 else 0) + strided


# -- backward (LoRA training) -----------------------------------------------------------------
def _pairs(op: str, args: Sequence[Array]) -> int:
    n = len(args) // 2
    if not n or len(args) % 2 or any(a.ndim != 2 for a in args):
        raise KernelError(f"{op} takes 2-D gradient blocks then as many 2-D operands, got "
                          f"{[a.shape for a in args]}")
    return n


def lora_linear(xp, out, args, scratch) -> None:
    """``x W^T + u B^T`` (a frozen linear layer and its LoRA adapter, ``u = x A^T``)."""
    if len(args) != 4:
        raise KernelError(f"lora_linear takes x, W, u and B, got {len(args)} inputs")
    x, w, u, b = args
    if any(a.ndim != 2 for a in args) or x.shape[1] != w.shape[1] or u.shape[1] != b.shape[1] \
            or out.shape != (x.shape[0], w.shape[0]) or (u.shape[0], b.shape[0]) != out.shape:
        raise KernelError(f"lora_linear: {x.shape} x {w.shape}^T + {u.shape} x {b.shape}^T do "
                          f"not give {out.shape}")
    xp.matmul(x, w.T, out=out)
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape)
    xp.matmul(u, b.T, out=partial)
    xp.add(out, partial, out=out)


def linear_dx(xp, out, args, scratch, col0: int = 0) -> None:
    """``sum_i dY_i W_i[:, col0:col0 + n]``: the input gradient of ``x W^T``."""
    attn_values(xp, out, _dx_operands(args, out, col0), scratch)


def _dx_operands(args: Sequence[Array], out: Array, col0: int = 0) -> list[Array]:
    """:func:`linear_dx`'s blocks ``dY_i`` and the column slices ``W_i[:, col0:col0 + n]``."""
    n = _pairs("linear_dx", args)
    return [*args[:n], *(w[:, col0:col0 + out.shape[1]] for w in args[n:])]


def linear_dw(xp, out, args, scratch) -> None:
    """``sum_i dY_i^T X_i``: the weight gradient of ``x W^T`` over row blocks."""
    n = _pairs("linear_dw", args)
    for dy, x in zip(args[:n], args[n:]):
        if dy.shape[0] != x.shape[0] or (dy.shape[1], x.shape[1]) != out.shape:
            raise KernelError(f"linear_dw: {dy.shape}^T x {x.shape} do not give {out.shape}")
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if n > 1 else None
    xp.matmul(args[0].T, args[n], out=out)
    for dy, x in zip(args[1:n], args[n + 1:]):
        xp.matmul(dy.T, x, out=partial)
        xp.add(out, partial, out=out)


def rmsnorm_backward(xp, out, args, scratch) -> None:
    """``dx = (g dy) / r - x sum(g dy x) / (n r^3)``, ``r = sqrt(mean(x^2) + eps)``."""
    if len(args) != 3:
        raise KernelError(f"rmsnorm_backward takes x, the gain and dy, got {len(args)} inputs")
    x, g, dy = args
    _same("rmsnorm_backward", out, [x, dy])
    x2, y, d2 = _rows(x), _rows(out), _rows(dy)
    r, c = _row_scratch(scratch, out)
    xp.multiply(x2, x2, out=y)
    xp.mean(y, axis=1, keepdims=True, out=r)
    xp.add(r, NORM_EPS, out=r)
    xp.sqrt(r, out=r)                                   # r
    xp.multiply(d2, g.reshape(-1), out=y)               # g dy
    xp.multiply(y, x2, out=y)
    xp.sum(y, axis=1, keepdims=True, out=c)             # sum(g dy x)
    xp.divide(c, r, out=c)
    xp.divide(c, r, out=c)
    xp.divide(c, x2.shape[1], out=c)                    # sum(g dy x) / (n r^2)
    xp.multiply(x2, c, out=y)                           # x c; out = (g dy - x c) / r
    xp.negative(y, out=y)
    tmp = scratch[2 * r.nbytes:2 * r.nbytes + y.nbytes].view(out.dtype).reshape(y.shape)
    xp.multiply(d2, g.reshape(-1), out=tmp)
    xp.add(y, tmp, out=y)
    xp.divide(y, r, out=y)


def layernorm_backward(xp, out, args, scratch) -> None:
    """``dx = (z - mean(z)) / r``, ``z = g dy - xhat mean(g dy xhat)``, ``xhat = (x - mean) /
    r``: the usual ``(g dy - mean(g dy) - xhat mean(g dy xhat)) / r``, as ``mean(xhat) = 0``."""
    if len(args) not in (2, 3):
        raise KernelError(f"layernorm_backward takes x, the optional gain and dy, got "
                          f"{len(args)} inputs")
    x, *gain, dy = args
    _same("layernorm_backward", out, [x, dy])
    x2, y, d2 = _rows(x), _rows(out), _rows(dy)
    xhat, c, r = _layernorm_xhat(xp, x2, out, scratch)
    _gain_dy(xp, y, d2, gain)
    xp.multiply(y, xhat, out=y)
    xp.mean(y, axis=1, keepdims=True, out=c)
    xp.multiply(xhat, c, out=xhat)                  # xhat mean(g dy xhat)
    _gain_dy(xp, y, d2, gain)
    xp.subtract(y, xhat, out=y)                     # z
    xp.mean(y, axis=1, keepdims=True, out=c)
    xp.subtract(y, c, out=y)
    xp.divide(y, r, out=y)


def _layernorm_xhat(xp, x2: Array, like: Array, scratch: Array) -> tuple[Array, Array, Array]:
    """``xhat = (x - mean) / r`` of the rows ``x2`` in ``scratch`` (:func:`_norm_backward_scratch`
    of ``like``, whose rows and dtype it takes), and the row ``mean`` and ``r`` beside it."""
    mean, r = _row_scratch(scratch, like)
    xhat = scratch[2 * r.nbytes:2 * r.nbytes + x2.size * like.dtype.itemsize]
    xhat = xhat.view(like.dtype).reshape(x2.shape)
    _layernorm_stats(xp, x2, xhat, mean, r)
    xp.subtract(x2, mean, out=xhat)
    xp.divide(xhat, r, out=xhat)
    return xhat, mean, r


def layernorm_dgain(xp, out, args, scratch) -> None:
    """``dg = sum over rows of dy xhat``: the gain's gradient of ``layernorm`` (inputs x, dy)."""
    if len(args) != 2:
        raise KernelError(f"layernorm_dgain takes x and dy, got {len(args)} inputs")
    x, dy = args
    if x.shape != dy.shape or out.shape != (x.shape[-1],):
        raise KernelError(f"layernorm_dgain: x {x.shape} and dy {dy.shape} do not give "
                          f"{out.shape}")
    xhat, _, _ = _layernorm_xhat(xp, _rows(x), x, scratch)
    xp.multiply(xhat, _rows(dy), out=xhat)
    xp.sum(xhat, axis=0, out=out)


def layernorm_dbias(xp, out, args, scratch) -> None:
    """``db = sum over rows of dy``: the bias's gradient of ``layernorm(x) + b``."""
    if len(args) != 1 or out.shape != (args[0].shape[-1],):
        raise KernelError(f"layernorm_dbias takes dy and gives one value per column, got "
                          f"inputs {[a.shape for a in args]} for {out.shape}")
    xp.sum(_rows(args[0]), axis=0, out=out)


def _gain_dy(xp, y, dy, gain: Sequence[Array]) -> None:
    xp.copyto(y, dy)
    _gain(xp, y, gain)


def _norm_backward_scratch(out: Array, args: Sequence[Array]) -> int:
    return _row_bytes(out, args) + out.nbytes


def _sigmoid(xp, s, gate) -> None:
    xp.negative(gate, out=s)
    xp.exp(s, out=s)
    xp.add(s, 1.0, out=s)
    xp.reciprocal(s, out=s)


def swiglu_dgate(xp, out, args, scratch) -> None:
    """``dy up s (1 + gate (1 - s))``, ``s = sigmoid(gate)``."""
    _same("swiglu_dgate", out, args, 3)
    gate, up, dy = args
    _silu_grad(xp, out, gate, scratch)
    xp.multiply(out, up, out=out)
    xp.multiply(out, dy, out=out)


def _silu_grad(xp, out, x, scratch) -> None:
    """``silu'(x) = s (1 + x (1 - s))``, ``s = sigmoid(x)`` in ``scratch``."""
    s = scratch[:out.nbytes].view(out.dtype).reshape(out.shape)
    _sigmoid(xp, s, x)
    xp.subtract(1.0, s, out=out)
    xp.multiply(out, x, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, s, out=out)


def silu_backward(xp, out, args, scratch) -> None:
    """``silu'(x) dy``."""
    _same("silu_backward", out, args, 2)
    x, dy = args
    _silu_grad(xp, out, x, scratch)
    xp.multiply(out, dy, out=out)


def swiglu_dup(xp, out, args, scratch) -> None:
    """``silu(gate) dy``."""
    _same("swiglu_dup", out, args, 3)
    gate, _, dy = args
    _sigmoid(xp, out, gate)
    xp.multiply(out, gate, out=out)
    xp.multiply(out, dy, out=out)


def rotary_backward(xp, out, args, scratch, offset: int = 0) -> None:
    """The transpose of :func:`rotary`, the rotation by the opposite angles:
    ``[d1 cos + d2 sin, d2 cos - d1 sin]``, computed as ``rotary([d1, -d2])`` with its second
    half negated."""
    _same("rotary_backward", out, args, 1)
    if out.ndim != 2 or out.shape[1] % 2:
        raise KernelError(f"rotary_backward needs (rows, head_dim) with an even head_dim, got "
                          f"{out.shape}")
    half = out.shape[1] // 2
    e = scratch[_rotary_scratch(out, args):][:out.nbytes].view(out.dtype).reshape(out.shape)
    d = args[0]
    xp.copyto(e[:, :half], d[:, :half])
    xp.negative(d[:, half:], out=e[:, half:])
    rotary(xp, out, [e], scratch, offset)
    second = out[:, half:]
    xp.negative(second, out=second)


def _rotary_backward_scratch(out: Array, args: Sequence[Array]) -> int:
    return _rotary_scratch(out, args) + out.nbytes


def attn_dprobs(xp, out, args, scratch) -> None:
    """``dO V^T`` for one head, a query block against a key block."""
    if len(args) != 2:
        raise KernelError(f"attn_dprobs takes dO and V, got {len(args)} inputs")
    do, v = args
    if out.shape != (do.shape[0], v.shape[0]) or do.shape[1] != v.shape[1]:
        raise KernelError(f"attn_dprobs: {do.shape} x {v.shape}^T do not give {out.shape}")
    xp.matmul(do, v.T, out=out)


def attn_delta(xp, out, args, scratch) -> None:
    """``rowsum(dO * O)`` as a column."""
    if len(args) != 2:
        raise KernelError(f"attn_delta takes dO and O, got {len(args)} inputs")
    do, o = args
    if do.shape != o.shape or out.shape != (do.shape[0], 1):
        raise KernelError(f"attn_delta: {do.shape} and {o.shape} do not give {out.shape}")
    prod = scratch[:do.size * out.dtype.itemsize].view(out.dtype).reshape(do.shape)
    xp.multiply(do, o, out=prod)
    xp.sum(prod, axis=1, keepdims=True, out=out)


def softmax_backward(xp, out, args, scratch) -> None:
    """``P (dP - delta)``."""
    if len(args) != 3:
        raise KernelError(f"softmax_backward takes P, dP and delta, got {len(args)} inputs")
    p, dp, delta = args
    _same("softmax_backward", out, [p, dp])
    xp.subtract(dp, delta, out=out)
    xp.multiply(out, p, out=out)


def attn_dq(xp, out, args, scratch) -> None:
    """``sum_j dS_j K_j / sqrt(dh)``."""
    attn_values(xp, out, args, scratch)
    xp.multiply(out, 1.0 / math.sqrt(out.shape[1]), out=out)


def attn_dk(xp, out, args, scratch) -> None:
    """``sum_i dS_i^T Q_i / sqrt(dh)``."""
    linear_dw(xp, out, args, scratch)
    xp.multiply(out, 1.0 / math.sqrt(out.shape[1]), out=out)


def _ce_check(op: str, out: Array, args: Sequence[Array]) -> tuple[Array, Array]:
    if len(args) != 2:
        raise KernelError(f"{op} takes logits and labels, got {len(args)} inputs")
    logits, labels = args
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise KernelError(f"{op}: logits {logits.shape} and labels {labels.shape} do not fit")
    return logits, labels


def _log_softmax(xp, logits: Array, labels: Array, scratch: Array) -> tuple[Array, Array, Array]:
    """In scratch: ``logits - logsumexp`` (rows, vocab) in the compute dtype, the flat
    indices ``r vocab + label_r mod vocab`` of the labels' logits, and a row column."""
    rows, vocab = logits.shape
    ct = _compute_dtype(logits)
    size = np.dtype(ct).itemsize
    idx = scratch[:rows * 8].view(np.int64)
    base = scratch[rows * 8:rows * 16].view(np.int64)
    floats = scratch[rows * 16:rows * 16 + (rows * vocab + rows) * size].view(ct)
    t, col = floats[:rows * vocab].reshape(rows, vocab), floats[rows * vocab:]
    xp.remainder(labels, vocab, out=idx)
    _counting(xp, base)
    xp.subtract(base, 1, out=base)
    xp.multiply(base, vocab, out=base)
    xp.add(idx, base, out=idx)
    lse = col.reshape(rows, 1)
    xp.copyto(t, logits)
    xp.max(t, axis=1, keepdims=True, out=lse)
    xp.subtract(t, lse, out=t)
    xp.exp(t, out=t)
    xp.sum(t, axis=1, keepdims=True, out=lse)
    xp.log(t, out=t)
    xp.log(lse, out=lse)
    xp.subtract(t, lse, out=t)
    return t, idx, col


def _ce_scratch(out: Array, args: Sequence[Array]) -> int:
    rows, vocab = args[0].shape
    return rows * 16 + (rows * vocab + rows) * np.dtype(_compute_dtype(args[0])).itemsize


def cross_entropy(xp, out, args, scratch, tokens: int = 1) -> None:
    """``sum_r (logsumexp(logits_r) - logits_r[label_r]) / tokens``, shape (1,); labels are
    taken modulo the vocabulary."""
    logits, labels = _ce_check("cross_entropy", out, args)
    if out.shape != (1,):
        raise KernelError(f"cross_entropy writes shape (1,), not {out.shape}")
    t, idx, col = _log_softmax(xp, logits, labels, scratch)
    xp.take(t.reshape(-1), idx, out=col)
    xp.sum(col, keepdims=True, out=out)
    xp.multiply(out, -1.0 / tokens, out=out)


def cross_entropy_backward(xp, out, args, scratch, tokens: int = 1) -> None:
    """``(softmax(logits) - onehot(label)) / tokens``."""
    logits, labels = _ce_check("cross_entropy_backward", out, args)
    if out.shape != logits.shape:
        raise KernelError(f"cross_entropy_backward: logits {logits.shape} do not give "
                          f"{out.shape}")
    t, idx, col = _log_softmax(xp, logits, labels, scratch)
    xp.exp(t, out=t)
    xp.take(t.reshape(-1), idx, out=col)
    xp.subtract(col, 1.0, out=col)
    xp.put(t.reshape(-1), idx, col)
    xp.multiply(t, 1.0 / tokens, out=t)
    xp.copyto(out, t)


KERNELS: Registry[Kernel] = Registry("kernel", error=KernelError, listed="known ops", sort=True,
                                    within=OPS)
"""Each op's kernel, registered against the op's name (:data:`~offloadlab.core.ops.OPS`);
every op but ``generic`` has one (tests/test_kernel_cases.py)."""
KERNELS.update({
    "linear": Kernel(linear, lambda out, args: (aligned(out.nbytes) if len(args) > 2 else 0)
                     + _shard_bytes(args[:-1], args[-1].T)),
    "swiglu": Kernel(swiglu),
    "embedding": Kernel(embedding),
    "embedding_backward": Kernel(embedding_backward, lambda out, args: args[0].size * 8),
    "rotary": Kernel(rotary, _rotary_scratch),
    "attn_scores": Kernel(attn_scores),
    "softmax_stats": Kernel(softmax_stats, _stats_scratch),
    "causal_softmax": Kernel(causal_softmax, _softmax_scratch),
    "attn_values": Kernel(attn_values, _values_bytes),
    "matmul": Kernel(matmul, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "add": Kernel(add, _fold_bytes),
    "mul": Kernel(mul),
    "relu": Kernel(relu),
    "gelu": Kernel(gelu),
    "silu": Kernel(silu),
    "softmax": Kernel(softmax, _row_bytes),
    "rmsnorm": Kernel(rmsnorm, _row_bytes),
    "layernorm": Kernel(layernorm, _row_bytes),
    "lora_linear": Kernel(lora_linear, lambda out, args: out.nbytes),
    "linear_dx": Kernel(linear_dx, lambda out, args: _values_bytes(out, _dx_operands(args, out))),
    "linear_dw": Kernel(linear_dw, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "rmsnorm_backward": Kernel(rmsnorm_backward, _norm_backward_scratch),
    "swiglu_dgate": Kernel(swiglu_dgate, lambda out, args: out.nbytes),
    "swiglu_dup": Kernel(swiglu_dup),
    "gelu_backward": Kernel(gelu_backward, lambda out, args: out.nbytes),
    "silu_backward": Kernel(silu_backward, lambda out, args: out.nbytes),
    "layernorm_backward": Kernel(layernorm_backward, _norm_backward_scratch),
    "layernorm_dgain": Kernel(layernorm_dgain,
                              lambda out, args: _norm_backward_scratch(args[0], args)),
    "layernorm_dbias": Kernel(layernorm_dbias),
    "rotary_backward": Kernel(rotary_backward, _rotary_backward_scratch),
    "attn_dprobs": Kernel(attn_dprobs),
    "attn_delta": Kernel(attn_delta, lambda out, args: args[0].size * out.dtype.itemsize),
    "softmax_backward": Kernel(softmax_backward),
    "attn_dq": Kernel(attn_dq, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "attn_dk": Kernel(attn_dk, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "attn_dv": Kernel(linear_dw, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "cross_entropy": Kernel(cross_entropy, _ce_scratch),
    "cross_entropy_backward": Kernel(cross_entropy_backward, _ce_scratch),
    "adam_update": Kernel(adam_update),
    "sgd_update": Kernel(sgd_update),
    "copy": Kernel(copy),
    "cast": Kernel(cast),
    "layer_forward": Kernel(combine, _fold_bytes),
    "layer_backward": Kernel(combine, _fold_bytes),
    "weight_grad": Kernel(combine, _fold_bytes),
    "mix": Kernel(combine, _fold_bytes),
})


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
