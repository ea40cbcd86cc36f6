"""Profiling a TaskGraph's kernels at their own shapes (offloadlab.executor.profile)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from test_cli import fails, run

from offloadlab.core import formats
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.workloads import build_workload
from offloadlab.executor.profile import _batches, profile, signatures
from offloadlab.planner import plan
from offloadlab.simulator import simulate

MACHINE = machine_from_spec("p100x4:gpus=1")


def _matmuls(*sizes: int) -> TaskGraph:
    """A chain of n x n matmuls on gpu0, one per size (each reads the weight of its size)."""
    g = TaskGraph("matmuls")
    for k, n in enumerate(sizes):
        g.add_input(f"x{k}", 4 * n * n, "gpu0", shape=(n, n))
        g.add_input(f"w{k}", 4 * n * n, "gpu0", shape=(n, n))
        g.add_compute(f"y{k}", "matmul", [f"x{k}", f"w{k}"], "gpu0", 4 * n * n, 2.0 * n ** 3,
                      shape=(n, n))
    return g


def test_signatures_group_vertices_of_the_same_shapes():
    graph = build_workload("matmul-chain:layers=5,gpus=1,batch=64,hidden=64")
    sigs = signatures(graph)
    matmul = [ids for s, ids in sigs.items() if s.template.op == "matmul"]
    assert len(matmul) == 1 and len(matmul[0]) == 5
    assert len(signatures(_matmuls(32, 64, 32))) == 2


def test_profile_times_every_kernel_and_changes_nothing_else():
    graph = build_workload("llama-lora-train:model=tiny,seq=32,batch=1,gpus=1,block=16")
    result = profile(graph, MACHINE, repeats=2)
    timed = result.graph
    assert [t.id for t in timed] == [t.id for t in graph]
    for before, after in zip(graph, timed):
        assert before.time is None                      # the graph given is not changed
        assert replace(after, time=None) == before
        assert (after.time is not None and after.time > 0) == (before.kind == "compute")
    assert result.table["vertices"].sum() == sum(t.kind == "compute" for t in graph)
    assert (result.table["least"] <= result.table["seconds"]).all()
    assert (result.table["seconds"] <= result.table["greatest"]).all()


def test_a_larger_kernel_takes_longer():
    table = profile(_matmuls(48, 384), MACHINE, repeats=3).table.set_index("shape")
    assert table.at[(384, 384), "seconds"] > 4 * table.at[(48, 48), "seconds"]


def test_the_simulator_prices_a_profiled_kernel_by_its_time():
    timed = profile(_matmuls(64, 128), MACHINE, repeats=2).graph
    one = replace(MACHINE, streams=1)                  # one kernel at a time
    trace = simulate(plan(timed, one, "buildmemgraph"), one).trace.set_index("vertex")
    for k in (0, 1):
        seconds = trace.at[f"y{k}", "end"] - trace.at[f"y{k}", "start"]
        assert seconds == pytest.approx(timed[f"y{k}"].time)


def test_batches_cut_at_the_memory_given_and_still_time_everything():
    graph = _matmuls(16, 32, 48)
    sigs = list(signatures(graph))
    assert [len(b) for b in _batches(sigs, 2, 1)] == [1, 1, 1]
    assert [len(b) for b in _batches(sigs, 2, 2**30)] == [3]
    result = profile(graph, MACHINE, repeats=2, memory=1)
    assert all(t.time is not None for t in result.graph if t.kind == "compute")


def test_an_op_without_a_kernel_keeps_its_cost_model_and_cpu_ops_are_timed():
    g = _matmuls(32)
    g.add_compute("odd", "generic:aten.cumsum.default", ["y0"], "gpu0", 4096, 1024.0,
                  shape=(32, 32))
    g.add_input("h", 4 * 64 * 64, "host", shape=(64, 64))
    g.add_compute("c", "matmul", ["h", "h"], "cpu", 4 * 64 * 64, 2.0 * 64 ** 3, shape=(64, 64))
    result = profile(g, MACHINE, repeats=2)
    assert result.graph["odd"].time is None and result.graph["c"].time > 0
    rows = result.table.set_index("op")
    assert math.isnan(rows.at["generic:aten.cumsum.default", "seconds"])
    assert rows.loc["matmul", "device"].tolist() == ["gpu", "cpu"]


def test_profile_refuses_no_repeats():
    with pytest.raises(ValueError, match="repeats >= 1"):
        profile(_matmuls(8), MACHINE, repeats=0)


def test_taskgraph_profile_writes_the_times(capsys, tmp_path):
    out = tmp_path / "g.json"
    code, stdout, err = run(capsys, "-q", "taskgraph", "--workload",
                            "matmul-chain:layers=3,gpus=1,batch=32,hidden=32", "--out", out,
                            "--profile", "--repeats", "2")
    assert code == 0, err
    graph = formats.taskgraph_from_json(out.read_text())
    assert all((t.time is not None) == (t.kind == "compute") for t in graph)
    assert "--repeats: must be positive" in fails(
        capsys, "taskgraph", "--workload", "matmul-chain", "--out", tmp_path / "h.json",
        "--profile", "--repeats", "0")
    assert not (tmp_path / "h.json").exists()


def test_validate_profile_labels_its_rows(capsys):
    code, out, err = run(capsys, "validate", "--workload",
                         "matmul-chain:layers=3,gpus=1,batch=64,hidden=64",
                         "--machine", "p100x4:gpus=1,gpu_memory=60KB", "--runs", "1",
                         "--profile", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows and all(r["profiled"] is True and r["correct"] for r in rows)


def test_each_run_of_a_kernel_reads_inputs_of_its_own():
    """Inputs shared by the runs would stay in the CPU's caches, which a plan's seldom do."""
    from offloadlab.executor.profile import _graph
    [sig] = signatures(_matmuls(16))
    mg, which = _graph([sig], 3)
    kernels = [v for v in mg if v.kind == "compute"]
    assert len(kernels) == 3 and len(which) == 3
    assert len({u for v in kernels for u in v.inputs}) == 6


def test_repeats_that_would_not_fit_in_ram_are_refused_before_anything_is_built():
    from offloadlab.core.errors import SpecError
    with pytest.raises(SpecError, match="profiling 1000000000 runs of each kernel"):
        profile(_matmuls(64), MACHINE, repeats=10**9)
