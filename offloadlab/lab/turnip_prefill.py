"""TURNIP's prefill grid in simulation (Sec. 8, Figs. 10-12): time to first token of LLaMA-7B
and 65B against the prompt's length on the paper's two servers, for BuildMemGraph with dynamic
dispatch (TURNIP) and for the level-wise baseline (DISCO); the runner is
:mod:`.turnip_grid`'s.

Fig. 12 is one sequence of 1K-32K tokens (:data:`SINGLE`), Figs. 10-11 batches of 8 and 16
(:data:`BATCHED`).  The paper gives its times only as bar charts, so ``PREFILL.paper`` is
empty.  Float16, as the paper's prefill.  How the batches were read from the text:
docs/results/reproductions.md ("TURNIP's LLaMA prefill grid").
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
