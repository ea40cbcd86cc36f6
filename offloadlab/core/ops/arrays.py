"""Array helpers the kernels share: fitting inputs onto an output, products of column shards,
the scratch layout, rows and the compute dtype.  Written against the array module ``xp`` a
kernel is given; nothing here imports NumPy."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .base import DTYPES, Array, KernelError


def accumulate(xp, out: Array, x: Array, scratch: Array) -> None:
    """``out += fit(x)``, flat: ``x`` folded onto ``out`` when longer, tiled when shorter.

    A fold of up to :data:`FOLD_ROWS` rows of ``out``'s length adds them one by one in place;
    more rows are summed in one reduction into ``scratch`` (:func:`fold_bytes`) first, so
    that a tiny output of a long input costs no Python loop per row (a 1-element output of a
    400 KB input took 100k iterations).

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    out : array
        Added to in place.
    x : array
        The input, of any length.
    scratch : array
        A byte workspace of at least :func:`fold_bytes`.
    """
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
    """Refuse inputs whose shape is not the output's, or whose number is not ``count``.

    Parameters
    ----------
    op : str
        The op's name, for the message.
    out : array
        The output.
    args : sequence of array
        The inputs.
    count : int, optional
        How many inputs the op takes (any number if not given).

    Raises
    ------
    KernelError
        A wrong number of inputs, or an input of another shape.
    """
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
    ``right`` that is a strided slice is first copied into ``scratch`` (:func:`dense`).

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    out : array
        The product, written in place.
    left : sequence of array
        The left operand's column shards.
    right : array
        The right operand.
    scratch : array
        A byte workspace of at least :func:`shard_bytes` (and the partial product's where
        ``left`` has several shards).
    """
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
    """``nbytes`` rounded up to a multiple of :data:`ALIGN`: where a buffer after it starts.

    Parameters
    ----------
    nbytes : int
        A buffer's bytes.

    Returns
    -------
    int
        The offset of the next buffer.
    """
    return -(-nbytes // ALIGN) * ALIGN


def is_strided(x: Array) -> bool:
    """A 2-D operand that is neither C- nor F-contiguous, which CuPy's matmul would copy into
    a fresh allocation before calling cuBLAS.

    Parameters
    ----------
    x : array
        The operand.

    Returns
    -------
    bool
        It is strided.
    """
    return not (x.flags.c_contiguous or x.flags.f_contiguous)


def dense(xp, x: Array, scratch: Array) -> Array:
    """``x``, or a C-contiguous copy of it at the start of ``scratch`` if it is strided.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    x : array
        A 2-D operand.
    scratch : array
        A byte workspace of at least ``x.nbytes``.

    Returns
    -------
    array
        ``x`` itself, or its copy.
    """
    if not is_strided(x):
        return x
    copy = scratch[:x.nbytes].view(x.dtype).reshape(x.shape)
    xp.copyto(copy, x)
    return copy


def shard_bytes(left: Sequence[Array], right: Array) -> int:
    """Scratch of :func:`matmul_shards`: room for the largest strided block of ``right``.

    Parameters
    ----------
    left : sequence of array
        The left operand's column shards.
    right : array
        The right operand.

    Returns
    -------
    int
        The bytes (the partial product's come before them where there are several shards).
    """
    row, block = 0, 0
    for x in left:
        piece = right[row:row + x.shape[1]]
        row += x.shape[1]
        if is_strided(piece):
            block = max(block, piece.nbytes)
    return block


def fold_bytes(out: Array, args: Sequence[Array]) -> int:
    """Scratch of :func:`accumulate`: one output's worth where an input folds onto it in
    one reduction.

    Parameters
    ----------
    out : array
        The output.
    args : sequence of array
        The inputs folded onto it.

    Returns
    -------
    int
        The bytes.
    """
    return out.nbytes if any(x.size > FOLD_ROWS * max(out.size, 1) for x in args) else 0


def as_rows(x: Array) -> Array:
    """``x`` as a 2-D array of rows (the last axis), 1 row if flat.

    Parameters
    ----------
    x : array
        Any array.

    Returns
    -------
    array
        The 2-D view.
    """
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def row_bytes(out: Array, args: Sequence[Array]) -> int:
    """Scratch of :func:`row_scratch`: two values per row of ``out``.

    Parameters
    ----------
    out : array
        The output, whose rows are the last axis.
    args : sequence of array
        The inputs (unused: a scratch function takes them).

    Returns
    -------
    int
        The bytes.
    """
    return 2 * as_rows(out).shape[0] * out.dtype.itemsize


def row_scratch(scratch: Array, out: Array) -> tuple[Array, Array]:
    """Two columns of one value per row of ``out``, in ``scratch``.

    Parameters
    ----------
    scratch : array
        A byte workspace of at least :func:`row_bytes`.
    out : array
        The output, whose dtype the columns take.

    Returns
    -------
    tuple of (array, array)
        The two columns, each of shape ``(rows, 1)``.
    """
    rows, size = as_rows(out).shape[0], out.dtype.itemsize
    both = scratch[:2 * rows * size].view(out.dtype).reshape(2, rows, 1)
    return both[0], both[1]


def compute_dtype(out: Array) -> str:
    """The dtype a kernel computes a reduction of ``out`` in: float64 for float64, else
    float32.

    Parameters
    ----------
    out : array
        The output.

    Returns
    -------
    str
        The dtype's name.
    """
    return "float64" if out.dtype == "float64" else "float32"


def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype`` (a name of :data:`~.base.DTYPES`).

    Parameters
    ----------
    dtype : str
        The dtype's name.

    Returns
    -------
    int
        Its bytes per element.
    """
    return DTYPES[dtype]


def is_numpy(xp: Any) -> bool:
    """Whether the array module ``xp`` is NumPy (not CuPy).

    Parameters
    ----------
    xp : module
        An array module.

    Returns
    -------
    bool
        It is NumPy.
    """
    return bool(xp.__name__ == "numpy")


def counting(xp, v: Array) -> Array:
    """``v`` (1-D) filled with 1, 2, ..., len(v), allocating nothing.

    On NumPy by doubling (``v[k:2k] = v[:k] + k``, disjoint halves: a cumulative sum in place
    copies its input first); on CuPy, whose ``cumsum`` allocates, by an elementwise kernel of
    the index.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    v : array
        A 1-D array, overwritten.

    Returns
    -------
    array
        ``v``.
    """
    if not is_numpy(xp):
        _index_kernel(xp)(v)
        return v
    if v.size:
        v[0] = 1
    k = 1
    while k < v.size:
        step = min(k, v.size - k)
        xp.add(v[:step], k, out=v[k:k + step])
        k += step
    return v


@functools.cache
def _index_kernel(xp) -> Any:
    """CuPy's ``v[i] = i + 1`` (compiled once per process, on first use: the executor runs
    every kernel once before the clock starts)."""
    return xp.ElementwiseKernel("", "T v", "v = (T)(i + 1)", "offloadlab_counting")
