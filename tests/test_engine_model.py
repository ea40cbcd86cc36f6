"""One engine model for both sides: the simulator's ``engine=fifo`` GPU runs the kernels
launched on its streams in the order the numpy backend's GPU runs them (one core, one lane,
launch order); ``calibrate`` writes ``fifo`` for the numpy backend and prices every op a
built-in workload emits from a measurement."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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
    rated = {op for op, *_ in machine.op_rates}
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


def _rows(sizes, seconds_of, repeats=5, outlier=None):
    import pandas as pd
    rows = [dict(bytes=b, seconds=seconds_of(b)) for b in sizes for _ in range(repeats)]
    if outlier is not None:                       # a kernel held up by a loaded machine
        rows[0]["seconds"] *= outlier
    return pd.DataFrame(rows)


TINY = 8e-6


@settings(max_examples=60, **SETTINGS)
@given(rate=st.floats(1e8, 1e11), overhead=st.sampled_from([0.0, 3e-6, 1e-4]),
       outlier=st.sampled_from([None, 30.0]))
def test_an_op_measured_at_its_shapes_gets_its_rate_and_overhead_back(rate, overhead, outlier):
    """Kernels whose time grows with their bytes (a CPU's): the line through the medians gives
    the rate and the overhead, whatever one held-up kernel took."""
    from offloadlab.executor.calibrate import _shape_rate
    sizes = (33_000, 130_000, 526_000)
    rows = _rows(sizes, lambda b: TINY + overhead + b / rate, outlier=outlier)
    got_rate, got_overhead = _shape_rate(rows, TINY, bandwidth=9e9)
    if sizes[-1] / rate >= overhead:             # the bytes take at least half the time
        assert got_rate == pytest.approx(rate, rel=1e-6)
        assert got_overhead == pytest.approx(overhead, abs=1e-9)
    else:                                        # launch-bound: at the bandwidth
        assert got_rate == 9e9
        assert got_overhead == pytest.approx(overhead + 130_000 / rate - 130_000 / 9e9,
                                             rel=1e-6, abs=1e-12)


def test_a_launch_bound_op_moves_its_bytes_at_the_bandwidth_and_pays_an_overhead():
    """A GPU's workload-shape kernels: 20 us of launches and well under a microsecond of bytes.
    Their slope is noise: the bytes of a large kernel of the op are priced at ``add``'s
    bandwidth, not at the 3 GB/s that 300 KB in 20 us would say."""
    from offloadlab.executor.calibrate import _shape_rate
    noise = iter([0.0, 1e-6, -5e-7, 2e-6] * 10)
    rows = _rows((82_000, 104_000, 229_000, 286_000),
                 lambda b: TINY + 2e-5 + b / 7e11 + next(noise))
    rate, overhead = _shape_rate(rows, TINY, bandwidth=7e11)
    assert rate == 7e11
    assert overhead == pytest.approx(2e-5, abs=1.5e-6)
    one = _rows((32_772,), lambda b: TINY + 1e-5)      # one size: nothing to fit a slope to
    assert _shape_rate(one, TINY, bandwidth=7e11) == (7e11, pytest.approx(1e-5 - 32_772 / 7e11))


@pytest.mark.parametrize("gpu", [True, False])
def test_a_matmul_in_disguise_gets_a_byte_rate_only_where_it_runs_near_the_matmul_rate(gpu):
    """``linear_dw`` on an H200: 59 KB in 34 us and 204 KB in 88 us, a line of 3 GB/s, which
    would price a 7B layer's 167 MB at 50 ms where its flops take 6 ms.  At 23 GFLOP/s
    against a measured 48 TFLOP/s that is not its work: its bytes move at the bandwidth.
    On a CPU the same shapes run at a sixth of its BLAS's rate (not compute-bound, which the
    roofline would price), and the line is kept."""
    import pandas as pd

    from offloadlab.executor.calibrate import _op_rates
    shapes = [(59_136, 352_256.0), (203_520, 1_409_024.0)]
    flops_rate, tiny = (48e12, 2.7e-5) if gpu else (30e9, 8e-6)
    seconds = {59_136: 3.4e-5, 203_520: 8.8e-5} if gpu else \
        {b: tiny + f / 5e9 for b, f in shapes}
    kernels = pd.DataFrame([dict(op="linear_dw", size=0, bytes=b, read=0, flops=f,
                                 seconds=seconds[b]) for b, f in shapes for _ in range(5)])
    (op, rate, _, overhead), = _op_rates(kernels, tiny, flops_rate, bandwidth=6e11 if gpu else 8e9)
    if gpu:
        assert rate == 6e11 and overhead == pytest.approx(np.median(
            [seconds[b] - tiny - b / 6e11 for b, _ in shapes]))
    else:
        assert rate == pytest.approx(203_520 / (1_409_024 / 5e9), rel=1e-6) and overhead == 0


def test_an_op_faster_than_a_tiny_kernel_at_its_small_shapes_is_priced_by_its_largest():
    from offloadlab.executor.calibrate import _shape_rate
    rows = _rows((49_408, 99_328), lambda b: {49_408: 7e-6, 99_328: 1.3e-5}[b])
    rate, overhead = _shape_rate(rows, TINY, bandwidth=9e9)
    assert overhead == 0.0 and rate == pytest.approx(99_328 / 5e-6)


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
