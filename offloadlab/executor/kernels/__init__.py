"""The kernels of the ops of :mod:`offloadlab.core.ops`, written once against an array module.

A kernel is ``fn(xp, out, args, scratch)``: ``xp`` is ``numpy`` or ``cupy``, ``out`` the
vertex's planned location viewed with its shape and dtype, ``args`` its inputs in argument
order, and ``scratch`` a 1-D byte workspace of the stream it runs on (allocated once at
start-up, at least :func:`scratch_bytes` long).  Kernels write ``out`` in place (``out=``) and
allocate nothing on the device.  The reference evaluation
(:mod:`offloadlab.executor.reference`) runs the same functions on fresh arrays, so the
executor's answers can be compared with it.

The synthetic ops of the random and training workloads (``mix``, ``layer_forward``,
``layer_backward``, ``weight_grad``) read every element of every input and fold or tile each
onto the output's length: ``out = sin(1/2 + sum_i fit(x_i))``.  They stand for the real layer
math in cost and in data flow, so a race on any byte of an input shows in the output.

The kernels are grouped by op family, a module each (:mod:`.elementwise`, :mod:`.linear`,
:mod:`.norm`, :mod:`.attention`), each kernel registered against its op's name with
:func:`~.base.kernel_for`; :mod:`.base` holds the kernel type, the registry and what the
families share.
"""

from .attention import (
    attn_delta,
    attn_dk,
    attn_dprobs,
    attn_dq,
    attn_scores,
    causal_softmax,
    rotary,
    rotary_backward,
    softmax_backward,
    softmax_stats,
)
from .base import (
    ADAM_EPS,
    ADAM_LR,
    KERNELS,
    NORM_EPS,
    SGD_LR,
    Kernel,
    KernelError,
    aligned,
    check_runnable,
    initial_value,
    kernel,
    kernel_for,
    tensor_shape,
    view,
)
from .elementwise import (
    adam_update,
    add,
    cast,
    combine,
    copy,
    gelu,
    gelu_backward,
    mul,
    relu,
    sgd_update,
    silu,
    silu_backward,
    swiglu,
    swiglu_dgate,
    swiglu_dup,
)
from .linear import (
    attn_values,
    embedding,
    embedding_backward,
    linear,
    linear_dw,
    linear_dx,
    lora_linear,
    matmul,
)
from .norm import (
    argmax,
    cross_entropy,
    cross_entropy_backward,
    layernorm,
    layernorm_backward,
    layernorm_dbias,
    layernorm_dgain,
    rmsnorm,
    rmsnorm_backward,
    softmax,
)

__all__ = ["ADAM_EPS", "ADAM_LR", "KERNELS", "NORM_EPS", "SGD_LR", "Kernel", "KernelError",
           "aligned", "check_runnable", "initial_value", "kernel", "kernel_for", "tensor_shape",
           "view",
           "adam_update", "add", "argmax", "attn_delta", "attn_dk", "attn_dprobs", "attn_dq",
           "attn_scores", "attn_values", "cast", "causal_softmax", "combine", "copy",
           "cross_entropy", "cross_entropy_backward", "embedding", "embedding_backward", "gelu",
           "gelu_backward", "layernorm", "layernorm_backward", "layernorm_dbias",
           "layernorm_dgain", "linear", "linear_dw", "linear_dx", "lora_linear", "matmul", "mul",
           "relu", "rmsnorm", "rmsnorm_backward", "rotary", "rotary_backward", "sgd_update",
           "silu", "silu_backward", "softmax", "softmax_backward", "softmax_stats", "swiglu",
           "swiglu_dgate", "swiglu_dup"]
