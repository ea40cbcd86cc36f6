"""Elementwise kernels: the synthetic folds, sums and products, activations and their gradients,
casts and optimizer updates."""

from __future__ import annotations

import math

from ...core.ops import FLOAT_DTYPES
from .base import (
    ADAM_EPS,
    ADAM_LR,
    SGD_LR,
    KernelError,
    accumulate,
    fold_bytes,
    kernel_for,
    same,
)

GELU_A, GELU_C = 0.044715, math.sqrt(2 / math.pi)


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


@kernel_for("layer_forward", fold_bytes)
@kernel_for("layer_backward", fold_bytes)
@kernel_for("weight_grad", fold_bytes)
@kernel_for("mix", fold_bytes)
def combine(xp, out, args, scratch) -> None:
    """``out = sin(1/2 + sum_i fit(x_i))`` (the synthetic ops)."""
    out.fill(0.5)
    for x in args:
        accumulate(xp, out, x, scratch)
    xp.sin(out, out=out)


@kernel_for("add", fold_bytes)
def add(xp, out, args, scratch) -> None:
    """Elementwise sum (inputs of other lengths are folded or tiled onto the output)."""
    out.fill(0)
    for x in args:
        accumulate(xp, out, x, scratch)


@kernel_for("mul")
def mul(xp, out, args, scratch) -> None:
    """Elementwise product of inputs of the output's shape."""
    same("mul", out, args)
    out.fill(1)
    for x in args:
        xp.multiply(out, x, out=out)


@kernel_for("relu")
def relu(xp, out, args, scratch) -> None:
    same("relu", out, args, 1)
    xp.maximum(args[0], 0, out=out)


@kernel_for("copy")
def copy(xp, out, args, scratch) -> None:
    same("copy", out, args, 1)
    xp.copyto(out, args[0])


@kernel_for("cast")
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


@kernel_for("gelu")
def gelu(xp, out, args, scratch) -> None:
    """tanh approximation: ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    same("gelu", out, args, 1)
    x = args[0]
    _gelu_tanh(xp, out, x)
    xp.add(out, 1.0, out=out)
    xp.multiply(out, x, out=out)
    xp.multiply(out, 0.5, out=out)


@kernel_for("gelu_backward", lambda out, args: out.nbytes)
def gelu_backward(xp, out, args, scratch) -> None:
    """The derivative of :func:`gelu`'s formula times ``dy``: with ``t = tanh(u)``,
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


@kernel_for("silu")
def silu(xp, out, args, scratch) -> None:
    """``x * sigmoid(x)``."""
    same("silu", out, args, 1)
    x = args[0]
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.divide(x, out, out=out)


@kernel_for("swiglu")
def swiglu(xp, out, args, scratch) -> None:
    """``silu(gate) * up`` (LLaMA's MLP)."""
    same("swiglu", out, args, 2)
    gate, up = args
    xp.negative(gate, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1.0, out=out)
    xp.divide(gate, out, out=out)
    xp.multiply(out, up, out=out)


@kernel_for("swiglu_dgate", lambda out, args: out.nbytes)
def swiglu_dgate(xp, out, args, scratch) -> None:
    """``dy up s (1 + gate (1 - s))``, ``s = sigmoid(gate)``."""
    same("swiglu_dgate", out, args, 3)
    gate, up, dy = args
    _silu_grad(xp, out, gate, scratch)
    xp.multiply(out, up, out=out)
    xp.multiply(out, dy, out=out)


@kernel_for("silu_backward", lambda out, args: out.nbytes)
def silu_backward(xp, out, args, scratch) -> None:
    """``silu'(x) dy``."""
    same("silu_backward", out, args, 2)
    x, dy = args
    _silu_grad(xp, out, x, scratch)
    xp.multiply(out, dy, out=out)


@kernel_for("swiglu_dup")
def swiglu_dup(xp, out, args, scratch) -> None:
    """``silu(gate) dy``."""
    same("swiglu_dup", out, args, 3)
    gate, _, dy = args
    _sigmoid(xp, out, gate)
    xp.multiply(out, gate, out=out)
    xp.multiply(out, dy, out=out)


@kernel_for("adam_update")
def adam_update(xp, out, args, scratch) -> None:
    """One Adam step on ``w`` from its gradient ``g`` with fresh moments (``m = g``,
    ``v = g^2`` after bias correction): ``w - lr * g / (|g| + eps)``."""
    same("adam_update", out, args, 2)
    w, g = args
    xp.abs(g, out=out)
    xp.add(out, ADAM_EPS, out=out)
    xp.divide(g, out, out=out)
    xp.multiply(out, -ADAM_LR, out=out)
    xp.add(out, w, out=out)


@kernel_for("sgd_update")
def sgd_update(xp, out, args, scratch) -> None:
    """``w - lr * g``."""
    same("sgd_update", out, args, 2)
    w, g = args
    xp.multiply(g, -SGD_LR, out=out)
    xp.add(out, w, out=out)
