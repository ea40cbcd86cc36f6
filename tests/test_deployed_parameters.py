"""The deployed offload schemes (issue 45): accelerate-offload, zero-offload and
fsdp-cpu-offload plan what they apply to into MemGraphs the verifier accepts, with each
scheme's moves where the original makes them, refuse the rest (and what would not fit) in one
line, and execute to the reference under every dispatch policy."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS

from offloadlab.core.dispatch import POLICIES
from offloadlab.core.errors import PlanError, SpecError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.planner.deployed.step import step_of
from offloadlab.simulator import simulate

DEPLOYED = ("accelerate-offload", "zero-offload", "fsdp-cpu-offload")
MLP = "model:name=mlp,mode=train,gpus=1"
GPT2 = "model:name=gpt2,mode=train,gpus=2"
LORA = "llama-lora-train:model=tiny,seq=16,block=8"
CHAIN = "training-chain:w=1MB;1MB;1MB;1MB,a=64KB;64KB;64KB;64KB,iterations=3"
PREFILL = "llama-prefill:model=tiny,seq=16,block=8,gpus=2"
GENERATE = "llama-generate:model=tiny,seq=12,block=4,batch=2,gen=3"
TRAINING = (MLP, GPT2, LORA, CHAIN)
SPECS = {"accelerate-offload": ["accelerate-offload"],
         "zero-offload": ["zero-offload", "zero-offload:reduce_bucket_size=20000",
                          "zero-offload:overlap_comm=true,reduce_bucket_size=20000",
                          "zero-offload:dpu=true"],
         "fsdp-cpu-offload": ["fsdp-cpu-offload", "fsdp-cpu-offload:min_num_params=3000",
                              "fsdp-cpu-offload:min_num_params=3000,limit_all_gathers=false"]}
CASES = [(w, s) for w in TRAINING for name in DEPLOYED for s in SPECS[name]] \
    + [(PREFILL, "accelerate-offload"), (GENERATE, "accelerate-offload")]


def machine(graph, spec="p100x4"):
    return machine_from_spec(f"{spec}:gpus={max(1, len(graph.gpus()))}")


@pytest.mark.parametrize(("workload", "spec"), CASES)
def test_plans_verify_and_simulate(workload, spec):
    graph = build_workload(workload)
    m = machine(graph)
    mg = plan(graph, m, spec)
    verify(mg, graph, m)
    assert mg.graph["planner"] == spec.split(":")[0]
    assert simulate(mg, m).makespan > 0


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "spec"), CASES)
def test_plans_execute_to_the_reference_under_every_policy(workload, spec):
    graph = build_workload(workload)
    m = machine(graph)
    mg = plan(graph, m, spec)
    reference = reference_outputs(graph)
    for policy in POLICIES:
        for seed in range(1 if policy in ("dynamic", "fixed") else 3):
            run = execute(mg, m, policy=policy, seed=seed, rate_limit=False, poison=True)
            assert check_outputs(run.outputs, reference) is None, (policy, seed)


def _compute_before(mg, v) -> bool:
    """Whether MemGraph vertex ``v`` waits (memory edge) for a compute vertex on its GPU."""
    return any(kind == "memory" and mg[u].kind == "compute" and mg[u].device == mg[v].device
               for u, kind in mg.pred[v].items())


def test_accelerate_loads_each_weight_on_demand_and_drops_it_after_its_module():
    """No prefetch: every load after the first vertex waits for the vertex before its reader;
    an inference graph loads each weight once and holds it only for its module's forward."""
    graph = build_workload("llama-prefill:model=tiny,seq=16,block=8")
    m = machine(graph)
    mg = plan(graph, m, "accelerate-offload")
    loads = [v for v in mg if v.kind == "load"]
    assert sorted(v.of for v in loads) == sorted(t.id for t in graph
                                                 if t.kind == "input" and t.device == "host")
    first = min(v.order for v in mg if v.kind == "compute")
    assert all(_compute_before(mg, v.id) for v in loads if v.order > first)
    # dropped after their module: never all of them on the GPU at once
    weights = sum(v.bytes for v in loads)
    assert simulate(mg, m).peak_memory["gpu0"] < weights

def test_accelerate_loads_every_weight_again_for_each_forward_call_of_a_generation():
    """AlignDevicesHook's post_forward drops a module's weights after every call and each
    decode step calls the model: modules x forward calls loads, each within its call."""
    graph = build_workload(GENERATE)
    m = machine(graph)
    mg = plan(graph, m, "accelerate-offload")
    verify(mg, graph, m)
    calls = 1 + graph.meta["gen"]
    weights = {t.id for t in graph if t.kind == "input" and t.category == "weights"}
    loads = [v for v in mg if v.kind == "load"]
    assert len([v for v in loads if v.of in weights]) == len(weights) * calls
    assert all(sum(v.of == w for v in loads) == calls for w in weights)
    batch = [t.id for t in graph if t.kind == "input" and t.id not in weights]
    assert batch and all(sum(v.of == u for v in loads) == 1 for u in batch)
    # the embedding's loads: one before each call's first embedding, none running ahead of
    # the token it embeds
    order = {v.id: v.order for v in mg}
    embeds = sorted(order[v.id] for v in loads if v.of == "embed")
    tokens = [order[t] for t in ("token.s1", "d1.token.s1", "d2.token.s1")]
    assert embeds[0] < tokens[0] < embeds[1] < tokens[1] < embeds[2] < tokens[2] < embeds[3]
    assert simulate(mg, m).peak_memory["gpu0"] < sum(graph[w].bytes for w in weights)


def test_accelerate_under_checkpointing_loads_weights_again_for_the_recomputation():
    """LoRA with checkpointing: the recomputed forward calls each module again, so its base
    weights are loaded twice; a traced step without recomputation keeps what autograd saved."""
    lora = build_workload(LORA)
    counts: dict[str, int] = {}
    for v in plan(lora, machine(lora), "accelerate-offload"):
        if v.kind == "load":
            counts[v.of] = counts.get(v.of, 0) + 1
    assert counts["L0.wq.h0"] == 2 and counts["L1.w_down.g0"] == 2
    mlp = build_workload(MLP)
    loads = [v.of for v in plan(mlp, machine(mlp), "accelerate-offload") if v.kind == "load"]
    assert len(loads) == len(set(loads))


def test_zero_offload_updates_on_the_cpu_and_copies_gradients_out_by_buckets():
    graph = build_workload(MLP)
    m = machine(graph)
    updates = set(step_of(graph).updates)
    grads = {graph[u].inputs[1] for u in updates}
    backward = step_of(graph).backward

    def trace_of(spec):
        mg = plan(graph, m, spec)
        assert {v.id for v in mg if v.device == "cpu"} == updates
        assert sorted(v.of for v in mg if v.kind == "offload") == sorted(grads)
        copied = [v.of for v in mg if v.kind == "load" and v.of in updates]
        assert sorted(copied) == sorted(updates)       # each new weight back on the GPU
        return mg, simulate(mg, m).trace

    # DeepSpeed's 5e8-element bucket holds every gradient: copied after the backward
    mg, trace = trace_of("zero-offload")
    last_backward = trace[trace.vertex.isin(backward - updates)
                          & trace.resource.str.startswith("gpu")].end.max()
    offloads = trace[trace.kind == "offload"]
    assert offloads.start.min() >= last_backward - 1e-12
    cpu = trace[trace.resource == "cpu"]
    assert cpu.start.min() >= offloads.end.max() - 1e-12
    # small buckets: copied during the backward, and on the compute stream unless overlap_comm
    mg, trace = trace_of("zero-offload:reduce_bucket_size=20000")
    offloads = trace[trace.kind == "offload"]
    assert offloads.start.min() < last_backward
    assert _stream_waits(mg)
    mg, _ = trace_of("zero-offload:reduce_bucket_size=20000,overlap_comm=true")
    assert not _stream_waits(mg)


def _stream_waits(mg) -> list[tuple[str, str]]:
    """The compute vertices that wait for a gradient copy whose bytes they do not reuse: the
    compute stream waiting for a copy issued on it."""
    def overlap(a, b) -> bool:
        return a.loc is not None and b.loc is not None and a.loc.offset < b.loc.end \
            and b.loc.offset < a.loc.end
    return [(v.id, w) for v in mg if v.kind == "offload" for w, kind in mg.succ[v.id].items()
            if kind == "memory" and mg[w].kind == "compute" and mg[w].device == v.device
            and not overlap(mg[w], mg[mg[v.id].inputs[0]])]

def test_zero_offload_dpu_lets_the_next_iteration_start_before_the_step_ends():
    """Without DPU the next forward waits for the whole CPU step; with it, only for the
    updated weights it reads (on a slow CPU, where the step takes as long as a layer)."""
    graph = build_workload(CHAIN)
    m = machine_from_spec("p100x4:gpus=1,cpu_flops=1e8")
    times = {}
    for dpu in (False, True):
        trace = simulate(plan(graph, m, f"zero-offload:dpu={str(dpu).lower()}"), m).trace
        cpu = trace[trace.resource == "cpu"]
        step_end = cpu[cpu.vertex.str.endswith("@1")].end.max()     # iteration 1's step
        start = trace.set_index("vertex").start
        times[dpu] = bool(start["F1@2"] < step_end), float(trace.end.max())
    assert times[False][0] is False and times[True][0] is True
    assert times[True][1] < times[False][1]


def test_fsdp_units_are_loaded_for_the_forward_and_again_for_the_backward():
    graph = build_workload(MLP)
    m = machine(graph)
    weights = [t.id for t in graph if t.kind == "input" and t.device == "host"]
    # the default unit size (1e8) leaves every parameter in the root: loaded once
    loads = [v.of for v in plan(graph, m, "fsdp-cpu-offload") if v.kind == "load"]
    assert sorted(loads) == sorted(weights)
    # small units: a wrapped unit's parameters come twice (forward, backward), and each
    # unshard after the second waits for an earlier unit's free (limit_all_gathers)
    mg = plan(graph, m, "fsdp-cpu-offload:min_num_params=3000")
    counts: dict[str, int] = {}
    for v in mg:
        if v.kind == "load":
            counts[v.of] = counts.get(v.of, 0) + 1
    assert max(counts.values()) == 2 and sum(c == 2 for c in counts.values()) > len(counts) / 2
    assert counts["input"] == counts["target"] == 1     # the batch is no unit's parameter
    assert sum(_compute_before(mg, v.id) for v in mg if v.kind == "load") > 2
    updates = set(step_of(graph).updates)
    assert {v.id for v in mg if v.device == "cpu"} == updates
    assert sorted(v.of for v in mg if v.kind == "offload") == sorted(
        graph[u].inputs[1] for u in updates)


@pytest.mark.parametrize("name", ["zero-offload", "fsdp-cpu-offload"])
def test_only_training_steps_apply(name):
    graph = build_workload(PREFILL)
    with pytest.raises(PlanError, match=f"^{name} plans training steps: TaskGraph "
                                        f"'llama-prefill-tiny' has no optimizer update"):
        plan(graph, machine(graph), name)


def test_accelerate_needs_weights_in_host_ram_and_every_module_on_a_gpu():
    graph = build_workload("random:vertices=20")
    for t in graph:
        if t.kind == "input":
            t.device = "gpu0"
    with pytest.raises(PlanError, match="no host-resident input that a GPU reads"):
        plan(graph, machine(graph), "accelerate-offload")
    chain = build_workload(CHAIN)
    m = machine(chain)
    on_cpu = plan(chain, m, "cotrain:k=0")
    from offloadlab.executor import taskgraph_of
    with pytest.raises(PlanError, match="runs every module on its GPU: vertex 'w"):
        plan(taskgraph_of(on_cpu), m, "accelerate-offload")


@pytest.mark.parametrize("spec", DEPLOYED)
def test_a_scheme_that_does_not_fit_is_refused_naming_the_shortfall(spec):
    graph = build_workload(MLP)
    m = machine_from_spec("p100x4:gpus=1,gpu_memory=1MB")
    with pytest.raises(PlanError, match=rf"^{spec}: the deployed scheme runs out of memory on "
                                        rf"gpu0: it holds \d+ bytes there at vertex '[^']+', "
                                        rf"\d+ more than the GPU's 1000000$"):
        plan(graph, m, spec)


@pytest.mark.parametrize(("spec", "message"), [
    ("zero-offload:reduce_bucket_size=0", "reduce_bucket_size must be a positive"),
    ("fsdp-cpu-offload:min_num_params=-5", "min_num_params must be a positive"),
    ("accelerate-offload:prefetch=1", "unknown option")])
def test_bad_options_are_refused(spec, message):
    graph = build_workload(MLP)
    with pytest.raises((PlanError, SpecError), match=message):
        plan(graph, machine(graph), spec)


def test_list_shows_the_deployed_schemes(capsys):
    assert main(["list", "planners"]) == 0
    out = capsys.readouterr().out
    for name, option in (("accelerate-offload", "(no options)"),
                         ("zero-offload", "reduce_bucket_size=500000000"),
                         ("zero-offload", "overlap_comm=false"), ("zero-offload", "dpu=false"),
                         ("fsdp-cpu-offload", "min_num_params=100000000"),
                         ("fsdp-cpu-offload", "limit_all_gathers=true")):
        assert name in out and option in out
    lines = [line for line in out.splitlines() if line.split()[:1] == ["zero-offload"]]
    assert "DeepSpeed ZeRO-Offload" in lines[0]



@pytest.mark.parametrize("spec", ["zero-offload", "fsdp-cpu-offload:min_num_params=300000"])
def test_a_cpu_vertex_reading_a_gpu_tensor_gets_it_copied_out(spec):
    """A TaskGraph that already runs some updates on the CPU (CoTrain's placement): their
    gradients, made on the GPU, are offloaded before them."""
    from offloadlab.executor import taskgraph_of
    chain = build_workload(CHAIN)
    m = machine(chain)
    graph = taskgraph_of(plan(chain, m, "cotrain:k=2"))
    on_cpu = [t.id for t in graph if t.device == "cpu"]
    assert on_cpu
    mg = plan(graph, m, spec)
    verify(mg, graph, m)
    offloaded = {v.of for v in mg if v.kind == "offload"}
    assert {graph[t].inputs[1] for t in on_cpu} <= offloaded
    run = execute(mg, m, policy="random", seed=3, rate_limit=False, poison=True)
    assert check_outputs(run.outputs, reference_outputs(graph)) is None


@settings(max_examples=40, **SETTINGS)
@given(layers=st.integers(1, 4), iterations=st.integers(1, 3), data=st.data(),
       memory=st.integers(200_000, 6_000_000),
       spec=st.sampled_from([s for name in DEPLOYED for s in SPECS[name]]))
def test_random_chains_plan_within_memory_or_are_refused(layers, iterations, data, memory,
                                                         spec):
    """On random training chains and GPU sizes each scheme's plan verifies within the GPU, or
    the scheme is refused as running out of memory, its peak above the GPU's bytes."""
    sizes = st.integers(1, 64).map(lambda k: k * 8192)
    w = ";".join(str(data.draw(sizes)) for _ in range(layers))
    a = ";".join(str(data.draw(sizes)) for _ in range(layers))
    uF = ";".join(["0.01"] * layers)
    graph = build_workload(f"training-chain:w={w},a={a},uF={uF},uB={uF},"
                           f"iterations={iterations}")
    m = machine_from_spec(f"p100x4:gpus=1,gpu_memory={memory}")
    try:
        mg = plan(graph, m, spec)
    except PlanError as exc:
        found = re.search(r"runs out of memory on gpu0: it holds (\d+) bytes", str(exc))
        assert found or "fragmented" in str(exc), str(exc)
        assert found is None or int(found.group(1)) > memory
        return
    verify(mg, graph, m)


def test_fsdp_unshards_the_updated_parameters_after_each_optimizer_step():
    """On a 3-iteration chain with every parameter in the root: each iteration loads each
    weight once, at its start, the updated ones once the CPU step has ended."""
    graph = build_workload(CHAIN)
    mg = plan(graph, machine(graph), "fsdp-cpu-offload")
    loads = [v for v in mg if v.kind == "load"]
    assert sorted(v.of for v in loads) == sorted(f"w{i}@{t}" for i in range(1, 5)
                                                 for t in range(3))
    for v in loads:
        t = int(v.of.split("@")[1])
        assert v.order < mg[f"F1@{t + 1}"].order
        assert (t > 0) == any(mg[u].device == "cpu" for u in mg.pred[v.id])


@pytest.mark.parametrize("spec", ["zero-offload", "fsdp-cpu-offload"])
def test_the_cpu_step_is_the_same_in_every_process(spec):
    """The optimizer step's updates whose weights are first read together (a layer's weight
    and bias) run in program order: they were ordered as a set of strings iterates, so the
    plan changed with the process's string hash seed."""
    code = ("import hashlib; from offloadlab.core.machine import machine_from_spec; "
            "from offloadlab.core.workloads import build_workload; "
            "from offloadlab.core.formats import to_json; from offloadlab.planner import plan; "
            "g = build_workload('model:name=mlp,mode=train,gpus=1'); "
            f"print(hashlib.sha1(to_json(plan(g, machine_from_spec('p100x4:gpus=1'), '{spec}'))"
            ".encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2", "3")}
    assert len(digests) == 1
