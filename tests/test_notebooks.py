"""The studies in ``notebooks/`` run top to bottom (docs/design.md: executed by the tests)."""

import json
from pathlib import Path

import matplotlib
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_studies_are_there():
    assert {p.stem for p in NOTEBOOKS} == {"compare_strategies", "sim_vs_measured",
                                           "determinism_ablation"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    """Execute every code cell in order in one namespace, as Jupyter would."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells
    for i, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"{path.name}, code cell {i + 1}", "exec"), namespace)
    assert plt.get_fignums(), "each study ends with a plot"
    plt.close("all")
