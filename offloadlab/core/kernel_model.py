"""The fitted kernel-time model, a Machine's ``cost=fitted`` (docs/cost-model.md).

A GPU kernel of op class ``c`` that does ``f`` flops and touches ``b`` bytes takes

    t = (latency_c**p_c + (f / (e_c F))**p_c + (b / (beta_c B))**p_c) ** (1 / p_c)

with ``F`` and ``B`` the GPU's peak flop rate and memory bandwidth.  The parameters were fitted
(``bench/fit_kernels.py``) to microsoft/vidur's per-operator measurements of LLaMA layers on an
A100 and an H100, and to its A100 attention kernels (:data:`OP_CLASSES` maps the toolkit's ops
onto them).  What each parameter means and the fit's error: docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .checks import short
from .ops import op_name

KernelFit = tuple[tuple[str, float, float, float, float], ...]
"""Per op class: ``(class, flop fraction e, bandwidth fraction beta, latency s, blend p)``."""

ATTENTION = "attention"
"""The class of the blocked attention's ops, fitted to vidur's measured attention kernels: their
bandwidth fraction may exceed 1, being of the score blocks' bytes that the unfused ops declare
and a fused kernel keeps on chip."""
ELEMENTWISE = "elementwise"
"""The class of every op no other class names: one memory-bound fit of vidur's norm, rotary,
activation and add operators together."""

OP_CLASSES: dict[str, str] = {
    **dict.fromkeys(("matmul", "linear", "lora_linear", "linear_dx", "linear_dw",
                     "layer_forward", "layer_backward", "weight_grad"), "gemm"),
    **dict.fromkeys(("attn_scores", "softmax_stats", "causal_softmax", "attn_values",
                     "attn_dprobs", "attn_delta", "softmax_backward", "attn_dq", "attn_dk",
                     "attn_dv"), ATTENTION),
    **dict.fromkeys(("rmsnorm", "layernorm", "rmsnorm_backward", "layernorm_backward",
                     "layernorm_dgain", "layernorm_dbias"), "norm"),
    **dict.fromkeys(("rotary", "rotary_backward"), "rotary"),
    **dict.fromkeys(("swiglu", "silu", "gelu", "relu", "swiglu_dgate", "swiglu_dup",
                     "silu_backward", "gelu_backward"), "activation"),
    **dict.fromkeys(("add", "mul"), "add"),
    **dict.fromkeys(("embedding", "embedding_backward"), "embedding"),
}
"""The toolkit's ops by fitted class; the rest (an unblocked softmax, cross-entropy, optimizer
updates, copies, casts, ``mix``, ``generic``) are :data:`ELEMENTWISE`.  The blocked attention's
forward and backward ops are :data:`ATTENTION`, fitted to its forward (docs/cost-model.md)."""

CLASSES = ("gemm", "norm", "rotary", "activation", "add", "embedding", ATTENTION, ELEMENTWISE)
"""The classes a fit must give, each once."""


def op_class(op: str | None) -> str:
    """The fitted class of ``op`` (:data:`OP_CLASSES`; :data:`ELEMENTWISE` otherwise).

    Parameters
    ----------
    op : str or None
        A vertex's op (with its parameters, if any).

    Returns
    -------
    str
        Its class.
    """
    return OP_CLASSES.get(op_name(op), ELEMENTWISE) if op is not None else ELEMENTWISE


def by_class(fit: KernelFit) -> dict[str, tuple[float, float, float, float]]:
    """``fit`` as ``{class: (e, beta, latency, p)}``.

    Parameters
    ----------
    fit : KernelFit
        A machine's ``kernel_fit``.

    Returns
    -------
    dict
        Each class's parameters.
    """
    return {name: (e, beta, latency, p) for name, e, beta, latency, p in fit}


def kernel_time(params: Sequence[float], flops: float, touched: float, peak_flops: float,
                bandwidth: float) -> float:
    """Seconds of a kernel of ``flops`` touching ``touched`` bytes on a GPU of ``peak_flops``
    and ``bandwidth``, by one class's ``(e, beta, latency, p)``: the module's formula.

    Parameters
    ----------
    params : sequence of float
        The class's ``(e, beta, latency, p)``.
    flops : float
        The kernel's flops.
    touched : float
        The bytes it reads and writes.
    peak_flops, bandwidth : float
        The GPU's; either may be infinite (no time).

    Returns
    -------
    float
        The kernel's seconds.
    """
    e, beta, latency, p = params
    compute = flops / (e * peak_flops)
    memory = touched / (beta * bandwidth)
    top = max(latency, compute, memory)
    if top == 0.0:
        return 0.0
    return top * ((latency / top) ** p + (compute / top) ** p + (memory / top) ** p) ** (1 / p)


def fit_problem(fit: object) -> str | None:
    """What is wrong with ``fit`` as a Machine's ``kernel_fit``.

    A fit is a tuple of ``(class, e, beta, latency, p)`` with every class of :data:`CLASSES`
    once, ``0 < e, beta <= 1`` (``beta > 0`` for :data:`ATTENTION`), ``latency`` finite and
    ``>= 0``, ``p`` finite and ``>= 1``.

    Parameters
    ----------
    fit : object
        The value read.

    Returns
    -------
    str or None
        The problem in words; None if there is none.
    """
    if type(fit) is not tuple:
        return f"must be a list of [class, e, beta, latency, p], got {short(fit)}"
    seen = []
    for entry in fit:
        if type(entry) is not tuple or len(entry) != 5 or entry[0] not in CLASSES \
                or not all(type(x) in (int, float) and math.isfinite(x) for x in entry[1:]):
            return (f"entries must be [class, e, beta, latency, p] with a class of "
                    f"{', '.join(CLASSES)} and finite numbers; got {short(entry)}")
        name, e, beta, latency, p = entry
        if not (0 < e <= 1 and 0 < beta and (beta <= 1 or name == ATTENTION)
                and latency >= 0 and p >= 1):
            return (f"{name}: needs 0 < e <= 1, 0 < beta <= 1 (any beta > 0 for "
                    f"{ATTENTION}), latency >= 0 and p >= 1; got {short(entry)}")
        seen.append(name)
    if sorted(seen) != sorted(CLASSES):
        return (f"must give each class once ({', '.join(CLASSES)}); got "
                f"{', '.join(seen) or 'none'}")
    return None


FIT_SOURCE = ("kernel times fitted (docs/cost-model.md) to the measured float16 operators of "
              "Llama-2-7b-hf and Meta-Llama-3-8B in microsoft/vidur@7d47513 "
              "(data/profiling/compute/GPU/meta-llama/MODEL/mlp.csv), attention to its A100 "
              "FlashAttention kernels (.../Llama-2-7b-hf/attention.csv)")
"""Where :data:`A100_FIT` and :data:`H100_FIT` come from."""

# fitted by bench/fit_kernels.py: (class, e, beta, latency s, p); fractions of an A100 80GB
# SXM's 312 TFLOP/s float16 and 2039 GB/s, of an H100 SXM5's 989 TFLOP/s and 3.35 TB/s
A100_FIT: KernelFit = (
    ("gemm", 0.7516, 0.8268, 6.67e-06, 1.282),
    ("norm", 1.0, 0.3578, 4.276e-06, 2.75),
    ("rotary", 1.0, 0.4152, 2.938e-06, 1.663),
    ("activation", 1.0, 0.4741, 2.62e-06, 1.378),
    ("add", 1.0, 0.9377, 2.04e-06, 2.257),
    ("embedding", 1.0, 0.1453, 4.081e-06, 1.702),
    ("attention", 0.3435, 8.008, 1.256e-07, 1.0),
    ("elementwise", 1.0, 0.6281, 2.923e-06, 1.537),
)
H100_FIT: KernelFit = (
    ("gemm", 0.8861, 1.0, 4.774e-06, 1.011),
    ("norm", 1.0, 0.3656, 3.833e-06, 2.372),
    ("rotary", 1.0, 0.4867, 2.157e-06, 1.456),
    ("activation", 1.0, 0.5396, 1.733e-06, 1.202),
    ("add", 1.0, 1.0, 1.307e-06, 1.777),
    ("embedding", 1.0, 0.1805, 2.776e-06, 1.132),
    ("attention", 0.3435, 8.008, 1.256e-07, 1.0),
    ("elementwise", 1.0, 0.7984, 1.788e-06, 1.0),
)
