"""Why a plan is fast or slow (lab/explain.py): overlap and idle attribution add up on any
trace, and name the cause worked out by hand on small timelines."""

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import fails, run
from test_properties import SETTINGS, machine_for, task_graphs
from test_simulator import add, machine

from offloadlab.core.dispatch import POLICIES
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import MemGraph
from offloadlab.core.memory import memory_over_time
from offloadlab.core.taskgraph import CATEGORIES
from offloadlab.core.workloads import build_workload
from offloadlab.executor import execute
from offloadlab.lab.compare import compare_planners
from offloadlab.lab.explain import (
    CAUSES,
    UNKNOWN,
    category_table,
    explain,
    memory_by_category,
    overlap,
    union,
)
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import simulate


def adds_up(table, trace) -> None:
    for row in table.itertuples():
        idle = sum(getattr(row, f"idle_{c}") for c in CAUSES)
        assert row.busy + idle == pytest.approx(row.makespan, abs=1e-9)
        assert min(idle, row.busy, row.hidden, row.transfer) >= -1e-12
        assert row.hidden <= min(row.busy, row.transfer) + 1e-12
        assert math.isnan(row.overlap) or 0.0 <= row.overlap <= 1.0 + 1e-12
    gpus = {d for d, k in zip(trace["device"], trace["kind"])
            if d.startswith("gpu") and "->" not in d and k in ("compute", "load", "reload",
                                                               "offload")}
    assert list(table["gpu"]) == sorted(gpus, key=lambda g: int(g[3:]))


@settings(max_examples=150, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 1.0]),
       planner=st.sampled_from(["buildmemgraph", "levelwise"]),
       policy=st.sampled_from(list(POLICIES)), noise=st.sampled_from([0, 0.3]))
def test_busy_and_attributed_idle_add_up_to_the_makespan_on_every_gpu(graph, slack, planner,
                                                                     policy, noise):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    trace = simulate(mg, m, policy, noise=noise, seed=1).trace
    adds_up(explain(trace, mg), trace)


@settings(max_examples=15, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 1.0]))
def test_a_measured_trace_adds_up_too(graph, slack):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m)
    trace = execute(mg, m, rate_limit=False).trace
    adds_up(explain(trace, mg), trace)


def test_interval_helpers():
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert overlap([(0, 2), (3, 4)], [(1, 3.5)]) == pytest.approx(1.5)
    assert overlap([], [(0, 1)]) == 0.0


def _timeline() -> MemGraph:
    """On 1 flop/s GPUs and 1 B/s links (tests/test_simulator.py): gpu0 loads x (2 s) while
    nothing runs, computes k0 (1 s); gpu1 computes k1 (3 s) and sends its result to gpu0
    (1 s); gpu0 then computes k2 (1 s) from both, after a memory edge from k0."""
    mg = MemGraph()
    add(mg, "x", "input", "host", 2)
    add(mg, "L", "load", "gpu0", 2, ["x"], loc=("gpu0", 0, 2))
    add(mg, "k0", "compute", "gpu0", 1, ["L"], flops=1.0, loc=("gpu0", 2, 1))
    add(mg, "k1", "compute", "gpu1", 1, [], flops=3.0, loc=("gpu1", 0, 1))
    add(mg, "T", "transfer", "gpu1->gpu0", 1, ["k1"], loc=("gpu0", 3, 1))
    add(mg, "k2", "compute", "gpu0", 1, ["k0", "T"], flops=1.0, loc=("gpu0", 4, 1))
    for i, v in enumerate(mg):
        v.order = i
    return mg


def test_each_cause_on_a_timeline_worked_out_by_hand():
    mg = _timeline()
    trace = simulate(mg, machine()).trace
    table = explain(trace, mg).set_index("gpu")
    # gpu0: idle 0-2 waiting for the load, busy 2-3 (k0), idle 3-4 waiting for T (from gpu1,
    # ending at 4), busy 4-5 (k2); the makespan is 5.
    gpu0 = table.loc["gpu0"]
    assert gpu0.makespan == 5.0 and gpu0.busy == 2.0
    assert (gpu0.idle_load, gpu0.idle_dependency, gpu0.idle_memory, gpu0.idle_launch,
            gpu0.idle_done) == (2.0, 1.0, 0.0, 0.0, 0.0)
    assert gpu0.transfer == 2.0 and gpu0.hidden == 0.0 and gpu0.overlap == 0.0
    # gpu1: busy 0-3, then nothing to do until the end.
    gpu1 = table.loc["gpu1"]
    assert (gpu1.busy, gpu1.idle_done) == (3.0, 2.0) and math.isnan(gpu1.overlap)


def test_a_location_still_in_use_is_memory_and_a_late_start_is_launch():
    """gpu0 computes y (1 s), offloads it (3 s), then computes z into y's bytes (1 s): z waits
    for the offload over a memory edge.  Then the same trace with z started 0.5 s late (as a
    measured run's dispatch would): the extra half second is launch."""
    mg = MemGraph()
    add(mg, "x", "input", "gpu0", 1, loc=("gpu0", 0, 1))
    add(mg, "y", "compute", "gpu0", 3, ["x"], flops=1.0, loc=("gpu0", 1, 3))
    add(mg, "O", "offload", "gpu0", 3, ["y"])
    add(mg, "z", "compute", "gpu0", 3, ["x"], flops=1.0, loc=("gpu0", 1, 3), after=["O"])
    for i, v in enumerate(mg):
        v.order = i
    trace = simulate(mg, machine()).trace
    row = explain(trace, mg).iloc[0]
    assert (row.makespan, row.busy, row.idle_memory, row.idle_launch) == (5.0, 2.0, 3.0, 0.0)
    assert (row.transfer, row.hidden) == (3.0, 0.0)
    late = trace.copy()
    late.loc[late["vertex"] == "z", ["start", "end"]] += 0.5
    row = explain(late, mg).iloc[0]
    assert (row.makespan, row.idle_memory, row.idle_launch) == (5.5, 3.0, 0.5)


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_simulate_and_run_explain(capsys, tmp_path, command):
    spec = "disco-example:gpu_memory=400KB"
    path = tmp_path / "mg.json"
    assert run(capsys, "plan", "--workload", "matmul-chain:layers=4,batch=64,hidden=256",
               "--machine", spec, "--out", path)[0] == 0
    extra = ["--no-rate-limit"] if command == "run" else []
    code, out, err = run(capsys, command, path, "--machine", spec, "--explain", *extra)
    assert code == 0 and "why, per GPU" in out and "overlap" in out, err
    code, out, err = run(capsys, command, path, "--machine", spec, "--explain", "--json",
                         *extra)
    rows = json.loads(out)["explain"]
    assert [r["gpu"] for r in rows] == ["gpu0", "gpu1"]
    for r in rows:
        assert r["busy"] + sum(r[f"idle_{c}"] for c in CAUSES) == \
            pytest.approx(r["makespan"], abs=1e-9)


def test_compare_rows_carry_the_overlap_and_the_waits_which_add_up_to_the_idle_shares():
    graph = build_workload("random:vertices=80,gpus=2,seed=4,min_bytes=4096,max_bytes=65536")
    machine = replace(machine_from_spec("p100x4:gpus=2"),
                      gpu_memory=int(1.2 * min_capacity(graph)))
    table = compare_planners(graph, machine, ["buildmemgraph", "levelwise"])
    for row in table.itertuples():
        idle = (row.idle_gpu0 + row.idle_gpu1) / 2
        assert sum(getattr(row, f"wait_{c}") for c in CAUSES) == pytest.approx(idle, abs=1e-9)
        assert 0.0 <= row.overlap <= 1.0


# -- memory by category ---------------------------------------------------------------------------
def _categories_add_up(series, trace, mg) -> None:
    """At every instant a step changes, on every GPU, the categories' bytes add up to the
    memory in use (memory_over_time)."""
    total = memory_over_time(trace, mg)
    for gpu, used in total[total.device != "host"].groupby("device"):
        mine = series[series.device == gpu]
        times = sorted({*used.time, *mine.time})
        for t in times:
            expected = used[used.time <= t].bytes.iloc[-1] if (used.time <= t).any() else 0
            held = sum(one[one.time <= t].bytes.iloc[-1] for _, one in mine.groupby("category")
                       if (one.time <= t).any())
            assert held == expected, (gpu, t)
    assert set(series.device) <= set(total.device)
    assert (series.bytes >= 0).all()


@settings(max_examples=60, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 1.0]),
       planner=st.sampled_from(["buildmemgraph", "levelwise"]),
       policy=st.sampled_from(["dynamic", "fixed", "random"]), data=st.data())
def test_memory_by_category_adds_up_at_every_instant(graph, slack, planner, policy, data):
    cats = data.draw(st.lists(st.sampled_from((None, *CATEGORIES)), min_size=len(graph),
                              max_size=len(graph)))
    for t, cat in zip(list(graph), cats):
        if cat is not None:
            t.category = cat
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    trace = simulate(mg, m, policy, seed=1).trace
    series = memory_by_category(trace, mg, graph)
    _categories_add_up(series, trace, mg)
    assert set(series.category) <= {*CATEGORIES, UNKNOWN}
    bare = memory_by_category(trace, mg)            # no TaskGraph: all unknown
    assert set(bare.category) <= {UNKNOWN}
    _categories_add_up(bare, trace, mg)


@pytest.mark.parametrize("spec", ["torch-compile-offload", "torchtune-offload", "buildmemgraph"])
def test_memory_by_category_of_a_training_step(spec):
    graph = build_workload("gpt2-train:depth=3,batch=2,seq=16,weight_bytes=300000,iterations=2")
    m = replace(machine_from_spec("v100"), gpu_memory=8 * 2**20)
    mg = plan(graph, m, spec)
    for trace in (simulate(mg, m).trace, execute(mg, m, rate_limit=False).trace):
        series = memory_by_category(trace, mg, graph)
        _categories_add_up(series, trace, mg)
        table = category_table(series)
        assert set(table.category) == {"weights", "activations", "gradients"}
        peak = memory_over_time(trace, mg).query("device == 'gpu0'").bytes.max()
        assert table.at_gpu_peak.sum() == peak
        assert table.share.sum() == pytest.approx(1.0)
        for row in table.itertuples():
            assert row.peak == series[series.category == row.category].bytes.max()
            assert row.at_gpu_peak <= row.peak


def test_simulate_and_run_split_memory_by_category(capsys, tmp_path):
    workload = "training-chain:w=4MB;4MB,a=1MB;1MB,uF=0.01;0.01,uB=0.02;0.02"
    spec = "v100:gpu_memory=40MB"
    path, table = tmp_path / "mg.json", tmp_path / "cat.csv"
    assert run(capsys, "plan", "--workload", workload, "--machine", spec, "--planner",
               "torch-compile-offload", "--out", path)[0] == 0
    code, out, err = run(capsys, "simulate", path, "--explain", "--workload", workload,
                         "--categories", table)
    assert code == 0, err
    assert "memory by category" in out and "weights" in out and "gradients" in out
    import pandas as pd
    written = pd.read_csv(table)
    assert list(written.columns) == ["time", "device", "category", "bytes"]
    assert set(written.category) == {"weights", "activations", "gradients"}
    code, out, err = run(capsys, "simulate", path, "--explain", "--json")
    rows = json.loads(out)["memory_by_category"]
    assert [r["category"] for r in rows] == [UNKNOWN] and rows[0]["share"] == 1.0
    code, out, err = run(capsys, "run", "--workload", workload, "--machine", spec,
                         "--planner", "torchtune-offload", "--explain", "--json",
                         "--no-rate-limit")
    assert code == 0, err
    assert {r["category"] for r in json.loads(out)["memory_by_category"]} == \
        {"weights", "activations", "gradients"}
    assert "--explain" in fails(capsys, "simulate", path, "--categories", table)
    assert "a table needs" in fails(capsys, "simulate", path, "--explain", "--categories",
                                    tmp_path / "cat.txt")
    assert "planned from" in fails(capsys, "simulate", path, "--explain", "--workload",
                                   "training-chain")
