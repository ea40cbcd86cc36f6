"""Issue 19's op vocabulary: the backward of ``gelu``, ``silu`` and ``layernorm``, each kernel
against central differences of its forward kernel in float64, their flops and bytes touched,
and the unknown-op error that lists them."""

from __future__ import annotations

import numpy as np
import pytest
from test_lora import normal, run_kernel, vjp_check

from offloadlab.core.ops import OpError, op_flops, parse_op, touched_bytes
from offloadlab.executor.kernels import KernelError, kernel


def forward(op: str, *args: np.ndarray) -> np.ndarray:
    """``op``'s forward kernel in float64."""
    return run_kernel(op, args[0].shape, list(args))


def elementwise_derivative(op: str, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``f'(x)`` of an elementwise forward kernel by central differences."""
    return (forward(op, x + eps) - forward(op, x - eps)) / (2 * eps)


@pytest.mark.parametrize("op", ["gelu", "silu"])
def test_activation_backward_is_the_derivative_of_the_forward_kernel(op):
    # large |x| too, where tanh and the sigmoid saturate
    x, dy = np.concatenate([normal(4, 6), 6 * normal(2, 6)]), normal(6, 6)
    got = run_kernel(f"{op}_backward", x.shape, [x, dy])
    np.testing.assert_allclose(got, elementwise_derivative(op, x) * dy, rtol=1e-7, atol=1e-9)
    vjp_check(lambda x: forward(op, x), [x], 0, got, dy)


def test_gelu_backward_differentiates_the_tanh_approximation_not_erf():
    """At x = 1 the tanh form's slope is 1.08296; erf's, Phi(1) + phi(1) = 1.08332."""
    got = run_kernel("gelu_backward", (1,), [np.ones(1), np.ones(1)])
    c, a = np.sqrt(2 / np.pi), 0.044715
    t = np.tanh(c * (1 + a))
    assert got[0] == pytest.approx(0.5 * (1 + t) + 0.5 * (1 - t * t) * c * (1 + 3 * a), rel=1e-12)
    assert abs(got[0] - 1.0833154705876864) > 1e-4


@pytest.mark.parametrize("gain", [True, False])
def test_layernorm_backward_is_the_gradient_of_the_forward_kernel(gain):
    x, g, dy = normal(5, 8), normal(8), normal(5, 8)
    x[0] *= 100.0                           # a row of large values: mean(x^2) - mean^2
    gains = [g] if gain else []
    got = run_kernel("layernorm_backward", x.shape, [x, *gains, dy])
    for _ in range(3):                      # three random directions
        vjp_check(lambda x: forward("layernorm", x, *gains), [x], 0, got, dy)
    # every row's gradient sums to zero: layernorm is unchanged by adding a constant to a row
    np.testing.assert_allclose(got.sum(axis=1), 0.0, atol=1e-10)
    # a 3-D batch is normalized over its last axis, as the forward
    x3, dy3 = normal(3, 2, 8), normal(3, 2, 8)
    batched = run_kernel("layernorm_backward", x3.shape, [x3, *gains, dy3])
    rows = run_kernel("layernorm_backward", (6, 8), [x3.reshape(6, 8), *gains, dy3.reshape(6, 8)])
    np.testing.assert_allclose(batched.reshape(6, 8), rows)

def test_layernorm_backward_in_float32_matches_float64():
    x, g, dy = normal(4, 16), normal(16), normal(4, 16)
    want = run_kernel("layernorm_backward", x.shape, [x, g, dy])
    args = [a.astype(np.float32) for a in (x, g, dy)]
    got = run_kernel("layernorm_backward", x.shape, args, "float32")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op, inputs, message", [
    ("gelu_backward", [(4, 6)], "gelu_backward takes 2 input"),
    ("silu_backward", [(4, 6), (4, 5)], "silu_backward"),
    ("layernorm_backward", [(4, 6)], "layernorm_backward takes x, the optional gain and dy"),
    ("layernorm_backward", [(4, 6), (5,), (4, 6)], "norm gain has 5 elements, rows have 6"),
])
def test_backward_kernels_refuse_wrong_inputs(op, inputs, message):
    with pytest.raises(KernelError, match=message):
        run_kernel(op, (4, 6), [normal(*s) for s in inputs])


@pytest.mark.parametrize("op, per_element", [
    ("gelu_backward", 17), ("silu_backward", 9), ("layernorm_backward", 14)])
def test_backward_flops_and_bytes_touched(op, per_element):
    assert op_flops(op, (8, 1024), [(8, 1024), (8, 1024)]) == per_element * 8 * 1024
    assert touched_bytes(op, 4096, [4096, 4096]) == 3 * 4096          # x, dy and dx
    assert touched_bytes(op, 4096, [4096, 64, 4096]) == 3 * 4096 + 64  # and the gain


def test_unknown_op_errors_list_the_backward_ops():
    with pytest.raises(OpError, match="known ops: .*gelu_backward.*layernorm_backward.*"
                                      "silu_backward"):
        parse_op("erf_backward")
    with pytest.raises(KernelError, match="vertex 'v': no kernel for op 'erf_backward'; known "
                                          "ops: .*gelu_backward.*layernorm_backward.*"
                                          "silu_backward"):
        kernel("erf_backward", "v")
