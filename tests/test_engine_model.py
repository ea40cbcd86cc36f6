"""One engine model for both sides: the simulator's ``engine=fifo`` GPU runs the kernels
launched on its streams in the order the numpy backend's GPU runs them (one core, one lane,
launch order); ``calibrate`` writes ``fifo`` for the numpy backend and prices every op a
built-in workload emits from a measurement."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS, machine_for, task_graphs

from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.executor import execute
from offloadlab.planner import plan
from offloadlab.simulator import simulate


def _kernel_order(trace, gpu: str = "gpu0") -> list[str]:
    rows = trace[(trace["device"] == gpu) & (trace["kind"] == "compute")]
    return list(rows.sort_values(["start", "end"])["vertex"])


@pytest.mark.parametrize("seed", [3, 4])
def test_a_fifo_gpu_runs_kernels_in_the_order_the_numpy_backend_runs_them(seed):
    # Kernels only (no copies), several streams, dynamic dispatch: what a kernel's readiness
    # waits for is decided by the order kernels complete, which on a fifo engine is the
    # order they were launched in, on both sides, whatever their durations.
    graph = build_workload(f"random:vertices=40,gpus=1,seed={seed},min_bytes=4096,"
                           f"max_bytes=262144,host_fraction=0,transfer_fraction=0")
    machine = machine_from_spec("p100x4:gpus=1,streams=3,engine=fifo")
    mg = plan(graph, machine, "levelwise")
    measured = execute(mg, machine, backend="numpy", policy="dynamic").trace
    simulated = simulate(mg, machine, policy="dynamic").trace
    assert _kernel_order(simulated) == _kernel_order(measured)
    kernels = simulated[simulated["kind"] == "compute"].sort_values("start")
    assert (kernels["start"].to_numpy()[1:] >= kernels["end"].to_numpy()[:-1] - 1e-12).all()
    # The sharing model lets short kernels overtake long ones launched before them.
    shared = simulate(mg, replace(machine, engine="sharing"), policy="dynamic").trace
    assert _kernel_order(shared) != _kernel_order(measured)


def test_the_op_sources_cover_every_built_in_workload():
    from offloadlab.core.spec import parse_spec
    from offloadlab.core.workloads import WORKLOADS
    from offloadlab.core.workloads.models import MODELS
    from offloadlab.executor.calibrate import OP_SOURCES
    named = [parse_spec(spec) for spec in OP_SOURCES]
    assert {name for name, _ in named} == set(WORKLOADS)
    assert {(o["name"], o["mode"]) for name, o in named if name == "model"} == \
        {(m, mode) for m in MODELS for mode in ("infer", "train")}


@pytest.fixture(scope="module")
def calibration():
    from offloadlab.executor.calibrate import calibrate
    return calibrate(machine_from_spec("p100x4:gpus=1"), "numpy", quick=True)


def test_a_calibrated_machine_prices_by_its_measured_rates(calibration):
    """Calibrated from a fitted preset, the machine is the roofline at the rates measured: the
    preset's fitted fractions are not applied to them again (docs/cost-model.md)."""
    from offloadlab.executor.calibrate import _fit
    m = _fit(machine_from_spec("h100-sxm:gpus=1"), calibration.table, "numpy")
    assert m.cost == "roofline" and m.kernel_fit == () and "cost" not in m.to_dict()


def test_calibrate_prices_every_op_a_built_in_workload_emits_from_a_measurement(calibration):
    from offloadlab.executor.calibrate import compute_bound, workload_ops
    machine, table = calibration.machine, calibration.table
    assert machine.engine == "fifo"
    kernels = table[table["what"] == "kernel"]
    tiny = float(table.loc[table["what"] == "tiny kernel", "seconds"].iloc[0])
    rated = {op for op, _, _ in machine.op_rates}
    ops = workload_ops()
    assert {"layer_forward", "layer_backward", "weight_grad", "mix", "linear"} <= set(ops)
    for op in ops:
        rows = kernels[kernels["op"] == op]
        assert len(rows), f"{op} was not measured"
        priced = op in rated or op == "matmul" or (
            not rows["size"].any() and compute_bound(rows, tiny, machine.gpu_flops))
        assert priced, f"{op} is not priced from its measurement"
    # the synthetic ops' one kernel, measured like mix, is priced near mix (not at add's rate)
    mix = machine.duration("compute", "gpu0", 2**22, touched=2**24, op="mix")
    for op in ("layer_forward", "layer_backward", "weight_grad"):
        assert 0.25 < machine.duration("compute", "gpu0", 2**22, touched=2**24, op=op) / mix < 4


@settings(max_examples=150, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.2, 1.0]),
       policy=st.sampled_from(["dynamic", "fixed", "random"]), streams=st.integers(1, 5))
def test_a_fifo_gpu_runs_each_kernel_alone_for_its_cost_and_never_below_the_bound(
        graph, slack, policy, streams):
    from offloadlab.core.bound import durations, lower_bound
    machine = replace(machine_for(graph, int(graph.meta.get("gpus", 4)), slack),
                      engine="fifo", streams=streams)
    mg = plan(graph, machine, "levelwise")
    result = simulate(mg, machine, policy=policy, seed=1)
    order = sorted(mg, key=lambda v: v.order)
    cost = dict(zip((v.id for v in order), durations(mg, machine, order)))
    trace = result.trace
    kernels = trace[(trace["kind"] == "compute") & (trace["device"] != "cpu")]
    for gpu, rows in kernels.groupby("device"):
        rows = rows.sort_values("start")
        assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-12).all(), gpu
    for r in kernels.itertuples():
        assert r.end - r.start == pytest.approx(cost[r.vertex], rel=1e-9, abs=1e-12)
    assert result.makespan >= lower_bound(mg, machine) * (1 - 1e-9)
