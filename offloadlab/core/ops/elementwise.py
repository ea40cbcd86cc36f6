"""Elementwise ops: the synthetic folds, sums and products, activations and their gradients,
casts and optimizer updates.

The synthetic ops of the random and training workloads (``mix``, ``layer_forward``,
``layer_backward``, ``weight_grad``) read every element of every input and fold or tile each
onto the output's length: ``out = sin(1/2 + sum_i fit(x_i))``.  They stand for the real layer
math in cost and in data flow, so a race on any byte of an input shows in the output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .arrays import accumulate, fold_bytes, same
from .base import FLOAT_DTYPES, KernelError, Shape, numel, op, per_element

GELU_A, GELU_C = 0.044715, math.sqrt(2 / math.pi)
ADAM_LR, ADAM_EPS = 1e-3, 1e-8
SGD_LR = 1e-2

SILU_FLOPS = 4.0        # negate, exp, add 1, divide
SWIGLU_FLOPS = SILU_FLOPS + 1.0
SWIGLU_DGATE_FLOPS = 10.0       # sigmoid (4), dy up, 1 - s, g (1 - s), + 1, two products
SILU_BACKWARD_FLOPS = 9.0       # sigmoid (4), 1 - s, x (1 - s), + 1, times s, times dy
GELU_BACKWARD_FLOPS = 17.0      # tanh(u) (6), c x (1 + 3a x^2) (5), the product rule (6)
ADAM_FLOPS = 12.0               # two moment updates, bias corrections, root, division, step
SGD_FLOPS = 2.0                 # scaled subtraction

UPDATE_OPS: dict[str, float] = {"adam_update": ADAM_FLOPS, "sgd_update": SGD_FLOPS}
"""Optimizer updates, which a planner may run on the CPU instead of the vertex's GPU
(CoTrain), with their flop per element there: Adam's two moment updates, bias corrections,
square root, division and step; SGD's scaled subtraction."""


def _sum_of_inputs(out: Shape, ins: Sequence[Shape]) -> float:
    return max(len(ins) - 1, 0) * numel(out)


def _gelu_tanh(xp, t, x) -> None:
    """``t = tanh(c (x + a x^3))``, ``c = sqrt(2/pi)``, ``a = 0.044715``."""
    xp.multiply(x, x, out=t)
    xp.multiply(t, GELU_A, out=t)
    xp.add(t, 1.0, out=t)
    xp.multiply(t, x, out=t)
    xp.multiply(t, GELU_C, out=t)
    xp.tanh(t, out=t)


def _sigmoid(xp, s, gate) -> None:
    xp.negative(gate, out=s)
    xp.exp(s, out=s)
    xp.add(s, 1.0, out=s)
    xp.reciprocal(s, out=s)


def _silu_grad(xp, out, x, scratch) -> None:
    """``silu'(x) = s (1 + x (1 - s))``, ``s = sigmoid(x)`` in ``scratch``."""
    s = scratch[:out.nbytes].view(out.dtype).reshape(out.shape)
    _sigmoid(xp, s, x)
    xp.subtract(1.0, s, out=out)
    xp.multiply(out, x, out=out)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, s, out=out)


@op("layer_forward", "a sequential layer's forward a(i) = f(a(i-1); w) (Beaumont et al. "
    "Sec. 3)", folds=True, scratch=fold_bytes)
@op("layer_backward", "a layer's backward: delta(i-1) from delta(i) and w", folds=True,
    scratch=fold_bytes)
@op("weight_grad", "a layer's weight gradient dw from a(i-1) and delta(i)", folds=True,
    scratch=fold_bytes)
@op("mix", "synthetic op of the random workload: a deterministic reduction of its inputs "
    "written into an output of the vertex's size", folds=True, scratch=fold_bytes)
def combine(xp, out, args, scratch) -> None:
    """``out = sin(1/2 + sum_i fit(x_i))`` (the synthetic ops).

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    out : array
        The output, written in place.
    args : sequence of array
        The inputs, of any lengths (folded or tiled onto ``out``'s, :func:`~.arrays.accumulate`).
    scratch : array
        A byte workspace of at least :func:`~.arrays.fold_bytes`.
    """
    out.fill(0.5)
    for x in args:
        accumulate(xp, out, x, scratch)
    xp.sin(out, out=out)


@op("add", "elementwise sum of the inputs (a residual add)", flops=_sum_of_inputs, folds=True,
    scratch=fold_bytes)
def _add(xp, out, args, scratch) -> None:
    """Elementwise sum (inputs of other lengths are folded or tiled onto the output)."""
    out.fill(0)
    for x in args:
        accumulate(xp, out, x, scratch)


@op("mul", "elementwise product of the inputs", flops=_sum_of_inputs)
def _mul(xp, out, args, scratch) -> None:
    """Elementwise product of inputs of the output's shape."""
    same("mul", out, args)
    out.fill(1)
    for x in args:
        xp.multiply(out, x, out=out)


@op("relu", "max(x, 0)", flops=per_element(1.0))
def _relu(xp, out, args, scratch) -> None:
    same("relu", out, args, 1)
    xp.maximum(args[0], 0, out=out)


@op("copy", "identity", flops=per_element(0.0))
def _copy(xp, out, args, scratch) -> None:
    same("copy", out, args, 1)
    xp.copyto(out, args[0])


@op("cast", "the input converted to the output's dtype (float16, float32 or float64, rounded "
    "to nearest as NumPy's astype); also its own backward, which casts the gradient back to "
    "the input's dtype.  Memory-bound: no flops (as PyTorch's flop counter), its bytes read "
    "and written", flops=per_element(0.0))
def _cast(xp, out, args, scratch) -> None:
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


@op("gelu", "GELU (tanh approximation)", flops=per_element(9.0))
def _gelu(xp, out, args, scratch) -> None:
    """tanh approximation: ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    same("gelu", out, args, 1)
    x = args[0]
    _gelu_tanh(xp, out, x)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, 0.5, out=out)


@op("gelu_backward", "dx of gelu (inputs x, dy): the tanh approximation differentiated",
    flops=per_element(GELU_BACKWARD_FLOPS), scratch=lambda out, args: out.nbytes)
def _gelu_backward(xp, out, args, scratch) -> None:
    """The derivative of :func:`_gelu`'s formula times ``dy``: with ``t = tanh(u)``,
    ``u' = c (1 + 3a x^2)``, ``(1 + t)/2 + x (1 - t^2) u'/2 = (1 + t) (1 + x u' (1 - t)) / 2``."""
    same("gelu_backward", out, args, 2)
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


@op("silu", "x * sigmoid(x)", flops=per_element(SILU_FLOPS))
def _silu(xp, out, args, scratch) -> None:
    """``x * sigmoid(x)``."""
    same("silu", out, args, 1)
    x = args[0]
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.divide(x, out, out=out)


@op("swiglu", "silu(gate) * up, the SwiGLU product of LLaMA's MLP (Shazeer 2020)",
    flops=per_element(SWIGLU_FLOPS))
def _swiglu(xp, out, args, scratch) -> None:
    """``silu(gate) * up`` (LLaMA's MLP)."""
    same("swiglu", out, args, 2)
    gate, up = args
    xp.negative(gate, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.divide(gate, out, out=out)
    xp.multiply(out, up, out=out)


@op("swiglu_dgate", "d gate of silu(gate) * up (inputs gate, up, dy)",
    flops=per_element(SWIGLU_DGATE_FLOPS), scratch=lambda out, args: out.nbytes)
def _swiglu_dgate(xp, out, args, scratch) -> None:
    """``dy up s (1 + gate (1 - s))``, ``s = sigmoid(gate)``."""
    same("swiglu_dgate", out, args, 3)
    gate, up, dy = args
    _silu_grad(xp, out, gate, scratch)
    xp.multiply(out, up, out=out)
    xp.multiply(out, dy, out=out)


@op("silu_backward", "dx of silu (inputs x, dy): s (1 + x (1 - s)) dy, s = sigmoid(x)",
    flops=per_element(SILU_BACKWARD_FLOPS), scratch=lambda out, args: out.nbytes)
def _silu_backward(xp, out, args, scratch) -> None:
    """``silu'(x) dy``."""
    same("silu_backward", out, args, 2)
    x, dy = args
    _silu_grad(xp, out, x, scratch)
    xp.multiply(out, dy, out=out)


@op("swiglu_dup", "d up of silu(gate) * up (inputs gate, up, dy): silu(gate) dy",
    flops=per_element(SWIGLU_FLOPS))
def _swiglu_dup(xp, out, args, scratch) -> None:
    """``silu(gate) dy``."""
    same("swiglu_dup", out, args, 3)
    gate, _, dy = args
    _sigmoid(xp, out, gate)
    xp.multiply(out, gate, out=out)
    xp.multiply(out, dy, out=out)


@op("adam_update", "one Adam step on a weight from its gradient, fresh moments",
    flops=per_element(ADAM_FLOPS))
def _adam_update(xp, out, args, scratch) -> None:
    """One Adam step on ``w`` from its gradient ``g`` with fresh moments (``m = g``,
    ``v = g^2`` after bias correction): ``w - lr * g / (|g| + eps)``."""
    same("adam_update", out, args, 2)
    w, g = args
    xp.abs(g, out=out)
    xp.add(out, ADAM_EPS, out=out)
    xp.divide(g, out, out=out)
    xp.multiply(out, -ADAM_LR, out=out)
    xp.add(out, w, out=out)


@op("sgd_update", "one SGD step on a weight from its gradient", flops=per_element(SGD_FLOPS))
def _sgd_update(xp, out, args, scratch) -> None:
    """``w - lr * g``."""
    same("sgd_update", out, args, 2)
    w, g = args
    xp.multiply(g, -SGD_LR, out=out)
    xp.add(out, w, out=out)
