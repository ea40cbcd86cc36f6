"""Row-wise ops: softmax, RMSNorm and LayerNorm with their gradients, the cross-entropy loss
and the greedy choice of a token."""

from __future__ import annotations

from collections.abc import Sequence

from .arrays import as_rows, compute_dtype, counting, itemsize, row_bytes, row_scratch, same
from .base import (
    SOFTMAX_FLOPS,
    STATS_FLOPS,
    Array,
    KernelError,
    op,
    per_element,
    per_input_element,
)

NORM_EPS = 1e-5

RMSNORM_FLOPS = 4.0     # square, sum, divide by the root, gain
RMSNORM_BACKWARD_FLOPS = 8.0    # the root again (2), g dy (1), its dot with x (2), combine (3)
LAYERNORM_BACKWARD_FLOPS = 14.0     # the statistics (5), g dy (1), two row means (4), combine (4)
LAYERNORM_DGAIN_FLOPS = 9.0     # the statistics (5), xhat (2), dy xhat (1), the column sum (1)
CROSS_ENTROPY_FLOPS = STATS_FLOPS                       # log-sum-exp per logit
CROSS_ENTROPY_BACKWARD_FLOPS = STATS_FLOPS + SOFTMAX_FLOPS + 1.0   # softmax, / tokens


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


def _layernorm_xhat(xp, x2: Array, like: Array, scratch: Array) -> tuple[Array, Array, Array]:
    """``xhat = (x - mean) / r`` of the rows ``x2`` in ``scratch`` (:func:`_norm_backward_scratch`
    of ``like``, whose rows and dtype it takes), and the row ``mean`` and ``r`` beside it."""
    mean, r = row_scratch(scratch, like)
    xhat = scratch[2 * r.nbytes:2 * r.nbytes + x2.size * like.dtype.itemsize]
    xhat = xhat.view(like.dtype).reshape(x2.shape)
    _layernorm_stats(xp, x2, xhat, mean, r)
    xp.subtract(x2, mean, out=xhat)
    xp.divide(xhat, r, out=xhat)
    return xhat, mean, r


def _gain_dy(xp, y, dy, gain: Sequence[Array]) -> None:
    xp.copyto(y, dy)
    _gain(xp, y, gain)


def _norm_backward_scratch(out: Array, args: Sequence[Array]) -> int:
    return row_bytes(out, args) + out.nbytes


def _ce_check(name: str, out: Array, args: Sequence[Array]) -> tuple[Array, Array]:
    if len(args) != 2:
        raise KernelError(f"{name} takes logits and labels, got {len(args)} inputs")
    logits, labels = args
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise KernelError(f"{name}: logits {logits.shape} and labels {labels.shape} do not fit")
    return logits, labels


def _log_softmax(xp, logits: Array, labels: Array, scratch: Array) -> tuple[Array, Array, Array]:
    """In scratch: ``logits - logsumexp`` (rows, vocab) in the compute dtype, the flat
    indices ``r vocab + label_r mod vocab`` of the labels' logits, and a row column."""
    rows, vocab = logits.shape
    ct = compute_dtype(logits)
    size = itemsize(ct)
    idx = scratch[:rows * 8].view("int64")
    base = scratch[rows * 8:rows * 16].view("int64")
    floats = scratch[rows * 16:rows * 16 + (rows * vocab + rows) * size].view(ct)
    t, col = floats[:rows * vocab].reshape(rows, vocab), floats[rows * vocab:]
    xp.remainder(labels, vocab, out=idx)
    counting(xp, base)
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
    return rows * 16 + (rows * vocab + rows) * itemsize(compute_dtype(args[0]))


@op("softmax", "row-wise softmax", flops=per_element(STATS_FLOPS + SOFTMAX_FLOPS),
    scratch=row_bytes)
def _softmax(xp, out, args, scratch) -> None:
    """Row-wise softmax over the last axis, stabilised by the row maximum."""
    same("softmax", out, args, 1)
    x, y = as_rows(args[0]), as_rows(out)
    r, _ = row_scratch(scratch, out)
    xp.max(x, axis=1, keepdims=True, out=r)
    xp.subtract(x, r, out=y)
    xp.exp(y, out=y)
    xp.sum(y, axis=1, keepdims=True, out=r)
    xp.divide(y, r, out=y)


@op("rmsnorm", "RMSNorm over the last axis, optional gain as second input",
    flops=per_element(RMSNORM_FLOPS), scratch=row_bytes)
def _rmsnorm(xp, out, args, scratch) -> None:
    """``x / sqrt(mean(x^2) + eps) * g`` over the last axis (``g``, the gain, optional)."""
    same("rmsnorm", out, args[:1])
    x, y = as_rows(args[0]), as_rows(out)
    r, _ = row_scratch(scratch, out)
    xp.multiply(x, x, out=y)
    xp.mean(y, axis=1, keepdims=True, out=r)
    xp.add(r, NORM_EPS, out=r)
    xp.sqrt(r, out=r)
    xp.divide(x, r, out=y)
    _gain(xp, y, args[1:])


@op("layernorm", "LayerNorm over the last axis, optional gain as second input",
    flops=per_element(7.0), scratch=row_bytes)
def _layernorm(xp, out, args, scratch) -> None:
    """``(x - mean) / sqrt(var + eps) * g`` over the last axis (``g``, the gain, optional);
    ``var = mean(x^2) - mean^2``."""
    same("layernorm", out, args[:1])
    x, y = as_rows(args[0]), as_rows(out)
    mean, r = row_scratch(scratch, out)
    _layernorm_stats(xp, x, y, mean, r)
    xp.subtract(x, mean, out=y)
    xp.divide(y, r, out=y)
    _gain(xp, y, args[1:])


@op("rmsnorm_backward", "dx of RMSNorm from x, the gain and dy (inputs x, g, dy); the gain "
    "frozen", flops=per_element(RMSNORM_BACKWARD_FLOPS), scratch=_norm_backward_scratch)
def _rmsnorm_backward(xp, out, args, scratch) -> None:
    """``dx = (g dy) / r - x sum(g dy x) / (n r^3)``, ``r = sqrt(mean(x^2) + eps)``."""
    if len(args) != 3:
        raise KernelError(f"rmsnorm_backward takes x, the gain and dy, got {len(args)} inputs")
    x, g, dy = args
    same("rmsnorm_backward", out, [x, dy])
    x2, y, d2 = as_rows(x), as_rows(out), as_rows(dy)
    r, c = row_scratch(scratch, out)
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


@op("layernorm_backward", "dx of LayerNorm from x, the optional gain and dy (inputs x, "
    "[g,] dy); the gain frozen", flops=per_element(LAYERNORM_BACKWARD_FLOPS),
    scratch=_norm_backward_scratch)
def _layernorm_backward(xp, out, args, scratch) -> None:
    """``dx = (z - mean(z)) / r``, ``z = g dy - xhat mean(g dy xhat)``, ``xhat = (x - mean) /
    r``: the usual ``(g dy - mean(g dy) - xhat mean(g dy xhat)) / r``, as ``mean(xhat) = 0``."""
    if len(args) not in (2, 3):
        raise KernelError(f"layernorm_backward takes x, the optional gain and dy, got "
                          f"{len(args)} inputs")
    x, *gain, dy = args
    same("layernorm_backward", out, [x, dy])
    x2, y, d2 = as_rows(x), as_rows(out), as_rows(dy)
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


@op("layernorm_dgain", "dg of LayerNorm's gain from x and dy (inputs x, dy), shape (dim,): "
    "sum over rows of dy xhat", flops=per_input_element(LAYERNORM_DGAIN_FLOPS),
    scratch=lambda out, args: _norm_backward_scratch(args[0], args))
def _layernorm_dgain(xp, out, args, scratch) -> None:
    """``dg = sum over rows of dy xhat``: the gain's gradient of ``layernorm`` (inputs x, dy)."""
    if len(args) != 2:
        raise KernelError(f"layernorm_dgain takes x and dy, got {len(args)} inputs")
    x, dy = args
    if x.shape != dy.shape or out.shape != (x.shape[-1],):
        raise KernelError(f"layernorm_dgain: x {x.shape} and dy {dy.shape} do not give "
                          f"{out.shape}")
    xhat, _, _ = _layernorm_xhat(xp, as_rows(x), x, scratch)
    xp.multiply(xhat, as_rows(dy), out=xhat)
    xp.sum(xhat, axis=0, out=out)


@op("layernorm_dbias", "db of a bias added to LayerNorm's output (input dy), shape (dim,): "
    "sum over rows of dy", flops=per_input_element(1.0))
def _layernorm_dbias(xp, out, args, scratch) -> None:
    """``db = sum over rows of dy``: the bias's gradient of ``layernorm(x) + b``."""
    if len(args) != 1 or out.shape != (args[0].shape[-1],):
        raise KernelError(f"layernorm_dbias takes dy and gives one value per column, got "
                          f"inputs {[a.shape for a in args]} for {out.shape}")
    xp.sum(as_rows(args[0]), axis=0, out=out)


@op("cross_entropy", "sum over rows of logsumexp(logits) - logits[label] / tokens (inputs "
    "logits, int labels taken modulo the vocabulary), shape (1,)", params=(("tokens", 1),),
    flops=per_input_element(CROSS_ENTROPY_FLOPS), scratch=_ce_scratch)
def _cross_entropy(xp, out, args, scratch, tokens: int = 1) -> None:
    """``sum_r (logsumexp(logits_r) - logits_r[label_r]) / tokens``, shape (1,); labels are
    taken modulo the vocabulary."""
    logits, labels = _ce_check("cross_entropy", out, args)
    if out.shape != (1,):
        raise KernelError(f"cross_entropy writes shape (1,), not {out.shape}")
    t, idx, col = _log_softmax(xp, logits, labels, scratch)
    xp.take(t.reshape(-1), idx, out=col)
    xp.sum(col, keepdims=True, out=out)
    xp.multiply(out, -1.0 / tokens, out=out)


@op("argmax", "the index of the largest entry of the input's last row (the first of equal "
    "ones), shape (1,): the greedy choice of the next token from its logits",
    flops=lambda out, ins: float(ins[0][-1]), scratch=lambda out, args: 8)
def _argmax(xp, out, args, scratch) -> None:
    """The index of the largest entry of the last row of ``args[0]``, into ``out`` (shape
    (1,)): greedy decoding's next token (ties to the first, on NumPy and CuPy alike).  The
    index is written to 8 bytes of scratch first, as CuPy would allocate it otherwise."""
    if len(args) != 1 or out.shape != (1,) or args[0].ndim < 1:
        raise KernelError(f"argmax takes one tensor and gives shape (1,), got inputs "
                          f"{[a.shape for a in args]} for {out.shape}")
    index = scratch[:8].view("int64").reshape(())
    xp.argmax(as_rows(args[0])[-1], out=index)
    out[...] = index


@op("cross_entropy_backward", "d logits of cross_entropy: (softmax(logits) - onehot(label)) "
    "/ tokens", params=(("tokens", 1),), flops=per_element(CROSS_ENTROPY_BACKWARD_FLOPS),
    scratch=_ce_scratch)
def _cross_entropy_backward(xp, out, args, scratch, tokens: int = 1) -> None:
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
