"""The ops a compute vertex may name and the dtypes a tensor may have.  The cost model prices a
vertex by its ``flops`` and the bytes it touches (:func:`touched_bytes`); the executor gives
each op its NumPy/CuPy kernel (:mod:`offloadlab.executor.kernels`); builders price a vertex
with :func:`op_flops` from its shapes.

An op is named ``NAME`` or, for the ops that take integer parameters, ``NAME:key=value,...``
(the toolkit's spec syntax): ``rotary:offset=4096`` rotates rows at positions 4096 onwards,
``causal_softmax:q0=4096,k0=0`` masks a query block starting at row 4096 against a key block
starting at key 0.  :func:`op_call` writes such a name and :func:`parse_op` reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

DTYPES: dict[str, int] = {
    "float16": 2, "float32": 4, "float64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}
"""Tensor dtypes (NumPy names) and their bytes per element."""

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


def _stats(out: Shape, ins: Sequence[Shape]) -> float:
    """Row maximum, subtract, exp and sum: 4 per score."""
    return 4.0 * sum(_numel(s) for s in ins)


SOFTMAX_FLOPS = 3.0     # subtract the row maximum, exp, divide by the row sum
STATS_FLOPS = 4.0       # compare for the maximum, subtract, exp, add for the sum
RMSNORM_FLOPS = 4.0     # square, sum, divide by the root, gain
ROTARY_FLOPS = 3.0      # x cos, rotate_half(x) sin, add (the angles are per row, not counted)
SILU_FLOPS = 4.0        # negate, exp, add 1, divide
SWIGLU_FLOPS = SILU_FLOPS + 1.0


@dataclass(frozen=True)
class Op:
    """One op: what it computes, the integer parameters its name may carry (with defaults),
    its flops from the output's and inputs' shapes (None: builders give them), and whether it
    reads only part of its last input (a gather) for the cost model's bytes touched."""

    doc: str
    params: tuple[tuple[str, int], ...] = ()
    flops: FlopsFn | None = None
    gather: bool = False


OPS: dict[str, Op] = {
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
    "adam_update": Op("one Adam step on a weight from its gradient, fresh moments"),
    "sgd_update": Op("one SGD step on a weight from its gradient"),
    "copy": Op("identity", flops=_elementwise(0.0)),
    "layer_forward": Op("a sequential layer's forward a(i) = f(a(i-1); w) (Beaumont et al. "
                        "Sec. 3)"),
    "layer_backward": Op("a layer's backward: delta(i-1) from delta(i) and w"),
    "weight_grad": Op("a layer's weight gradient dw from a(i-1) and delta(i)"),
    "mix": Op("synthetic op of the random workload: a deterministic reduction of its inputs "
              "written into an output of the vertex's size"),
}

UPDATE_OPS: dict[str, float] = {"adam_update": 12.0, "sgd_update": 2.0}
"""Optimizer updates, which a planner may run on the CPU instead of the vertex's GPU
(CoTrain), with their flop per element there: Adam's two moment updates, bias corrections,
square root, division and step; SGD's scaled subtraction."""


class OpError(ValueError):
    """An op name that is not in the vocabulary, or whose parameters are wrong."""


@lru_cache(maxsize=4096)
def parse_op(op: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """``"rotary:offset=8"`` -> ``("rotary", (("offset", 8),))``, every declared parameter
    present (defaults filled in); :class:`OpError` for an unknown op or a bad parameter."""
    name, colon, rest = op.partition(":")
    spec = OPS.get(name)
    if spec is None:
        raise OpError(f"unknown op {op!r}; known ops: {', '.join(OPS)}")
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
        return f"unknown op {op!r}; known ops: {', '.join(OPS)}"
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
