"""What every op family shares: the dtypes, the :class:`Op` and :class:`Kernel` records, their
registries, the :func:`op` declaration and the flop counts of more than one family.

Nothing here imports NumPy: a kernel gets its array module (``xp``) when it runs, so that the
planners, the readers and the simulator know every op without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import GraphError
from ..registry import Registry

DTYPES: dict[str, int] = {
    "float16": 2, "float32": 4, "float64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}
"""Tensor dtypes (NumPy names) and their bytes per element."""

FLOAT_DTYPES = ("float16", "float32", "float64")
"""The floating-point dtypes, between which ``cast`` converts."""

Shape = Sequence[int]
FlopsFn = Callable[[Shape, Sequence[Shape]], float]
Array = Any   # numpy.ndarray or cupy.ndarray
KernelFn = Callable[[Any, Array, Sequence[Array], Array], None]
ScratchFn = Callable[[Array, Sequence[Array]], int]
F = TypeVar("F", bound=Callable[..., None])

SOFTMAX_FLOPS = 3.0     # subtract the row maximum, exp, divide by the row sum
STATS_FLOPS = 4.0       # compare for the maximum, subtract, exp, add for the sum


def numel(shape: Shape) -> int:
    """Elements of a tensor of ``shape``.

    Parameters
    ----------
    shape : sequence of int
        The tensor's shape.

    Returns
    -------
    int
        The product of its dimensions (1 for a scalar).
    """
    return math.prod(shape)


def per_element(flops: float) -> FlopsFn:
    """``flops`` per output element.

    Parameters
    ----------
    flops : float
        The flops of one element.

    Returns
    -------
    callable
        An op's ``flops(out, ins)``.
    """
    return lambda out, ins: flops * numel(out)


def per_input_element(flops: float, which: int = 0) -> FlopsFn:
    """``flops`` per element of input ``which``.

    Parameters
    ----------
    flops : float
        The flops of one element.
    which : int, default 0
        The input whose elements count.

    Returns
    -------
    callable
        An op's ``flops(out, ins)``.
    """
    return lambda out, ins: flops * numel(ins[which])


@dataclass(frozen=True)
class Op:
    """One op: what it computes, the integer parameters its name may carry (with defaults),
    its flops from the output's and inputs' shapes (None: builders give them), whether it
    reads only part of its last input (a gather) for the cost model's bytes touched, whether
    its name carries a free label after the colon instead of parameters, and whether its
    kernel folds or tiles inputs of any length onto its output (``calibrate`` times it on
    flat inputs)."""

    doc: str
    params: tuple[tuple[str, int], ...] = ()
    flops: FlopsFn | None = None
    gather: bool = False
    labelled: bool = False
    folds: bool = False


class OpError(ValueError):
    """An op name that is not in the vocabulary, or whose parameters are wrong."""


class KernelError(GraphError):
    """A vertex cannot run: its op has no kernel, or its tensors do not fit the op."""


@dataclass(frozen=True)
class Kernel:
    """An op's implementation ``fn(xp, out, args, scratch)`` and the scratch bytes it needs
    for given tensors, ``scratch(out, args)``."""

    fn: KernelFn
    scratch: ScratchFn = lambda out, args: 0


OPS: Registry[Op] = Registry("op", error=OpError, listed="known ops", sort=True,
                             doc=lambda op: op.doc, options=lambda op: dict(op.params))
"""The ops by name, each declared with its kernel by :func:`op` in a module of this package."""

KERNELS: Registry[Kernel] = Registry("kernel", error=KernelError, listed="known ops", sort=True,
                                    within=OPS)
"""Each op's kernel, registered with the op (:func:`op`); every op but ``generic`` has one
(tests/test_registry.py)."""


def op(name: str, doc: str, *, params: tuple[tuple[str, int], ...] = (),
       flops: FlopsFn | None = None, gather: bool = False, folds: bool = False,
       scratch: ScratchFn | None = None) -> Callable[[F], F]:
    """Declare op ``name`` (its :class:`Op` fields) with the decorated function as its kernel.

    Parameters
    ----------
    name : str
        The op's name.
    doc : str
        Its description, as ``offloadlab list ops`` shows it.
    params : tuple of (str, int) pairs, default ()
        The integer parameters its name may carry, with their defaults; bound to the kernel as
        keyword arguments.
    flops : callable, optional
        Its flops from the output's and the inputs' shapes.
    gather : bool, default False
        It reads only part of its last input.
    folds : bool, default False
        Its kernel folds or tiles inputs of any length onto its output.
    scratch : callable, optional
        ``scratch(out, args)``, the workspace bytes the kernel needs (none if not given).

    Returns
    -------
    callable
        The decorator, which registers the op and its kernel and returns the function.
    """
    def deco(fn: F) -> F:
        OPS[name] = Op(doc, params, flops, gather, folds=folds)
        KERNELS[name] = Kernel(fn) if scratch is None else Kernel(fn, scratch)
        return fn
    return deco


GENERIC = "generic"
"""The op of a vertex priced from its shapes alone, ``generic:<source op>``."""

OPS[GENERIC] = Op("generic:<source op>, an op the toolkit does not know (import-torch "
                  "--generic), priced from its shapes alone: one flop per output element, its "
                  "inputs' and output's bytes touched; it has no kernel",
                  flops=per_element(1.0), labelled=True)
