"""The ops a compute vertex may name and the dtypes a tensor may have.  The cost model prices a
vertex by its ``flops`` and the bytes it touches; the executor gives each op its NumPy/CuPy
kernel (:mod:`offloadlab.executor.kernels`)."""

DTYPES: dict[str, int] = {
    "float16": 2, "float32": 4, "float64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}
"""Tensor dtypes (NumPy names) and their bytes per element."""

OPS: dict[str, str] = {
    "matmul": "hstack(inputs[:-1]) @ inputs[-1]: the left operand may come as column shards",
    "add": "elementwise sum of the inputs",
    "mul": "elementwise product of the inputs",
    "relu": "max(x, 0)",
    "gelu": "GELU (tanh approximation)",
    "silu": "x * sigmoid(x)",
    "softmax": "row-wise softmax",
    "rmsnorm": "RMSNorm over the last axis, optional gain as second input",
    "layernorm": "LayerNorm over the last axis, optional gain as second input",
    "adam_update": "one Adam step on a weight from its gradient, fresh moments",
    "sgd_update": "one SGD step on a weight from its gradient",
    "copy": "identity",
    "layer_forward": "a sequential layer's forward a(i) = f(a(i-1); w) (Beaumont et al. Sec. 3)",
    "layer_backward": "a layer's backward: delta(i-1) from delta(i) and w",
    "weight_grad": "a layer's weight gradient dw from a(i-1) and delta(i)",
    "mix": "synthetic op of the random workload: a deterministic reduction of its inputs "
           "written into an output of the vertex's size",
}

UPDATE_OPS: dict[str, float] = {"adam_update": 12.0, "sgd_update": 2.0}
"""Optimizer updates, which a planner may run on the CPU instead of the vertex's GPU
(CoTrain), with their flop per element there: Adam's two moment updates, bias corrections,
square root, division and step; SGD's scaled subtraction."""
