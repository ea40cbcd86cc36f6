"""The parameter gradients of ``embedding`` and ``layernorm``: ``embedding_backward``,
``layernorm_dgain`` and ``layernorm_dbias``, each kernel against central differences of the
forward kernels in float64 (every element of the gradient), their flops and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from test_lora import normal, run_kernel, vjp_check

from offloadlab.core.ops import op_flops
from offloadlab.executor.kernels import KernelError


def numeric_gradient(forward, a: np.ndarray, dy: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``d <dy, forward(a)> / d a``, every element by central differences."""
    grad = np.empty_like(a)
    for i in np.ndindex(a.shape):
        plus, minus = a.copy(), a.copy()
        plus[i] += eps
        minus[i] -= eps
        grad[i] = np.sum(dy * (forward(plus) - forward(minus))) / (2 * eps)
    return grad


def embed(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    return run_kernel("embedding", (*ids.shape, table.shape[1]), [ids, table])


def layernorm(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    return run_kernel("layernorm", x.shape, [x, g])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_embedding_backward_is_the_gradient_of_embedding(dtype):
    # id 1 three times (once as 6 = 1 mod 5, once as -4), 13 and -1 wrap; row 2 is never read
    ids = np.array([[1, 6, 13], [0, -4, -1]], dtype)
    table, dy = normal(5, 3), normal(2, 3, 3)
    got = run_kernel("embedding_backward", table.shape, [ids, dy])
    np.testing.assert_allclose(got, numeric_gradient(lambda t: embed(ids, t), table, dy),
                               rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(got[1], dy[0, 0] + dy[0, 1] + dy[1, 1])
    assert (got[2] == 0).all()
    vjp_check(lambda t: embed(ids, t), [table], 0, got, dy)


def test_layernorm_dgain_is_the_gradient_of_layernorm_in_its_gain():
    x, g, dy = normal(3, 2, 8), normal(8), normal(3, 2, 8)
    x[0, 0] *= 100.0                        # a row of large values: mean(x^2) - mean^2
    got = run_kernel("layernorm_dgain", (8,), [x, dy])
    np.testing.assert_allclose(got, numeric_gradient(lambda g: layernorm(x, g), g, dy),
                               rtol=1e-6, atol=1e-8)


def test_layernorm_dbias_is_the_gradient_of_a_bias_after_layernorm():
    x, g, b, dy = normal(6, 8), normal(8), normal(8), normal(6, 8)
    got = run_kernel("layernorm_dbias", (8,), [dy])

    def forward(b):
        return run_kernel("add", x.shape, [layernorm(x, g), b])

    np.testing.assert_allclose(got, numeric_gradient(forward, b, dy), rtol=1e-7, atol=1e-9)
    batched = run_kernel("layernorm_dbias", (8,), [dy.reshape(3, 2, 8)])
    np.testing.assert_array_equal(batched, got)


def test_layernorm_dgain_in_float32_matches_float64():
    x, dy = normal(4, 16), normal(4, 16)
    want = run_kernel("layernorm_dgain", (16,), [x, dy])
    got = run_kernel("layernorm_dgain", (16,), [x.astype(np.float32), dy.astype(np.float32)],
                     "float32")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op, out, ins, per", [
    ("embedding_backward", (50, 16), [(4, 8), (4, 8, 16)], 1),
    ("layernorm_dgain", (16,), [(4, 8, 16), (4, 8, 16)], 9),
    ("layernorm_dbias", (16,), [(4, 8, 16)], 1),
])
def test_flops_count_per_element_of_dy(op, out, ins, per):
    assert op_flops(op, out, ins) == per * 4 * 8 * 16


@pytest.mark.parametrize("op, out, inputs, message", [
    ("embedding_backward", (5, 3), [(4,)], "embedding_backward takes ids and dy"),
    ("embedding_backward", (5, 3), [(4,), (4, 3)], "ids must be integers"),
    ("embedding_backward", (5, 3), ["ids", (4, 2)], r"ids \(4,\) and dy \(4, 2\) do not give"),
    ("embedding_backward", (5, 3), ["ids", (3, 3)], r"ids \(4,\) and dy \(3, 3\) do not give"),
    ("layernorm_dgain", (6,), [(4, 6)], "layernorm_dgain takes x and dy"),
    ("layernorm_dgain", (5,), [(4, 6), (4, 6)], r"do not give \(5,\)"),
    ("layernorm_dgain", (6,), [(4, 6), (3, 6)], r"x \(4, 6\) and dy \(3, 6\)"),
    ("layernorm_dbias", (5,), [(4, 6)], "layernorm_dbias takes dy and gives one value"),
    ("layernorm_dbias", (6,), [(4, 6), (4, 6)], "layernorm_dbias takes dy"),
])
def test_grad_kernels_refuse_wrong_inputs(op, out, inputs, message):
    args = [np.arange(4) if s == "ids" else normal(*s) for s in inputs]
    with pytest.raises(KernelError, match=message):
        run_kernel(op, out, args)
