"""FlexGen's policy as a planner (issue 45): plans verify and execute to the reference under
every dispatch policy; the policy's homes follow FlexGen's rules; the zig-zag schedule overlaps
the next layer's weights with the current layer; the LP picks a policy that fits and is no
worse under its own cost model than the corners of the policy space; graphs it does not plan,
bad options and policies that do not fit are refused in one line."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.errors import PlanError, SpecError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.ilp.flexgen import CostModel, best
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.planner.flexgen import FlexGenOptions, corners, cost_model
from offloadlab.planner.flexgen.schedule import cache_on_gpu, gpu_weights
from offloadlab.planner.flexgen.structure import structure
from offloadlab.simulator import makespan

CHUNKED = "llama-prefill:model=tiny,seq=24,block=8,batch=2"   # 6 GPU batches, chunked
WHOLE = "llama-prefill:model=tiny,seq=8"                        # one GPU batch
CORNERS = [f"flexgen:w_gpu_percent={w},cache_gpu_percent={c},act_gpu_percent={a}"
           for w in (0, 100) for c in (0, 100) for a in (0, 100)]
SPECS = CORNERS + ["flexgen:w_gpu_percent=40,cache_gpu_percent=0,act_gpu_percent=0",
                   "flexgen:w_gpu_percent=40,cache_gpu_percent=0,act_gpu_percent=0,"
                   "overlap=false", "flexgen"]


def machine(memory: str | int = "1GB"):
    return machine_from_spec(f"v100:gpu_memory={memory}")


@functools.cache
def tight(workload: str, spec: str) -> int:
    """The least GPU memory (to 2%) in which ``spec`` plans ``workload``; the search
    (``flexgen``) gets 5% more than the policy holding least on the GPU needs."""
    if spec == "flexgen":
        return int(tight(workload, CORNERS[0]) * 1.05)
    graph = build_workload(workload)
    lo, hi = 1000, 10**7
    while hi - lo > hi // 50:
        mid = (lo + hi) // 2
        try:
            plan(graph, machine(mid), spec)
            hi = mid
        except PlanError:
            lo = mid
    return hi


def cases(workload: str):
    """Each spec with generous and with tight memory, where plans reuse memory."""
    return [(spec, m) for spec in SPECS for m in (machine(), machine(tight(workload, spec)))]


@pytest.mark.parametrize("workload", [CHUNKED, WHOLE])
def test_every_policy_verifies_and_moves_what_it_holds_on_the_host(workload):
    graph = build_workload(workload)
    for spec, m in cases(workload):
        mg = plan(graph, m, spec)
        verify(mg, graph, m)
        chosen = mg.graph["policy"]
        assert mg.graph["planner"] == "flexgen" and chosen["w_cpu_percent"] == \
            100 - chosen["w_gpu_percent"]
        weights = sum(graph[t].bytes for t in graph.tasks if graph[t].kind == "input")
        assert mg.moved_bytes()["load"] == weights      # every weight and token, once
        host_act = chosen["act_gpu_percent"] == 0
        host_cache = chosen["cache_gpu_percent"] < 100
        assert (mg.count("offload") > 0) == (host_act or host_cache)


@pytest.mark.slow
@pytest.mark.parametrize("workload", [CHUNKED, WHOLE])
def test_plans_execute_to_the_reference_under_every_policy(workload):
    graph = build_workload(workload)
    reference = reference_outputs(graph)
    for spec, m in cases(workload):
        mg = plan(graph, m, spec)
        for policy in ("dynamic", "fixed", "random", "adversarial"):
            for seed in range(3):
                run = execute(mg, m, policy=policy, seed=seed, poison=True, rate_limit=False)
                wrong = check_outputs(run.outputs, reference)
                assert wrong is None, f"{spec}, {policy}, seed {seed}: {wrong}"


def test_weights_and_cache_go_where_flexgen_puts_them():
    graph = build_workload(CHUNKED)
    st_ = structure(graph)
    assert st_.layers == 4 and st_.batches == 6
    for percent in (0, 30, 70, 100):
        home = gpu_weights(graph, st_, percent)
        for layer in st_.weights:
            sizes = [graph[w].bytes for w in layer]
            on_gpu = [w in home for w in layer]
            # the tail of each layer's list is on the GPU: by the middle of each weight's bytes
            assert on_gpu == sorted(on_gpu)
            done = 0
            for w, size in zip(layer, sizes):
                assert (w in home) == ((done + size / 2) / sum(sizes) * 100 >= 100 - percent)
                done += size
    assert not gpu_weights(graph, st_, 0) and len(gpu_weights(graph, st_, 100)) == \
        sum(len(layer) for layer in st_.weights)
    # FlexGen's mixed cache rounds the GPU's share down to whole sequences of a GPU batch
    assert [cache_on_gpu(32, p) for p in (0, 50, 99.9, 100)] == [False, False, False, True]
    assert cache_on_gpu(32, 50, gpu_batch_size=4)


def test_the_zig_zag_schedule_overlaps_the_next_layers_weights():
    graph = build_workload(CHUNKED)
    m = machine()
    spec = "flexgen:w_gpu_percent=0,cache_gpu_percent=100,act_gpu_percent=100"
    mg = plan(graph, m, spec)
    serial = plan(graph, m, spec + ",overlap=false")
    assert makespan(mg, m) < makespan(serial, m)
    order = {v.id: v.order for v in mg}
    st_ = structure(graph)
    for j in range(1, st_.layers):
        first_step = st_.layer_steps(j - 1)[0]
        # layer j's weights are issued in layer j-1's first step, before its kernels
        for w in st_.weights[j]:
            assert order[f"load:{w}@gpu0"] < order[st_.computes[first_step][0]]


def test_searched_policy_is_recorded_and_reproduces_the_plan():
    graph = build_workload(CHUNKED)
    for memory in ("1GB", "550KB", "500KB"):
        m = machine(memory)
        mg = plan(graph, m, "flexgen")
        verify(mg, graph, m)
        chosen = mg.graph["options"]
        assert mg.graph["policy"]["cost_model_seconds"] > 0
        again = plan(graph, m, "flexgen:" + ",".join(
            f"{k}={chosen[k]}" for k in ("w_gpu_percent", "cache_gpu_percent",
                                         "act_gpu_percent")))
        assert [v.id for v in again] == [v.id for v in mg]
        assert makespan(again, m) == makespan(mg, m)
    # less memory, less on the GPU
    assert plan(graph, machine("500KB"), "flexgen").graph["options"]["w_gpu_percent"] < \
        plan(graph, machine("1GB"), "flexgen").graph["options"]["w_gpu_percent"]


@pytest.mark.parametrize("workload", [CHUNKED, WHOLE])
def test_the_search_plans_wherever_the_policy_holding_least_does(workload):
    graph = build_workload(workload)
    m = machine(tight(workload, CORNERS[0]))
    mg = plan(graph, m, "flexgen")
    verify(mg, graph, m)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_lp_policy_fits_and_beats_every_corner_that_fits(data):
    n = data.draw(st.integers(2, 6))
    sizes = st.lists(st.integers(0, 10**9), min_size=n, max_size=n)
    model = CostModel(
        weights=tuple(data.draw(st.lists(st.integers(1, 10**9), min_size=n, max_size=n))),
        cache=tuple(data.draw(sizes)), cache_reads=tuple(data.draw(sizes)),
        hidden=tuple(data.draw(sizes)), hidden_in=tuple(data.draw(sizes)),
        compute=tuple(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))),
        tokens=data.draw(st.integers(0, 10**6)), hidden_batch=data.draw(st.integers(0, 10**8)),
        workspace=data.draw(st.integers(0, 10**8)),
        h2d=data.draw(st.floats(1e9, 50e9)), d2h=data.draw(st.floats(1e9, 50e9)))
    least, most = model.peak(0, 0, 0), model.peak(1, 1, 1)
    memory = data.draw(st.floats(min(least, most) * 0.9, max(least, most) * 1.1))
    found = best(model, memory, corners(FlexGenOptions()))
    fitting = [(w, c, h) for w in (0, 1) for c in (0, 1) for h in (0, 1)
               if model.peak(w, c, h) <= memory]
    if found is None:
        assert not fitting
        return
    assert model.peak(found.wg, found.cg, found.hg) <= memory * (1 + 1e-6)
    for corner in fitting:
        assert found.seconds <= model.seconds(*corner) * (1 + 1e-6), corner


def test_the_cost_model_is_measured_on_the_graph():
    graph = build_workload(CHUNKED)
    m = machine()
    model = cost_model(graph, m, structure(graph))
    inputs = [t for t in graph if t.kind == "input"]
    assert sum(model.weights) + model.tokens == sum(t.bytes for t in inputs)
    assert sum(model.cache) == sum(graph[t].bytes for t in graph.tasks
                                   if ".kr." in t or ".v." in t)
    assert model.cache_reads[0] == 0 and sum(model.cache_reads) > 0   # the chunked prefill
    assert model.h2d == m.h2d_bandwidth and model.seconds(1, 1, 1) < model.seconds(0, 0, 0)


@pytest.mark.parametrize("workload,message", [
    ("gpt2-train:depth=2,batch=1,seq=8,weight_bytes=30000,iterations=1",
     "flexgen plans LLaMA inference \\(llama-prefill, llama-generate\\): TaskGraph .* "
     "is not one"),
    ("llama-prefill:model=tiny,seq=8,gpus=2",
     "flexgen offloads one GPU's model .* runs on 2 GPUs"),
    ("llama-lora-train:model=tiny,seq=8", "is not one"),
])
def test_graphs_it_does_not_plan_are_refused(workload, message):
    graph = build_workload(workload)
    with pytest.raises(PlanError, match=message):
        plan(graph, machine_from_spec("p100x4"), "flexgen")


def test_a_prefill_without_its_model_shape_is_refused():
    graph = build_workload(WHOLE)
    del graph.meta["heads"]
    with pytest.raises(PlanError, match="flexgen plans LLaMA inference"):
        plan(graph, machine(), "flexgen")


@pytest.mark.parametrize("spec,message", [
    ("flexgen:w_gpu_percent=120", "w_gpu_percent must be a percent from 0 to 100"),
    ("flexgen:cache_gpu_percent=-3", "cache_gpu_percent must be a percent from 0 to 100"),
    ("flexgen:act_gpu_percent=50", "act_gpu_percent must be 0 or 100"),
    ("flexgen:colour=red", "unknown option"),
])
def test_bad_options_are_refused(spec, message):
    from offloadlab.planner.registry import check_spec
    with pytest.raises((PlanError, SpecError), match=message):
        check_spec(spec)


def test_policies_that_do_not_fit_are_refused_naming_the_shortfall():
    graph = build_workload(CHUNKED)
    everything = CORNERS[-1]
    with pytest.raises(PlanError, match=r"flexgen: the policy \(w_gpu_percent=100, "
                                        r"cache_gpu_percent=100, act_gpu_percent=100\) needs "
                                        r"(\d+) bytes on gpu0 .*, (\d+) more than its "
                                        r"capacity of 300000"):
        plan(graph, machine("300KB"), everything)
    with pytest.raises(PlanError, match=r"flexgen: no policy fits: the one holding least on "
                                        r"the GPU \(w_gpu_percent=0, .*\) needs \d+ bytes on "
                                        r"gpu0 at layer \d, GPU batch \d, \d+ more than its "
                                        r"capacity of 100000"):
        plan(graph, machine("100KB"), "flexgen")


def test_the_cli_lists_it_and_refuses_in_one_line(capsys, tmp_path):
    assert main(["list", "planners"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.split()[:1] == ["flexgen"])
    assert "FlexGen" in line
    for name in ("w_gpu_percent=-1.0", "cache_gpu_percent=-1.0", "act_gpu_percent=-1.0",
                 "overlap=true"):
        assert name in out
    code = main(["plan", "--workload", "matmul-chain:layers=2", "--machine", "v100",
                 "--planner", "flexgen", "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert code == 2 and "flexgen plans LLaMA inference" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.json").exists()


def test_a_larger_model_fits_what_the_lp_promises():
    """At 7B scale the search lands on a plan that fits, stepping the LP's memory down where
    its model underestimates the layout."""
    graph = build_workload("llama-prefill:model=7b,seq=256")
    m = replace(machine_from_spec("a100x8"), gpus=1, gpu_memory=3 * 2**30)
    mg = plan(graph, m, "flexgen")
    verify(mg, graph, m)
    assert 0 < mg.graph["options"]["w_gpu_percent"] < 100
