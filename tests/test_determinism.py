"""Issue 43, part 1: the determinism ablation as TURNIP defines it (Sec. 8 (3), Figure 14):
the fixed run adds dependencies that make each GPU run its kernels in the order input into
BuildMemGraph (``--fixed planned``, the default), the replay of a noiseless dynamic run stays
as ``--fixed replay``; and ``reproduce turnip-determinism`` sets the paper's four cells beside
ours."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS, machine_for, task_graphs

from offloadlab.core import Machine, TaskGraph, formats
from offloadlab.core.verify import verify
from offloadlab.lab.ablate import ablate_determinism, planned
from offloadlab.lab.cli import main
from offloadlab.lab.turnip_determinism import CELLS, COLUMNS, run
from offloadlab.lab.turnip_grid import Point
from offloadlab.planner import plan
from offloadlab.simulator import simulate

MB = 10**6


def kernels_by_gpu(mg) -> dict[str, list[str]]:
    """Each GPU's kernels in planner order."""
    out: dict[str, list[str]] = {}
    for v in sorted(mg, key=lambda v: v.order):
        if v.kind == "compute" and v.device.startswith("gpu"):
            out.setdefault(v.device, []).append(v.id)
    return out


def assert_runs_in_planned_order(trace: pd.DataFrame, mg) -> None:
    """In ``trace`` each GPU's kernels start in planner order, each after the last ended."""
    starts = dict(zip(trace["vertex"], trace["start"]))
    ends = dict(zip(trace["vertex"], trace["end"]))
    for gpu, ids in kernels_by_gpu(mg).items():
        assert sorted(ids, key=lambda v: (starts[v], ids.index(v))) == ids, gpu
        for before, after in zip(ids, ids[1:]):
            assert starts[after] >= ends[before], (gpu, before, after)


@settings(max_examples=300, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       planner=st.sampled_from(["buildmemgraph", "buildmemgraph:ahead=false", "levelwise"]),
       policy=st.sampled_from(["dynamic", "random"]), noise=st.sampled_from([0.0, 0.3]),
       seed=st.integers(0, 1000))
def test_the_planned_run_starts_each_gpus_kernels_in_planner_order(graph, slack, planner,
                                                                   policy, noise, seed):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    edges = sorted(mg.edges())
    fixed = planned(mg)
    verify(fixed, graph, m)                         # a MemGraph like any other
    assert sorted(mg.edges()) == edges              # the plan itself is left alone
    added = set(fixed.edges()) - set(edges)
    assert all(kind == "memory" for _, _, kind in added)
    chains = {(a, b) for ids in kernels_by_gpu(mg).values() for a, b in zip(ids, ids[1:])}
    assert {(u, v) for u, v, _ in added} <= chains
    assert all(v in fixed.succ[u] for u, v in chains)
    assert_runs_in_planned_order(simulate(fixed, m, policy, noise, seed).trace, mg)


@settings(max_examples=15, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.5]))
def test_the_executor_runs_each_gpus_kernels_in_planner_order(graph, slack):
    from offloadlab.executor import execute
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, "buildmemgraph")
    result = execute(planned(mg), m, rate_limit=False)
    assert_runs_in_planned_order(result.trace, mg)


def late_weight() -> tuple[TaskGraph, Machine]:
    """One GPU: kernel ``a`` reads a 60 MB weight from host RAM (a 5 ms load), kernel ``b``
    does not; V lists ``a`` first.  The dynamic runtime runs ``b`` while the weight loads, the
    planned order makes ``b`` wait for ``a``."""
    g = TaskGraph(name="late-weight")
    g.add_input("w", 60 * MB)
    g.add_input("x", MB, home="gpu0")
    g.add_compute("a", "mix", ["w"], "gpu0", MB, flops=14e9)       # 1 ms at 14 TFLOP/s
    g.add_compute("b", "mix", ["x"], "gpu0", MB, flops=14e9)
    return g, Machine(gpus=1, gpu_memory=100 * MB, h2d_bandwidth=12e9, link_latency=0.0,
                      kernel_latency=0.0)


def test_without_noise_the_planned_order_can_be_slower_and_the_replay_cannot():
    graph, machine = late_weight()
    rows = {fixed: ablate_determinism(graph, machine, ["buildmemgraph"], noises=(0.0, 0.2),
                                      seeds=6, fixed=fixed) for fixed in ("planned", "replay")}
    quiet = rows["planned"].iloc[0]
    # dynamic: b (1 ms) during the 5 ms load, then a; planned: the load, a, then b
    assert quiet.mean_makespan_a == pytest.approx(0.006, rel=0.01)
    assert quiet.mean_makespan_b == pytest.approx(0.007, rel=0.01)
    assert quiet.ci_low == quiet.mean_speedup == quiet.ci_high == pytest.approx(1 / 6, rel=0.02)
    assert rows["replay"].iloc[0].mean_speedup == 0
    for table, fixed in ((rows["planned"], "planned"), (rows["replay"], "replay")):
        assert list(table["fixed"]) == [fixed, fixed] and list(table["seeds"]) == [6, 6]
        noisy = table.iloc[1]
        assert noisy.ci_low <= noisy.mean_speedup <= noisy.ci_high


def test_the_noisy_runs_are_paired_by_seed():
    """A seed draws the same factor for a vertex in either run: where the planned order
    changes nothing (a chain), every seed's speedup is zero."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.workloads import build_workload
    graph = build_workload("matmul-chain:layers=4")
    rows = ablate_determinism(graph, machine_from_spec("disco-example"), ["levelwise"],
                              noises=(0.3,), seeds=5)
    assert rows.iloc[0].ci_low == rows.iloc[0].ci_high == 0


def test_ablate_cli_fixed_planned_and_replay(capsys, tmp_path):
    graph, machine = late_weight()
    formats.to_json(graph, tmp_path / "g.json")
    (tmp_path / "m.json").write_text(machine.to_json())
    argv = ["ablate", "determinism", "--taskgraph", str(tmp_path / "g.json"), "--machine",
            str(tmp_path / "m.json"), "--planner", "buildmemgraph", "--noise", "0",
            "--seeds", "2"]
    shown = {}
    for fixed in ("planned", "replay", None):
        assert main(argv + (["--fixed", fixed] if fixed else []) + ["--json"]) == 0
        row, = json.loads(capsys.readouterr().out)
        shown[fixed] = row["fixed"], round(row["mean_speedup"], 3)
    assert shown == {"planned": ("planned", 0.167), "replay": ("replay", 0.0),
                     None: ("planned", 0.167)}
    assert main(argv) == 0
    assert "each GPU's kernels in the planner's order" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["determinism", "--fixed", "nope"], "argument --fixed: invalid choice: 'nope'"),
    (["determinism", "--fixed"], "argument --fixed: expected one argument"),
    (["parts", "--fixed", "replay"], "--fixed does not apply to ablate parts")])
def test_ablate_cli_refuses_a_bad_fixed_order(capsys, tmp_path, argv, message):
    code = main(["ablate", *argv[:1], "--workload", "matmul-chain:layers=2", "--machine",
                 "disco-example", *argv[1:], "--out", str(tmp_path / "a.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("offloadlab: error: ") and err.count("\n") == 1
    assert message in err
    assert list(tmp_path.iterdir()) == []


TINY = {"inference": [Point("tiny", 64, "p100x4"), Point("tiny", 64, "a100x8:gpus=4"),
                      Point("tiny", 128, "a100x8:gpus=4")],
        "training": [Point("tiny", 64, "p100x4", 2)]}


def test_reproduce_sets_each_cell_beside_the_papers():
    table = run(TINY, noises=(0.0, 0.2), seeds=4, progress=False)
    assert list(table.columns) == COLUMNS
    points, cells = table[table.scope == "point"], table[table.scope == "cell"]
    assert len(points) == 4 * 2 and (points.status == "ok").all()
    assert len(cells) == 4 * 2
    assert [(r.experiment, r.machine) for r in cells[cells.noise == 0].itertuples()] == [
        (c.experiment, c.machine) for c in CELLS]
    assert set(points.workload) == {
        "llama-prefill:model=tiny,seq=64,batch=1,gpus=4",
        "llama-prefill:model=tiny,seq=128,batch=1,gpus=4",
        "llama-lora-train:model=tiny,seq=64,batch=2,gpus=4"}
    by_cell = cells.set_index(["experiment", "machine", "noise"])
    a100 = by_cell.loc[("inference", "a100x8", 0.2)]
    assert a100.points == 2 and a100.workload == (
        "llama-prefill:model=tiny,seq=64,batch=1,gpus=4;"
        "llama-prefill:model=tiny,seq=128,batch=1,gpus=4")
    mine = points[(points.machine == "a100x8:gpus=4") & (points.noise == 0.2)]
    assert a100.mean_speedup == pytest.approx(mine.mean_speedup.mean())   # same seeds each
    assert a100.ci_low <= a100.mean_speedup <= a100.ci_high
    assert a100.paper == 0.0402 and a100.difference == pytest.approx(a100.mean_speedup - 0.0402)
    quiet = cells[(cells.noise == 0) & (cells.points > 0)]
    assert len(quiet) == 3
    assert (quiet.ci_low == quiet.mean_speedup).all()
    assert (quiet.ci_high == quiet.mean_speedup).all()
    missing = by_cell.loc[("training", "a100x8", 0.0)]
    assert missing.status == "no points" and missing.points == 0 and missing.mean_speedup != \
        missing.mean_speedup


def test_reproduce_turnip_determinism_cli(capsys, tmp_path):
    assert main(["reproduce", "turnip-determinism", "--only", "tiny-64@p100x4", "--seeds", "2",
                 "--noise", "0,0.1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4.02%" in out and "14.50%" in out and "no points" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["turnip-determinism.csv",
                                                          "turnip-determinism.png"]
    table = pd.read_csv(tmp_path / "turnip-determinism.csv")
    assert list(table.columns) == COLUMNS and set(table.fixed) == {"planned"}
    assert len(table[table.scope == "point"]) == 2 * 2
    assert main(["reproduce", "turnip-determinism", "--only", "tiny-64@p100x4", "--seeds", "2",
                 "--noise", "0", "--fixed", "replay", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["fixed"] for r in rows} == {"replay"}
    assert all(r["mean_speedup"] == 0 for r in rows if r["points"])


@pytest.mark.parametrize("argv,message", [
    (["beaumont-table1", "--seeds", "3"], "--seeds applies to reproduce turnip-determinism"),
    (["turnip-lora", "--quick"], "--quick applies to reproduce turnip-determinism"),
    (["turnip-determinism", "--quick", "--only", "7b-1024"], "--only and --quick"),
    (["turnip-determinism", "--fixed", "later"], "argument --fixed: invalid choice"),
    (["turnip-determinism", "--only", "tiny-64@a100x8"], "not divisible by gpus (8)")])
def test_reproduce_turnip_determinism_refuses_bad_arguments(capsys, tmp_path, argv, message):
    code = main(["reproduce", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("offloadlab: error: ") and err.count("\n") == 1
    assert message in err
    assert list(tmp_path.iterdir()) == []
