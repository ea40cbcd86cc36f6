"""bench/grid_table.py (issue 43): a ``reproduce turnip-*`` CSV as the docs' table, TURNIP
beside level-wise on each point's row."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from grid_table import TIMES, table  # noqa: E402

from offloadlab.lab.turnip_grid import Point, run  # noqa: E402
from offloadlab.lab.turnip_lora import LORA  # noqa: E402


def test_a_row_per_point_with_both_planners_and_the_paper():
    points = [Point("tiny", 256, "p100x4", 1), Point("tiny", 512, "p100x4", 2)]
    rows = run(LORA, points, progress=False)
    rows.loc[3, ["status", "step"]] = ["OOM", None]       # level-wise found no plan
    rows.loc[[2, 3], "paper"] = 1.5
    shown = table(rows, *TIMES["turnip-lora"])
    assert list(shown["tokens"]) == ["256", "512"] and list(shown["batch"]) == [1, 2]
    first = rows[rows["seq"] == 256].set_index("planner")
    assert shown.iloc[0]["step TURNIP / level-wise (s)"] == (
        f"{first.at['buildmemgraph', 'step']:.3g} / {first.at['levelwise', 'step']:.3g}")
    assert shown.iloc[1]["step TURNIP / level-wise (s)"].endswith(" /  (levelwise: OOM)")
    assert list(shown["paper"]) == ["", "1.5"]
    assert shown.iloc[0]["TaskGraph"] == f"{int(first.at['buildmemgraph', 'taskgraph']):,}"
