"""Blocked causal attention (LLaMA, Sec. 8 of TURNIP's evaluation): rotary embeddings, scores,
the softmax's statistics and probabilities, the values, and their gradients."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from .arrays import as_rows, compute_dtype, counting, itemsize, same
from .base import (
    SOFTMAX_FLOPS,
    STATS_FLOPS,
    Array,
    FlopsFn,
    KernelError,
    Shape,
    numel,
    op,
    per_element,
    per_input_element,
)
from .linear import attn_values, linear_dw, pairs_flops, values_flops

ROPE_BASE = 10000.0
ROTARY_FLOPS = 3.0      # x cos, rotate_half(x) sin, add (the angles are per row, not counted)
SOFTMAX_BACKWARD_FLOPS = 2.0    # P (dP - delta)


def _scores_flops(out: Shape, ins: Sequence[Shape]) -> float:
    """``Q K^T / sqrt(dh)``: ``2 dh`` per score, and one to scale it."""
    return (2.0 * ins[0][-1] + 1.0) * numel(out)


def _stats_flops(out: Shape, ins: Sequence[Shape]) -> float:
    """Row maximum, subtract, exp and sum: 4 per score."""
    return STATS_FLOPS * sum(numel(s) for s in ins)


def _scaled(fn: FlopsFn) -> FlopsFn:
    """``fn`` and one more per output element (a scale)."""
    return lambda out, ins: fn(out, ins) + numel(out)


def _rotary_scratch(out: Array, args: Sequence[Array]) -> int:
    rows, half = as_rows(out).shape[0], out.shape[-1] // 2
    return (rows + half + 2 * rows * half) * itemsize(compute_dtype(out)) + \
        rows * half * out.dtype.itemsize


def _mask_bytes(rows: int, cols: int, ct: str) -> int:
    size = itemsize(ct)
    return rows * cols * (2 * size + 1) + (cols + 4 * rows) * size


class _Masked:
    """Buffers in a kernel's scratch for masked score blocks of up to ``rows x cols``: the
    block in the compute dtype, key-minus-query index differences, key and query counters,
    three row columns, and the mask (last, so that every float buffer stays aligned)."""

    def __init__(self, xp, scratch: Array, rows: int, cols: int, ct: str) -> None:
        size = itemsize(ct)
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
        self.mask = scratch[start:start + n].view("bool").reshape(rows, cols)

    def load(self, s: Array, q0: int, k0: int, fill: float) -> Array:
        """The block ``s`` in the compute dtype, ``fill`` where key ``k0 + c`` is past query
        ``q0 + r``; returns its view in scratch."""
        xp, (bq, bk) = self.xp, s.shape
        t = self.t.reshape(-1)[:bq * bk].reshape(bq, bk)
        xp.copyto(t, s)
        if k0 + bk - 1 > q0:                        # some key is past some query
            diff = self.diff.reshape(-1)[:bq * bk].reshape(bq, bk)
            mask = self.mask.reshape(-1)[:bq * bk].reshape(bq, bk)
            keys, queries = counting(self.xp, self.keys[:bk]), self.queries[:bq]
            counting(xp, queries.reshape(-1))
            xp.subtract(keys[None, :], queries, out=diff)       # c - r
            xp.greater(diff, q0 - k0, out=mask)
            xp.copyto(t, fill, where=mask)
        return t


def _key_offsets(k0: int, blocks: Sequence[Array]) -> list[int]:
    return list(itertools.accumulate([k0] + [b.shape[1] for b in blocks]))[:-1]


def _stats_scratch(out: Array, args: Sequence[Array]) -> int:
    return _mask_bytes(out.shape[0], max(a.shape[1] for a in args), compute_dtype(out))


def _softmax_scratch(out: Array, args: Sequence[Array]) -> int:
    return _mask_bytes(args[0].shape[0], args[0].shape[-1], compute_dtype(out))


def _rotary_backward_scratch(out: Array, args: Sequence[Array]) -> int:
    return _rotary_scratch(out, args) + out.nbytes


@op("rotary", "rotary position embedding (Su et al. 2021, as in LLaMA) of rows at positions "
    "offset, offset+1, ...: x cos + rotate_half(x) sin, base 10000", params=(("offset", 0),),
    flops=per_element(ROTARY_FLOPS), scratch=_rotary_scratch)
def _rotary(xp, out, args, scratch, offset: int = 0) -> None:
    """Rotary position embedding (Su et al. 2021) of rows at positions ``offset + r``, in the
    half-split layout of Hugging Face's LLaMA: with ``x = [x1, x2]`` and angles
    ``(offset + r) * base^(-2i/dh)``, ``out = [x1 cos - x2 sin, x2 cos + x1 sin]``, the angles
    in float32 (float64 for float64 tensors) as there."""
    same("rotary", out, args, 1)
    if out.ndim != 2 or out.shape[1] % 2:
        raise KernelError(f"rotary needs (rows, head_dim) with an even head_dim, got {out.shape}")
    rows, dim = out.shape
    half = dim // 2
    ct = compute_dtype(out)
    size = itemsize(ct)
    at = 0

    def take(n: int, dtype: Any, item: int) -> Array:
        nonlocal at
        piece = scratch[at:at + n * item].view(dtype)
        at += n * item
        return piece

    pos = counting(xp, take(rows, ct, size))
    xp.add(pos, offset - 1.0, out=pos)
    inv = counting(xp, take(half, ct, size))
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


@op("attn_scores", "Q K^T / sqrt(dh) for one head, a query block against a key block",
    flops=_scores_flops)
def _attn_scores(xp, out, args, scratch) -> None:
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


@op("softmax_stats", "the causal softmax's row maximum and row sum of exp over a query "
    "block's key blocks (the inputs, contiguous keys from k0), as a (rows, 2) float32 "
    "tensor; keys past a query's position are masked", params=(("q0", 0), ("k0", 0)),
    flops=_stats_flops, scratch=_stats_scratch)
def _softmax_stats(xp, out, args, scratch, q0: int = 0, k0: int = 0) -> None:
    """The causal softmax's statistics for a query block (rows at ``q0``...) over its key
    blocks (the inputs, keys ``k0``... in order): ``out[:, 0]`` the row maximum, ``out[:, 1]``
    the row sum of ``exp(s - max)``, keys past a query masked out (a block wholly past the
    query block is skipped)."""
    if not args or out.ndim != 2 or out.shape[1] != 2 or \
            any(a.ndim != 2 or a.shape[0] != out.shape[0] for a in args):
        raise KernelError(f"softmax_stats: score blocks {[a.shape for a in args]} do not give "
                          f"(rows, 2) statistics {out.shape}")
    rows = out.shape[0]
    work = _Masked(xp, scratch, rows, max(a.shape[1] for a in args), compute_dtype(out))
    m, part, total = work.cols
    m.fill(-math.inf)
    total.fill(0)
    visible = [(b, kj) for b, kj in zip(args, _key_offsets(k0, args)) if kj <= q0 + rows - 1]
    for b, kj in visible:
        t = work.load(b, q0, kj, -math.inf)
        xp.max(t, axis=1, keepdims=True, out=part)
        xp.maximum(m, part, out=m)
    for b, kj in visible:
        t = work.load(b, q0, kj, -math.inf)
        xp.subtract(t, m, out=t)
        xp.exp(t, out=t)
        xp.sum(t, axis=1, keepdims=True, out=part)
        xp.add(total, part, out=total)
    xp.copyto(out[:, :1], m)
    xp.copyto(out[:, 1:], total)


@op("causal_softmax", "a key block's probabilities exp(S - max) / sum from the row "
    "statistics (second input), zero where key k0+j is past query q0+i",
    params=(("q0", 0), ("k0", 0)), flops=per_element(SOFTMAX_FLOPS), scratch=_softmax_scratch)
def _causal_softmax(xp, out, args, scratch, q0: int = 0, k0: int = 0) -> None:
    """A key block's probabilities ``exp(s - max) / sum`` from the row statistics (second
    input, :func:`_softmax_stats`), zero where key ``k0 + c`` is past query ``q0 + r``."""
    if len(args) != 2:
        raise KernelError(f"causal_softmax takes a score block and its statistics, got "
                          f"{len(args)} inputs")
    s, stats = args
    if s.ndim != 2 or out.shape != s.shape or stats.shape != (s.shape[0], 2):
        raise KernelError(f"causal_softmax: scores {s.shape} with statistics {stats.shape} do "
                          f"not give {out.shape}")
    work = _Masked(xp, scratch, s.shape[0], s.shape[1], compute_dtype(out))
    t = work.load(s, q0, k0, -math.inf)
    xp.subtract(t, stats[:, :1], out=t)
    xp.exp(t, out=t)
    xp.divide(t, stats[:, 1:], out=t)
    xp.copyto(out, t)


@op("rotary_backward", "the gradient through rotary:offset=..: the inverse rotation of dy",
    params=(("offset", 0),), flops=per_element(ROTARY_FLOPS), scratch=_rotary_backward_scratch)
def _rotary_backward(xp, out, args, scratch, offset: int = 0) -> None:
    """The transpose of :func:`_rotary`, the rotation by the opposite angles:
    ``[d1 cos + d2 sin, d2 cos - d1 sin]``, computed as ``rotary([d1, -d2])`` with its second
    half negated."""
    same("rotary_backward", out, args, 1)
    if out.ndim != 2 or out.shape[1] % 2:
        raise KernelError(f"rotary_backward needs (rows, head_dim) with an even head_dim, got "
                          f"{out.shape}")
    half = out.shape[1] // 2
    e = scratch[_rotary_scratch(out, args):][:out.nbytes].view(out.dtype).reshape(out.shape)
    d = args[0]
    xp.copyto(e[:, :half], d[:, :half])
    xp.negative(d[:, half:], out=e[:, half:])
    _rotary(xp, out, [e], scratch, offset)
    second = out[:, half:]
    xp.negative(second, out=second)


@op("attn_dprobs", "dP = dO V^T for one head, a query block against a key block",
    flops=lambda out, ins: 2.0 * ins[0][-1] * numel(out))
def _attn_dprobs(xp, out, args, scratch) -> None:
    """``dO V^T`` for one head, a query block against a key block."""
    if len(args) != 2:
        raise KernelError(f"attn_dprobs takes dO and V, got {len(args)} inputs")
    do, v = args
    if out.shape != (do.shape[0], v.shape[0]) or do.shape[1] != v.shape[1]:
        raise KernelError(f"attn_dprobs: {do.shape} x {v.shape}^T do not give {out.shape}")
    xp.matmul(do, v.T, out=out)


@op("attn_delta", "rowsum(dO * O) for one head and query block, (rows, 1): the softmax "
    "backward's correction term", flops=per_input_element(2.0),
    scratch=lambda out, args: args[0].size * out.dtype.itemsize)
def _attn_delta(xp, out, args, scratch) -> None:
    """``rowsum(dO * O)`` as a column."""
    if len(args) != 2:
        raise KernelError(f"attn_delta takes dO and O, got {len(args)} inputs")
    do, o = args
    if do.shape != o.shape or out.shape != (do.shape[0], 1):
        raise KernelError(f"attn_delta: {do.shape} and {o.shape} do not give {out.shape}")
    prod = scratch[:do.size * out.dtype.itemsize].view(out.dtype).reshape(do.shape)
    xp.multiply(do, o, out=prod)
    xp.sum(prod, axis=1, keepdims=True, out=out)


@op("softmax_backward", "dS = P (dP - delta) for a key block (inputs P, dP, delta); zero "
    "where P is masked", flops=per_element(SOFTMAX_BACKWARD_FLOPS))
def _softmax_backward(xp, out, args, scratch) -> None:
    """``P (dP - delta)``."""
    if len(args) != 3:
        raise KernelError(f"softmax_backward takes P, dP and delta, got {len(args)} inputs")
    p, dp, delta = args
    same("softmax_backward", out, [p, dp])
    xp.subtract(dp, delta, out=out)
    xp.multiply(out, p, out=out)


@op("attn_dq", "dQ = sum_j dS_j K_j / sqrt(dh) (inputs dS_0.. then K_0..)",
    flops=_scaled(values_flops), scratch=lambda out, args: out.nbytes if len(args) > 2 else 0)
def _attn_dq(xp, out, args, scratch) -> None:
    """``sum_j dS_j K_j / sqrt(dh)``."""
    attn_values(xp, out, args, scratch)
    xp.multiply(out, 1.0 / math.sqrt(out.shape[1]), out=out)


@op("attn_dk", "dK = sum_i dS_i^T Q_i / sqrt(dh) over the query blocks at or after the "
    "key block (inputs dS_0.. then Q_0..)", flops=_scaled(pairs_flops),
    scratch=lambda out, args: out.nbytes if len(args) > 2 else 0)
def _attn_dk(xp, out, args, scratch) -> None:
    """``sum_i dS_i^T Q_i / sqrt(dh)``."""
    linear_dw(xp, out, args, scratch)
    xp.multiply(out, 1.0 / math.sqrt(out.shape[1]), out=out)
