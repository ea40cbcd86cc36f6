"""One engine model for both sides: the simulator's ``engine=fifo`` GPU runs the kernels
launched on its streams in the order the numpy backend's GPU runs them (one core, one lane,
launch order); ``calibrate`` writes ``fifo`` for the numpy backend and prices every op a
built-in workload emits from a measurement."""

from __future__ import annotations

from dataclasses import replace

import pytest

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
