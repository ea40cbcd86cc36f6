"""The ops a compute vertex may name and the dtypes a tensor may have.  The cost model prices a
vertex by its ``flops`` and the bytes it touches (:func:`touched_bytes`); the executor gives
each op its NumPy/CuPy kernel (:mod:`offloadlab.executor.kernels`); builders price a vertex
with :func:`op_flops` from its shapes.

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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .registry import Registry

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


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _elementwise(per_element: float) -> FlopsFn:
    return lambda out, ins: per_element * _numel(out)


def _sum_of_inputs(out: Shape, ins: Sequence[Shape]) -> float:
    return max(len(ins) - 1, 0) * _numel(out)


def _matmul(out: Shape, ins: Sequence[Shape]) -> float:
    """``2 m n k``: ``k`` the left operand's columns, summed over its shards."""
    return 2.0 * _numel(out) * sum(s[-1] for s in ins[:-1])


def _scores(out: Shape, ins: Sequence[Shape]) -> float:
    """``Q K^T / sqrt(dh)``: ``2 dh`` per score, and one to scale it."""
    return (2.0 * ins[0][-1] + 1.0) * _numel(out)


def _attn_values(out: Shape, ins: Sequence[Shape]) -> float:
    """``sum_j P_j V_j``: ``2 k dh`` per output element over every key block, plus the sums."""
    half = len(ins) // 2
    return 2.0 * _numel(out) * sum(s[-1] for s in ins[:half]) + (half - 1) * _numel(out)


def _pairs_tn(out: Shape, ins: Sequence[Shape]) -> float:
    """``sum_i A_i^T B_i``: ``2 rows_i`` per output element for each pair, plus the sums."""
    half = len(ins) // 2
    return 2.0 * _numel(out) * sum(s[0] for s in ins[:half]) + (half - 1) * _numel(out)


def _scaled(fn: FlopsFn) -> FlopsFn:
    """``fn`` and one more per output element (a scale)."""
    return lambda out, ins: fn(out, ins) + _numel(out)


def _lora_linear(out: Shape, ins: Sequence[Shape]) -> float:
    """``x W^T + u B^T``: two matmuls and their sum."""
    return 2.0 * _numel(out) * (ins[0][-1] + ins[2][-1]) + _numel(out)


def _per_input_element(per: float, which: int = 0) -> FlopsFn:
    return lambda out, ins: per * _numel(ins[which])


def _stats(out: Shape, ins: Sequence[Shape]) -> float:
    """Row maximum, subtract, exp and sum: 4 per score."""
    return 4.0 * sum(_numel(s) for s in ins)


SOFTMAX_FLOPS = 3.0     # subtract the row maximum, exp, divide by the row sum
STATS_FLOPS = 4.0       # compare for the maximum, subtract, exp, add for the sum
RMSNORM_FLOPS = 4.0     # square, sum, divide by the root, gain
ROTARY_FLOPS = 3.0      # x cos, rotate_half(x) sin, add (the angles are per row, not counted)
SILU_FLOPS = 4.0        # negate, exp, add 1, divide
SWIGLU_FLOPS = SILU_FLOPS + 1.0
RMSNORM_BACKWARD_FLOPS = 8.0    # the root again (2), g dy (1), its dot with x (2), combine (3)
SWIGLU_DGATE_FLOPS = 10.0       # sigmoid (4), dy up, 1 - s, g (1 - s), + 1, two products
SILU_BACKWARD_FLOPS = 9.0       # sigmoid (4), 1 - s, x (1 - s), + 1, times s, times dy
GELU_BACKWARD_FLOPS = 17.0      # tanh(u) (6), c x (1 + 3a x^2) (5), the product rule (6)
LAYERNORM_BACKWARD_FLOPS = 14.0     # the statistics (5), g dy (1), two row means (4), combine (4)
LAYERNORM_DGAIN_FLOPS = 9.0     # the statistics (5), xhat (2), dy xhat (1), the column sum (1)
SOFTMAX_BACKWARD_FLOPS = 2.0    # P (dP - delta)
ADAM_FLOPS = 12.0               # two moment updates, bias corrections, root, division, step
SGD_FLOPS = 2.0                 # scaled subtraction
CROSS_ENTROPY_FLOPS = STATS_FLOPS                       # log-sum-exp per logit
CROSS_ENTROPY_BACKWARD_FLOPS = STATS_FLOPS + SOFTMAX_FLOPS + 1.0   # softmax, / tokens


@dataclass(frozen=True)
class Op:
    """One op: what it computes, the integer parameters its name may carry (with defaults),
    its flops from the output's and inputs' shapes (None: builders give them), whether it
    reads only part of its last input (a gather) for the cost model's bytes touched, and
    whether its name carries a free label after the colon instead of parameters."""

    doc: str
    params: tuple[tuple[str, int], ...] = ()
    flops: FlopsFn | None = None
    gather: bool = False
    labelled: bool = False


class OpError(ValueError):
    """An op name that is not in the vocabulary, or whose parameters are wrong."""


OPS: Registry[Op] = Registry("op", error=OpError, listed="known ops", doc=lambda op: op.doc,
                             options=lambda op: dict(op.params))
"""The ops by name; the executor registers each one's kernel against its name
(:data:`offloadlab.executor.kernels.KERNELS`)."""
OPS.update({
    "matmul": Op("hstack(inputs[:-1]) @ inputs[-1]: the left operand may come as column shards",
                 flops=_matmul),
    "linear": Op("hstack(inputs[:-1]) @ inputs[-1]^T: x W^T with W stored (out, in) as in "
                 "PyTorch; the left operand may come as column shards", flops=_matmul),
    "add": Op("elementwise sum of the inputs (a residual add)", flops=_sum_of_inputs),
    "mul": Op("elementwise product of the inputs", flops=_sum_of_inputs),
    "relu": Op("max(x, 0)", flops=_elementwise(1.0)),
    "gelu": Op("GELU (tanh approximation)", flops=_elementwise(9.0)),
    "silu": Op("x * sigmoid(x)", flops=_elementwise(SILU_FLOPS)),
    "swiglu": Op("silu(gate) * up, the SwiGLU product of LLaMA's MLP (Shazeer 2020)",
                 flops=_elementwise(SWIGLU_FLOPS)),
    "softmax": Op("row-wise softmax", flops=_elementwise(STATS_FLOPS + SOFTMAX_FLOPS)),
    "rmsnorm": Op("RMSNorm over the last axis, optional gain as second input",
                  flops=_elementwise(RMSNORM_FLOPS)),
    "layernorm": Op("LayerNorm over the last axis, optional gain as second input",
                    flops=_elementwise(7.0)),
    "embedding": Op("table[ids]: rows of the table (second input) at the token ids (first "
                    "input, taken modulo the table's rows)", flops=_elementwise(0.0),
                    gather=True),
    "rotary": Op("rotary position embedding (Su et al. 2021, as in LLaMA) of rows at positions "
                 "offset, offset+1, ...: x cos + rotate_half(x) sin, base 10000",
                 params=(("offset", 0),), flops=_elementwise(ROTARY_FLOPS)),
    "attn_scores": Op("Q K^T / sqrt(dh) for one head, a query block against a key block",
                      flops=_scores),
    "softmax_stats": Op("the causal softmax's row maximum and row sum of exp over a query "
                        "block's key blocks (the inputs, contiguous keys from k0), as a "
                        "(rows, 2) float32 tensor; keys past a query's position are masked",
                        params=(("q0", 0), ("k0", 0)), flops=_stats),
    "causal_softmax": Op("a key block's probabilities exp(S - max) / sum from the row "
                         "statistics (second input), zero where key k0+j is past query q0+i",
                         params=(("q0", 0), ("k0", 0)), flops=_elementwise(SOFTMAX_FLOPS)),
    "attn_values": Op("sum_j P_j V_j for one head: inputs P_0..P_n-1 then V_0..V_n-1",
                      flops=_attn_values),
    # backward ops (LoRA training, llama-lora-train): frozen weights get no gradient
    "lora_linear": Op("x W^T + u B^T (inputs x, W, u, B): a frozen linear layer with its "
                      "LoRA adapter (Hu et al. 2021), u = x A^T computed beforehand",
                      flops=_lora_linear),
    "linear_dx": Op("sum_i dY_i W_i[:, col0:col0+n] (inputs dY_0..dY_n-1 then W_0..W_n-1, n "
                    "the output's columns): the input gradient of x W^T (summed over the "
                    "layers that read x)", params=(("col0", 0),), flops=_attn_values),
    "linear_dw": Op("sum_i dY_i^T X_i (inputs dY_0..dY_n-1 then X_0..X_n-1): the weight "
                    "gradient of x W^T, summed over row blocks", flops=_pairs_tn),
    "rmsnorm_backward": Op("dx of RMSNorm from x, the gain and dy (inputs x, g, dy); the gain "
                           "frozen", flops=_elementwise(RMSNORM_BACKWARD_FLOPS)),
    "swiglu_dgate": Op("d gate of silu(gate) * up (inputs gate, up, dy)",
                       flops=_elementwise(SWIGLU_DGATE_FLOPS)),
    "swiglu_dup": Op("d up of silu(gate) * up (inputs gate, up, dy): silu(gate) dy",
                     flops=_elementwise(SWIGLU_FLOPS)),
    "gelu_backward": Op("dx of gelu (inputs x, dy): the tanh approximation differentiated",
                        flops=_elementwise(GELU_BACKWARD_FLOPS)),
    "silu_backward": Op("dx of silu (inputs x, dy): s (1 + x (1 - s)) dy, s = sigmoid(x)",
                        flops=_elementwise(SILU_BACKWARD_FLOPS)),
    "layernorm_backward": Op("dx of LayerNorm from x, the optional gain and dy (inputs x, "
                             "[g,] dy); the gain frozen",
                             flops=_elementwise(LAYERNORM_BACKWARD_FLOPS)),
    "layernorm_dgain": Op("dg of LayerNorm's gain from x and dy (inputs x, dy), shape (dim,): "
                          "sum over rows of dy xhat",
                          flops=_per_input_element(LAYERNORM_DGAIN_FLOPS)),
    "layernorm_dbias": Op("db of a bias added to LayerNorm's output (input dy), shape (dim,): "
                          "sum over rows of dy", flops=_per_input_element(1.0)),
    "embedding_backward": Op("dtable of embedding (inputs ids, dy; output the table's shape): "
                             "each row of dy added at row id mod rows, repeated ids summed",
                             flops=_per_input_element(1.0, which=1)),
    "rotary_backward": Op("the gradient through rotary:offset=..: the inverse rotation of dy",
                          params=(("offset", 0),), flops=_elementwise(ROTARY_FLOPS)),
    "attn_dprobs": Op("dP = dO V^T for one head, a query block against a key block",
                      flops=lambda out, ins: 2.0 * ins[0][-1] * _numel(out)),
    "attn_delta": Op("rowsum(dO * O) for one head and query block, (rows, 1): the softmax "
                     "backward's correction term", flops=_per_input_element(2.0)),
    "softmax_backward": Op("dS = P (dP - delta) for a key block (inputs P, dP, delta); zero "
                           "where P is masked", flops=_elementwise(SOFTMAX_BACKWARD_FLOPS)),
    "attn_dq": Op("dQ = sum_j dS_j K_j / sqrt(dh) (inputs dS_0.. then K_0..)",
                  flops=_scaled(_attn_values)),
    "attn_dk": Op("dK = sum_i dS_i^T Q_i / sqrt(dh) over the query blocks at or after the "
                  "key block (inputs dS_0.. then Q_0..)", flops=_scaled(_pairs_tn)),
    "attn_dv": Op("dV = sum_i P_i^T dO_i over the query blocks (inputs P_0.. then dO_0..)",
                  flops=_pairs_tn),
    "cross_entropy": Op("sum over rows of logsumexp(logits) - logits[label] / tokens (inputs "
                        "logits, int labels taken modulo the vocabulary), shape (1,)",
                        params=(("tokens", 1),),
                        flops=_per_input_element(CROSS_ENTROPY_FLOPS)),
    "cross_entropy_backward": Op("d logits of cross_entropy: (softmax(logits) - onehot(label)) "
                                 "/ tokens", params=(("tokens", 1),),
                                 flops=_elementwise(CROSS_ENTROPY_BACKWARD_FLOPS)),
    "argmax": Op("the index of the largest entry of the input's last row (the first of equal "
                 "ones), shape (1,): the greedy choice of the next token from its logits",
                 flops=lambda out, ins: float(ins[0][-1])),
    "adam_update": Op("one Adam step on a weight from its gradient, fresh moments",
                      flops=_elementwise(ADAM_FLOPS)),
    "sgd_update": Op("one SGD step on a weight from its gradient", flops=_elementwise(SGD_FLOPS)),
    "copy": Op("identity", flops=_elementwise(0.0)),
    "cast": Op("the input converted to the output's dtype (float16, float32 or float64, "
               "rounded to nearest as NumPy's astype); also its own backward, which casts the "
               "gradient back to the input's dtype.  Memory-bound: no flops (as PyTorch's "
               "flop counter), its bytes read and written", flops=_elementwise(0.0)),
    "layer_forward": Op("a sequential layer's forward a(i) = f(a(i-1); w) (Beaumont et al. "
                        "Sec. 3)"),
    "layer_backward": Op("a layer's backward: delta(i-1) from delta(i) and w"),
    "weight_grad": Op("a layer's weight gradient dw from a(i-1) and delta(i)"),
    "mix": Op("synthetic op of the random workload: a deterministic reduction of its inputs "
              "written into an output of the vertex's size"),
    "generic": Op("generic:<source op>, an op the toolkit does not know (import-torch "
                  "--generic), priced from its shapes alone: one flop per output element, its "
                  "inputs' and output's bytes touched; it has no kernel",
                  flops=_elementwise(1.0), labelled=True),
})

UPDATE_OPS: dict[str, float] = {"adam_update": ADAM_FLOPS, "sgd_update": SGD_FLOPS}
"""Optimizer updates, which a planner may run on the CPU instead of the vertex's GPU
(CoTrain), with their flop per element there: Adam's two moment updates, bias corrections,
square root, division and step; SGD's scaled subtraction."""


GENERIC = "generic"
"""The op of a vertex priced from its shapes alone, ``generic:<source op>``."""


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
    (the conventions are in this module: ``2 m n k`` for a matmul, a few per element for the
    rest)."""
    spec = OPS[op_name(op)]
    if spec.flops is None:
        raise OpError(f"op {op!r} has no flop count from shapes; give the vertex its flops")
    return float(spec.flops(out, ins))


GATHER_OPS = frozenset(name for name, spec in OPS.items() if spec.gather)


def touched_bytes(op: str | None, out: int, ins: Sequence[int]) -> int:
    """Bytes a kernel reads and writes: its output and its inputs, except that a gather
    (``embedding``) reads only as many bytes of its table (the last input) as it writes."""
    if op is not None and op_name(op) in GATHER_OPS:
        return out + sum(ins[:-1]) + min(out, ins[-1] if ins else 0)
    return out + sum(ins)
