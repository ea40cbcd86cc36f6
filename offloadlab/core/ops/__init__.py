"""The ops a compute vertex may name and the dtypes a tensor may have.  The cost model prices a
vertex by its ``flops`` and the bytes it touches (:func:`touched_bytes`); the executor runs
each op's kernel; builders price a vertex with :func:`op_flops` from its shapes.

Each op is declared once, with its kernel, by :func:`~.base.op` in the module of its family
(:mod:`.elementwise`, :mod:`.linear`, :mod:`.norm`, :mod:`.attention`; docs/extending.md, An
op and its kernel).  This package imports every module in it (found by :mod:`pkgutil`), and
none of them imports NumPy, so that the planners, readers and simulator know every op without
it.  A kernel is ``fn(xp, out, args, scratch)``: ``xp`` is ``numpy`` or ``cupy``, ``out`` the
vertex's planned location viewed with its shape and dtype, ``args`` its inputs in argument
order, and ``scratch`` a 1-D byte workspace of the stream it runs on (at least as long as the
op's ``scratch(out, args)``).  Kernels write ``out`` in place (``out=``) and allocate nothing
on the device.

An op is named ``NAME`` or, for the ops that take integer parameters, ``NAME:key=value,...``
(the toolkit's spec syntax): ``rotary:offset=4096`` rotates rows at positions 4096 onwards,
``causal_softmax:q0=4096,k0=0`` masks a query block starting at row 4096 against a key block
starting at key 0.  :func:`op_call` writes such a name and :func:`parse_op` reads it.

One op has no kernel: ``generic:<source op>`` (``generic:aten.cumsum.default``), which
``offloadlab import-torch --generic`` writes for an op the toolkit does not know, priced from
its shapes alone (:data:`GENERIC`).  Planners and the simulator take it; the executor refuses
a graph that holds one.
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
    """``"rotary:offset=8"`` -> ``("rotary", (("offset", 8),))``, every declared parameter
    present (defaults filled in); ``"generic:aten.cumsum.default"`` -> ``("generic", ())``;
    :class:`OpError` for an unknown op, a bad parameter or a missing label."""
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
    """What is wrong with ``op`` as a compute vertex's op, or None."""
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
    """The op name ``NAME:key=value,...`` (parameters equal to their default left out)."""
    spec = OPS[name]
    defaults = dict(spec.params)
    unknown = set(params) - set(defaults)
    if unknown:
        raise OpError(f"{name} takes no parameter {', '.join(sorted(unknown))}")
    parts = [f"{k}={params[k]}" for k in defaults if params.get(k, defaults[k]) != defaults[k]]
    return f"{name}:{','.join(parts)}" if parts else name


def op_name(op: str) -> str:
    """The op's name without its parameters."""
    return op.partition(":")[0]


def op_flops(op: str, out: Shape, ins: Sequence[Shape]) -> float:
    """The flops of ``op`` writing a tensor of shape ``out`` from inputs of shapes ``ins``
    (the conventions are in the family modules: ``2 m n k`` for a matmul, a few per element
    for the rest)."""
    spec = OPS[op_name(op)]
    if spec.flops is None:
        raise OpError(f"op {op!r} has no flop count from shapes; give the vertex its flops")
    return float(spec.flops(out, ins))


def touched_bytes(op: str | None, out: int, ins: Sequence[int]) -> int:
    """Bytes a kernel reads and writes: its output and its inputs, except that a gather
    (``embedding``) reads only as many bytes of its table (the last input) as it writes."""
    spec = None if op is None else OPS.get(op_name(op))
    if spec is not None and spec.gather:
        return out + sum(ins[:-1]) + min(out, ins[-1] if ins else 0)
    return out + sum(ins)
