"""bench/grid_table.py (issue 43): a ``reproduce turnip-*`` CSV as the docs' table, TURNIP
beside level-wise on each point's row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("text, message", [
    (None, "cannot read it as CSV"), ("", "cannot read it as CSV"),
    ("a,b\n1,2\n", "not a reproduce turnip-lora CSV: no column model, seq"),
])
def test_a_missing_or_foreign_csv_is_one_line_and_exit_2(tmp_path, text, message):
    path = tmp_path / "turnip-lora.csv"
    if text is not None:
        path.write_text(text)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "grid_table.py"), str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr
