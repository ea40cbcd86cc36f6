"""Issue 43, host memory as a resource (docs/host-memory.md): the machine's ``host_memory``
(presets, overrides, files, refused values), a plan's host peak in its own order and a run's
over time, each against an independent recount on random plans, the planners' refusal and the
simulator's out-of-memory outcome, and the rows of ``compare`` and the TURNIP grids."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import PLANNERS, SETTINGS, machine_for, task_graphs

from offloadlab.core import formats
from offloadlab.core.errors import HostMemoryError, PlanError, SpecError
from offloadlab.core.host import planned_host_peak
from offloadlab.core.machine import PRESETS, GiB, Machine, machine_from_spec
from offloadlab.core.presets import HOST_MEMORY
from offloadlab.core.workloads import build_workload, random_dag
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.simulator import makespan_and_host_peak, simulate

# -- the machine's field ---------------------------------------------------------------------


def test_presets_hold_the_host_ram_the_papers_state():
    assert PRESETS["p100x4"].host_memory == 22 * 64 * GiB        # TURNIP: 22 64 GB modules
    assert PRESETS["a100x8"].host_memory == 1152 * GiB           # p4d.24xlarge
    assert PRESETS["titan-rtx"].host_memory == 128 * GiB         # CoTrain's slides
    for name in ("disco-example", "v100", "h100-pcie", "h100-sxm", "h200", "rtx4090"):
        assert PRESETS[name].host_memory is None, name           # not stated: unlimited
    assert set(HOST_MEMORY) == {"p100x4", "a100x8", "titan-rtx"}
    for name, (host_memory, source) in HOST_MEMORY.items():
        assert PRESETS[name].host_memory == host_memory and source


@pytest.mark.parametrize("spec, expected", [
    ("a100x8:host_memory=512GB", 512 * 10**9),
    ("a100x8:host_memory=1.5TiB", 3 * 2**39),
    ("v100:host_memory=4096", 4096),
    ("a100x8:host_memory=unlimited", None),
    ("a100x8:host_memory=None", None),
    ("p100x4:host_memory=inf", None),
])
def test_host_memory_overrides(spec, expected):
    assert machine_from_spec(spec).host_memory == expected


@pytest.mark.parametrize("value, message", [
    ("-1", "host_memory must be a positive integer, got -1"),
    ("0", "host_memory must be a positive integer, got 0"),
    ("nan", "option host_memory: cannot read 'nan' as a byte size (e.g. 512GB) or unlimited"),
    ("-1GB", "option host_memory: cannot read '-1GB' as a byte size"),
    ("1.5", "option host_memory: cannot read '1.5' as a byte size"),
    ("lots", "option host_memory: cannot read 'lots' as a byte size"),
    ("", "option host_memory: cannot read '' as a byte size"),
])
def test_bad_host_memory_overrides_name_the_field(value, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        machine_from_spec(f"a100x8:host_memory={value}")


@pytest.mark.parametrize("value, message", [
    (-5, "host_memory must be a positive integer, got -5"),
    (0, "host_memory must be a positive integer, got 0"),
    (float("nan"), "host_memory must be a positive integer, got nan"),
    (float("inf"), "host_memory must be a positive integer, got inf"),
    (1.5, "host_memory must be a positive integer, got 1.5"),
    (True, "host_memory must be a positive integer, got True"),
    ("512GB", "host_memory must be a positive integer, got '512GB'"),
])
def test_bad_host_memory_in_a_machine_file_names_file_and_field(tmp_path, value, message):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**PRESETS["v100"].to_dict(), "host_memory": value}))
    with pytest.raises(SpecError, match=r"machine file '.*m\.json': " + re.escape(message)):
        Machine.from_json_file(path)


def test_host_memory_round_trips_and_unlimited_is_left_out(tmp_path):
    m = PRESETS["a100x8"]
    data = json.loads(m.to_json())
    assert data["host_memory"] == 1152 * GiB and Machine.from_dict(data) == m
    assert Machine.from_dict(data | {"host_memory": 1152.0 * GiB}) == m     # an integral float
    unlimited = replace(m, host_memory=None)
    assert "host_memory" not in unlimited.to_dict()
    assert Machine.from_dict(unlimited.to_dict()) == unlimited
    assert Machine.from_dict(data | {"host_memory": None}) == unlimited     # null: unlimited
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"gpus": 1, "gpu_memory": 2**30, "host_memory": 2**33}))
    assert machine_from_spec(f"{path}:host_memory=1GiB").host_memory == 2**30


def test_a_bad_host_memory_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "mg.json"
    code = main(["plan", "--workload", "matmul-chain:layers=2", "--machine",
                 "disco-example:host_memory=nan", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "host_memory" in err and "'nan'" in err
    assert not out.exists()


# -- a plan's host peak, and a run's ---------------------------------------------------------


def serial_recount(mg) -> int:
    """The host peak with the vertices run one at a time in planner order, counted step by
    step: at each step, the host inputs and every host tensor written at or before it whose
    last data reader is at or after it."""
    order = sorted(mg, key=lambda v: v.order)
    position = {v.id: k for k, v in enumerate(order)}
    static = sum(v.bytes for v in order if v.kind == "input" and v.out_device == "host")
    spans = []
    for v in order:
        if v.out_device == "host" and v.kind != "input":
            readers = [position[w] for w, kind in mg.succ[v.id].items() if kind == "data"]
            spans.append((position[v.id], max([position[v.id], *readers]), v.bytes))
    return static + max((sum(b for first, last, b in spans if first <= k <= last)
                         for k in range(len(order))), default=0)


def trace_recount(mg, trace) -> int:
    """The host peak of a run, counted from its trace at every instant something starts:
    host inputs from 0 to the end, each other host tensor from its writer's start until the
    end of its last data reader (its own end if it has none)."""
    times = {r.vertex: (r.start, r.end) for r in trace.itertuples()}
    end = max((e for _, e in times.values()), default=0.0)
    held = []
    for v in mg:
        if v.out_device != "host":
            continue
        if v.kind == "input":
            held.append((0.0, end, v.bytes))
        else:
            start, stop = times[v.id]
            readers = [times[w][1] for w, kind in mg.succ[v.id].items() if kind == "data"]
            held.append((start, max([stop, *readers]), v.bytes))
    instants = {0.0, *(start for start, _ in times.values())}
    return max(sum(b for since, until, b in held if since <= t < until) for t in instants)


@settings(max_examples=300, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.0, 0.05, 0.5]),
       planner=st.sampled_from([*PLANNERS, "cotrain"]),
       policy=st.sampled_from(["dynamic", "fixed", "random"]),
       noise=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 3))
def test_host_peaks_equal_an_independent_recount_on_random_plans(graph, slack, planner, policy,
                                                                 noise, seed):
    m = machine_for(graph, 4, slack)
    try:
        mg = plan(graph, m, planner)
    except PlanError:                     # cotrain plans only the graphs it applies to
        assert planner == "cotrain"
        return
    assert planned_host_peak(mg) == serial_recount(mg)
    result = simulate(mg, m, policy, noise=noise, seed=seed)
    assert result.host_peak == trace_recount(mg, result.trace)
    assert makespan_and_host_peak(mg, m, policy, noise, seed) == \
        (result.makespan, result.host_peak)


@settings(max_examples=150, **SETTINGS)
@given(seed=st.integers(0, 10**6), vertices=st.integers(2, 120),
       slack=st.sampled_from([0.0, 0.02, 0.3]), planner=st.sampled_from(PLANNERS))
def test_a_plan_over_host_memory_is_refused_and_one_within_it_is_the_same_plan(
        seed, vertices, slack, planner):
    graph = random_dag(vertices=vertices, gpus=2, seed=seed, min_bytes=1024,
                       max_bytes=64 * 1024, host_fraction=0.9)
    m = machine_for(graph, 2, slack)
    mg = plan(graph, m, planner)
    peak = planned_host_peak(mg)
    within = plan(graph, replace(m, host_memory=max(peak, 1)), planner)
    assert [(v.id, v.loc, v.order) for v in within] == [(v.id, v.loc, v.order) for v in mg]
    assert list(within.edges()) == list(mg.edges())
    if peak > 1:                          # 0: a graph with nothing on the host
        with pytest.raises(HostMemoryError, match=f"a host peak of {peak} bytes .* exceeds "
                                                  f"the machine's host_memory of {peak - 1} "):
            plan(graph, replace(m, host_memory=peak - 1), planner)


def test_an_unlimited_host_writes_the_plan_as_before():
    """No host_memory in the recorded machine, and the same vertices and edges as on a
    machine with room to spare: what bench/plan_hashes.py checks on its 640 cases."""
    graph = build_workload("llama-lora-train:model=tiny,seq=64,batch=2,gpus=1,block=32")
    from offloadlab.planner.buildmemgraph import min_capacity
    unlimited = machine_from_spec(f"p100x4:gpus=1,gpu_memory={min_capacity(graph)},"
                                  f"host_memory=unlimited")
    mg = plan(graph, unlimited)
    assert mg.count("offload") > 0 and "host_memory" not in mg.graph["machine"]
    limited = json.loads(formats.to_json(plan(graph, replace(unlimited, host_memory=2**40))))
    assert limited["graph"].pop("machine").pop("host_memory") == 2**40
    same = json.loads(formats.to_json(mg))
    same["graph"].pop("machine")
    assert limited == same


TINY_LORA = "llama-lora-train:model=tiny,seq=64,batch=2,gpus=1,block=32"


def _tight_plan():
    """BuildMemGraph's plan of a LoRA step in the least GPU memory it can plan in: offloads
    and reloads, and its run holds more in host RAM at once than its own order does."""
    from offloadlab.planner.buildmemgraph import min_capacity
    graph = build_workload(TINY_LORA)
    m = machine_from_spec(f"p100x4:gpus=1,gpu_memory={min_capacity(graph)}")
    return graph, m, plan(graph, m)


def test_host_memory_holds_offloads_until_their_last_reload():
    """The host holds the weights throughout and each offloaded copy only until its last
    reload ends, so the run's host peak is below the weights plus every offload."""
    graph, m, mg = _tight_plan()
    result = simulate(mg, m)
    weights = sum(v.bytes for v in mg if v.kind == "input" and v.out_device == "host")
    offloaded = sum(v.bytes for v in mg if v.kind == "offload")
    assert offloaded > 0 and weights < result.host_peak < weights + offloaded
    host = result.memory[result.memory["device"] == "host"]
    assert host["bytes"].max() == result.host_peak and host["bytes"].iloc[-1] == 0
    assert host["time"].iloc[-1] == result.makespan


# -- refused or flagged ----------------------------------------------------------------------


def test_the_simulator_flags_a_run_over_host_memory():
    graph, m, mg = _tight_plan()
    peak = simulate(mg, m).host_peak
    assert simulate(mg, replace(m, host_memory=peak)).out_of_memory is None
    over = simulate(mg, replace(m, host_memory=peak - 1))
    assert over.host_peak == peak and over.makespan > 0
    assert over.out_of_memory == (
        f"out of host memory: a host peak of {peak} bytes ({peak / GiB:.4g} GiB) exceeds the "
        f"machine's host_memory of {peak - 1} bytes ({(peak - 1) / GiB:.4g} GiB)")


def test_simulate_reports_the_host_peak_and_exits_1_out_of_memory(tmp_path, capsys):
    graph, m, mg = _tight_plan()
    path = tmp_path / "mg.json"
    formats.to_json(mg, path)
    peak = simulate(mg, m).host_peak
    assert main(["simulate", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["host_peak"] == peak and summary["host_memory"] == m.host_memory
    assert summary["outcome"] == "ok" and summary["peak_memory"]["host"] == peak
    spec = f"p100x4:gpus=1,gpu_memory={m.gpu_memory},host_memory={peak - 1}"
    assert main(["simulate", str(path), "--machine", spec]) == 1
    captured = capsys.readouterr()
    assert "host peak:" in captured.out and "OUT OF MEMORY" in captured.out
    over = simulate(mg, replace(m, host_memory=peak - 1)).out_of_memory
    assert captured.err == f"offloadlab: {over}\n"


def test_compare_rows_carry_the_host_peak_and_the_outcome(capsys):
    import pandas as pd

    from offloadlab.lab.compare import compare_planners
    graph, m, mg = _tight_plan()
    planned, simulated = planned_host_peak(mg), simulate(mg, m).host_peak
    assert planned < simulated            # the run overlaps what the plan's order does not
    rows = {}
    for host_memory in (None, simulated, planned, planned - 1):
        table = compare_planners(graph, replace(m, host_memory=host_memory), ["buildmemgraph"])
        assert "peak_host_memory" not in table
        rows[host_memory] = table.iloc[0]
    assert "host_peak" not in table            # no planner planned: no figures at all
    assert rows[None]["outcome"] == rows[simulated]["outcome"] == "ok"
    assert rows[None]["host_peak"] == rows[simulated]["host_peak"] == simulated
    # the plan fits in its own order, its run does not: flagged, the figures kept
    assert rows[planned]["outcome"] == "OOM" and rows[planned]["host_peak"] == simulated
    assert rows[planned]["makespan"] > 0 and pd.isna(rows[planned]["error"])
    # below the plan's own host peak: the planner refuses it
    refused = rows[planned - 1]
    assert refused["outcome"] == "OOM" and pd.isna(refused.get("host_peak"))
    assert f"a host peak of {planned} bytes" in refused["error"]
    spec = f"p100x4:gpus=1,gpu_memory={m.gpu_memory},host_memory={planned}"
    assert main(["compare", "--workload", TINY_LORA, "--machine", spec, "--planner",
                 "buildmemgraph"]) == 0
    assert "OOM: a host peak above the machine's host_memory" in capsys.readouterr().out


def test_the_turnip_grid_marks_a_run_over_host_memory_oom():
    from offloadlab.lab.turnip_grid import Point, evaluate
    from offloadlab.lab.turnip_lora import LORA
    rows = evaluate(LORA, Point("tiny", 64, "p100x4", 2))
    assert all(r["status"] == "ok" and r["host_peak"] > 0 for r in rows)
    assert all(math.isnan(r["ratio"]) and r["paper_outcome"] is None for r in rows)
    peak = rows[0]["host_peak"]
    small = evaluate(LORA, Point("tiny", 64, f"p100x4:host_memory={peak - 1}", 2))[0]
    assert small["status"].startswith("OOM: ") and "out of host memory" in small["status"]
    assert math.isnan(small["step"])


def test_a_sweep_over_host_memory(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert main(["sweep", "--workload", "matmul-chain:layers=6", "--machine", "disco-example",
                 "--grid", "machine.host_memory=unlimited,1KiB", "--planner", "levelwise",
                 "--store", str(tmp_path / "s.sqlite"), "--workers", "0", "--out", str(out)]
                ) == 0
    capsys.readouterr()
    import pandas as pd
    table = pd.read_csv(out)
    assert list(table["outcome"]) == ["ok", "OOM"]
    assert table["machine.host_memory"].isna()[0] and table["machine.host_memory"][1] == 1024
    assert table["host_peak"][0] > 1024 and "out of host memory" in table["error"][1]
