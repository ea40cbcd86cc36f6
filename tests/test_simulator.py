"""The SimPy simulator against timings worked out by hand (docs/design.md, Execution semantics).

Machines use round numbers: 1 flop/s GPUs with memory bandwidth so high that kernels take
exactly ``flops`` seconds, 1 B/s links and no latencies, so a vertex of ``b`` bytes moves in
``b`` seconds.
"""

import math

import numpy as np
import pandas as pd
import pytest

from offloadlab.core.errors import GraphError, SpecError
from offloadlab.core.machine import Machine
from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.core.trace import TRACE_COLUMNS, to_chrome_trace
from offloadlab.simulator import DeadlockError, PolicyError, SimResult, simulate


def machine(**kw) -> Machine:
    base = dict(gpus=2, gpu_memory=1000, gpu_flops=1.0, gpu_mem_bandwidth=1e18,
                kernel_latency=0.0, streams=1, h2d_bandwidth=1.0, d2h_bandwidth=1.0,
                link_latency=0.0, gpu_gpu_bandwidth=1.0, gpu_gpu_latency=0.0, cpu_flops=1.0)
    return Machine(**{**base, **kw})


def add(mg: MemGraph, id: str, kind: str, device: str, nbytes: int = 1, inputs=(),
        flops: float = 0.0, loc: tuple | None = None, after=()) -> None:
    """Add a vertex with data edges from ``inputs`` and memory edges from ``after``."""
    mg.add_vertex(MemVertex(id, kind, device, nbytes, Loc(*loc) if loc else None,
                            flops=flops, inputs=tuple(inputs)))
    for u in inputs:
        mg.add_edge(u, id, "data")
    for u in after:
        mg.add_edge(u, id, "memory")


def times(result: SimResult) -> dict[str, tuple[float, float]]:
    return {r.vertex: (r.start, r.end) for r in result.trace.itertuples()}


def test_chain_timing_is_exact():
    # load (1 s) -> n kernels (1 s each) -> offload (1 s), strictly serial.
    n = 10
    mg = MemGraph()
    add(mg, "x", "input", "host")
    add(mg, "L", "load", "gpu0", inputs=["x"], loc=("gpu0", 0, 1))
    prev = "L"
    for i in range(n):
        add(mg, f"c{i}", "compute", "gpu0", inputs=[prev], flops=1.0, loc=("gpu0", 1 + i, 1))
        prev = f"c{i}"
    add(mg, "O", "offload", "gpu0", inputs=[prev])
    result = simulate(mg, machine())
    t = times(result)
    assert t["L"] == (0.0, 1.0)
    assert [t[f"c{i}"] for i in range(n)] == [(1.0 + i, 2.0 + i) for i in range(n)]
    assert t["O"] == (n + 1.0, n + 2.0)
    assert result.makespan == n + 2.0
    assert result.busy == {"h2d:gpu0": 1.0, "gpu0": float(n), "d2h:gpu0": 1.0}
    assert list(result.trace.columns) == TRACE_COLUMNS
    assert "x" not in set(result.trace.vertex)  # inputs are not executed
    assert set(result.trace.source) == {"sim"} and set(result.trace.run) == {0}
    assert dict(zip(result.trace.vertex, result.trace.resource))["O"] == "d2h:gpu0"


def test_alternating_chain_is_exact():
    # kernel, then n times (offload, reload, kernel): 3n + 1 one-second steps in a row.
    n = 6
    mg = MemGraph()
    add(mg, "k0", "compute", "gpu0", flops=1.0, loc=("gpu0", 0, 1))
    for i in range(n):
        add(mg, f"o{i}", "offload", "gpu0", inputs=[f"k{i}"])
        add(mg, f"r{i}", "reload", "gpu0", inputs=[f"o{i}"], loc=("gpu0", 1, 1))
        add(mg, f"k{i + 1}", "compute", "gpu0", inputs=[f"r{i}"], flops=1.0, loc=("gpu0", 2, 1),
            after=[f"k{i}"])
    result = simulate(mg, machine(gpu_memory=3), policy="fixed")
    assert result.makespan == 3 * n + 1.0
    result = simulate(mg, machine(gpu_memory=3), noise=0.0)
    assert result.makespan == 3 * n + 1.0
    assert (result.trace.end - result.trace.start == 1.0).all()


def test_kernels_on_two_gpus_overlap():
    mg = MemGraph()
    add(mg, "a", "compute", "gpu0", flops=2.0, loc=("gpu0", 0, 1))
    add(mg, "b", "compute", "gpu1", flops=3.0, loc=("gpu1", 0, 1))
    result = simulate(mg, machine())
    assert times(result) == {"a": (0.0, 2.0), "b": (0.0, 3.0)}
    assert result.makespan == 3.0
    assert result.busy == {"gpu0": 2.0, "gpu1": 3.0}
    assert result.peak_memory == {"gpu0": 1, "gpu1": 1, "host": 0}


def _two_loads() -> MemGraph:
    mg = MemGraph()
    add(mg, "x", "input", "host", 2)
    add(mg, "L0", "load", "gpu0", 2, ["x"], loc=("gpu0", 0, 2))
    add(mg, "L1", "load", "gpu1", 2, ["x"], loc=("gpu1", 0, 2))
    return mg


def test_loads_overlap_without_a_host_bus():
    result = simulate(_two_loads(), machine(h2d_bandwidth=2.0))
    assert times(result) == {"L0": (0.0, 1.0), "L1": (0.0, 1.0)}


def test_loads_serialize_on_a_shared_host_bus():
    result = simulate(_two_loads(), machine(h2d_bandwidth=2.0, host_bus_bandwidth=2.0))
    assert times(result) == {"L0": (0.0, 1.0), "L1": (1.0, 2.0)}  # planner order breaks the tie
    assert result.busy["bus:h2d"] == 2.0
    assert result.busy["h2d:gpu1"] == 1.0  # a link waiting for the bus is not busy
    # A bus slower than the links sets the rate: 2 B at 1 B/s.
    result = simulate(_two_loads(), machine(h2d_bandwidth=2.0, host_bus_bandwidth=1.0))
    assert times(result) == {"L0": (0.0, 2.0), "L1": (2.0, 4.0)}
    result = simulate(_two_loads(), machine(h2d_bandwidth=2.0, host_bus_bandwidth=2.0),
                      policy="fixed")
    assert times(result) == {"L0": (0.0, 1.0), "L1": (1.0, 2.0)}


def _loads(*gpus: int) -> MemGraph:
    """A 2-byte load onto each of ``gpus``, all ready at time 0."""
    mg = MemGraph()
    add(mg, "x", "input", "host", 2)
    for g in gpus:
        add(mg, f"L{g}", "load", f"gpu{g}", 2, ["x"], loc=(f"gpu{g}", 0, 2))
    return mg


def test_gpus_behind_one_pcie_switch_share_its_bus():
    """Two GPUs per bus (a PCIe switch's uplink): loads onto the same pair take turns, twice
    as long as loads onto GPUs of two pairs, which overlap."""
    m = machine(gpus=4, h2d_bandwidth=2.0, host_bus_bandwidth=2.0, gpus_per_bus=2)
    same, apart = simulate(_loads(0, 1), m), simulate(_loads(1, 2), m)
    assert times(same) == {"L0": (0.0, 1.0), "L1": (1.0, 2.0)}
    assert times(apart) == {"L1": (0.0, 1.0), "L2": (0.0, 1.0)}
    assert same.makespan == 2 * apart.makespan
    assert same.busy["bus0:h2d"] == 2.0 and "bus1:h2d" not in same.busy
    assert apart.busy["bus0:h2d"] == apart.busy["bus1:h2d"] == 1.0
    # one bus for all GPUs (0, or a group as large as the machine): the pairs take turns too
    for per_bus in (0, 4):
        one = simulate(_loads(1, 2), machine(gpus=4, h2d_bandwidth=2.0, host_bus_bandwidth=2.0,
                                             gpus_per_bus=per_bus))
        assert times(one) == {"L1": (0.0, 1.0), "L2": (1.0, 2.0)}
        assert one.busy["bus:h2d"] == 2.0


def test_offloads_take_their_own_direction_of_the_bus():
    m = machine(gpus=4, d2h_bandwidth=2.0, host_bus_bandwidth=2.0, gpus_per_bus=2)
    mg = _loads(0)
    for g in (0, 1):
        add(mg, f"y{g}", "input", f"gpu{g}", 2, loc=(f"gpu{g}", 2, 2))
        add(mg, f"O{g}", "offload", f"gpu{g}", 2, [f"y{g}"])
    result = simulate(mg, m)
    assert times(result) == {"L0": (0.0, 2.0), "O0": (0.0, 1.0), "O1": (1.0, 2.0)}
    assert result.busy == {"h2d:gpu0": 2.0, "bus0:h2d": 2.0, "d2h:gpu0": 1.0, "d2h:gpu1": 1.0,
                           "bus0:d2h": 2.0}


def _load_beside_offload() -> MemGraph:
    # L: a 1 s load from t=0; O: a 1 s offload of a 0.5 s kernel's output, from t=0.5.
    mg = MemGraph()
    add(mg, "x", "input", "host")
    add(mg, "y", "input", "gpu0", loc=("gpu0", 0, 1))
    add(mg, "L", "load", "gpu0", inputs=["x"], loc=("gpu0", 1, 1))
    add(mg, "C", "compute", "gpu0", inputs=["y"], flops=0.5, loc=("gpu0", 2, 1))
    add(mg, "O", "offload", "gpu0", inputs=["C"])
    return mg


def test_duplex_slows_concurrent_directions():
    t = times(simulate(_load_beside_offload(), machine(duplex=1.0)))
    assert t["L"] == (0.0, 1.0) and t["O"] == (0.5, 1.5)
    # duplex 0.5: L does 0.5 s of work alone by t=0.5, the other 0.5 s at half speed -> 1.5.
    # O does 0.5 s of work at half speed over [0.5, 1.5], the rest alone -> 2.0.
    result = simulate(_load_beside_offload(), machine(duplex=0.5))
    t = times(result)
    assert t["L"] == (0.0, 1.5) and t["O"] == (0.5, 2.0)
    assert result.busy["h2d:gpu0"] == 1.5 and result.busy["d2h:gpu0"] == 1.5
    # duplex 0.25: L has 0.5 s left at t=0.5 -> at 0.25 speed it ends at 2.5; O did 0.5 s of
    # work by then and ends at 3.0.
    t = times(simulate(_load_beside_offload(), machine(duplex=0.25)))
    assert t["L"] == (0.0, 2.5) and t["O"] == (0.5, 3.0)


def test_duplex_ignores_other_gpus_links():
    mg = MemGraph()
    add(mg, "x", "input", "host")
    add(mg, "y", "input", "gpu1", loc=("gpu1", 0, 1))
    add(mg, "L", "load", "gpu0", inputs=["x"], loc=("gpu0", 0, 1))
    add(mg, "O", "offload", "gpu1", inputs=["y"])
    assert times(simulate(mg, machine(duplex=0.5))) == {"L": (0.0, 1.0), "O": (0.0, 1.0)}


def _kernels(*flops: float) -> MemGraph:
    mg = MemGraph()
    for i, f in enumerate(flops):
        add(mg, f"k{i}", "compute", "gpu0", flops=f, loc=("gpu0", i, 1))
    return mg


def test_processor_sharing_of_streams():
    result = simulate(_kernels(1.0, 1.0), machine(), streams=2)
    assert times(result) == {"k0": (0.0, 2.0), "k1": (0.0, 2.0)}
    assert sorted(result.trace.stream) == [0, 1]
    assert result.busy["gpu0"] == 2.0  # the union of busy time, not the sum
    # Unequal kernels: k0 finishes its 1 s at half speed at t=2; k1 has 1 s left, alone.
    assert times(simulate(_kernels(1.0, 2.0), machine(), streams=2)) == \
        {"k0": (0.0, 2.0), "k1": (0.0, 3.0)}
    # Two streams, three kernels: the third starts when the first two free their streams.
    assert times(simulate(_kernels(1.0, 1.0, 1.0), machine(), streams=2))["k2"] == (2.0, 3.0)
    # One stream: serial, exactly the cost model's durations.
    assert times(simulate(_kernels(1.0, 1.0), machine(streams=5), streams=1)) == \
        {"k0": (0.0, 1.0), "k1": (1.0, 2.0)}
    assert times(simulate(_kernels(1.0, 1.0), machine(streams=2)))["k1"] == (0.0, 2.0)


def test_a_fifo_engine_runs_its_streams_kernels_one_at_a_time_in_launch_order():
    fifo = machine(engine="fifo")
    # Both launched at 0 on two streams: k0 runs alone, then k1 (sharing: both end at 2, 3).
    result = simulate(_kernels(1.0, 2.0), fifo, streams=2)
    assert times(result) == {"k0": (0.0, 1.0), "k1": (1.0, 3.0)}
    assert sorted(result.trace.stream) == [0, 1] and result.busy["gpu0"] == 3.0
    # Launch order is dispatch order: dynamic takes ready vertices in planner order, so the
    # long k0 runs first even though k1 and k2 are short; k2 takes k0's freed stream at 4.
    result = simulate(_kernels(4.0, 1.0, 1.0), fifo, streams=2)
    assert times(result) == {"k0": (0.0, 4.0), "k1": (4.0, 5.0), "k2": (5.0, 6.0)}
    assert result.trace.set_index("vertex").stream.to_dict() == {"k0": 0, "k1": 1, "k2": 0}
    # A successor readied at 1 joins behind what was launched before it.
    mg = _kernels(1.0, 3.0)
    add(mg, "after", "compute", "gpu0", inputs=["k0"], flops=1.0, loc=("gpu0", 5, 1))
    assert times(simulate(mg, fifo, streams=3))["after"] == (4.0, 5.0)
    # One slot engines (CPU, links) are unchanged, and fifo on one stream is plain serial.
    assert times(simulate(_kernels(1.0, 1.0), fifo, streams=1)) == \
        times(simulate(_kernels(1.0, 1.0), machine(), streams=1))


def test_the_engine_field_is_checked_and_read_from_specs_and_files(tmp_path):
    from offloadlab.core.machine import machine_from_spec
    assert machine_from_spec("v100").engine == "sharing"
    m = machine_from_spec("v100:engine=fifo")
    assert m.engine == "fifo" and Machine.from_dict(m.to_dict()).engine == "fifo"
    path = tmp_path / "m.json"
    path.write_text(m.to_json())
    assert machine_from_spec(str(path)).engine == "fifo"
    assert machine_from_spec(f"{path}:engine=sharing").engine == "sharing"
    for bad in ("v100:engine=lifo", "v100:engine=FIFO"):
        with pytest.raises(SpecError, match="engine must be one of sharing, fifo, got 'lifo'"
                           if "lifo" in bad else "engine must be one of"):
            machine_from_spec(bad)
    with pytest.raises(SpecError, match=r"machine file .*: engine must be a string, got 3"):
        path.write_text(m.to_json().replace('"engine": "fifo"', '"engine": 3'))
        machine_from_spec(str(path))


def _order_matters() -> MemGraph:
    # Planner order: x, L (3 s load), A (reads L), B (independent); both kernels 1 s on gpu0.
    mg = MemGraph()
    add(mg, "x", "input", "host", 3)
    add(mg, "L", "load", "gpu0", 3, ["x"], loc=("gpu0", 0, 3))
    add(mg, "A", "compute", "gpu0", inputs=["L"], flops=1.0, loc=("gpu0", 3, 1))
    add(mg, "B", "compute", "gpu0", flops=1.0, loc=("gpu0", 4, 1))
    return mg


def test_fixed_and_dynamic_dispatch_differ():
    dynamic = simulate(_order_matters(), machine(), policy="dynamic")
    assert times(dynamic) == {"L": (0.0, 3.0), "A": (3.0, 4.0), "B": (0.0, 1.0)}
    assert dynamic.makespan == 4.0
    fixed = simulate(_order_matters(), machine(), policy="fixed")
    assert times(fixed) == {"L": (0.0, 3.0), "A": (3.0, 4.0), "B": (4.0, 5.0)}
    assert fixed.makespan == 5.0
    # With two streams B may run beside A, but still not start before it: both share [3, 5].
    fixed2 = simulate(_order_matters(), machine(), policy="fixed", streams=2)
    assert times(fixed2)["A"] == (3.0, 5.0) and times(fixed2)["B"] == (3.0, 5.0)


def test_dynamic_prefers_earliest_ready_then_planner_order():
    # k0..k2 ready at 0 on one stream run in planner order; r (ready at 1, order 0) comes after
    # k1 and k2 that were ready earlier.
    mg = MemGraph()
    add(mg, "p", "compute", "gpu1", flops=1.0, loc=("gpu1", 0, 1))
    add(mg, "r", "compute", "gpu0", inputs=["p"], flops=1.0, loc=("gpu0", 0, 1))
    for i in range(3):
        add(mg, f"k{i}", "compute", "gpu0", flops=1.0, loc=("gpu0", 1 + i, 1))
    t = times(simulate(mg, machine()))
    assert [t[v][0] for v in ("k0", "k1", "k2", "r")] == [0.0, 1.0, 2.0, 3.0]


def test_the_dispatch_pass_follows_every_completion_of_its_instant():
    # p1 and p2 finish at 1 on gpu1 and gpu2, p1's completion first; the readers they make
    # ready on gpu0 then run in planner order (w2 first), not in the order of those events.
    mg = MemGraph()
    add(mg, "p1", "compute", "gpu1", flops=1.0, loc=("gpu1", 0, 1))
    add(mg, "p2", "compute", "gpu2", flops=1.0, loc=("gpu2", 0, 1))
    add(mg, "w2", "compute", "gpu0", inputs=["p2"], flops=1.0, loc=("gpu0", 0, 1))
    add(mg, "w1", "compute", "gpu0", inputs=["p1"], flops=1.0, loc=("gpu0", 1, 1))
    for i, v in enumerate(mg):
        v.order = i
    t = times(simulate(mg, machine(gpus=3)))
    assert t["w2"] == (1.0, 2.0) and t["w1"] == (2.0, 3.0)


def test_memory_edges_order_reuse_of_a_location():
    # A's location is reused by B once A's reader R has finished (memory edge R -> B).
    mg = MemGraph()
    add(mg, "A", "compute", "gpu0", 4, flops=1.0, loc=("gpu0", 0, 4))
    add(mg, "R", "compute", "gpu0", 4, ["A"], flops=1.0, loc=("gpu0", 4, 4))
    add(mg, "B", "compute", "gpu0", 4, flops=1.0, loc=("gpu0", 0, 4), after=["R"])
    result = simulate(mg, machine(gpu_memory=8), streams=2)
    assert times(result) == {"A": (0.0, 1.0), "R": (1.0, 2.0), "B": (2.0, 3.0)}
    assert result.peak_memory == {"gpu0": 8, "gpu1": 0, "host": 0}
    assert result.memory.values.tolist() == [[0.0, "gpu0", 4], [1.0, "gpu0", 8], [3.0, "gpu0", 0]]


def test_memory_beyond_capacity_is_an_error():
    # Without the memory edge B overwrites A's location while R still needs A.
    mg = MemGraph()
    add(mg, "A", "compute", "gpu0", 4, flops=1.0, loc=("gpu0", 0, 4))
    add(mg, "R", "compute", "gpu0", 4, ["A"], flops=1.0, loc=("gpu0", 4, 4))
    add(mg, "B", "compute", "gpu0", 4, flops=1.0, loc=("gpu0", 0, 4))
    with pytest.raises(RuntimeError, match="gpu0.*12"):
        simulate(mg, machine(gpu_memory=8), streams=2)


def test_cpu_and_gpu_to_gpu_transfers():
    mg = MemGraph()
    add(mg, "a", "compute", "gpu0", 2, flops=1.0, loc=("gpu0", 0, 2))
    add(mg, "t", "transfer", "gpu0->gpu1", 2, ["a"], loc=("gpu1", 0, 2))
    add(mg, "c", "compute", "cpu", 1, flops=3.0)
    result = simulate(mg, machine())
    assert times(result) == {"a": (0.0, 1.0), "t": (1.0, 3.0), "c": (0.0, 3.0)}
    assert dict(zip(result.trace.vertex, result.trace.resource)) == \
        {"a": "gpu0", "t": "gpu0->gpu1", "c": "cpu"}


def test_noise_is_seeded_and_lognormal():
    mg = _order_matters()
    base = simulate(mg, machine(), noise=0.0).trace
    a = simulate(mg, machine(), noise=0.3, seed=7).trace
    b = simulate(mg, machine(), noise=0.3, seed=7).trace
    c = simulate(mg, machine(), noise=0.3, seed=8).trace
    pd.testing.assert_frame_equal(a, b)
    assert not a[["start", "end"]].equals(c[["start", "end"]])
    assert not a[["start", "end"]].equals(base[["start", "end"]])
    z = np.random.default_rng(7).standard_normal(4)  # one draw per vertex in planner order
    factor = np.exp(0.3 * z - 0.3 ** 2 / 2)
    t = times(simulate(mg, machine(), noise=0.3, seed=7))
    assert t["L"] == (0.0, 3.0 * factor[1])
    assert t["B"] == (0.0, 1.0 * factor[3])
    a_start = max(t["L"][1], t["B"][1])  # one stream: A waits for L and for a free gpu0
    assert t["A"] == (a_start, a_start + factor[2])


def test_unknown_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match="dynamic.*fixed"):
        simulate(_kernels(1.0), machine(), policy="greedy")
    with pytest.raises(PolicyError):
        simulate(_kernels(1.0), machine(), policy="")


def test_cycle_is_reported_with_stuck_vertices():
    mg = MemGraph()
    add(mg, "ok", "compute", "gpu0", flops=1.0, loc=("gpu0", 0, 1))
    add(mg, "a", "compute", "gpu0", flops=1.0, loc=("gpu0", 1, 1))
    add(mg, "b", "compute", "gpu0", inputs=["a"], flops=1.0, loc=("gpu0", 2, 1))
    mg.add_edge("b", "a", "memory")
    with pytest.raises(DeadlockError, match=r"2 of 3 .*'a'.*'b'") as err:
        simulate(mg, machine())
    assert isinstance(err.value, GraphError)


def test_fixed_order_against_the_edges_deadlocks_only_under_fixed():
    mg = MemGraph()
    add(mg, "first", "compute", "gpu0", flops=1.0, loc=("gpu0", 0, 1))
    add(mg, "second", "compute", "gpu0", flops=1.0, loc=("gpu0", 1, 1))
    mg.add_edge("second", "first", "data")  # planner order 0 waits for order 1
    assert simulate(mg, machine()).makespan == 2.0
    with pytest.raises(DeadlockError, match="'first'.*waiting.*'second'.*queued on gpu0"):
        simulate(mg, machine(), policy="fixed")


def test_graph_using_a_missing_gpu_is_rejected():
    mg = MemGraph()
    add(mg, "a", "compute", "gpu3", flops=1.0, loc=("gpu3", 0, 1))
    with pytest.raises(SpecError, match="gpu3"):
        simulate(mg, machine())


def test_chrome_trace_of_a_run():
    result = simulate(_load_beside_offload(), machine(duplex=0.5), run=3)
    chrome = to_chrome_trace(result.trace)
    spans = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in spans) == ["C", "L", "O"]
    o = next(e for e in spans if e["name"] == "O")
    assert (o["ts"], o["dur"]) == (0.5e6, 1.5e6)
    names = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[o["pid"]] == "d2h:gpu0"
    assert set(result.trace.run) == {3}


def test_empty_and_input_only_graphs():
    mg = MemGraph()
    assert simulate(mg, machine()).makespan == 0.0
    add(mg, "x", "input", "gpu1", 5, loc=("gpu1", 0, 5))
    result = simulate(mg, machine())
    assert result.makespan == 0.0 and len(result.trace) == 0
    # Occupancy is half-open, [start, end): in a run of length 0 nothing is ever in use.
    assert result.peak_memory == {"gpu0": 0, "gpu1": 0, "host": 0}
    assert math.isclose(sum(result.busy.values()), 0.0)


def test_unread_load_overwritten_through_a_path_is_not_resident_to_the_end():
    """A load nobody reads, whose bytes a later kernel overwrites with the ordering going
    through a third vertex (no direct memory edge): the verifier accepts it, and its bytes
    count only until the overwrite starts (they were counted to the end of the run, and the
    peak then exceeded the GPU)."""
    from offloadlab.core.verify import verify

    mg = MemGraph()
    add(mg, "h", "input", "host", 100)
    add(mg, "a", "input", "gpu0", 10, loc=("gpu0", 100, 10))
    add(mg, "L", "load", "gpu0", 100, inputs=["h"], loc=("gpu0", 0, 100))
    add(mg, "X", "compute", "gpu0", 10, inputs=["a"], flops=1, loc=("gpu0", 110, 10), after=["L"])
    add(mg, "C", "compute", "gpu0", 100, inputs=["X"], flops=1, loc=("gpu0", 0, 100))
    for i, v in enumerate(mg):
        v.order = i
    mg["L"].of = "h"
    m = machine(gpus=1, gpu_memory=150)
    verify(mg, machine=m)
    result = simulate(mg, m)
    assert result.peak_memory["gpu0"] == 120        # a, X and C at the end; L gone
    used = result.memory[result.memory["device"] == "gpu0"]
    assert used["bytes"].max() <= 150


def test_the_contract_numbers_vertices_by_planner_order_and_lists_what_each_holds():
    """core/contract.py: the structure the simulator and the executor both run."""
    from offloadlab.core.contract import contract, slots
    mg = _two_loads()
    for i, v in enumerate(reversed(list(mg))):     # planner order against insertion order
        v.order = i
    structure = contract(mg, machine(h2d_bandwidth=2.0, host_bus_bandwidth=2.0))
    ids = [v.id for v in structure.vertices]
    assert ids == sorted(ids, key=lambda t: mg[t].order)
    at = {t: i for i, t in enumerate(ids)}
    assert structure.holds[at["x"]] == ()                       # an input holds nothing
    assert structure.holds[at["L1"]] == ("h2d:gpu1", "bus:h2d")  # the engine, then the bus
    assert structure.sequences["bus:h2d"] == sorted([at["L0"], at["L1"]])
    assert structure.waiting[at["x"]] == 0 and structure.waiting[at["L0"]] == 1
    assert sorted(structure.succ[at["x"]]) == sorted([at["L0"], at["L1"]])
    assert [slots(r, 4) for r in ("gpu0", "h2d:gpu0", "gpu0->gpu1", "bus:h2d", "cpu")] == \
        [4, 1, 1, 1, 1]
    add(mg, "k", "compute", "gpu5", 1, ["x"], flops=1.0, loc=("gpu5", 0, 1))
    with pytest.raises(SpecError, match="gpu5"):
        contract(mg, machine())
