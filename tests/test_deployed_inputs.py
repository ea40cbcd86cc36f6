"""What a new user gets wrong with the deployed schemes (issue 45): each mistake is refused in
one line naming the file, option or value, with exit status 2, and nothing written."""

from __future__ import annotations

import json

import pytest

from offloadlab.core import formats
from offloadlab.core.errors import PlanError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.lab.cli import main
from offloadlab.planner import plan

LORA = "llama-lora-train:model=tiny,seq=32,batch=1,gpus=1,block=32"


def refused(capsys, *argv: str) -> str:
    """Run a command that must fail as a user error; its one line of stderr."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("offloadlab: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("forward", [-5, "abc", 2.5, True, [1], 10**20, 100_000])
@pytest.mark.parametrize("planner", ["torch-compile-offload", "zero-offload"])
def test_a_taskgraph_file_with_a_bad_forward_count_is_refused(capsys, tmp_path, forward,
                                                              planner):
    """``graph.forward`` (where the forward pass ends) is checked as the file is read: a
    string or a float made the schemes fail with a traceback, a negative or boolean count
    was taken as a Python slice, a count beyond the graph's compute vertices as all of them."""
    data = formats.to_dict(build_workload(LORA))
    data["graph"]["forward"] = forward
    path = tmp_path / "tg.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "mg.json"
    err = refused(capsys, "plan", "--taskgraph", path, "--machine", "v100", "--planner",
                  planner, "--out", out)
    assert f"{path}" in err and "graph.forward" in err
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("forward", [-1, "3", 10**6])
def test_a_built_graph_with_a_bad_forward_count_is_refused(forward):
    graph = build_workload(LORA)
    graph.meta["forward"] = forward
    with pytest.raises(PlanError, match="meta 'forward'.* must be an integer from 0 to"):
        plan(graph, machine_from_spec("v100"), "torchtune-offload")


def test_an_option_given_to_a_planner_that_takes_none(capsys, tmp_path):
    err = refused(capsys, "plan", "--workload", LORA, "--machine", "v100", "--planner",
                  "accelerate-offload:min_offload_size=1", "--out", tmp_path / "mg.json")
    assert "planner 'accelerate-offload': unknown option(s) min_offload_size; it takes none" \
        in err
    assert not list(tmp_path.iterdir())
