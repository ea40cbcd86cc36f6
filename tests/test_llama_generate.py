"""LLaMA generation (issue 45, ``llama-generate``): the prefill then greedy decode steps that
attend to the KV cache; every plan verifies and executes to the reference; FlexGen plans the
whole generation, loading host weights once per token and reading the host cache back once
per later token, with its LP's objective over every token."""

from __future__ import annotations

import pytest

from offloadlab.core.errors import PlanError, SpecError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.ilp.flexgen import CostModel
from offloadlab.planner import plan
from offloadlab.planner.flexgen import cost_model
from offloadlab.planner.flexgen.structure import structure
from offloadlab.simulator import makespan

GEN = "llama-generate:model=tiny,seq=12,block=4,batch=2,gen=3"   # chunked, 2 sequences
ONE = "llama-generate:model=tiny,seq=8,gen=4"                      # one GPU batch
PREFILL = "llama-prefill:model=tiny,seq=12,block=4,batch=2"
HOST = "flexgen:w_gpu_percent=0,cache_gpu_percent=0,act_gpu_percent=0"


def machine(memory: str = "1GB", gpus: int = 1):
    return machine_from_spec(f"a100x8:gpus={gpus},gpu_memory={memory}")


def test_the_prefill_is_llama_prefill_and_each_step_reads_the_whole_cache():
    graph, prefill = build_workload(GEN), build_workload(PREFILL)
    for t in prefill:      # the prefill, vertex for vertex (its logits now feed a token)
        assert graph[t.id].op == t.op and graph[t.id].inputs == t.inputs
    assert graph.meta["gen"] == 3 and graph.name == "llama-generate-tiny"
    # sequence 1's token (row 5, its last row block) at step 3: position 12 + 2
    values = graph["d3.L1.O.h2.b5"]
    keys = [f"L1.v.h2.b{r}" for r in (3, 4, 5)] + [f"d{u}.L1.v.h2.b5" for u in (1, 2, 3)]
    assert values.inputs[len(values.inputs) // 2:] == tuple(keys)
    assert graph["d3.L1.stats.h2.b5"].op == "softmax_stats:q0=14"
    assert graph["d3.L0.qr.h2.b5"].op == "rotary:offset=14"
    # each step's token is the argmax of the last one's logits: no step runs ahead
    assert graph["token.s1"].op == "argmax" and graph["token.s1"].inputs == ("logits.s1",)
    assert graph["d2.embed.b5"].inputs == ("d1.token.s1", "embed")
    assert {"d3.logits.s0", "d3.logits.s1"} <= set(graph.outputs())
    assert not [o for o in graph.outputs() if "token" in o]
    assert {t.category for t in graph if t.kind == "compute"} == {"activations"}


@pytest.mark.parametrize("spec,message", [
    ("llama-generate:gen=0", "gen must be a positive integer"),
    ("llama-generate:model=huge", "llama-generate: unknown model"),
    ("llama-generate:model=tiny,gpus=3", "not divisible by gpus"),
])
def test_bad_options_are_refused(spec, message):
    with pytest.raises(SpecError, match=message):
        build_workload(spec)


PLANNERS = ["buildmemgraph", "levelwise", "accelerate-offload", HOST,
            "flexgen:w_gpu_percent=50,cache_gpu_percent=100,act_gpu_percent=100",
            HOST + ",overlap=false", "flexgen"]


@pytest.mark.slow
@pytest.mark.parametrize("workload", [GEN, ONE])
def test_every_plan_verifies_and_executes_to_the_reference(workload):
    graph = build_workload(workload)
    reference = reference_outputs(graph)
    for spec in PLANNERS:
        for memory in ("1GB", "600KB"):
            m = machine(memory)
            try:
                mg = plan(graph, m, spec)
            except PlanError as e:
                assert memory != "1GB", e
                continue
            verify(mg, graph, m)
            for policy, seed in (("dynamic", 0), ("random", 1), ("adversarial", 2)):
                run = execute(mg, m, policy=policy, seed=seed, poison=True, rate_limit=False)
                wrong = check_outputs(run.outputs, reference)
                assert wrong is None, f"{spec} at {memory}, {policy}: {wrong}"


@pytest.mark.slow
def test_tensor_parallel_generation_executes_to_the_reference():
    graph = build_workload(GEN + ",gpus=2")
    m = machine("1GB", gpus=2)
    mg = plan(graph, m, "buildmemgraph")
    verify(mg, graph, m)
    run = execute(mg, m, poison=True, rate_limit=False)
    assert check_outputs(run.outputs, reference_outputs(graph)) is None


def test_flexgen_loads_host_weights_and_cache_once_per_token():
    graph = build_workload(GEN)
    st = structure(graph)
    assert st.width == 4 and st.gen_len == 4 and st.layers == 16
    mg = plan(graph, machine(), HOST)
    verify(mg, graph, machine())
    weights = [t for layer in st.weights for t in layer]
    loads = {v.of: 0 for v in mg if v.kind == "load"}
    for v in mg:
        if v.kind == "load":
            loads[v.of] += 1
    assert all(loads[w] == 4 for w in weights)        # load_weight(i, j, k), each token
    assert all(loads[u] == 1 for u in st.tokens)
    # the prompt's cache of layer 1 is read back by the prefill's later row blocks, and
    # once by each decode step
    reloads = sorted(v.id for v in mg if v.kind == "reload" and v.of == "L1.kr.h0.b3")
    assert reloads == ["reload:L1.kr.h0.b3@gpu0"] + [f"reload:L1.kr.h0.b3@gpu0#{i}"
                                                     for i in (1, 2, 3)]
    # zig-zag across tokens: token 1's embedding weights load in token 0's last layer
    order = {v.id: v.order for v in mg}
    head = st.layer_steps(st.width - 1)[0]
    assert order[st.computes[head - 1][-1]] < order["load:embed@gpu0#1"] < \
        order[st.computes[head][0]]
    # with its home on the GPU, a weight is loaded once and stays
    everything = plan(graph, machine(),
                      "flexgen:w_gpu_percent=100,cache_gpu_percent=100,act_gpu_percent=100")
    assert everything.count("load") == len(weights) + len(st.tokens)
    assert everything.count("reload") == 0 and everything.count("offload") == 0


def test_flexgen_refuses_naming_the_token():
    graph = build_workload(GEN)
    with pytest.raises(PlanError, match=r"needs \d+ bytes on gpu0 at token \d, layer \d, GPU "
                                        r"batch \d, \d+ more than its capacity of 100000"):
        plan(graph, machine("100KB"), HOST)


def test_the_cost_model_weighs_every_token():
    graph = build_workload(GEN)
    st = structure(graph)
    model = cost_model(graph, machine(), st)
    prefill = build_workload(PREFILL)
    alone = cost_model(prefill, machine(), structure(prefill))
    n = st.width
    assert model.gen_len == 4 and len(model.weights) == 4 * n
    assert model.weights == alone.weights * 4
    # the decode steps read the cache back, more at each step (the cache grows)
    reads = [sum(model.cache_reads[i * n:(i + 1) * n]) for i in range(4)]
    assert reads[0] == sum(alone.cache_reads) and 0 < reads[1] < reads[2] < reads[3]
    # every token's layers are timed; the weights count once in the peak
    for policy in ((0, 0, 0), (1, 1, 1), (0.5, 0, 1)):
        assert model.seconds(*policy) > alone.seconds(*policy)
    assert model.peak(1, 0, 0) - model.peak(0, 0, 0) == pytest.approx(
        sum(alone.weights) - max(a + b for a, b in zip(model.weights, model.weights[1:])))


def test_the_peak_counts_repeated_layers_once():
    one = CostModel((3, 5), (1, 1), (0, 0), (2, 2), (0, 2), (1.0, 1.0), 0, 2, 0, 1.0, 1.0)
    two = CostModel((3, 5, 3, 5), (1, 1, 1, 1), (0, 0, 1, 1), (2, 2, 2, 2), (0, 2, 2, 2),
                    (1.0, 1.0, 1.0, 1.0), 0, 2, 0, 1.0, 1.0, gen_len=2)
    assert two.peak(1, 0, 0) == one.peak(1, 0, 0)
    assert two.seconds(0, 0, 0) > one.seconds(0, 0, 0)


def test_the_searched_policy_plans_and_simulates():
    graph = build_workload(GEN)
    for memory in ("1GB", "600KB"):
        m = machine(memory)
        mg = plan(graph, m, "flexgen")
        verify(mg, graph, m)
        assert mg.graph["policy"]["cost_model_seconds"] > 0 and makespan(mg, m) > 0


def test_flexgen_refuses_tensor_parallel_generation():
    with pytest.raises(PlanError, match="flexgen offloads one GPU's model"):
        plan(build_workload(GEN + ",gpus=2"), machine(gpus=2), "flexgen")
