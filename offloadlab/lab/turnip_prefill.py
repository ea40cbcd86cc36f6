"""TURNIP's prefill grid in simulation (Sec. 8, Figs. 10-12): time to first token of LLaMA-7B
and 65B against the prompt's length on the paper's two servers, for BuildMemGraph with dynamic
dispatch (TURNIP) and for the level-wise baseline (DISCO); the runner is
:mod:`.turnip_grid`'s.

Figs. 10-11 (A100 and P100 servers) are batched: "For the smallest batch sizes considered, we
test prefill input sequence lengths: 1K, 2K, 4K, 8K, and 16K tokens. For larger batches we use
1K, 2K, 4K and 8K."  The text names two batches, 8 and 16, on the A100 server ("moving from
batch size of eight to 16 on the A100 server", of FlexGen), and none on the P100 server, nor
which batch is the smallest: the grid takes batch 8 as the smallest (1K-16K tokens) and 16 as
the larger (1K-8K), on both servers, for 7B and 65B (:data:`BATCHED`).  Fig. 12 is one
sequence of 1K-32K tokens on both servers, 7B and 65B (:data:`SINGLE`).

The paper shows its prefill times only as bar charts (Figs. 10-12; its text gives no value,
and which systems ran out of memory at which points its figures show, its text does not), so
there is no number of the paper's to print beside ours: ``PREFILL.paper`` is empty, and the
table says so.  The workload is float16, as the paper's prefill (Sec. 8), priced at the
presets' fp16 rates (the A100's tensor cores, the P100's half2 arithmetic).
"""

from __future__ import annotations

from .turnip_grid import MACHINES, Experiment, Point

MODELS = ("7b", "65b")
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
BATCHES = {8: SEQS[:5], 16: SEQS[:4]}
"""Figs. 10-11: each batch and its prompt lengths (8 taken as the smallest batch)."""

SINGLE = tuple(Point(m, s, machine) for machine in MACHINES for m in MODELS for s in SEQS)
BATCHED = tuple(Point(m, s, machine, b) for machine in MACHINES for m in MODELS
                for b, seqs in BATCHES.items() for s in seqs)

PREFILL = Experiment(
    name="turnip-prefill", workload="llama-prefill", time="ttft",
    label="time to first token (s)", grid=SINGLE + BATCHED)
NOTE = ("the paper (TURNIP Sec. 8, Figs. 10-12) shows its prefill times only as bar charts, "
        "with no values in its text: no paper column to compare; its batches (Figs. 10-11) "
        "are 8 and 16 on the A100 server, 8 taken as the smallest (1K-16K tokens, 16 at "
        "1K-8K), and the same assumed on the P100 server, whose batches the text does not name")
