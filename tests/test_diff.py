"""offloadlab diff (lab/diff.py): two MemGraphs of one TaskGraph side by side."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import fails, run
from test_properties import SETTINGS, machine_for, task_graphs

from offloadlab.core.errors import SpecError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.lab.diff import diff, moves
from offloadlab.planner import plan


@settings(max_examples=60, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 1.0]),
       planners=st.sampled_from([("buildmemgraph", "levelwise"),
                                 ("buildmemgraph:victim=lru", "buildmemgraph")]))
def test_the_moves_only_one_plan_makes_account_for_the_difference(graph, slack, planners):
    m = machine_for(graph, 4, slack)
    a, b = (plan(graph, m, p) for p in planners)
    d = diff(a, b, m)
    for kind in ("load", "reload", "offload"):
        in_a = sum(n for (k, *_), n in moves(a).items() if k == kind)
        in_b = sum(n for (k, *_), n in moves(b).items() if k == kind)
        only_a = sum(x.count for x in d.only_a if x.kind == kind)
        only_b = sum(x.count for x in d.only_b if x.kind == kind)
        assert in_a - in_b == only_a - only_b
    keys_a = {(x.kind, x.tensor, x.device, x.bytes) for x in d.only_a}
    assert not keys_a & {(x.kind, x.tensor, x.device, x.bytes) for x in d.only_b}
    same = diff(a, a, m)
    assert not same.only_a and not same.only_b and same.parting is None
    assert same.makespan_a == same.makespan_b == d.makespan_a


def test_where_buildmemgraph_and_levelwise_part_on_a_training_chain():
    """Both load w1 and compute F1 (0.1 s) alike; BuildMemGraph has w2 loaded by then (its
    loads run back to back from time 0), levelwise loads w2 only after F1's level: F2 starts
    after F1 in one and after the load of w2 in the other."""
    graph = build_workload("training-chain")
    machine = machine_from_spec("v100:gpu_memory=1.5GB")
    d = diff(plan(graph, machine), plan(graph, machine, "levelwise"), machine)
    assert not d.only_a and not d.only_b
    p = d.parting
    assert p.vertex == "F2@1" and p.waited_a == "F1@1" and p.waited_b.startswith("load:w2@0")
    assert p.start_a < p.start_b
    assert d.makespan_b - d.makespan_a == pytest.approx(0.1, abs=1e-3)


def test_plans_of_different_taskgraphs_are_refused():
    machine = machine_from_spec("disco-example")
    a = plan(build_workload("matmul-chain:layers=3,batch=64,hidden=256"), machine)
    b = plan(build_workload("matmul-chain:layers=4,batch=64,hidden=256"), machine)
    with pytest.raises(SpecError, match="different TaskGraphs"):
        diff(a, b, machine)
    del a.graph["taskgraph_hash"], b.graph["taskgraph_hash"]
    with pytest.raises(SpecError, match="not hold the same TaskGraph"):
        diff(a, b, machine)


def test_the_diff_command(capsys, tmp_path):
    spec = "v100:gpu_memory=1.5GB"
    for planner in ("buildmemgraph", "l2l"):
        assert run(capsys, "plan", "--workload", "training-chain", "--machine", spec,
                   "--planner", planner, "--out", tmp_path / f"{planner}.json")[0] == 0
    a, b = tmp_path / "buildmemgraph.json", tmp_path / "l2l.json"
    code, out, err = run(capsys, "diff", a, b)
    assert code == 0 and "moves only" in out and "the timelines part at" in out, err
    code, out, _ = run(capsys, "diff", a, b, "--json")
    found = json.loads(out)
    assert found["makespan_a"] < found["makespan_b"] and found["parting"]["vertex"]
    assert all(m["kind"] in ("load", "reload", "offload") for m in found["only_b"])
    assert run(capsys, "plan", "--workload", "matmul-chain:layers=3,batch=64,hidden=256",
               "--machine", "disco-example", "--out", tmp_path / "other.json")[0] == 0
    assert "different TaskGraphs" in fails(capsys, "diff", a, tmp_path / "other.json")
    assert "cannot read" in fails(capsys, "diff", a, tmp_path / "missing.json")
