"""TURNIP's LoRA training experiment in simulation (Sec. 8 (2), Fig. 13): the seconds of the
forward and backward pass of one batch of ``llama-lora-train`` (rank-16 adapters on Q, K, V
and the feed-forward matrices, activation checkpointing, fp32 weights) against the sequence
length and the batch size, on the paper's two servers, for BuildMemGraph with dynamic dispatch
(TURNIP) and for the level-wise baseline (DISCO); the runner is :mod:`.turnip_grid`'s.

Fig. 13 is a bar chart of LLaMA-7B on both servers whose axes the text does not give; our grid
is in its spirit: 7B at batch 1, 2, 4 and 8 and 1K, 2K and 4K tokens on both servers, and the
points the text speaks of.  It gives three of TURNIP's times, beside ours in the ``paper``
column with their ``ratio``: for 7B at 1K tokens, 5.6 s at batch 8 and 12.1 s at batch 32
(ZeRO-Infinity 12.5 s and 17.8 s), in the paragraph about the A100 server; and 65B at 1K
tokens, batch 8, 58.5 s (ZeRO-Infinity 72.9 s), on a server the text does not name.  We put it
on ``a100x8``: 65B in fp32 is 260 GB of weights; it does 9.7x the flops of 7B per token, and
9.7 x 5.6 s = 54 s is near the 58.5 s, where the P100 server has 4.2x less fp32 compute than
the A100 server's.  The text also says that this was "the one case [TURNIP] was able to run"
of 65B and that it "failed" at "larger batch sizes", without naming them or the cause: 65B at
1K tokens and batch 16 and 32 (the batches of the 7B numbers) on ``a100x8`` have
``paper_outcome`` ``OOM`` (``--only 65b-1024x16@a100x8``; not in the default grid: 3 and 6
million vertices).  The workload is float32 (Sec. 8: "All TURNIP model weights are stored as
single precision"), priced at the presets' fp32 rates (19.5 TFLOP/s per A100, 9.3 per P100).
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
