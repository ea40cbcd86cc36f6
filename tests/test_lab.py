"""lab: compare, plots, and the README / CI contract."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from offloadlab.core.errors import SpecError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.lab import COLUMNS, compare, gantt, lane_key, memory_plot, run_all, table

REPO = Path(__file__).resolve().parents[1]
CI_COMMAND = 'pip install ".[test]" && python -m pytest -n auto'
PNG = b"\x89PNG\r\n\x1a\n"


# -- compare ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layers", [3, 8])
def test_compare_reproduces_the_disco_example(layers):
    """DISCO Sec. 2: level-wise offloading takes 3n time units, buildMemGraph 2n + 1."""
    df = compare(build_workload(f"matmul-chain:layers={layers}"),
                 machine_from_spec("disco-example"),
                 [("levelwise", "dynamic"), ("buildmemgraph", "dynamic")])
    assert list(df.columns) == list(COLUMNS)
    makespan = dict(zip(df["planner"], df["makespan"]))
    assert makespan["levelwise"] == pytest.approx(3 * layers)
    assert makespan["buildmemgraph"] == pytest.approx(2 * layers + 1)
    assert (df["peak_gpu_memory"] <= 80 * 2**20).all() and (df["peak_gpu_memory"] > 0).all()
    assert (df["bytes_moved"] > 0).all() and (df["loads"] + df["reloads"] > 0).all()


def test_run_all_plans_each_planner_once_and_reports_progress():
    lines: list[str] = []
    runs = run_all(build_workload("tp-matmul:n=64"), machine_from_spec("p100x4"),
                   [("buildmemgraph", "dynamic"), ("buildmemgraph", "fixed")],
                   progress=lines.append)
    assert runs[0].memgraph is runs[1].memgraph
    assert sum("planning" in line for line in lines) == 1
    assert sum("simulating" in line for line in lines) == 2
    df = table(runs)
    assert list(df["policy"]) == ["dynamic", "fixed"]
    assert df["bytes_moved"].tolist() == [r.row()["bytes_moved"] for r in runs]


# -- plots ------------------------------------------------------------------------------------
def test_lane_order():
    lanes = ["cpu", "gpu10", "bus:d2h", "gpu0->gpu1", "d2h:gpu0", "gpu2", "h2d:gpu0", "bus:h2d",
             "h2d:gpu2", "gpu0"]
    assert sorted(lanes, key=lane_key) == ["gpu0", "gpu2", "gpu10", "h2d:gpu0", "d2h:gpu0",
                                           "h2d:gpu2", "bus:h2d", "bus:d2h", "gpu0->gpu1", "cpu"]


def _trace(shift: float = 0.0) -> pd.DataFrame:
    rows = [("a", "load", "gpu0", "h2d:gpu0", 0, 0.0, 1.0),
            ("b", "compute", "gpu0", "gpu0", 1, 1.0, 2.0),
            ("c", "offload", "gpu0", "d2h:gpu0", 0, 2.0, 3.0), ("d", "transfer", "gpu0->gpu1",
            "gpu0->gpu1", 0, 2.0, 2.5), ("e", "reload", "gpu0", "h2d:gpu0", 0, 3.0, 4.0)]
    df = pd.DataFrame(rows, columns=["vertex", "kind", "device", "resource", "stream", "start",
                                     "end"])
    df[["start", "end"]] += shift
    return df.assign(bytes=1, flops=0.0, source="sim", run=0)


def test_gantt_single_and_several_traces(tmp_path):
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    gantt(_trace(), one)
    gantt({"plan A": _trace(), "plan B": _trace(0.5)}, two, title="A vs B")
    assert one.read_bytes()[:8] == PNG and two.read_bytes()[:8] == PNG
    assert two.stat().st_size > one.stat().st_size // 2


def test_memory_plot(tmp_path):
    memory_plot(MEMORY, tmp_path / "mem.png", capacity=4 * 2**20)
    assert (tmp_path / "mem.png").read_bytes()[:8] == PNG


MEMORY = pd.DataFrame({"time": [0.0, 1.0, 2.0, 0.0, 1.5], "device": ["gpu0"] * 3 + ["host"] * 2,
                       "bytes": [2**20, 3 * 2**20, 0, 0, 2**20]})


def test_gantt_with_memory_panels(tmp_path):
    """The demo's figure: each schedule with each GPU's memory in use under it."""
    plain, both = tmp_path / "plain.png", tmp_path / "both.png"
    gantt({"A": _trace(), "B": _trace(0.5)}, plain)
    gantt({"A": _trace(), "B": _trace(0.5)}, both, memory={"A": MEMORY, "B": MEMORY},
          capacity=4 * 2**20)
    assert both.read_bytes()[:8] == PNG and both.stat().st_size > plain.stat().st_size


def test_plots_leave_pyplot_and_the_backend_alone(tmp_path, monkeypatch):
    """Each plot is a Figure of its own: no pyplot figure, no backend switched (Jupyter's
    inline one stays), and with no path nothing is written."""
    import matplotlib
    from matplotlib.figure import Figure

    from offloadlab.lab import plots
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(matplotlib.rcParams, "backend", "svg")   # not Agg, as Jupyter's
    table = pd.DataFrame({"planner": ["levelwise"], "policy": ["dynamic"], "makespan": [2.0],
                          "lower_bound": [1.5], "problem_bound": [1.0], "source": ["sim"],
                          "noise": [0.1], "mean_speedup": [0.01], "ci_low": [0.0],
                          "ci_high": [0.02]})
    figures = [gantt(_trace()), memory_plot(MEMORY), plots.compare_plot(table),
               plots.ablation_plot(table), plots.sweep_plot(table)]
    assert all(isinstance(f, Figure) and f.axes for f in figures)
    assert matplotlib.rcParams["backend"] == "svg"
    assert "matplotlib.pyplot" not in sys.modules or not sys.modules["matplotlib.pyplot"
                                                                    ].get_fignums()
    assert not list(tmp_path.iterdir())


# -- README and CI ----------------------------------------------------------------------------
def _quickstart_block() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```(?:\w+)?\n(.*?)```", section, re.S)
    assert block, "README's Quickstart has no fenced block"
    return block.group(1).strip().splitlines()


def test_readme_quickstart_is_exactly_the_two_commands():
    assert _quickstart_block() == ["pip install . && offloadlab demo", CI_COMMAND]


def test_ci_runs_the_readme_test_command_verbatim():
    script = REPO / ".ci" / "run"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    assert CI_COMMAND in text.splitlines()
    assert script.stat().st_mode & 0o111, ".ci/run must be executable"


# -- offloadlab compare (issue 18) ----------------------------------------------------------
def test_compare_planners_rows_bounds_and_errors():
    from offloadlab.lab.compare import compare_planners
    graph = build_workload("matmul-chain:layers=8,gpus=2")
    rows = compare_planners(graph, machine_from_spec("disco-example"))
    ok, failed = rows[rows.error.isna()], rows[rows.error.notna()]
    assert set(ok.planner) == {"buildmemgraph", "levelwise", "accelerate-offload"}
    assert set(failed.planner) == {"greedy-offload", "greedy-offload-nodiscount", "l2l",
                                   "ilp-select", "cotrain", "gemini", "torch-compile-offload",
                                   "torchtune-offload", "zero-offload", "fsdp-cpu-offload",
                                   "flexgen"}
    assert failed.makespan.isna().all() and (failed.error.str.contains(
        "training|LLaMA inference")).all()
    # DISCO's example: 16 shards over one bus bound every plan; BuildMemGraph takes 17,
    # levelwise 24, Accelerate's on-demand loads (the bus is the bottleneck either way) 17
    assert rows.problem_bound.tolist() == pytest.approx([16] * len(rows))
    assert set(rows.bound_limit) == {"bus:h2d"}
    assert sorted(ok.makespan) == pytest.approx([17, 17, 24])
    assert (ok.makespan >= ok.lower_bound).all() and (ok.lower_bound >= ok.problem_bound).all()
    assert (ok.bytes_h2d == 16 * 32 * 2**20).all() and (ok.bytes_d2h == 0).all()
    assert ok.gap.tolist() == pytest.approx(list(ok.makespan / 16 - 1))
    idle = ok[["idle_gpu0", "idle_gpu1"]].to_numpy()
    assert ((idle >= 0) & (idle < 1)).all()
    assert str(rows.loads.dtype) == "Int64"


def test_compare_cli_json_table_and_plot(capsys, tmp_path):
    import json

    from offloadlab.lab.cli import main
    out, plot = tmp_path / "t.csv", tmp_path / "t.png"
    assert main(["compare", "--workload", "training-chain", "--machine", "v100", "--json",
                 "--out", str(out), "--plot", str(plot), "--planner", "levelwise",
                 "--planner", "greedy-offload", "--planner", "l2l"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["planner"] for r in rows] == ["levelwise", "greedy-offload", "l2l"]
    for r in rows:
        assert {"planner", "makespan", "bytes_h2d", "bytes_d2h", "peak_memory",
                "lower_bound", "problem_bound"} <= set(r)
        assert r["makespan"] >= r["lower_bound"] >= r["problem_bound"] * (1 - 1e-9)
    assert list(pd.read_csv(out).planner) == ["levelwise", "greedy-offload", "l2l"]
    assert plot.stat().st_size > 0


@pytest.mark.parametrize("argv,message", [
    (["--planner", "nope"], "unknown planner 'nope'"),
    (["--out", "{tmp}/t.txt"], "a table needs one of the suffixes .csv, .parquet"),
    (["--out", "{tmp}/missing/t.csv"], "does not exist"),
    (["--plot", "{tmp}/t.csv"], "an image needs one of the suffixes")])
def test_compare_cli_bad_arguments(capsys, tmp_path, argv, message):
    from offloadlab.lab.cli import main
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["compare", "--workload", "matmul-chain:layers=2", "--machine",
                 "disco-example", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offloadlab: error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


# -- offloadlab ablate determinism (issue 18) ------------------------------------------------
def test_replayed_fixed_order_equals_dynamic_without_noise():
    from offloadlab.lab.ablate import replayed
    from offloadlab.planner import plan
    from offloadlab.simulator import makespan
    graph = build_workload("random:vertices=200,gpus=2,seed=4")
    machine = machine_from_spec("p100x4:gpus=2,gpu_memory=60MB")
    mg = plan(graph, machine, "buildmemgraph")
    again = replayed(mg, machine)
    assert makespan(again, machine, "fixed") == pytest.approx(makespan(mg, machine, "dynamic"))
    assert sorted(v.id for v in again) == sorted(v.id for v in mg)


def test_ablate_determinism_replay_no_difference_without_noise_and_a_gain_with():
    from offloadlab.lab.ablate import ablate_determinism
    graph = build_workload("random:vertices=300,gpus=4,seed=2")
    machine = machine_from_spec("p100x4:gpu_memory=200MB")
    rows = ablate_determinism(graph, machine, ["buildmemgraph"], noises=(0.0, 0.5), seeds=12,
                              fixed="replay")
    quiet, noisy = rows.iloc[0], rows.iloc[1]
    assert quiet.mean_speedup == 0 and quiet.ci_low == 0 and quiet.ci_high == 0
    assert noisy.ci_low <= noisy.mean_speedup <= noisy.ci_high
    assert {"policy_a", "policy_b", "noise", "mean_speedup", "ci_low", "ci_high",
            "seeds"} <= set(rows.columns)


def test_ablate_cli(capsys, tmp_path):
    import json

    from offloadlab.lab.cli import main
    assert main(["ablate", "determinism", "--workload", "matmul-chain:layers=3", "--machine",
                 "disco-example", "--seeds", "3", "--noise", "0,0.1", "--json",
                 "--out", str(tmp_path / "a.csv"), "--plot", str(tmp_path / "a.png")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["planner"], r["noise"]) for r in rows] == [
        ("levelwise", 0.0), ("levelwise", 0.1), ("buildmemgraph", 0.0), ("buildmemgraph", 0.1)]
    assert (tmp_path / "a.png").stat().st_size > 0 and len(pd.read_csv(tmp_path / "a.csv")) == 4
    assert main(["ablate", "determinism", "--workload", "matmul-chain:layers=3", "--machine",
                 "disco-example", "--noise", "0,-1"]) == 2
    assert "noise levels must be finite and >= 0" in capsys.readouterr().err


def test_compare_and_ablate_measured_on_the_executor():
    from offloadlab.lab.ablate import ablate_determinism
    from offloadlab.lab.compare import compare_planners
    graph = build_workload("matmul-chain:layers=3,gpus=2,batch=64,hidden=256")
    machine = machine_from_spec("p100x4:gpus=2,gpu_memory=1MiB")
    rows = compare_planners(graph, machine, ["levelwise", "buildmemgraph"], measured=True,
                            rate_limit=False)
    assert rows.correct.all() and (rows.measured_makespan > 0).all()
    assert rows.sim_error.tolist() == pytest.approx(
        list(rows.makespan / rows.measured_makespan - 1))
    ablation = ablate_determinism(graph, machine, ["buildmemgraph"], noises=(0.0,), seeds=3,
                                  measured=True, rate_limit=False)
    assert list(ablation.source) == ["sim", "measured"] and ablation.noise.isna().tolist() == [
        False, True]
    measured = ablation.iloc[1]
    assert measured.seeds == 3 and measured.ci_low <= measured.mean_speedup <= measured.ci_high


def test_ablate_parts(capsys):
    import json

    from offloadlab.lab.ablate import PARTS, ablate_parts
    from offloadlab.lab.cli import main
    graph = build_workload("random:vertices=200,gpus=2,seed=4")
    machine = machine_from_spec("p100x4:gpus=2,gpu_memory=60MB")
    rows = ablate_parts(graph, machine)
    assert len(rows) == sum(len(settings) for _, settings in PARTS)
    defaults = rows[rows.default]
    assert len(set(defaults.makespan)) == 1 and (defaults.change == 0).all()
    assert rows.change.tolist() == pytest.approx(list(rows.makespan / defaults.makespan.iloc[0]
                                                      - 1))
    assert main(["ablate", "parts", "--workload", "random:vertices=200,gpus=2,seed=4",
                 "--machine", "p100x4:gpus=2,gpu_memory=60MB", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == len(rows)
    assert main(["ablate", "parts", "--workload", "random:vertices=20", "--machine",
                 "p100x4", "--planner", "levelwise"]) == 2
    assert "--planner does not apply" in capsys.readouterr().err


def test_compare_adds_the_milp_bound_on_training_chains():
    from offloadlab.lab.compare import compare_planners
    graph = build_workload("training-chain")
    rows = compare_planners(graph, machine_from_spec("v100:gpu_memory=1.3GB"),
                            ["greedy-offload", "l2l", "ilp-select"])
    assert rows.milp_bound.nunique() == 1 and (rows.milp_bound > 0).all()
    # the weight-offloading planners schedule Beaumont et al.'s model: the MILP bounds them
    assert (rows.iteration_time >= rows.milp_bound * (1 - 1e-6)).all()
    assert rows.milp_gap.tolist() == pytest.approx(list(rows.iteration_time / rows.milp_bound
                                                        - 1))
    dag = compare_planners(build_workload("matmul-chain:layers=2"),
                           machine_from_spec("disco-example"), ["levelwise"])
    assert "milp_bound" not in dag


def test_compare_refuses_a_machine_without_the_graphs_gpus():
    from offloadlab.lab.compare import compare_planners
    with pytest.raises(SpecError, match="has 4 GPU"):
        compare_planners(build_workload("random:vertices=30,gpus=6"), machine_from_spec("p100x4"))
