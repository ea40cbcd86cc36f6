"""The TaskGraphs traced from PyTorch models (the ``model`` workload, offloadlab/data/models):
each loads, validates, is placed on its GPUs, plans with both TaskGraph planners, verifies and
simulates; every op they name runs in the reference; one executes; the pipeline placement; and,
with torch installed, the export script reproduces a committed file and from_torch's rules."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import need_torch

import offloadlab
from offloadlab.core import formats
from offloadlab.core.errors import GraphError, SpecError
from offloadlab.core.machine import Machine, machine_from_spec
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.core.workloads.models import GPUS, MODELS, MODES
from offloadlab.core.workloads.pipeline import pipeline, stages
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import simulate

DATA = Path(offloadlab.__file__).parent / "data" / "models"
CASES = [(name, mode, gpus) for name in MODELS for mode in MODES for gpus in GPUS]


def model(name: str, mode: str, gpus: int) -> TaskGraph:
    return build_workload(f"model:name={name},mode={mode},gpus={gpus}")


def machine_for(graph: TaskGraph, factor: float) -> Machine:
    """A P100 server with as many GPUs as the graph uses, each ``factor`` times the least
    memory BuildMemGraph can plan in."""
    m = machine_from_spec(f"p100x4:gpus={len(graph.gpus())}")
    return replace(m, gpu_memory=int(factor * min_capacity(graph)))


@pytest.mark.parametrize("name,mode,gpus", CASES, ids=[f"{n}-{m}-g{g}" for n, m, g in CASES])
def test_model_plans_verifies_and_simulates(name, mode, gpus):
    graph = model(name, mode, gpus)
    assert graph.name == f"{name}-{mode}-g{gpus}"
    assert graph.meta["mode"] == mode and graph.meta["source"] == "torch"
    assert graph.gpus() == [f"gpu{i}" for i in range(gpus)]
    assert all(t.device == "host" for t in graph if t.kind == "input")
    assert any(t.kind == "transfer" for t in graph) == (gpus > 1)
    m = machine_for(graph, 1.5)
    for planner in ("buildmemgraph", "levelwise"):
        mg = plan(graph, m, planner)
        verify(mg, graph, m)
        assert mg.count("load") > 0
        assert simulate(mg, m).makespan > 0


def test_the_workload_holds_every_committed_file():
    assert {p.name for p in DATA.glob("*.json")} == \
        {f"{n}-{m}-g{g}.json" for n, m, g in CASES}
    assert sum(p.stat().st_size for p in DATA.glob("*.json")) < 10 * 2**20
    with pytest.raises(SpecError, match="unknown name 'gpt3'; known: mlp, resnet18"):
        model("gpt3", "infer", 1)
    with pytest.raises(SpecError, match="unknown gpus 4"):
        model("gpt2", "infer", 4)


@pytest.mark.parametrize("name", MODELS)
def test_every_op_runs_in_the_reference(name):
    """The real ops a graph names accept the shapes it gives them (the GPU count changes
    placement only, so one graph per model and mode)."""
    for mode in MODES:
        graph = model(name, mode, 1)
        outputs = reference_outputs(graph)
        assert all(np.isfinite(x).all() for x in outputs.values())
        if mode == "train":
            updates = [t for t in graph if t.id.endswith("@updated")]
            assert updates and all(t.op in ("adam_update", "mix") for t in updates)


def test_a_training_step_executes():
    graph = model("mlp", "train", 2)
    m = machine_for(graph, 1.5)
    reference = reference_outputs(graph)
    for planner in ("buildmemgraph", "levelwise"):
        mg = plan(graph, m, planner)
        assert mg.count("offload") + mg.count("reload") > 0
        result = execute(mg, m, poison=True, rate_limit=False)
        assert check_outputs(result.outputs, reference) is None, planner


# -- pipeline placement ---------------------------------------------------------------------
def test_pipeline_cuts_balanced_contiguous_stages():
    assert stages([1.0] * 6, 3) == [0, 0, 1, 1, 2, 2]
    assert stages([10.0, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]
    assert stages([100.0, 0, 0], 3) == [0, 1, 2]          # every stage gets a vertex
    assert stages([0.0] * 4, 2) == [0, 0, 1, 1]


def test_pipeline_places_stages_and_transfers():
    one = build_workload("matmul-chain:layers=6,gpus=1,batch=16,hidden=32")
    placed = pipeline(one, 3)
    placed.validate()
    assert placed.gpus() == ["gpu0", "gpu1", "gpu2"]
    compute = [t.device for t in placed if t.kind == "compute"]
    assert compute == sorted(compute) and compute.count("gpu0") == 2
    transfers = [t for t in placed if t.kind == "transfer"]
    assert [(t.id, t.device) for t in transfers] == [("X3.0>gpu1", "gpu0->gpu1"),
                                                     ("X5.0>gpu2", "gpu1->gpu2")]
    assert placed["X4.0"].inputs == ("X3.0>gpu1", "Y3.0")
    assert pipeline(one, 1).tasks.keys() == one.tasks.keys()
    with pytest.raises(SpecError, match="cannot cut 6 compute vertices into 7 stages"):
        pipeline(one, 7)
    with pytest.raises(GraphError, match="share one GPU"):
        pipeline(build_workload("matmul-chain:layers=2,gpus=2,batch=16,hidden=32"), 2)


# -- from_torch (needs torch) ---------------------------------------------------------------
def test_export_reproduces_a_committed_file():
    torch = need_torch()
    committed = formats.taskgraph_from_json(DATA / "mlp-train-g2.json")
    spec = importlib.util.spec_from_file_location("export", DATA / "export.py")
    assert spec is not None and spec.loader is not None
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    graph = export.export("mlp", "train", 2)
    assert graph.meta["torch"] == str(torch.__version__)
    graph.meta["torch"] = committed.meta["torch"]        # the same graph from any torch
    assert list(graph.tasks) == list(committed.tasks)
    assert formats.to_json(graph) == formats.to_json(committed)


def test_need_torch_fails_where_ci_requires_torch(monkeypatch):
    """.ci/run sets OFFLOADLAB_REQUIRE_TORCH=1: there the torch tests fail, not skip, when
    torch does not import."""
    monkeypatch.setitem(sys.modules, "torch", None)      # import torch -> ImportError
    monkeypatch.delenv("OFFLOADLAB_REQUIRE_TORCH", raising=False)
    with pytest.raises(pytest.skip.Exception):
        need_torch()
    monkeypatch.setenv("OFFLOADLAB_REQUIRE_TORCH", "1")
    with pytest.raises(pytest.fail.Exception, match="OFFLOADLAB_REQUIRE_TORCH=1 but torch"):
        need_torch()
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text().splitlines()
    assert "export OFFLOADLAB_REQUIRE_TORCH=1" in ci and "pip install torch==2.13.0" in ci


def test_from_torch_maps_ops_exactly():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x):
            h = nn.functional.gelu(self.up(x), approximate="tanh")
            return torch.softmax(x + self.down(torch.relu(h)), dim=-1)

    with torch.device("meta"):
        block = Block()
    x = torch.empty(2, 4, 8, device="meta")
    infer = from_torch(block, x)
    ops = {t.id: t.op for t in infer if t.kind == "compute"}
    assert ops == {"addmm": "mix", "gelu": "gelu", "relu": "relu", "addmm_1": "mix",
                   "add": "add", "_softmax": "softmax"}
    assert infer["addmm"].shape == (2, 4, 16)           # read only as [B, T, D]
    assert infer["addmm"].flops == 2.0 * 8 * 8 * 16
    assert all(t.device == "host" for t in infer if t.kind == "input")
    train = from_torch(block, x, train=True, gpus=2, optimizer="sgd")
    train.validate()
    updates = {t.id: t.op for t in train if t.id.endswith("@updated")}
    assert updates == {f"{w}@updated": "sgd_update" for w, _ in block.named_parameters()}
    assert train.gpus() == ["gpu0", "gpu1"]
    assert reference_outputs(train)
    assert block.training                                # its mode is restored


def test_from_torch_errors_name_the_problem():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch
    nn = torch.nn

    class Complex(nn.Module):
        def forward(self, x):
            return torch.view_as_real(torch.view_as_complex(x) * 2)

    class Partial(nn.Module):
        def forward(self, x):
            y = x * 2
            y[0].add_(1)
            return y

    x = torch.empty(4, 2)
    with pytest.raises(GraphError, match=r"op aten\.mul\.Tensor: dtype complex64 is not"):
        from_torch(Complex(), x)
    with pytest.raises(GraphError, match=r"op aten\.add_\.Tensor writes in place into part"):
        from_torch(Partial(), x)
    with pytest.raises(SpecError, match="unknown loss 'l2'"):
        from_torch(nn.Linear(2, 2), x, train=True, loss="l2")
    with pytest.raises(SpecError, match="needs a target"):
        from_torch(nn.Linear(2, 2), x, train=True, loss="cross_entropy")


def test_import_torch_cli(tmp_path, capsys):
    need_torch()
    from offloadlab.lab.cli import main
    models = tmp_path / "models.py"
    models.write_text("from torch import nn\n\n"
                      "def mlp():\n    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(),"
                      " nn.Linear(128, 64))\n\n"
                      "def broken():\n    raise RuntimeError('no config')\n\n"
                      "def not_a_module():\n    return 3\n")
    out = tmp_path / "tg.json"
    assert main(["import-torch", f"{models}:mlp", "--input", "8,64", "--train", "--gpus", "2",
                 "--out", str(out)]) == 0
    graph = formats.taskgraph_from_json(out)
    assert graph.meta["mode"] == "train" and graph.gpus() == ["gpu0", "gpu1"]
    assert sum(t.op in ("adam_update", "mix") for t in graph if t.kind == "compute") >= 4
    assert main(["plan", "--taskgraph", str(out), "--machine", "p100x4:gpus=2",
                 "--out", str(tmp_path / "mg.json")]) == 0
    capsys.readouterr()
    for factory, message in ((f"{models}:broken", "raised RuntimeError: no config"),
                             (f"{models}:not_a_module", "returned a int, not a torch.nn.Module"),
                             (f"{models}:nope", "has no attribute 'nope'"),
                             (f"{models}:nn", "'nn' is a module, not a function returning"),
                             (f"{tmp_path / 'none.py'}:f", "no file"),
                             ("no.such.module:f", "No module named 'no'"),
                             ("nocolon", "expected MODULE:FACTORY")):
        assert main(["import-torch", factory, "--input", "8,64",
                     "--out", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.json").exists()


def test_import_torch_finds_a_module_in_the_working_directory(tmp_path, monkeypatch, capsys):
    """``import-torch mymodels:build`` imports ./mymodels.py (as ``uvicorn module:app``), with
    the working directory not on sys.path (the installed ``offloadlab`` script), and leaves
    sys.path as it was."""
    need_torch()
    from offloadlab.lab.cli import main
    (tmp_path / "cwd_models_42.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(16, 8)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_models_42", raising=False)
    before = list(sys.path)
    assert main(["import-torch", "cwd_models_42:build", "--input", "4,16", "--train",
                 "--out", "tg.json"]) == 0
    assert "wrote tg.json: " in capsys.readouterr().out
    meta = formats.taskgraph_from_json(tmp_path / "tg.json").meta
    assert meta["torch"] == str(need_torch().__version__)
    assert sys.path == before
    monkeypatch.delitem(sys.modules, "cwd_models_42")


def test_import_torch_says_a_trace_error_once(tmp_path, capsys):
    """A shape the module cannot take: one line naming what failed, not torch's logged
    traceback as well."""
    need_torch()
    from offloadlab.lab.cli import main
    models = tmp_path / "models.py"
    models.write_text("from torch import nn\n\ndef mlp():\n    return nn.Linear(64, 8)\n")
    assert main(["import-torch", f"{models}:mlp", "--input", "8,63",
                 "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot trace mlp: RuntimeError: " in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.json").exists()
