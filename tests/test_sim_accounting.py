"""The simulator's memory accounting from its own per-vertex arrays (issue 46) agrees with the
accounting from its trace, and the run structure's data edges with the MemGraph's."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.contract import contract
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memory import host_lifetimes, memory_over_time, peak_memory, run_host_peak
from offloadlab.core.workloads import build_workload
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import makespan_and_host_peak, simulate


def planned(seed: int, factor: float, spec: str = "p100x4:"):
    graph = build_workload(f"random:vertices=80,gpus=2,seed={seed},host_fraction=0.5,"
                           f"input_fraction=0.2")
    machine = machine_from_spec(f"{spec}gpus=2,gpu_memory={int(min_capacity(graph) * factor)}")
    return plan(graph, machine, "buildmemgraph"), machine


@given(seed=st.integers(0, 2**16), factor=st.sampled_from([1.0, 1.2, 3.0]),
       policy=st.sampled_from(["dynamic", "fixed", "random"]), noise=st.sampled_from([0, 0.3]),
       spec=st.sampled_from(["p100x4:", "a100x8:engine=fifo,duplex=0.5,"]))
@settings(max_examples=30, deadline=None)
def test_simulated_memory_is_the_trace_s(seed, factor, policy, noise, spec):
    """The memory over time, the peaks and the host peak that ``simulate`` and
    ``makespan_and_host_peak`` report are those the trace gives (:func:`memory_over_time`,
    :func:`host_lifetimes`), row for row, dtypes included."""
    mg, machine = planned(seed, factor, spec)
    result = simulate(mg, machine, policy=policy, noise=noise, seed=seed)
    pd.testing.assert_frame_equal(result.memory, memory_over_time(result.trace, mg))
    want = peak_memory(result.trace, mg)
    assert {d: result.peak_memory[d] for d in want} == want
    vertices = list(mg)
    index = {v.id: i for i, v in enumerate(vertices)}
    ran = dict(zip(result.trace["vertex"], zip(result.trace["start"], result.trace["end"])))
    start = [0.0 if v.kind == "input" else ran[v.id][0] for v in vertices]
    end = [0.0 if v.kind == "input" else ran[v.id][1] for v in vertices]
    host = run_host_peak(*host_lifetimes(vertices, mg.succ, index, start, end, result.makespan))
    assert result.host_peak == host
    assert makespan_and_host_peak(mg, machine, policy, noise, seed) == (result.makespan, host)


@given(seed=st.integers(0, 2**16))
@settings(max_examples=20, deadline=None)
def test_contract_data_edges_are_the_memgraph_s(seed):
    """``Contract.data`` lists each data edge once, by vertex number, and no memory edge."""
    mg, machine = planned(seed, 1.0)
    structure = contract(mg, machine)
    number = {v.id: i for i, v in enumerate(structure.vertices)}
    want = sorted((number[u], number[w]) for u, w, kind in mg.edges() if kind == "data")
    sources, targets = structure.data
    assert sources.dtype == np.int64 and targets.dtype == np.int64
    assert sorted(zip(sources.tolist(), targets.tolist())) == want
