"""Matrix products: matmul, linear and LoRA layers with their gradients, attention's sum of
probabilities times values, and the embedding gather and its gradient."""

from __future__ import annotations

from collections.abc import Sequence

from .arrays import aligned, dense, is_numpy, is_strided, matmul_shards, shard_bytes
from .base import Array, KernelError, Shape, numel, op, per_element, per_input_element


def _matmul_flops(out: Shape, ins: Sequence[Shape]) -> float:
    """``2 m n k``: ``k`` the left operand's columns, summed over its shards."""
    return 2.0 * numel(out) * sum(s[-1] for s in ins[:-1])


def values_flops(out: Shape, ins: Sequence[Shape]) -> float:
    """``sum_j P_j V_j``: ``2 k dh`` per output element over every key block, plus the sums.

    Parameters
    ----------
    out, ins
        The output's shape and the inputs', the ``P_j`` then the ``V_j``.

    Returns
    -------
    float
        The flops.
    """
    half = len(ins) // 2
    return 2.0 * numel(out) * sum(s[-1] for s in ins[:half]) + (half - 1) * numel(out)


def pairs_flops(out: Shape, ins: Sequence[Shape]) -> float:
    """``sum_i A_i^T B_i``: ``2 rows_i`` per output element for each pair, plus the sums.

    Parameters
    ----------
    out, ins
        The output's shape and the inputs', the ``A_i`` then the ``B_i``.

    Returns
    -------
    float
        The flops.
    """
    half = len(ins) // 2
    return 2.0 * numel(out) * sum(s[0] for s in ins[:half]) + (half - 1) * numel(out)


def _lora_linear_flops(out: Shape, ins: Sequence[Shape]) -> float:
    """``x W^T + u B^T``: two matmuls and their sum."""
    return 2.0 * numel(out) * (ins[0][-1] + ins[2][-1]) + numel(out)


def _pairs(name: str, args: Sequence[Array]) -> int:
    n = len(args) // 2
    if not n or len(args) % 2 or any(a.ndim != 2 for a in args):
        raise KernelError(f"{name} takes 2-D gradient blocks then as many 2-D operands, got "
                          f"{[a.shape for a in args]}")
    return n


def _values_bytes(out: Array, args: Sequence[Array]) -> int:
    """Scratch of :func:`attn_values`: the partial product's where there are several pairs,
    then room for the largest strided value block (:func:`_linear_dx`'s column slices)."""
    n = len(args) // 2
    strided = max((v.nbytes for v in args[n:] if v.ndim == 2 and is_strided(v)), default=0)
    return (aligned(out.nbytes) if n > 1 else 0) + strided


def _dx_operands(args: Sequence[Array], out: Array, col0: int = 0) -> list[Array]:
    """:func:`_linear_dx`'s blocks ``dY_i`` and the column slices ``W_i[:, col0:col0 + n]``."""
    n = _pairs("linear_dx", args)
    return [*args[:n], *(w[:, col0:col0 + out.shape[1]] for w in args[n:])]


@op("matmul", "hstack(inputs[:-1]) @ inputs[-1]: the left operand may come as column shards",
    flops=_matmul_flops, scratch=lambda out, args: out.nbytes if len(args) > 2 else 0)
def _matmul(xp, out, args, scratch) -> None:
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
    matmul_shards(xp, out, left, right, scratch)


@op("linear", "hstack(inputs[:-1]) @ inputs[-1]^T: x W^T with W stored (out, in) as in "
    "PyTorch; the left operand may come as column shards", flops=_matmul_flops,
    scratch=lambda out, args: (aligned(out.nbytes) if len(args) > 2 else 0)
    + shard_bytes(args[:-1], args[-1].T))
def _linear(xp, out, args, scratch) -> None:
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
    matmul_shards(xp, out, left, w.T, scratch)


@op("embedding", "table[ids]: rows of the table (second input) at the token ids (first "
    "input, taken modulo the table's rows)", flops=per_element(0.0), gather=True)
def _embedding(xp, out, args, scratch) -> None:
    """``table[ids]``, ids taken modulo the table's rows (NumPy's ``mode="wrap"``, which is
    also what CuPy's ``take`` does)."""
    if len(args) != 2:
        raise KernelError(f"embedding takes ids and a table, got {len(args)} inputs")
    ids, table = args
    if table.ndim != 2 or out.shape != (*ids.shape, table.shape[1]):
        raise KernelError(f"embedding: ids {ids.shape} into a table {table.shape} do not give "
                          f"{out.shape}")
    if is_numpy(xp):
        xp.take(table, ids, axis=0, out=out, mode="wrap")
    else:
        xp.take(table, ids, axis=0, out=out)


@op("embedding_backward", "dtable of embedding (inputs ids, dy; output the table's shape): "
    "each row of dy added at row id mod rows, repeated ids summed",
    flops=per_input_element(1.0, which=1), scratch=lambda out, args: args[0].size * 8)
def _embedding_backward(xp, out, args, scratch) -> None:
    """``dtable``: zero, then each row of ``dy`` added at row ``id mod rows`` (repeated ids
    add up), the gradient of :func:`_embedding`; the wrapped ids go to ``scratch``."""
    if len(args) != 2:
        raise KernelError(f"embedding_backward takes ids and dy, got {len(args)} inputs")
    ids, dy = args
    if ids.dtype.kind not in "iu":
        raise KernelError(f"embedding_backward: ids must be integers, got {ids.dtype}")
    if out.ndim != 2 or dy.shape != (*ids.shape, out.shape[1]):
        raise KernelError(f"embedding_backward: ids {ids.shape} and dy {dy.shape} do not give "
                          f"a table {out.shape}")
    rows = scratch[:ids.size * 8].view("int64")
    xp.remainder(ids.reshape(-1), out.shape[0], out=rows)
    out.fill(0)
    if is_numpy(xp):
        xp.add.at(out, rows, dy.reshape(-1, out.shape[1]))
    else:
        import cupyx
        cupyx.scatter_add(out, rows, dy.reshape(-1, out.shape[1]))


@op("lora_linear", "x W^T + u B^T (inputs x, W, u, B): a frozen linear layer with its "
    "LoRA adapter (Hu et al. 2021), u = x A^T computed beforehand", flops=_lora_linear_flops,
    scratch=lambda out, args: out.nbytes)
def _lora_linear(xp, out, args, scratch) -> None:
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


@op("attn_values", "sum_j P_j V_j for one head: inputs P_0..P_n-1 then V_0..V_n-1",
    flops=values_flops, scratch=_values_bytes)
def attn_values(xp, out, args, scratch) -> None:
    """``sum_j P_j V_j`` for one head: inputs ``P_0..P_{n-1}`` then ``V_0..V_{n-1}``.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    out : array
        The head's output, written in place.
    args : sequence of array
        The 2-D probability blocks, then as many value blocks.
    scratch : array
        The partial product's bytes where there are several pairs, then room for the largest
        strided value block.

    Raises
    ------
    KernelError
        Inputs that are not pairs whose products give ``out``'s shape.
    """
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
    xp.matmul(args[0], dense(xp, args[n], spare), out=out)
    for p, v in zip(args[1:n], args[n + 1:]):
        xp.matmul(p, dense(xp, v, spare), out=partial)
        xp.add(out, partial, out=out)


@op("linear_dx", "sum_i dY_i W_i[:, col0:col0+n] (inputs dY_0..dY_n-1 then W_0..W_n-1, n "
    "the output's columns): the input gradient of x W^T (summed over the layers that read "
    "x)", params=(("col0", 0),), flops=values_flops,
    scratch=lambda out, args: _values_bytes(out, _dx_operands(args, out)))
def _linear_dx(xp, out, args, scratch, col0: int = 0) -> None:
    """``sum_i dY_i W_i[:, col0:col0 + n]``: the input gradient of ``x W^T``."""
    attn_values(xp, out, _dx_operands(args, out, col0), scratch)


@op("linear_dw", "sum_i dY_i^T X_i (inputs dY_0..dY_n-1 then X_0..X_n-1): the weight "
    "gradient of x W^T, summed over row blocks", flops=pairs_flops,
    scratch=lambda out, args: out.nbytes if len(args) > 2 else 0)
@op("attn_dv", "dV = sum_i P_i^T dO_i over the query blocks (inputs P_0.. then dO_0..)",
    flops=pairs_flops, scratch=lambda out, args: out.nbytes if len(args) > 2 else 0)
def linear_dw(xp, out, args, scratch) -> None:
    """``sum_i dY_i^T X_i``: the weight gradient of ``x W^T`` over row blocks.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    out : array
        The gradient, shaped as ``W``, written in place.
    args : sequence of array
        The 2-D gradient blocks ``dY_i``, then as many input blocks ``X_i``.
    scratch : array
        The partial product's bytes where there are several pairs.

    Raises
    ------
    KernelError
        Inputs that are not pairs whose products give ``out``'s shape.
    """
    n = _pairs("linear_dw", args)
    for dy, x in zip(args[:n], args[n:]):
        if dy.shape[0] != x.shape[0] or (dy.shape[1], x.shape[1]) != out.shape:
            raise KernelError(f"linear_dw: {dy.shape}^T x {x.shape} do not give {out.shape}")
    partial = scratch[:out.nbytes].view(out.dtype).reshape(out.shape) if n > 1 else None
    xp.matmul(args[0].T, args[n], out=out)
    for dy, x in zip(args[1:n], args[n + 1:]):
        xp.matmul(dy.T, x, out=partial)
        xp.add(out, partial, out=out)
