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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..core.errors import GraphError
from ..core.ops import OPS, OpError, parse_op

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
    col = 0
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if len(left) > 1 else None
    for k, x in enumerate(left):
        block = w[:, col:col + x.shape[1]].T
        col += x.shape[1]
        if k == 0:
            xp.matmul(x, block, out=out)
        else:
            xp.matmul(x, block, out=partial)
            xp.add(out, partial, out=out)


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


ROPE_BASE = 10000.0


def _compute_dtype(out: Array) -> Any:
    return np.float64 if out.dtype == np.float64 else np.float32


def _counting(xp, v: Array) -> Array:
    """``v`` filled with 1, 2, ..., len(v) (no allocation: a cumulative sum in place)."""
    v.fill(1)
    xp.cumsum(v, out=v)
    return v


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
    xp.matmul(args[0], args[n], out=out)
    for p, v in zip(args[1:n], args[n + 1:]):
        xp.matmul(p, v, out=partial)
        xp.add(out, partial, out=out)


KERNELS: dict[str, Kernel] = {
    "linear": Kernel(linear, lambda out, args: out.nbytes if len(args) > 2 else 0),
    "swiglu": Kernel(swiglu),
    "embedding": Kernel(embedding),
    "rotary": Kernel(rotary, _rotary_scratch),
    "attn_scores": Kernel(attn_scores),
    "softmax_stats": Kernel(softmax_stats, _stats_scratch),
    "causal_softmax": Kernel(causal_softmax, _softmax_scratch),
    "attn_values": Kernel(attn_values, lambda out, args: out.nbytes if len(args) > 2 else 0),
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
                          f"{', '.join(sorted(KERNELS))}")
    return _bound(found, params)


@lru_cache(maxsize=4096)
def _bound(k: Kernel, params: tuple[tuple[str, int], ...]) -> Kernel:
    return Kernel(functools.partial(k.fn, **dict(params)), k.scratch)
