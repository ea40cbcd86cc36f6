"""CoTrain's split of the parameter update (issue 21): plans verify, simulate with the CPU
busy, and execute to the reference weights under many dispatch orders."""

from __future__ import annotations

from dataclasses import replace

import pytest

from offloadlab.core.errors import PlanError, VerificationError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.planner.cotrain import layers, separation
from offloadlab.simulator import simulate

CHAIN = "training-chain:w=1MB;1MB;1MB;1MB,a=64KB;64KB;64KB;64KB"


def machine_for(graph, factor=1.3):
    return replace(machine_from_spec("p100x4"), gpus=max(1, len(graph.gpus())),
                   gpu_memory=int(min_capacity(graph) * factor))


@pytest.mark.parametrize("spec", ["model:name=mlp,mode=train,gpus=1",
                                  "model:name=gpt2,mode=train,gpus=2", CHAIN])
def test_updates_past_k_run_on_the_cpu(spec):
    graph = build_workload(spec)
    machine = machine_for(graph)
    by_layer = layers(graph)
    for k in (0, 1, len(by_layer)):
        mg = plan(graph, machine, f"cotrain:k={k}")
        verify(mg, graph, machine)
        on_cpu = {v.id for v in mg if v.device == "cpu"}
        assert on_cpu == {u for layer in by_layer[k:] for u in layer}
        assert sorted(on_cpu) == mg.graph["cpu_updates"] and mg.graph["options"] == {"k": k}
        result = simulate(mg, machine)
        assert (result.busy.get("cpu", 0) > 0) == bool(on_cpu)
        # each CPU update reads its gradient from host RAM: it was offloaded
        offloaded = {v.of for v in mg if v.kind == "offload"}
        assert all(graph[u].inputs[1] in offloaded for u in on_cpu)


def test_the_default_k_is_the_slides_separation_distance():
    graph = build_workload("model:name=mlp,mode=train,gpus=1")
    machine = machine_for(graph)
    k = separation(graph, machine, layers(graph))
    assert 0 <= k <= len(layers(graph))
    assert plan(graph, machine, "cotrain").graph["options"] == {"k": k}


@pytest.mark.parametrize("spec", ["model:name=mlp,mode=train,gpus=1", CHAIN])
def test_executed_weights_equal_the_reference(spec):
    graph = build_workload(spec)
    machine = machine_for(graph)
    mg = plan(graph, machine, "cotrain:k=1")
    reference = reference_outputs(graph)
    for policy, seeds in (("dynamic", [0]), ("fixed", [0]), ("random", range(8))):
        for seed in seeds:
            run = execute(mg, machine, policy=policy, seed=seed, rate_limit=False, poison=True)
            assert check_outputs(run.outputs, reference) is None, (policy, seed)


def test_only_updates_may_move_to_the_cpu_and_only_training_steps_apply():
    graph = build_workload(CHAIN)
    machine = machine_for(graph)
    mg = plan(graph, machine, "cotrain:k=0")
    forward = next(v for v in mg if v.kind == "compute" and v.op == "layer_forward")
    forward.device, forward.loc = "cpu", None
    with pytest.raises(VerificationError, match=f"rule 2: vertex '{forward.id}' is compute on cpu"):
        verify(mg, graph, machine)
    with pytest.raises(PlanError, match="cotrain plans training steps"):
        plan(build_workload("random:vertices=30"), machine_from_spec("p100x4"), "cotrain")
    with pytest.raises(PlanError, match="k must be an integer"):
        plan(graph, machine, "cotrain:k=-2")


@pytest.mark.parametrize(("spec", "least"), [("model:name=mlp,mode=train,gpus=1", 0.03),
                                             ("model:name=gpt2,mode=train,gpus=2", 0.5)])
def test_cpu_updates_overlap_the_gpu_backward(spec, least):
    """The point of CoTrain: the CPU updates layers while the GPUs run the backward pass.  In
    the simulated trace (default k) most of the CPU's update time lies within the backward
    pass, and some of it beside a backward kernel running: at least ``least`` of it (the
    MLP's GPU mostly waits on copies there, 5% measured; GPT-2's runs kernels, 61%)."""
    from offloadlab.planner.cotrain import _backward
    graph = build_workload(spec)
    machine = machine_for(graph)
    trace = simulate(plan(graph, machine, "cotrain"), machine).trace
    cpu = trace[trace["resource"] == "cpu"]
    backward = trace[trace["vertex"].isin(set(_backward(graph)))
                     & trace["resource"].str.startswith("gpu")]
    assert len(cpu) and len(backward)

    def overlap(rows, start: float, end: float) -> float:
        return float((rows["end"].clip(upper=end)
                      - rows["start"].clip(lower=start)).clip(lower=0).sum())
    busy = float((cpu["end"] - cpu["start"]).sum())
    within = overlap(cpu, backward["start"].min(), backward["end"].max()) / busy
    beside = sum(overlap(backward, r.start, r.end) for r in cpu.itertuples()) / busy
    assert within > 0.8, within
    assert beside > least, beside
