"""The ops a compute vertex may name (``NAME`` or ``NAME:key=value,...``), their flops and the
bytes they touch, and the dtypes a tensor may have (the cost model's per-vertex price).

Each op is declared once, with its kernel, by :func:`~.base.op` in the module of its family;
this package imports every one of them, none of which imports NumPy.  docs/extending.md (An op
and its kernel) explains the kernels; docs/workloads.md the op names, docs/cost-model.md the
``generic`` op.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from functools import lru_cache

from .base import (
    DTYPES,
    FLOAT_DTYPES,
    GENERIC,
    KERNELS,
    OPS,
    Kernel,
    KernelError,
    Op,
    OpError,
    Shape,
    op,
)
from .elementwise import UPDATE_OPS

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["DTYPES", "FLOAT_DTYPES", "GENERIC", "KERNELS", "OPS", "UPDATE_OPS", "Kernel",
           "KernelError", "Op", "OpError", "op", "op_call", "op_flops", "op_name",
           "op_problem", "parse_op", "touched_bytes"]


@lru_cache(maxsize=4096)
def parse_op(op: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """An op name's name and parameters: ``"rotary:offset=8"`` -> ``("rotary", (("offset", 8),))``.

    Every declared parameter is present (defaults filled in);
    ``"generic:aten.cumsum.default"`` -> ``("generic", ())``.

    Parameters
    ----------
    op : str
        The op, ``NAME`` or ``NAME:key=value,...``.

    Returns
    -------
    tuple
        The name and a tuple of ``(key, value)`` pairs in declaration order.

    Raises
    ------
    OpError
        For an unknown op, a bad parameter or a missing label.
    """
    name, colon, rest = op.partition(":")
    spec = OPS.get(name)
    if spec is None:
        raise OPS.unknown(op)
    if spec.labelled:
        if not rest.strip():
            raise OpError(f"op {op!r}: {name} names its source op after a colon, as "
                          f"{name}:aten.cumsum.default")
        return name, ()
    given: dict[str, int] = {}
    for item in filter(None, rest.split(",")) if colon else ():
        key, eq, value = item.partition("=")
        known = dict(spec.params)
        if not eq or key not in known or key in given:
            raise OpError(f"op {op!r}: bad parameter {item!r}; {name} takes "
                          f"{', '.join(known) or 'no parameters'}, each once, as key=value")
        try:
            given[key] = int(value)
        except ValueError:
            raise OpError(f"op {op!r}: parameter {key} must be an integer, got "
                          f"{value!r}") from None
        if given[key] < 0:
            raise OpError(f"op {op!r}: parameter {key} must be >= 0, got {value}")
    return name, tuple((k, given.get(k, default)) for k, default in spec.params)


def op_problem(op: object) -> str | None:
    """What is wrong with ``op`` as a compute vertex's op, or None.

    Parameters
    ----------
    op : object
        The vertex's op, as read.

    Returns
    -------
    str or None
        The problem in a sentence, or None if ``op`` is a known op with good parameters.
    """
    if type(op) is not str:
        return str(OPS.unknown(op))
    if op in OPS:
        return None
    try:
        parse_op(op)
    except OpError as exc:
        return str(exc)
    return None


def op_call(name: str, **params: int) -> str:
    """The op name ``NAME:key=value,...`` (parameters equal to their default left out).

    Parameters
    ----------
    name : str
        A known op's name.
    **params : int
        Its integer parameters.

    Returns
    -------
    str

    Raises
    ------
    OpError
        If ``name`` is unknown or does not take a parameter given.
    """
    spec = OPS[name]
    defaults = dict(spec.params)
    unknown = set(params) - set(defaults)
    if unknown:
        raise OpError(f"{name} takes no parameter {', '.join(sorted(unknown))}")
    parts = [f"{k}={params[k]}" for k in defaults if params.get(k, defaults[k]) != defaults[k]]
    return f"{name}:{','.join(parts)}" if parts else name


def op_name(op: str) -> str:
    """The op's name without its parameters.

    Parameters
    ----------
    op : str
        The op, ``NAME`` or ``NAME:key=value,...``.

    Returns
    -------
    str
    """
    return op.partition(":")[0]


def op_flops(op: str, out: Shape, ins: Sequence[Shape]) -> float:
    """The flops of ``op`` writing a tensor of shape ``out`` from inputs of shapes ``ins``.

    The conventions are in the family modules: ``2 m n k`` for a matmul, a few per element
    for the rest.

    Parameters
    ----------
    op : str
        The op.
    out : Shape
        The output's shape.
    ins : sequence of Shape
        The inputs' shapes, in argument order.

    Returns
    -------
    float

    Raises
    ------
    OpError
        If ``op`` is unknown or has no flop count from shapes.
    """
    spec = OPS[op_name(op)]
    if spec.flops is None:
        raise OpError(f"op {op!r} has no flop count from shapes; give the vertex its flops")
    return float(spec.flops(out, ins))


def touched_bytes(op: str | None, out: int, ins: Sequence[int]) -> int:
    """Bytes a kernel reads and writes: its output and its inputs.

    A gather (``embedding``) reads only as many bytes of its table (the last input) as it
    writes.

    Parameters
    ----------
    op : str or None
        The op; None or an unknown op counts every input.
    out : int
        The output's bytes.
    ins : sequence of int
        The inputs' bytes.

    Returns
    -------
    int
    """
    spec = None if op is None else OPS.get(op_name(op))
    if spec is not None and spec.gather:
        return out + sum(ins[:-1]) + min(out, ins[-1] if ins else 0)
    return out + sum(ins)
