"""offloadlab estimate (lab/estimate.py): the smallest GPU memory per planner, the host RAM
then, and makespan against GPU memory."""

import json
from dataclasses import replace

import pytest
from test_cli import fails, run

from offloadlab.core.errors import OffloadlabError, SpecError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.lab.estimate import estimate, smallest_memory
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity

DAG = "random:vertices=60,gpus=2,seed=3,min_bytes=4096,max_bytes=65536"


def _plans(graph, machine, planner, memory) -> bool:
    try:
        plan(graph, replace(machine, gpu_memory=memory), planner)
    except OffloadlabError:
        return False
    return True


@pytest.mark.parametrize("planner", ["buildmemgraph", "levelwise", "buildmemgraph:victim=lru"])
def test_the_smallest_memory_plans_and_a_precision_less_does_not(planner):
    graph, machine = build_workload(DAG), machine_from_spec("p100x4:gpus=2")
    low = min_capacity(graph) - 1
    high = sum(t.bytes for t in graph)
    memory, probes, _ = smallest_memory(graph, machine, planner, low, high, precision=0.01)
    assert memory is not None and low < memory <= high and probes >= 2
    assert _plans(graph, machine, planner, memory)
    if memory > low + 1:
        assert not _plans(graph, machine, planner, int(memory - 0.01 * high) - 1)
    if planner == "buildmemgraph":
        assert memory == min_capacity(graph)       # BuildMemGraph's own bound is exact


def test_the_curve_never_beats_the_bound_and_starts_at_each_planners_smallest():
    graph, machine = build_workload(DAG), machine_from_spec("p100x4:gpus=2")
    found = estimate(graph, machine, ["buildmemgraph", "levelwise"], points=5)
    assert found.smallest["error"].isna().all()
    assert (found.curve["makespan"].dropna() >= found.bound - 1e-12).all()
    for row in found.smallest.itertuples():
        mine = found.curve[found.curve["planner"] == row.planner]
        assert mine["makespan"][mine["gpu_memory"] < row.smallest_gpu_memory].isna().all()
        assert mine["makespan"][mine["gpu_memory"] >= row.smallest_gpu_memory].notna().all()
    assert found.curve["gpu_memory"].max() == sum(t.bytes for t in graph)


def test_a_planner_that_does_not_apply_gets_its_reason():
    graph, machine = build_workload(DAG), machine_from_spec("p100x4:gpus=2")
    found = estimate(graph, machine, ["buildmemgraph", "greedy-offload"], points=2)
    row = found.smallest.set_index("planner").loc["greedy-offload"]
    assert row["error"] and row["smallest_gpu_memory"] != row["smallest_gpu_memory"]
    with pytest.raises(SpecError, match="points"):
        estimate(graph, machine, ["buildmemgraph"], points=1)
    with pytest.raises(SpecError, match="unknown planner"):
        estimate(graph, machine, ["nope"])


def test_the_estimate_command(capsys, tmp_path):
    code, out, err = run(capsys, "estimate", "--workload", DAG, "--machine", "p100x4:gpus=2",
                         "--planner", "buildmemgraph", "--planner", "levelwise", "--points", "3",
                         "--out", tmp_path / "curve.csv", "--plot", tmp_path / "curve.png")
    assert code == 0 and "smallest GPU memory" in out and "against GPU memory" in out, err
    assert (tmp_path / "curve.csv").stat().st_size and (tmp_path / "curve.png").stat().st_size
    code, out, _ = run(capsys, "estimate", "--workload", DAG, "--machine", "p100x4:gpus=2",
                       "--planner", "buildmemgraph", "--points", "2", "--json")
    found = json.loads(out)
    assert found["smallest"][0]["smallest_gpu_memory"] == min_capacity(build_workload(DAG))
    assert len(found["curve"]) == 2 and found["bound"] > 0
    assert "points" in fails(capsys, "estimate", "--workload", DAG, "--machine", "p100x4",
                             "--points", "1")
    assert "no planner can plan" in fails(capsys, "estimate", "--workload", DAG, "--machine",
                                          "p100x4:gpus=2", "--planner", "greedy-offload")
