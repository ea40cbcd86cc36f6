"""One training iteration of a sequential network (Beaumont et al., Sec. 3).

``F1..FL`` then ``BL..B1``; layer i has forward/backward times ``uF[i]``, ``uB[i]``, weights of
``w[i]`` bytes and an activation ``a^i`` of ``a[i]`` bytes (``a^0``, the batch, is ``a0``).  The
weight update happens inside ``B_i``, as the paper proposes.  :class:`TrainingChain` holds the
numbers the analytic planners and the MILP use; :meth:`TrainingChain.to_taskgraph` unrolls
several iterations into a TaskGraph that carries the chain in ``graph.meta["chain"]``.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from pathlib import Path

from ..checks import number
from ..errors import SpecError
from ..machine import PRESETS, Machine
from ..taskgraph import TaskGraph


@dataclass(frozen=True)
class TrainingChain:
    """Per-layer values of an L-layer chain; index 0 is layer 1."""

    uF: tuple[float, ...]
    uB: tuple[float, ...]
    w: tuple[int, ...]
    a: tuple[int, ...]
    a0: int = 0
    name: str = "training-chain"

    def __post_init__(self):
        if type(self.name) is not str:
            raise SpecError(f"training chain: name must be a string, got {self.name!r}")
        for key in ("uF", "uB", "w", "a"):
            if type(getattr(self, key)) is not tuple:
                raise SpecError(f"{self.name}: {key} must be a list of per-layer values, got "
                                f"{getattr(self, key)!r}")
        n = len(self.uF)
        if n == 0 or not len(self.uB) == len(self.w) == len(self.a) == n:
            raise SpecError(f"{self.name}: uF, uB, w and a need one value per layer "
                            f"(got {len(self.uF)}, {len(self.uB)}, {len(self.w)}, {len(self.a)})")
        for key, values in (("uF", self.uF), ("uB", self.uB)):
            for i, x in enumerate(values, 1):
                number(x, self.name, f"{key} of layer {i}", error=SpecError)
        for key, values in (("w", self.w), ("a", self.a)):
            for i, x in enumerate(values, 1):
                if not (isinstance(x, int) and not isinstance(x, bool) and x > 0):
                    raise SpecError(f"{self.name}: {key} of layer {i} must be > 0 bytes, got {x!r}")
        number(self.a0, self.name, "a0", count=True, error=SpecError)

    @property
    def L(self) -> int:
        return len(self.uF)

    @property
    def sum_u(self) -> float:
        """Σu: the iteration time with no idle time, a trivial lower bound."""
        return sum(self.uF) + sum(self.uB)

    def activations_upto(self, i: int) -> int:
        """Σ_{k<=i} |a^k|, k from 0."""
        return self.a0 + sum(self.a[:i])

    def memory_forward(self, i: int) -> int:
        """M_{F_i} = |w_i| + Σ_{k<=i} |a^k|  (eq. 1; i is 1-based)."""
        return self.w[i - 1] + self.activations_upto(i)

    def memory_backward(self, i: int) -> int:
        """M_{B_i} = 2|w_i| + Σ_{k<=i} |a^k|  (eq. 1; i is 1-based)."""
        return 2 * self.w[i - 1] + self.activations_upto(i)

    def operations(self) -> list[tuple[str, int]]:
        """``[("F", 1), ..., ("F", L), ("B", L), ..., ("B", 1)]``."""
        return [("F", i) for i in range(1, self.L + 1)] + [("B", i) for i in range(self.L, 0, -1)]

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingChain":
        """Read :meth:`to_dict`'s output (a training TaskGraph's ``graph.meta["chain"]``)."""
        if type(data) is not dict:
            raise SpecError(f"a training chain is a JSON object of {', '.join(_CHAIN_FIELDS)}, "
                            f"got {data!r:.80}")
        unknown = sorted(set(data) - set(_CHAIN_FIELDS))
        missing = [k for k in ("uF", "uB", "w", "a") if k not in data]
        if unknown or missing:
            problems = ([f"unknown field(s) {', '.join(map(str, unknown))}"] if unknown else []) \
                + ([f"missing {', '.join(missing)}"] if missing else [])
            raise SpecError(f"training chain: {'; '.join(problems)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    @classmethod
    def from_taskgraph(cls, graph: TaskGraph) -> "TrainingChain":
        from ..errors import PlanError
        if "chain" not in graph.meta:
            raise PlanError(f"TaskGraph {graph.name!r} is not a training workload (no "
                            f"meta['chain']); use training-chain, gpt2-train or bert-train")
        return cls.from_dict(graph.meta["chain"])

    def to_taskgraph(self, iterations: int = 3, gpu: str = "gpu0") -> TaskGraph:
        """Unroll ``iterations`` iterations on one GPU.

        Iteration t: ``F{i}@t`` reads ``a{i-1}`` and weight ``w{i}@{t-1}``; ``B_i`` is three
        vertices in the paper's order: ``G{i}@t`` (the gradient dw_i from a^{i-1} and δ^i),
        ``B{i}@t`` (δ^{i-1} from δ^i and w_i) and the update ``w{i}@t`` (adam_update of
        w_i with dw_i), taking ``uB/2``, ``uB/2`` and 0 seconds.  δ^L is F_L's output (the loss is free).
        Initial weights ``w{i}@0`` live in host RAM; each batch ``a0@t`` on the GPU.
        """
        if iterations <= 0:
            raise SpecError(f"{self.name}: iterations must be positive, got {iterations}")
        g = TaskGraph(name=self.name, meta={"chain": self.to_dict(), "iterations": iterations})
        for i in range(1, self.L + 1):
            g.add_input(f"w{i}@0", self.w[i - 1])
        for t in range(1, iterations + 1):
            g.add_input(f"a0@{t}", max(self.a0, 1), home=gpu)
            for i in range(1, self.L + 1):
                g.add_compute(f"F{i}@{t}", "layer_forward", [f"{_act(i - 1, t)}", f"w{i}@{t - 1}"],
                              gpu, self.a[i - 1], time=self.uF[i - 1])
            for i in range(self.L, 0, -1):
                delta = f"F{i}@{t}" if i == self.L else f"B{i + 1}@{t}"
                half = self.uB[i - 1] / 2
                g.add_compute(f"G{i}@{t}", "weight_grad", [_act(i - 1, t), delta], gpu,
                              self.w[i - 1], time=half)
                g.add_compute(f"B{i}@{t}", "layer_backward", [delta, f"w{i}@{t - 1}"], gpu,
                              max(self.a[i - 2] if i > 1 else self.a0, 1), time=half)
                g.add_compute(f"w{i}@{t}", "adam_update", [f"w{i}@{t - 1}", f"G{i}@{t}"], gpu,
                              self.w[i - 1], time=0.0)
        return g


_CHAIN_FIELDS = ("uF", "uB", "w", "a", "a0", "name")


def _act(i: int, t: int) -> str:
    return f"a0@{t}" if i == 0 else f"F{i}@{t}"


def training_chain(uF: str = "0.1;0.1;0.1;0.1", uB: str = "0.2;0.2;0.2;0.2",
                   w: str = "400MB;400MB;400MB;400MB", a: str = "20MB;20MB;20MB;20MB",
                   csv_path: str = "", a0: int = 0, iterations: int = 3) -> TaskGraph:
    """A chain from explicit per-layer values: ``uF``/``uB`` in seconds and ``w``/``a`` in bytes
    as ``;``-separated lists (e.g. ``uF=0.1;0.1``), or a CSV file with columns uF, uB, w, a
    (which then replaces the lists)."""
    if csv_path:
        try:
            with open(csv_path, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as exc:
            raise SpecError(f"training-chain: cannot read CSV {csv_path!r}: {exc.strerror}") from None
        try:
            cols = {k: [r[k] for r in rows] for k in ("uF", "uB", "w", "a")}
        except KeyError as exc:
            raise SpecError(f"training-chain: CSV {csv_path!r} lacks column {exc}") from None
        name = Path(csv_path).stem
    else:
        cols = {k: [x for x in v.split(";") if x.strip()] for k, v in
                dict(uF=uF, uB=uB, w=w, a=a).items()}
        name = "training-chain"
    from ..spec import parse_bytes
    try:
        chain = TrainingChain(tuple(map(float, cols["uF"])), tuple(map(float, cols["uB"])),
                              tuple(parse_bytes(x) for x in cols["w"]),
                              tuple(parse_bytes(x) for x in cols["a"]), a0, name)
    except ValueError as exc:
        raise SpecError(f"training-chain: {exc}") from None
    return chain.to_taskgraph(iterations)


def transformer_chain(name: str, depth: int, batch: int, seq: int, hidden: int = 3072,
                      heads: int = 24, dtype_bytes: int = 2, weight_bytes: int = 0,
                      machine: Machine | None = None) -> TrainingChain:
    """A Megatron-LM transformer stack priced by the cost model of ``machine`` (default v100).

    Per layer: 12h^2 + 13h parameters; forward 24bsh^2 + 4bs^2h flop; backward recomputes the
    forward then takes twice its flops (3x); the saved activation a^i is b*s*h values.  Weights
    and activations take ``dtype_bytes`` each (2: Megatron-LM's fp16 mixed precision), unless
    ``weight_bytes`` (> 0) sets the bytes a layer's weights take and move.
    """
    m = machine or PRESETS["v100"]
    if min(depth, batch, seq, hidden, heads) <= 0 or weight_bytes < 0:
        raise SpecError(f"{name}: depth, batch, seq, hidden and heads must be positive, "
                        f"weight_bytes >= 0")
    weight = weight_bytes or (12 * hidden * hidden + 13 * hidden) * dtype_bytes
    flops = 24.0 * batch * seq * hidden**2 + 4.0 * batch * seq**2 * hidden
    act = batch * seq * hidden * dtype_bytes
    uF = m.duration("compute", "gpu0", act, flops, 2 * act + weight)
    uB = m.duration("compute", "gpu0", act, 3 * flops, 4 * act + 2 * weight)
    return TrainingChain((uF,) * depth, (uB,) * depth, (weight,) * depth, (act,) * depth,
                         act, f"{name}-{depth}x{batch}")


def transformer_workspace(batch: int, seq: int, hidden: int = 3072, heads: int = 24,
                          dtype_bytes: int = 2) -> int:
    """Bytes of intermediate activations a transformer layer rebuilds during its backward
    (recomputation): about 14 b·s·h values (QKV, attention output, the 4h MLP in and out,
    layer norms) plus 3 b·heads·s² (scores, softmax, dropout).  Beaumont et al. set M_GPU
    below 16 GB by such a batch-dependent amount (Sec. 7)."""
    return dtype_bytes * (14 * batch * seq * hidden + 3 * batch * heads * seq * seq)


# Calibrated to Beaumont et al.'s Table 1 (measured on a V100):
# * ``seq``: Σu per layer at batch 16 is the paper's (157 ms GPT-2, 63 ms BERT);
# * weight bytes: the paper's L2L - Σu grows by 72.0 ms per GPT-2 layer and 26.7 ms per BERT
#   layer at every batch size, two exposed weight transfers per layer, i.e. 36.0 and 13.3 ms
#   per transfer at 12 GB/s: 432 and 160 MB.  The stated hyperparameters (hidden 3072) give
#   226 MB of fp16 weights for both networks, which cannot produce both figures.
GPT2_SEQ, BERT_SEQ = 168, 68
GPT2_WEIGHT_BYTES, BERT_WEIGHT_BYTES = 432_000_000, 160_000_000


def gpt2_train(depth: int = 38, batch: int = 16, seq: int = GPT2_SEQ, weight_bytes: int = 0,
               iterations: int = 3) -> TaskGraph:
    """GPT-2 with Megatron-LM hyperparameters (hidden 3072, 24 heads, fp16) on the v100 preset;
    the default ``seq`` is calibrated to the paper's Table 1.  ``weight_bytes`` > 0 overrides
    the hyperparameters' 226 MB per layer (Table 1's reproduction: ``GPT2_WEIGHT_BYTES``)."""
    return transformer_chain("gpt2", depth, batch, seq,
                             weight_bytes=weight_bytes).to_taskgraph(iterations)


def bert_train(depth: int = 96, batch: int = 16, seq: int = BERT_SEQ, weight_bytes: int = 0,
               iterations: int = 3) -> TaskGraph:
    """BERT with Megatron-LM hyperparameters (hidden 3072, 24 heads, fp16) on the v100 preset;
    the default ``seq`` is calibrated to the paper's Table 1.  ``weight_bytes`` > 0 overrides
    the hyperparameters' 226 MB per layer (Table 1's reproduction: ``BERT_WEIGHT_BYTES``)."""
    return transformer_chain("bert", depth, batch, seq,
                             weight_bytes=weight_bytes).to_taskgraph(iterations)
