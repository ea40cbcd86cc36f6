"""One small case per kernel (:data:`offloadlab.core.ops.KERNELS`), shared by the GPU test
(every kernel on cupy against numpy) and the CPU test that keeps this table complete."""

from __future__ import annotations

import numpy as np

#: (output shape, input shapes) per op
KERNEL_SHAPES = {
    "matmul": ((8, 6), [(8, 2), (8, 2), (4, 6)]),       # column shards: uses scratch
    "add": ((8, 6), [(8, 6), (100,), (5,)]),           # folded and tiled inputs
    "mul": ((8, 6), [(8, 6), (8, 6)]),
    "relu": ((8, 6), [(8, 6)]),
    "gelu": ((8, 6), [(8, 6)]),
    "silu": ((8, 6), [(8, 6)]),
    "copy": ((8, 6), [(8, 6)]),
    "cast": ((8, 6), [(48,)]),                         # float32 to float32, read in order
    "softmax": ((8, 6), [(8, 6)]),
    "rmsnorm": ((8, 6), [(8, 6), (6,)]),
    "layernorm": ((8, 6), [(8, 6), (6,)]),
    "gelu_backward": ((8, 6), [(8, 6), (8, 6)]),
    "silu_backward": ((8, 6), [(8, 6), (8, 6)]),
    "layernorm_backward": ((8, 6), [(8, 6), (6,), (8, 6)]),
    "layernorm_dgain": ((6,), [(8, 6), (8, 6)]),
    "layernorm_dbias": ((6,), [(8, 6)]),
    "embedding_backward": ((16, 6), [(2, 8), (2, 8, 6)]),   # ids up to 40: wrapped, repeated
    "adam_update": ((8, 6), [(8, 6), (8, 6)]),
    "sgd_update": ((8, 6), [(8, 6), (8, 6)]),
    "layer_forward": ((8, 6), [(8, 6), (100,), (5,)]),
    "layer_backward": ((8, 6), [(8, 6), (100,), (5,)]),
    "weight_grad": ((8, 6), [(8, 6), (100,), (5,)]),
    "mix": ((8, 6), [(8, 6), (100,), (5,)]),
    "linear": ((8, 6), [(8, 2), (8, 3), (6, 5)]),     # column shards: uses scratch
    "swiglu": ((8, 6), [(8, 6), (8, 6)]),
    "embedding": ((8, 6), [(8,), (16, 6)]),            # the ids are made integers below
    "rotary": ((8, 6), [(8, 6)]),
    "attn_scores": ((8, 6), [(8, 4), (6, 4)]),
    "softmax_stats": ((8, 2), [(8, 8), (8, 4)]),       # the diagonal block, then one skipped
    "causal_softmax": ((8, 8), [(8, 8), (8, 2)]),
    "attn_values": ((8, 4), [(8, 8), (8, 2), (8, 4), (2, 4)]),
    "lora_linear": ((5, 6), [(5, 8), (6, 8), (5, 3), (6, 3)]),
    "linear_dx": ((5, 8), [(5, 6), (6, 8)]),
    "linear_dw": ((6, 8), [(5, 6), (5, 8)]),
    "rmsnorm_backward": ((4, 6), [(4, 6), (6,), (4, 6)]),
    "swiglu_dgate": ((4, 6), [(4, 6), (4, 6), (4, 6)]),
    "swiglu_dup": ((4, 6), [(4, 6), (4, 6), (4, 6)]),
    "rotary_backward": ((5, 8), [(5, 8)]),
    "argmax": ((1,), [(6, 10)]),                       # the last row's
    "cross_entropy": ((1,), [(6, 10), (6,)]),          # the labels are made integers below
    "cross_entropy_backward": ((6, 10), [(6, 10), (6,)]),
    "attn_delta": ((8, 1), [(8, 4), (8, 4)]),
    "attn_dprobs": ((8, 6), [(8, 4), (6, 4)]),
    "softmax_backward": ((8, 6), [(8, 6), (8, 6), (8, 1)]),
    "attn_dq": ((8, 4), [(8, 6), (6, 4)]),
    "attn_dk": ((6, 4), [(8, 6), (8, 4)]),
    "attn_dv": ((6, 4), [(8, 6), (8, 4)]),
}

#: inputs that are integer indices: (op, input) -> the range they are drawn from
INTEGER_INPUTS = {("embedding", 0): 16, ("embedding_backward", 0): 40, ("cross_entropy", 1): 10,
                  ("cross_entropy_backward", 1): 10}


def kernel_case(op: str) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """The output shape and float32 (or integer index) inputs of ``op``'s case."""
    shape, shapes = KERNEL_SHAPES[op]
    rng = np.random.default_rng(0)
    args = [rng.integers(0, INTEGER_INPUTS[op, i], s).astype(np.int32)
            if (op, i) in INTEGER_INPUTS else rng.uniform(-1, 1, s).astype(np.float32)
            for i, s in enumerate(shapes)]
    return shape, args
