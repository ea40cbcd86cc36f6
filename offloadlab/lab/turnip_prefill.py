"""TURNIP's prefill grid in simulation (Sec. 8, Figs. 10-12): time to first token of LLaMA-7B
and 65B against the prompt's length, 1K-32K tokens, one sequence, on the paper's two servers,
for BuildMemGraph with dynamic dispatch (TURNIP) and for the level-wise baseline (DISCO); the
runner is :mod:`.turnip_grid`'s.

The paper shows its prefill times only as bar charts (Figs. 10-12; its text gives no value),
so there is no number of the paper's to print beside ours: ``PREFILL.paper`` is empty, and the
table says so.  The workload is float16, as the paper's prefill (Sec. 8), priced at the presets'
fp16 rates (the A100's tensor cores, the P100's half2 arithmetic).
"""

from __future__ import annotations

from .turnip_grid import MACHINES, Experiment, Point

MODELS = ("7b", "65b")
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)

PREFILL = Experiment(
    name="turnip-prefill", workload="llama-prefill", time="ttft",
    label="time to first token (s)",
    grid=tuple(Point(m, s, machine) for machine in MACHINES for m in MODELS for s in SEQS))
NOTE = ("the paper (TURNIP Sec. 8, Figs. 10-12) shows its prefill times only as bar charts, "
        "with no values in its text: no paper column to compare")
