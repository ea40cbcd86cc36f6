"""Issue 19, ops the toolkit does not know: a ``generic:<op>`` vertex (written by
``import-torch --generic``) is read from a TaskGraph file, priced from its shapes, planned and
simulated, and refused by the executor, in ``run``, ``compare --measured``, ``validate`` and
``ablate --measured``, before anything is set up; with torch installed, an unknown ATen op is
an error naming the node and the op unless ``--generic``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import need_torch

import offloadlab.executor
import offloadlab.planner
from offloadlab.core import formats
from offloadlab.core.errors import GraphError
from offloadlab.core.machine import Machine
from offloadlab.core.ops import OPS, OpError, op_flops, parse_op, touched_bytes
from offloadlab.executor import KernelError, execute, reference_outputs
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.simulator import simulate

CUMSUM = "generic:aten.cumsum.default"
REFUSAL = f"vertex 'scan': op '{CUMSUM}' is priced from its shapes alone"


def graph_data(op: str) -> dict:
    """``x -> relu -> <op> -> relu``, written as a TaskGraph file holds it."""
    node = {"kind": "compute", "device": "gpu0", "bytes": 4096, "shape": [32, 32]}
    return {"directed": True, "graph": {"type": "TaskGraph", "name": "scan"}, "nodes": [
        {"id": "x", "kind": "input", "device": "host", "bytes": 4096, "shape": [32, 32]},
        {"id": "pre", **node, "op": "relu", "inputs": ["x"], "flops": 1024.0},
        {"id": "scan", **node, "op": op, "inputs": ["pre"], "flops": 1024.0},
        {"id": "post", **node, "op": "relu", "inputs": ["scan"], "flops": 1024.0}],
        "edges": [{"source": "x", "target": "pre"}, {"source": "pre", "target": "scan"},
                  {"source": "scan", "target": "post"}]}


@pytest.fixture
def generic_file(tmp_path) -> Path:
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(graph_data(CUMSUM)))
    return path


def test_a_generic_op_is_priced_from_its_shapes():
    assert parse_op(CUMSUM) == ("generic", ())
    assert op_flops(CUMSUM, (32, 32), [(32, 32), (32,)]) == 32 * 32    # one per output element
    assert touched_bytes(CUMSUM, 4096, [4096, 128]) == 4096 + 4096 + 128
    for bad in ("generic", "generic:", "generic: "):
        with pytest.raises(OpError, match="names its source op after a colon"):
            parse_op(bad)


def test_a_taskgraph_file_with_a_generic_op_reads_plans_and_simulates(generic_file):
    graph = formats.taskgraph_from_json(generic_file)
    assert graph["scan"].op == CUMSUM
    machine = Machine(gpus=1, gpu_memory=3 * 4096)
    for planner in ("buildmemgraph", "levelwise"):
        assert simulate(plan(graph, machine, planner), machine).makespan > 0


@pytest.mark.parametrize("op,message", [
    ("cumsum", "vertex 'scan': unknown op 'cumsum'; known ops: "),
    ("generic:", "vertex 'scan': op 'generic:': generic names its source op after a colon"),
])
def test_other_op_names_stay_errors_naming_the_vertex(op, message):
    with pytest.raises(GraphError) as err:
        formats.taskgraph_from_dict(graph_data(op))
    assert message in str(err.value)
    if op == "cumsum":
        assert all(name in str(err.value) for name in OPS)


def test_the_executor_refuses_a_generic_op_before_setting_anything_up(generic_file,
                                                                      monkeypatch):
    graph = formats.taskgraph_from_json(generic_file)
    machine = Machine(gpus=1)
    mg = plan(graph, machine, "buildmemgraph")

    def no_backend(*args, **kwargs):
        raise AssertionError("a backend was made")

    monkeypatch.setattr(offloadlab.executor, "make_backend", no_backend)
    for run in (lambda: execute(mg, machine), lambda: reference_outputs(graph)):
        with pytest.raises(KernelError, match=REFUSAL):
            run()


def one_error_line(capsys, *argv: object) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("offloadlab: error: "), err
    return err


def test_every_command_that_executes_refuses_it_in_one_line(generic_file, tmp_path, capsys,
                                                            monkeypatch):
    mg = tmp_path / "mg.json"
    assert main(["plan", "--taskgraph", str(generic_file), "--machine", "p100x4:gpus=1",
                 "--out", str(mg)]) == 0
    assert main(["simulate", str(mg)]) == 0
    capsys.readouterr()
    assert REFUSAL in one_error_line(capsys, "run", mg)

    def no_planning(*args, **kwargs):
        raise AssertionError("planned a graph the executor refuses")

    monkeypatch.setattr(offloadlab.planner, "plan", no_planning)
    problem = ("--taskgraph", generic_file, "--machine", "p100x4:gpus=1")
    for argv in (("run", *problem), ("compare", *problem, "--measured"),
                 ("validate", *problem), ("ablate", "determinism", *problem, "--measured")):
        assert REFUSAL in one_error_line(capsys, *argv)


# -- import-torch (needs torch) ---------------------------------------------------------------
MODELS = """
import torch
from torch import nn


class Scan(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(torch.cumsum(self.lin(x), dim=-1))


def scan():
    return Scan()


def mish():
    return nn.Sequential(nn.Linear(16, 16), nn.Mish())
"""


def test_an_unknown_aten_op_names_the_node_unless_generic():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch

    class Sort(torch.nn.Module):
        def forward(self, x):
            values, indices = torch.sort(x, dim=-1)
            return values * indices

    x = torch.empty(4, 16)
    with pytest.raises(GraphError, match=r"Sort: node 'sort': ATen op aten\.sort\.default is "
                                         r"not one the toolkit knows"):
        from_torch(Sort(), x)
    graph = from_torch(Sort(), x, generic=True)
    sort = graph["sort"]
    assert sort.op == "generic:aten.sort.default" and sort.inputs == ("input",)
    assert sort.flops == 2 * 4 * 16 and sort.bytes == 4 * 16 * (4 + 8)   # values and indices
    assert Machine().duration("compute", "gpu0", sort.bytes, sort.flops,
                              touched_bytes(sort.op, sort.bytes, [4 * 16 * 4]), op=sort.op) > 0


def test_import_torch_generic_plans_simulates_and_run_refuses(tmp_path, capsys):
    need_torch()
    models = tmp_path / "models.py"
    models.write_text(MODELS)
    out = tmp_path / "tg.json"
    for factory, node, op in (("scan", "cumsum", "aten.cumsum.default"),
                              ("mish", "mish", "aten.mish.default")):
        err = one_error_line(capsys, "import-torch", f"{models}:{factory}", "--input", "8,16",
                             "--out", out)
        assert f"node '{node}': ATen op {op} is not one the toolkit knows" in err
        assert "--generic" in err and not out.exists()
    assert main(["import-torch", f"{models}:scan", "--input", "8,16", "--train", "--generic",
                 "--out", str(out)]) == 0
    assert "2 generic op(s)" in capsys.readouterr().out          # cumsum and its backward's
    graph = formats.taskgraph_from_json(out)
    assert graph["cumsum"].op == "generic:aten.cumsum.default"
    mg = tmp_path / "mg.json"
    assert main(["plan", "--taskgraph", str(out), "--machine", "p100x4:gpus=1",
                 "--out", str(mg)]) == 0
    assert main(["simulate", str(mg)]) == 0
    capsys.readouterr()
    err = one_error_line(capsys, "run", "--taskgraph", out, "--machine", "p100x4:gpus=1")
    assert "vertex 'cumsum': op 'generic:aten.cumsum.default'" in err
