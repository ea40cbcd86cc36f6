"""Training workloads (Beaumont et al., Sec. 3): layer chains given by hand or priced as
transformer stacks, each a :class:`~offloadlab.core.cycle.TrainingChain` unrolled into a
TaskGraph of several iterations (:meth:`~offloadlab.core.cycle.TrainingChain.to_taskgraph`).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from ..budget import TASK_VERTEX, check_ram
from ..cycle import TrainingChain
from ..errors import SpecError
from ..formats.nodelink import check_input
from ..machine import PRESETS, Machine
from ..taskgraph import TaskGraph
from .registry import workload


def _chain_layers(o: dict) -> int:
    """training-chain's layers: its ``uF`` list's, or at most a CSV file's lines (a row takes
    at least 8 bytes: four values, three commas and a newline)."""
    if not o["csv_path"]:
        return len([x for x in str(o["uF"]).split(";") if x.strip()])
    if not os.path.exists(o["csv_path"]):
        return 0                                # training_chain names the missing file
    check_input(o["csv_path"], "training-chain CSV", sniff=False)
    return os.stat(o["csv_path"]).st_size // 8


def _chain_vertices(layers: int, iterations: int) -> int:
    """An upper bound of the vertices of a chain of ``layers`` unrolled over ``iterations``
    (tests/test_adversarial.py checks it against the graphs built)."""
    return layers + iterations * (1 + 4 * layers)


@workload("training-chain",
          vertices=lambda o: _chain_vertices(_chain_layers(o), o["iterations"]))
def training_chain(uF: str = "0.1;0.1;0.1;0.1", uB: str = "0.2;0.2;0.2;0.2",
                   w: str = "400MB;400MB;400MB;400MB", a: str = "20MB;20MB;20MB;20MB",
                   csv_path: str = "", a0: int = 0, iterations: int = 3) -> TaskGraph:
    """A chain from explicit per-layer values: ``uF``/``uB`` in seconds and ``w``/``a`` in bytes
    as ``;``-separated lists (e.g. ``uF=0.1;0.1``), or a CSV file with columns uF, uB, w, a
    (which then replaces the lists).

    Parameters
    ----------
    uF, uB : str
        Forward and backward seconds per layer.
    w, a : str
        Weight and activation bytes per layer (``400MB``).
    csv_path : str
        A CSV file of the four columns, one row per layer; "" for the lists.
    a0 : int
        Bytes of the batch, |a^0|.
    iterations : int
        Training iterations to unroll.

    Returns
    -------
    TaskGraph
        The unrolled chain (:meth:`TrainingChain.to_taskgraph`).

    Raises
    ------
    SpecError
        An unreadable CSV file or column, or a bad value.
    """
    if csv_path:
        try:
            with open(csv_path, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as exc:
            raise SpecError(f"training-chain: cannot read CSV {csv_path!r}: "
                            f"{exc.strerror}") from None
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
    forward then takes twice its flops (3x); the saved activation a^i is b*s*h values.

    Parameters
    ----------
    name : str
        The workload's name, which the chain's name and an error start with.
    depth, batch, seq, hidden, heads : int
        Layers, sequences, tokens per sequence, the hidden size and the attention heads.
    dtype_bytes : int, default 2
        Bytes per value of the weights and activations (Megatron-LM's fp16 mixed precision).
    weight_bytes : int, default 0
        If > 0, the bytes a layer's weights take and move instead.
    machine : Machine, optional
        Prices the layers (default the ``v100`` preset).

    Returns
    -------
    TrainingChain
        The chain.

    Raises
    ------
    SpecError
        A size that is not positive, a negative ``weight_bytes``, or a chain too large for the
        RAM available.
    """
    m = machine or PRESETS["v100"]
    if min(depth, batch, seq, hidden, heads) <= 0 or weight_bytes < 0:
        raise SpecError(f"{name}: depth, batch, seq, hidden and heads must be positive, "
                        f"weight_bytes >= 0")
    # an iteration of the chain is 1 + 4 * depth vertices (TrainingChain.unrolled_size)
    check_ram(f"{name}: depth {depth} (about {1 + 4 * depth:.3g} vertices an iteration)",
              (1 + 4 * depth) * TASK_VERTEX)
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
    below 16 GB by such a batch-dependent amount (Sec. 7).

    Parameters
    ----------
    batch, seq, hidden, heads : int
        Sequences, tokens per sequence, the hidden size and the attention heads.
    dtype_bytes : int, default 2
        Bytes per value.

    Returns
    -------
    int
        The bytes.
    """
    return dtype_bytes * (14 * batch * seq * hidden + 3 * batch * heads * seq * seq)


# Calibrated to Beaumont et al.'s Table 1 (measured on a V100):
# * ``seq``: Σu per layer at batch 16 is the paper's (157 ms GPT-2, 63 ms BERT);
# * weight bytes: the paper's L2L - Σu grows by 72.0 ms per GPT-2 layer and 26.7 ms per BERT
#   layer at every batch size, two exposed weight transfers per layer, i.e. 36.0 and 13.3 ms
#   per transfer at 12 GB/s: 432 and 160 MB.  The stated hyperparameters (hidden 3072) give
#   226 MB of fp16 weights for both networks, which cannot produce both figures.
GPT2_SEQ, BERT_SEQ = 168, 68
GPT2_WEIGHT_BYTES, BERT_WEIGHT_BYTES = 432_000_000, 160_000_000


@workload("gpt2-train", vertices=lambda o: _chain_vertices(o["depth"], o["iterations"]))
def gpt2_train(depth: int = 38, batch: int = 16, seq: int = GPT2_SEQ, weight_bytes: int = 0,
               iterations: int = 3) -> TaskGraph:
    """GPT-2 with Megatron-LM hyperparameters (hidden 3072, 24 heads, fp16) on the v100 preset;
    the default ``seq`` is calibrated to the paper's Table 1.  ``weight_bytes`` > 0 overrides
    the hyperparameters' 226 MB per layer (Table 1's reproduction: ``GPT2_WEIGHT_BYTES``).

    Parameters
    ----------
    depth : int
        Layers.
    batch : int
        Sequences per batch.
    seq : int
        Tokens per sequence.
    weight_bytes : int
        Bytes of one layer's weights; 0: as the hyperparameters give them.
    iterations : int
        Training iterations to unroll.

    Returns
    -------
    TaskGraph
        The unrolled chain (:meth:`TrainingChain.to_taskgraph`).

    Raises
    ------
    SpecError
        A value that is not positive (``weight_bytes``: negative).
    """
    return transformer_chain("gpt2", depth, batch, seq,
                             weight_bytes=weight_bytes).to_taskgraph(iterations)


@workload("bert-train", vertices=lambda o: _chain_vertices(o["depth"], o["iterations"]))
def bert_train(depth: int = 96, batch: int = 16, seq: int = BERT_SEQ, weight_bytes: int = 0,
               iterations: int = 3) -> TaskGraph:
    """BERT with Megatron-LM hyperparameters (hidden 3072, 24 heads, fp16) on the v100 preset;
    the default ``seq`` is calibrated to the paper's Table 1.  ``weight_bytes`` > 0 overrides
    the hyperparameters' 226 MB per layer (Table 1's reproduction: ``BERT_WEIGHT_BYTES``).

    Parameters
    ----------
    depth : int
        Layers.
    batch : int
        Sequences per batch.
    seq : int
        Tokens per sequence.
    weight_bytes : int
        Bytes of one layer's weights; 0: as the hyperparameters give them.
    iterations : int
        Training iterations to unroll.

    Returns
    -------
    TaskGraph
        The unrolled chain (:meth:`TrainingChain.to_taskgraph`).

    Raises
    ------
    SpecError
        A value that is not positive (``weight_bytes``: negative).
    """
    return transformer_chain("bert", depth, batch, seq,
                             weight_bytes=weight_bytes).to_taskgraph(iterations)
