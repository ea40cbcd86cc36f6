"""Result rows say what they measured (issue 42): every row of compare, ablate and validate, in
JSON, CSV and Parquet, carries the full workload and machine specs as given (overrides
included), the planner spec, the policy and the version; bytes and seconds are numbers, and no
error is an empty cell.  (Sweep: tests/test_sweep.py; reproduce: tests/test_reproduce.py.)"""

from __future__ import annotations

import json

import pandas as pd
import pytest

import offloadlab
from offloadlab.core.machine import machine_from_spec
from offloadlab.lab import plots
from offloadlab.lab.cli import main
from offloadlab.lab.compare import machine_spec

WORKLOAD = "random:vertices=40,gpus=2,seed=3"
MACHINE = "p100x4:gpus=2,gpu_memory=60MB"
PROBLEM = ["--workload", WORKLOAD, "--machine", MACHINE]


def read(path) -> pd.DataFrame:
    return pd.read_parquet(path) if str(path).endswith(".parquet") else \
        pd.read_csv(path, keep_default_na=False)


def says_what_it_measured(table: pd.DataFrame) -> None:
    assert set(table.workload) == {WORKLOAD} and set(table.machine) == {MACHINE}
    assert set(table.version) == {offloadlab.__version__}
    assert table.planner.notna().all() and table.policy.notna().all()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_compare_rows_and_title(tmp_path, capsys, monkeypatch, suffix):
    titles: list[str] = []
    drawn = plots.compare_plot
    monkeypatch.setattr(plots, "compare_plot", lambda table, path, title="":
                        titles.append(title) or drawn(table, path, title))
    out = tmp_path / f"t{suffix}"
    assert main(["compare", *PROBLEM, "--planner", "levelwise", "--planner", "l2l",
                 "--out", str(out), "--plot", str(tmp_path / "t.png")]) == 0
    printed = capsys.readouterr().out
    assert f"on {MACHINE}," in printed and "None" not in printed
    assert titles == [f"random on {MACHINE} (dynamic dispatch)"]
    table = read(out)
    says_what_it_measured(table)
    assert list(table.columns[:4]) == ["workload", "machine", "planner", "policy"]
    assert list(table.columns[-2:]) == ["version", "error"]
    ok = table[table.planner == "levelwise"].iloc[0]
    assert pd.isna(ok.error) or ok.error == ""                   # empty, not "None"
    assert str(ok.bytes_h2d).isdigit() and float(ok.makespan) > 0
    assert "not a training workload" in table[table.planner == "l2l"].error.iloc[0]
    assert main(["compare", *PROBLEM, "--planner", "levelwise", "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert (row["workload"], row["machine"], row["error"]) == (WORKLOAD, MACHINE, None)
    assert isinstance(row["bytes_h2d"], int) and isinstance(row["makespan"], float)


def test_ablate_rows(tmp_path, capsys):
    out = tmp_path / "d.parquet"
    assert main(["ablate", "determinism", *PROBLEM, "--planner", "levelwise", "--noise",
                 "0,0.1", "--seeds", "3", "--out", str(out)]) == 0
    assert f"on {MACHINE}:" in capsys.readouterr().out
    table = read(out).rename(columns={"policy_a": "policy"})
    says_what_it_measured(table)
    out = tmp_path / "p.csv"
    assert main(["ablate", "parts", *PROBLEM, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"on {MACHINE}:" in printed and " MiB" in printed
    table = read(out)
    says_what_it_measured(table)
    assert "buildmemgraph:victim=lru" in set(table.planner)
    assert table.bytes_moved.dtype.kind == "i" and table.makespan.dtype.kind == "f"


def test_validate_rows(tmp_path, capsys):
    problem = ["--workload", "matmul-chain:layers=3,gpus=1,batch=64,hidden=64",
               "--machine", "p100x4:gpus=1,gpu_memory=1MB"]
    table = tmp_path / "v.csv"
    assert main(["validate", *problem, "--planner", "levelwise", "--runs", "1", "--json",
                 "--table", str(table)]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert (row["workload"], row["machine"]) == (problem[1], problem[3])
    assert (row["planner"], row["policy"], row["version"]) == ("levelwise", "dynamic",
                                                               offloadlab.__version__)
    components = read(table)
    assert set(components.workload) == {problem[1]} and set(components.machine) == {problem[3]}
    assert set(components.planner) == {"levelwise"} and set(components.policy) == {"dynamic"}


def test_machine_spec_rebuilds_the_machine():
    for spec in (MACHINE, "v100", "p100x4:h2d_bandwidth=4e9,streams=2", "disco-example"):
        machine = machine_from_spec(spec)
        assert machine_from_spec(machine_spec(machine)) == machine
    assert machine_spec(machine_from_spec(MACHINE)) == "p100x4:gpus=2,gpu_memory=60000000"
