"""bench/bench_deployed.py writes one problem's part of docs/results/deployed.md (issue 45: the
LoRA 7B row, whose run is long) and leaves the other problems' tables and summary rows as the
page has them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_deployed import (  # noqa: E402
    BEGIN,
    DEPLOYED,
    END,
    PROBLEMS,
    markdown,
    page_sections,
    sections,
)

PAGE = (ROOT / "docs" / "results" / "deployed.md").read_text()


def _rows(label: str, scale: float) -> list[dict]:
    rows = []
    for factor in (1.5, 4.0):
        for planner, makespan in (("buildmemgraph", 2.0), ("zero-offload", 2.5), ("gemini", 3.0)):
            rows.append(dict(label=label, factor=factor, memory=int(factor * 2**30),
                             planner=planner, outcome="ok", makespan=makespan * scale,
                             error=None, problem_bound=1.9 * scale))
    rows.append(dict(label=label, factor=4.0, memory=4 * 2**30, planner="flexgen",
                     outcome="error", makespan=None, error="flexgen: out of memory",
                     problem_bound=None))
    rows.append(dict(label=label, factor=1.5, memory=int(1.5 * 2**30), planner="flexgen",
                     outcome="error", makespan=None, error="flexgen plans LLaMA inference",
                     problem_bound=None))
    return rows


def test_the_page_reads_back_as_written():
    block = PAGE.partition(BEGIN)[2].partition(END)[0].strip("\n")
    parts = page_sections(PAGE)
    assert list(parts)[:2] == ["gpt2-train", "mlp"] and "llama-prefill 13B" in parts
    assert markdown(parts) == block


def test_one_problem_replaces_its_part_and_a_new_one_follows_the_others():
    parts, notes = sections(_rows("mlp", 1.0) + _rows("llama-lora-train 7B", 10.0), (1.5, 4.0))
    assert notes == ["mlp 1.5x flexgen: flexgen plans LLaMA inference",
                     "mlp 4x flexgen: flexgen: out of memory",
                     "llama-lora-train 7B 1.5x flexgen: flexgen plans LLaMA inference",
                     "llama-lora-train 7B 4x flexgen: flexgen: out of memory"]
    before = {label: part for label, part in page_sections(PAGE).items()
              if label != "llama-lora-train 7B"}
    merged = page_sections(f"{BEGIN}\n{markdown(before)}\n{END}") | parts
    assert list(merged) == list(before) + ["llama-lora-train 7B"]
    text = markdown(merged)
    for label, (table, summary) in before.items():
        if label != "mlp":
            assert "\n".join(table) in text and all(row in text for row in summary)
    assert "| gemini | 3 | 3 |" in text and "| gemini | 30 | 30 |" in text
    assert "| mlp | 4x | zero-offload 0.80 (OOM: flexgen) | 1.05 |" in text
    assert "| llama-lora-train 7B | 1.5x | zero-offload 0.80 | 1.05 |" in text
    assert page_sections(f"{BEGIN}\n{text}\n{END}") == merged


def test_the_page_lists_every_deployed_scheme_the_bound_and_the_gains_for_every_problem():
    """Issue 45's goal: for each of bench_deployed's problems the page's table has a row for
    every deployed scheme (a makespan, OOM, or - where it does not apply) and the bound, and
    the summary states BuildMemGraph's makespan over each scheme that planned and over the
    bound at every memory."""
    parts = page_sections(PAGE)
    assert set(parts) == set(PROBLEMS)
    for label, (table, summary) in parts.items():
        rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table
                if line.startswith("| ") and not line.startswith("| ---")}
        assert set(DEPLOYED) | {"buildmemgraph", "lower bound"} <= set(rows), label
        factors = [cell.split("x:")[0] for cell in rows["planner"]]
        assert [row.split(" | ")[1] for row in summary] == [f"{f}x" for f in factors], label
        for k, row in enumerate(summary):
            gains = row.split(" | ")[2]
            for p in DEPLOYED:
                cell = rows[p][k].strip(" |")
                if cell == "-":
                    assert p not in gains, (label, row)
                elif cell == "OOM":
                    assert re.search(rf"OOM: [^)]*\b{p}\b", gains), (label, row)
                else:
                    assert re.search(rf"\b{p} \d+\.\d\d\b", gains), (label, row)
            assert re.fullmatch(r"\d+\.\d\d \|", row.split(" | ")[3]), (label, row)
