"""The simulator's set-up as array work (issue 46): the durations priced per kind of copy and
the run structure's successor lists and waits from the flat edge array are those the
per-vertex cost model and the MemGraph's own edge dicts give."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.bound import durations
from offloadlab.core.contract import contract
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import MemGraph
from offloadlab.core.ops import touched_bytes
from offloadlab.core.workloads import build_workload
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity

MACHINES = ["p100x4:", "a100x8:duplex=0.7,engine=fifo,",
            "p100x4:host_bus_bandwidth=8e9,gpus_per_bus=2,link_latency=0,",
            "a100x8:h2d_bandwidth=inf,gpu_gpu_bandwidth=3e9,cost=fitted,"]


def planned(seed: int, spec: str, workload: str = "random"):
    graph = build_workload(f"random:vertices=60,gpus=2,seed={seed},host_fraction=0.4,"
                           f"transfer_fraction=0.2,input_fraction=0.2"
                           if workload == "random" else workload)
    machine = machine_from_spec(f"{spec}gpus=2,gpu_memory={int(min_capacity(graph) * 1.2)}")
    return plan(graph, machine, "buildmemgraph"), machine


def per_vertex(mg: MemGraph, machine, vertices) -> list[float]:
    """The durations one :meth:`Machine.duration` call per vertex gives."""
    return [machine.duration(v.kind, v.device, v.bytes, v.flops,
                             touched_bytes(v.op, v.bytes, [mg[u].bytes for u in v.inputs])
                             if v.kind == "compute" else 0, v.time, v.op, v.dtype)
            for v in vertices]


@given(seed=st.integers(0, 2**16), spec=st.sampled_from(MACHINES),
       timed=st.floats(0, 1), workload=st.sampled_from(
           ["random", "llama-lora-train:model=tiny,seq=64,batch=2,gpus=2,block=32"]))
@settings(max_examples=30, deadline=None)
def test_durations_are_the_cost_model_s(seed, spec, timed, workload):
    """Every vertex's duration, bit for bit, with profiled times on a share of the vertices
    (copies and inputs among them) overriding the cost model."""
    mg, machine = planned(seed, spec, workload)
    rng = random.Random(seed)
    for v in mg:
        if rng.random() < timed:
            v.time = rng.choice([0.0, 1e-3, rng.random()])
    vertices = sorted(mg, key=lambda v: v.order)
    got = durations(mg, machine, vertices)
    assert got == per_vertex(mg, machine, vertices)
    assert all(type(d) is float for d in got)
    assert durations(mg, machine) == per_vertex(mg, machine, list(mg))


def test_a_kernel_shape_is_priced_once(monkeypatch):
    """The cost model is asked once per distinct kernel (op, device, sizes, flops, dtype), not
    once per vertex: a model's layers repeat a few shapes (LoRA 7B at batch 8: 341,089 kernels,
    417 shapes)."""
    mg, machine = planned(0, "a100x8:cost=fitted,", "llama-lora-train:model=tiny,seq=64,batch=2,"
                                                    "gpus=2,block=32")
    asked = []
    original = type(machine).duration
    monkeypatch.setattr(type(machine), "duration",
                        lambda self, *args: asked.append(args) or original(self, *args))
    kernels = [v for v in mg if v.kind == "compute" and v.time is None]
    shapes = {(v.op, v.device, v.bytes, v.flops, v.dtype, tuple(mg[u].bytes for u in v.inputs))
              for v in kernels}
    got = durations(mg, machine)
    assert len(asked) == len(shapes) < len(kernels) / 2
    monkeypatch.undo()
    assert got == per_vertex(mg, machine, list(mg))


def test_copy_cost_prices_each_kind_of_copy():
    """``latency + bytes / bandwidth`` per kind of copy, capped by a host bus; nothing for a
    vertex that copies nothing."""
    machine = machine_from_spec("p100x4:host_bus_bandwidth=8e9,h2d_bandwidth=12e9,"
                                "d2h_bandwidth=6e9,link_latency=2e-6")
    assert machine.copy_cost("load") == machine.copy_cost("reload") == (2e-6, 8e9)
    assert machine.copy_cost("offload") == (2e-6, 6e9)
    assert machine.copy_cost("transfer") == (machine.gpu_gpu_latency,
                                             machine.gpu_gpu_bandwidth)
    assert machine.copy_cost("compute") is None and machine.copy_cost("input") is None
    assert machine.duration("load", "gpu0", 8000) == 2e-6 + 8000 / 8e9


@given(seed=st.integers(0, 2**16), shuffled=st.booleans())
@settings(max_examples=30, deadline=None)
def test_contract_edges_are_the_memgraph_s(seed, shuffled):
    """Each vertex's successors, in the order of its edge dict, and its number of
    predecessors, whether the MemGraph holds its vertices in planner order or not."""
    mg, machine = planned(seed, "p100x4:")
    if shuffled:
        ids = list(mg.vertices)
        random.Random(seed).shuffle(ids)
        for name in ("vertices", "succ", "pred"):
            table = getattr(mg, name)
            setattr(mg, name, {i: table[i] for i in ids})
    structure = contract(mg, machine)
    vertices = structure.vertices
    assert [v.order for v in vertices] == sorted(v.order for v in mg)
    number = {v.id: i for i, v in enumerate(vertices)}
    assert structure.succ == [[number[w] for w in mg.succ[v.id]] for v in vertices]
    assert structure.waiting == [len(mg.pred[v.id]) for v in vertices]
    assert all(type(w) is int for w in structure.waiting)
