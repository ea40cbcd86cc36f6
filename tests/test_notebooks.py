"""The studies in ``notebooks/`` run top to bottom in a real Jupyter kernel (docs/design.md:
executed by the tests), each shows at least one figure inline, and each writes only into
``out/`` beside it, which git ignores."""

import os
import shutil
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

import offloadlab

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_the_studies_are_there():
    assert {p.stem for p in NOTEBOOKS} == {"compare_strategies", "sim_vs_measured",
                                           "determinism_ablation"}


def test_what_the_studies_write_is_ignored():
    assert "notebooks/out/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_shows_a_figure_and_writes_only_out(path, tmp_path, monkeypatch):
    """Run a copy in a kernel started in its own folder, as Jupyter would, with MPLBACKEND as
    CI sets it (Agg: a figure must still show inline)."""
    here = tmp_path / path.name
    shutil.copy(path, here)
    # the kernel imports the offloadlab this test imports (the checkout, or the installed build)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(offloadlab.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ["PATH"]]))   # its `python`
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(here, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert figures, f"{path.name} shows no figure"
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    assert written - {Path(path.name)}, "each study writes its figure or data"
    assert all(p.parts[0] == "out" for p in written - {Path(path.name)}), written
