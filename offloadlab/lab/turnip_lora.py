"""TURNIP's LoRA training experiment in simulation (Sec. 8 (2), Fig. 13): the seconds of the
forward and backward pass of one batch of ``llama-lora-train`` (rank-16 adapters on Q, K, V
and the feed-forward matrices, activation checkpointing, fp32 weights) against the sequence
length and the batch size, on the paper's two servers, for BuildMemGraph with dynamic dispatch
(TURNIP) and for the level-wise baseline (DISCO); the runner is :mod:`.turnip_grid`'s.

The grid (7B at batch 1-8 and 1K-4K tokens, and 65B at 1K tokens, batch 8, on ``a100x8``), the
paper's three times it stands beside, and why the 65B point is put on ``a100x8``:
docs/results/reproductions.md ("TURNIP's LoRA training grid").
"""

from __future__ import annotations

from .turnip_grid import MACHINES, Experiment, Point

BATCHES = (1, 2, 4, 8)
SEQS = (1024, 2048, 4096)
PAPER_65B = Point("65b", 1024, "a100x8", 8)
PAPER_7B = {Point("7b", 1024, "a100x8", 8): 5.6, Point("7b", 1024, "a100x8", 32): 12.1}
PAPER_65B_OOM = frozenset(Point("65b", 1024, "a100x8", b) for b in (16, 32))

LORA = Experiment(
    name="turnip-lora", workload="llama-lora-train", time="step",
    label="forward and backward of one batch (s)",
    grid=tuple(Point("7b", s, machine, b) for machine in MACHINES for b in BATCHES
               for s in SEQS) + (Point("7b", 1024, "a100x8", 32), PAPER_65B),
    paper={**PAPER_7B, PAPER_65B: 58.5}, paper_oom=PAPER_65B_OOM)
NOTE = ("the paper's seconds (TURNIP Sec. 8 (2); Fig. 13 is a bar chart without values): 7B at "
        "1K tokens, 5.6 s at batch 8 and 12.1 s at batch 32 (ZeRO-Infinity 12.5 and 17.8), on "
        "the A100 server; 65B at 1K tokens, batch 8, 58.5 s (ZeRO-Infinity 72.9), server not "
        "named (a100x8 here), the one 65B case TURNIP ran: it failed at larger batches, which "
        "the text does not name (16 and 32 with --only, paper_outcome OOM)")
