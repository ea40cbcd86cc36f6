"""The deployed activation-offloading schemes as planners (issue 45, docs/deployed.md):
``torch-compile-offload`` and ``torchtune-offload`` plan every training workload, their plans
verify and execute to the reference under every dispatch policy, they move what the originals
move when the originals move it, and they refuse other graphs and machines too small, in one
line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import need_torch
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core import anatomy
from offloadlab.core.devices import HOST
from offloadlab.core.dispatch import POLICIES
from offloadlab.core.errors import PlanError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.planner.activation_offload import GIB, Training

CHAIN = ("training-chain:w=400KB;300KB;400KB;500KB,a=100KB;60KB;100KB;80KB,"
         "uF=0.1;0.1;0.1;0.1,uB=0.2;0.2;0.2;0.2,a0=50KB,iterations=2")
WORKLOADS = (CHAIN, "gpt2-train:depth=3,batch=1,seq=8,weight_bytes=300000,iterations=2",
             "llama-lora-train:model=tiny,seq=64,batch=2,gpus=2,block=32",
             "llama-lora-train:model=tiny,seq=32,batch=1,gpus=1,block=32,checkpoint=false",
             "model:name=mlp,mode=train,gpus=2", "model:name=resnet18,mode=train",
             "model:name=gpt2,mode=train,gpus=3", "model:name=llama,mode=train")
SPECS = ("torch-compile-offload", "torch-compile-offload:activation_reload_prefetch=false",
         "torch-compile-offload:activation_offload_sink_wait=false",
         "torch-compile-offload:activation_offload_separate_stream=false",
         "torchtune-offload", "torchtune-offload:min_offload_size=1,max_fwd_stash_size=1",
         "torchtune-offload:use_streams=false")


def machine_for(graph, memory: str = "64GB"):
    return replace(machine_from_spec(f"p100x4:gpu_memory={memory}"),
                   gpus=max(1, len(graph.gpus())))


def moves(mg, kind: str) -> dict[str, list[str]]:
    """Tensor -> the vertices of ``kind`` moving it, in plan order."""
    found: dict[str, list[str]] = {}
    for v in mg.vertices.values():
        if v.kind == kind:
            found.setdefault(v.of, []).append(v.id)
    return found


def readers(mg, v: str) -> list[str]:
    return [r for r, kind in mg.succ[v].items() if kind == "data"]


def ancestors(mg, v: str) -> set[str]:
    seen, todo = set(), [v]
    while todo:
        for u in mg.pred[todo.pop()]:
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_plans_verify(workload, spec):
    graph = build_workload(workload)
    machine = machine_for(graph)
    mg = plan(graph, machine, spec)
    verify(mg, graph, machine)
    assert mg.graph["planner"] == spec.split(":")[0]
    assert moves(mg, "offload") and mg.graph["taskgraph_hash"] == graph.content_hash()


def test_import_torch_step_plans():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch
    module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                 torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                 torch.nn.Linear(128, 10))
    graph = from_torch(module, torch.randn(32, 64), train=True, gpus=2)
    machine = machine_for(graph)
    for spec in ("torch-compile-offload", "torchtune-offload"):
        verify(plan(graph, machine, spec), graph, machine)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["torch-compile-offload",
                                  "torch-compile-offload:activation_offload_sink_wait=false",
                                  "torchtune-offload:min_offload_size=1,max_fwd_stash_size=2",
                                  "torchtune-offload:use_streams=false"])
@pytest.mark.parametrize("workload", [CHAIN, WORKLOADS[1], "model:name=mlp,mode=train,gpus=2",
                                      "model:name=gpt2,mode=train,gpus=2"])
def test_plans_execute_to_the_reference(workload, spec):
    graph = build_workload(workload)
    machine = machine_for(graph)
    mg = plan(graph, machine, spec)
    assert moves(mg, "reload") or moves(mg, "load")
    reference = reference_outputs(graph)
    for policy in POLICIES:
        for seed in (range(4) if policy in ("random", "adversarial") else [0]):
            run = execute(mg, machine, policy=policy, seed=seed, rate_limit=False,
                          poison=True)
            assert check_outputs(run.outputs, reference) is None, (policy, seed)


def test_listed():
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["list", "planners"]) == 0
    assert "torch-compile-offload" in out.getvalue() and "torchtune-offload" in out.getvalue()
    assert "max_fwd_stash_size" in out.getvalue() and "activation_reload_prefetch" in \
        out.getvalue()


# -- torch-compile-offload ------------------------------------------------------------------------
@pytest.mark.parametrize("workload", [CHAIN, WORKLOADS[2], WORKLOADS[4], WORKLOADS[6]])
def test_torch_compile_moves_each_saved_activation_once(workload):
    """Every saved activation (not a weight, not a forward output) leaves its GPU once, after
    its last forward reader, and comes back once, before its first backward reader."""
    graph = build_workload(workload)
    mg = plan(graph, machine_for(graph), "torch-compile-offload")
    step = Training(graph, "test")
    saved = step.saved()
    outputs = set(step.parts.outputs)
    offloads, reloads, loads = moves(mg, "offload"), moves(mg, "reload"), moves(mg, "load")
    on_gpu = [s for s in saved if graph[s.tensor].out_device != HOST]
    assert sorted(offloads) == sorted({s.tensor for s in on_gpu})
    assert not outputs & set(offloads)
    assert all(graph[x].category != "weights" for x in offloads)
    for s in on_gpu:
        (off,) = offloads[s.tensor]
        (back,) = reloads[s.tensor]
        assert set(s.forward) <= ancestors(mg, off)           # after its last forward use
        assert mg[back].inputs == (off,)
        first = min(s.backward, key=step.at.__getitem__)
        assert back in mg.pred[first]                          # before its first backward use
        assert all(mg[r].inputs.count(back) for r in s.backward)
    for s in saved:
        if graph[s.tensor].out_device == HOST:              # the batch: loaded again
            assert len([x for x in loads[s.tensor] if mg[x].device == s.gpu]) == 2


def test_torch_compile_prefetch_covers_the_transfer_time():
    """A reload is issued where the compute before its first use takes its estimated transfer
    time (bytes / cpu_gpu_bw), or at the start of the backward; without prefetch, just before
    its first use."""
    graph = build_workload(CHAIN)
    machine = machine_for(graph)
    step = Training(graph, "test")
    for bw, prefetch in ((50.0, True), (0.001, True), (50.0, False)):
        mg = plan(graph, machine, f"torch-compile-offload:cpu_gpu_bw={bw},"
                                  f"activation_reload_prefetch={str(prefetch).lower()}")
        order = sorted(mg.vertices, key=lambda v: mg[v].order)
        for x, (back,) in moves(mg, "reload").items():
            first = min(readers(mg, back), key=lambda v: mg[v].order)
            between = [v for v in order[order.index(back) + 1:order.index(first)]
                       if mg[v].kind == "compute"]
            stretch = step.stretch(first, "gpu0")
            if not prefetch:
                assert between == []
                continue
            covered = sum(machine.task_seconds(graph, graph[v]) for v in between)
            need = graph[x].bytes / (bw * GIB)
            starts = not between or between[0] == stretch[0] or order.index(back) < \
                order.index(stretch[0])
            assert covered >= need or starts, (x, covered, need)
            if bw == 50.0:      # 50 GB/s: a few microseconds, one vertex of 0.1 s covers it
                assert len([v for v in between if graph[v].time]) <= 1


def test_torch_compile_sink_wait():
    """With sink_wait the compute stream waits for the offloads only where the backward
    starts; without it, right after each."""
    graph = build_workload(CHAIN)
    machine = machine_for(graph)
    step = Training(graph, "test")
    for sink in (True, False):
        mg = plan(graph, machine, f"torch-compile-offload:activation_offload_sink_wait="
                                  f"{str(sink).lower()}")
        for x, (off,) in moves(mg, "offload").items():
            waiting = [v for v in mg.succ[off] if mg[v].kind == "compute"]
            last = max((r for r in graph.succ[x] if r in step.forward), key=step.at.get)
            after = [v for v in step.computes("gpu0") if step.at[v] > step.at[last]
                     and not (sink and v in step.forward)]
            assert waiting == after[:1]
            assert sink or step.at[after[0]] == step.at[last] + 1


# -- torchtune-offload ----------------------------------------------------------------------------
def stash_counts(graph, size: int, smallest: int) -> tuple[int, int]:
    """Offloads and reloads torchtune makes: every saved GPU tensor of ``smallest`` bytes or
    more is offloaded; per GPU and iteration the last ones in the stash stay: those whose
    tensor id (counting every saved tensor) is above the last offloaded one's less ``size``."""
    step = Training(graph, "test")
    offloads = reloads = 0
    by_pass: dict[tuple[str, int], list] = {}
    for s in step.saved():
        by_pass.setdefault((s.gpu, step.pass_of[s.forward[0]]), []).append(s)
    for saved in by_pass.values():
        big = [(i, s) for i, s in enumerate(saved, 1) if graph[s.tensor].bytes >= smallest]
        offloads += sum(graph[s.tensor].out_device != HOST for _, s in big)
        if big:
            last = big[-1][0]
            reloads += sum(1 for i, _ in big if i <= last - size)
    return offloads, reloads


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 8), smallest=st.sampled_from([1, 1024, 60_000, 90_000, 10**6]),
       workload=st.sampled_from([CHAIN, WORKLOADS[4], WORKLOADS[1]]))
def test_torchtune_offloads_the_big_ones_and_keeps_the_last(size, smallest, workload):
    graph = build_workload(workload)
    machine = machine_for(graph)
    mg = plan(graph, machine, f"torchtune-offload:max_fwd_stash_size={size},"
                              f"min_offload_size={smallest}")
    verify(mg, graph, machine)
    offloads, reloads = stash_counts(graph, size, smallest)
    assert sum(map(len, moves(mg, "offload").values())) == offloads
    assert sum(map(len, moves(mg, "reload").values())) + sum(
        len(v) - 1 for x, v in moves(mg, "load").items() if graph[x].category == "activations"
    ) == reloads
    assert all(graph[x].bytes >= smallest for x in moves(mg, "offload"))


def test_torchtune_without_streams_reloads_everything_just_in_time():
    graph = build_workload(CHAIN)
    mg = plan(graph, machine_for(graph), "torchtune-offload:use_streams=false")
    offloads = moves(mg, "offload")
    assert sorted(moves(mg, "reload")) == sorted(offloads)
    for (off,) in offloads.values():                    # the compute stream waits for it
        assert [v for v in mg.succ[off] if mg[v].kind == "compute"]


def test_torchtune_prefetches_one_vertex_ahead():
    """With streams a reload waits for the backward vertex two before its first use, and so
    overlaps the one just before it."""
    graph = build_workload(CHAIN)
    mg = plan(graph, machine_for(graph), "torchtune-offload:min_offload_size=1,"
                                         "max_fwd_stash_size=1")
    step = Training(graph, "test")
    for (back,) in moves(mg, "reload").values():
        first = min(readers(mg, back), key=lambda v: mg[v].order)
        runs = step.stretch(first, "gpu0")
        k = runs.index(first)
        waits = {v for v, kind in mg.pred[back].items() if kind == "memory"
                 and mg[v].kind == "compute"}
        if k >= 2:
            assert runs[k - 2] in waits and runs[k - 1] not in ancestors(mg, back)
        else:                           # at the backward's start: after the forward's end
            assert step.neighbour(runs[0], "gpu0", later=False) in waits


# -- refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["torch-compile-offload", "torchtune-offload"])
@pytest.mark.parametrize("workload", ["llama-prefill:model=tiny,seq=32,batch=1,gpus=1,block=32",
                                      "matmul-chain:layers=2,gpus=1", "random:vertices=40",
                                      "model:name=mlp,mode=infer"])
def test_other_graphs_refused(workload, spec):
    graph = build_workload(workload)
    with pytest.raises(PlanError) as err:
        plan(graph, machine_for(graph), spec)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{spec} plans training steps")


def test_cpu_updates_refused():
    graph = build_workload(CHAIN)
    update = next(t for t in graph if t.op == "adam_update")
    graph.tasks[update.id] = replace(update, device="cpu")
    with pytest.raises(PlanError, match="on the CPU"):
        plan(graph, machine_for(graph), "torchtune-offload")


@pytest.mark.parametrize("spec", ["torch-compile-offload", "torchtune-offload"])
def test_too_little_memory_is_an_oom(spec):
    graph = build_workload(CHAIN)
    with pytest.raises(PlanError) as err:
        plan(graph, machine_for(graph, "700KB"), spec)
    message = str(err.value)
    assert "\n" not in message and "bytes short" in message and "run out of memory" in message
    assert message.startswith(spec)


@pytest.mark.parametrize("spec,problem", [
    ("torchtune-offload:max_fwd_stash_size=0", "at least 1"),
    ("torchtune-offload:min_offload_size=-1", "min_offload_size"),
    ("torch-compile-offload:cpu_gpu_bw=0", "cpu_gpu_bw")])
def test_bad_options_refused(spec, problem):
    graph = build_workload(CHAIN)
    with pytest.raises(PlanError, match=problem):
        plan(graph, machine_for(graph), spec)


def test_saved_are_the_anatomy_s():
    graph = build_workload(WORKLOADS[3])
    step = Training(graph, "test")
    assert {s.tensor for s in step.saved()} == set(anatomy.saved(graph)[0])
