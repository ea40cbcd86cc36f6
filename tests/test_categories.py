"""Tensor categories on the TaskGraph (issue 45): set by the builders, written and read by both
readers, refused when unknown, kept out of the content hash and the plans; and the anatomy of
a training step (offloadlab/core/anatomy.py) on every training workload."""

from __future__ import annotations

import gc
import json
from collections import Counter
from dataclasses import replace

import pytest
from conftest import need_torch
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core import anatomy, formats
from offloadlab.core.errors import GraphError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.taskgraph import CATEGORIES, UNKNOWN, Task, TaskGraph, _hashed
from offloadlab.core.workloads import build_workload
from offloadlab.core.workloads.pipeline import pipeline
from offloadlab.planner import plan

TRAINING = ("training-chain:iterations=2", "gpt2-train:depth=3,iterations=2",
            "bert-train:depth=2,iterations=1",
            "llama-lora-train:model=tiny,seq=64,batch=2,gpus=2,block=32",
            "llama-lora-train:model=tiny,seq=64,batch=1,gpus=1,block=32,checkpoint=false",
            "llama-lora-train:model=tiny,seq=32,batch=1,gpus=1,block=32,optimizer=sgd",
            "model:name=mlp,mode=train,gpus=2", "model:name=resnet18,mode=train",
            "model:name=gpt2,mode=train")


def strip(graph: TaskGraph) -> TaskGraph:
    """``graph`` without categories."""
    return TaskGraph(graph.name, dict(graph.meta),
                     {t.id: replace(t, category=UNKNOWN) for t in graph})


def by_category(graph: TaskGraph) -> dict[str, set[str]]:
    """Category -> the ops (or kinds, for inputs and transfers) of its vertices."""
    found: dict[str, set[str]] = {}
    for t in graph:
        found.setdefault(str(t.category), set()).add(t.op or t.kind)
    return found


# -- the builders -----------------------------------------------------------------------------
def test_training_chain_categories():
    g = build_workload("training-chain:iterations=2")
    cats = {t.id: t.category for t in g}
    assert cats["w1@0"] == "weights" and cats["w1@1"] == "weights"
    assert cats["a0@1"] == "activations" and cats["F2@1"] == "activations"
    assert cats["G2@1"] == "gradients" and cats["B2@1"] == "gradients"
    assert by_category(g) == {"weights": {"input", "adam_update"},
                              "activations": {"input", "layer_forward"},
                              "gradients": {"weight_grad", "layer_backward"}}
    assert {t.category for t in build_workload("gpt2-train:depth=2")} == \
        {"weights", "activations", "gradients"}


def test_llama_prefill_categories():
    g = build_workload("llama-prefill:model=tiny,seq=32,batch=2,gpus=2,block=16")
    assert all(t.category == ("activations" if t.kind != "input" or t.id.startswith("tokens")
                              else "weights") for t in g)
    moved = [t for t in g if t.kind == "transfer"]
    assert moved and all(t.category == g[t.inputs[0]].category for t in moved)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_llama_lora_categories(checkpoint):
    g = build_workload(f"llama-lora-train:model=tiny,seq=64,batch=1,gpus=2,block=32,"
                       f"checkpoint={str(checkpoint).lower()}")
    compute = [t for t in g if t.kind == "compute"]
    forward = g.meta["forward"]
    assert {t.category for t in compute[:forward]} == {"activations"}
    later = Counter(t.category for t in compute[forward:])
    assert set(later) == {"gradients", "weights"} | ({"workspace"} if checkpoint else set())
    assert all(t.id.startswith("re.") for t in compute if t.category == "workspace")
    assert all(t.op == "adam_update" for t in compute if t.category == "weights")
    inputs = {t.id: t.category for t in g if t.kind == "input"}
    assert inputs["tokens.b0"] == inputs["labels.b0"] == "activations"
    assert inputs["L0.lora_A.q"] == inputs["L0.wq.h0"] == inputs["embed"] == "weights"


def test_import_torch_categories():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                 torch.nn.ReLU(), torch.nn.Linear(16, 4))
    g = from_torch(module, torch.randn(4, 8), train=True, gpus=2, loss="cross_entropy",
                   target=torch.zeros(4, dtype=torch.long))
    cats = {t.id: t.category for t in g}
    params = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    assert {cats[p] for p in params} == {"weights"}
    assert cats["input"] == cats["target"] == "activations"
    compute = [t for t in g if t.kind == "compute"]
    forward = g.meta["forward"]
    assert {t.category for t in compute[:forward]} <= {"activations", "weights"}
    assert [t.id for t in compute[:forward] if t.category == "weights"] == ["add_"]  # a buffer
    assert all(t.category == ("weights" if t.id.endswith("@updated") else "gradients")
               for t in compute[forward:])
    assert all(t.category == g[t.inputs[0]].category for t in g if t.kind == "transfer")
    step = anatomy.training_step(g)
    copies = {t.id for t in g if t.kind == "transfer"}
    assert step.saved and set(step.saved) <= {t.id for t in compute[:forward]} | copies | {
        "input", "target"}                      # the batch, saved for the loss's backward
    assert set(step.updates) == {t.id for t in compute if t.id.endswith("@updated")}
    inference = from_torch(module, torch.randn(4, 8))
    assert {t.category for t in inference if t.kind == "compute"} <= {"activations", "weights"}


def test_pipeline_keeps_categories():
    g = build_workload("training-chain:iterations=1")
    placed = pipeline(g, 2)
    assert all(placed[t.id].category == t.category for t in g)
    assert all(t.category == placed[t.inputs[0]].category for t in placed
               if t.kind == "transfer")


# -- formats, validation, hash ----------------------------------------------------------------
def test_round_trip_by_both_readers():
    g = build_workload("llama-lora-train:model=tiny,seq=32,batch=1,gpus=2,block=32")
    text = formats.to_json(g)
    for back in (formats.taskgraph_from_json(text), formats.taskgraph_from_dict(json.loads(text))):
        assert [t.category for t in back] == [t.category for t in g]
    assert [n.get("category") for n in formats.to_dict(g)["nodes"]] == [t.category for t in g]


def test_unknown_is_left_out_of_files():
    g = strip(build_workload("training-chain:iterations=1"))
    assert '"category"' not in formats.to_json(g)
    assert all("category" not in n for n in formats.to_dict(g)["nodes"])
    data = json.loads(formats.to_json(build_workload("training-chain:iterations=1")))
    for n in data["nodes"]:
        n["category"] = None                        # null reads as unknown
    assert {t.category for t in formats.taskgraph_from_json(json.dumps(data))} == {UNKNOWN}
    assert {t.category for t in formats.taskgraph_from_dict(data)} == {UNKNOWN}


@pytest.mark.parametrize("value", ["weight", "Weights", 5, ["weights"], ""])
def test_unknown_category_refused(value, tmp_path):
    data = json.loads(formats.to_json(build_workload("training-chain:iterations=1")))
    data["nodes"][2]["category"] = value
    vertex = data["nodes"][2]["id"]
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GraphError) as err:
        formats.taskgraph_from_json(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and repr(vertex) in message
    assert "category" in message and json.dumps(value).strip('"') in message.replace("'", '"')
    g = build_workload("training-chain:iterations=1")
    g[vertex].category = value
    with pytest.raises(GraphError, match=f"vertex {vertex!r}: unknown category"):
        g.validate()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from((UNKNOWN, *CATEGORIES)), min_size=9, max_size=9))
def test_categories_stay_out_of_the_hash(cats):
    g = strip(build_workload("training-chain:uF=0.1;0.1,uB=0.2;0.2,w=4MB;4MB,a=1MB;1MB,"
                             "iterations=1"))
    before = g.content_hash()
    for t, cat in zip(g, cats):
        t.category = cat
    assert g.content_hash() == before
    assert formats.taskgraph_from_json(formats.to_json(g)).content_hash() == before


def test_hash_is_that_of_the_vertices_without_categories():
    """The hash as it was before categories (a MemGraph recorded then names it): the
    MessagePack of the meta, then of the vertices' other fields, a block at a time."""
    import hashlib

    import msgspec
    g = build_workload("training-chain:iterations=1")
    assert len(g) < 10_000                          # one block (HASH_BLOCK)
    encode = msgspec.msgpack.encode
    fields = ("id", "kind", "device", "bytes", "inputs", "op", "flops", "shape", "dtype", "time")
    digest = hashlib.sha256(encode(g.meta))
    digest.update(encode([{f: getattr(t, f) for f in fields} for t in g]))
    assert g.content_hash() == "sha256:" + digest.hexdigest()


HASHED = ("id", "kind", "device", "bytes", "inputs", "op", "flops", "shape", "dtype", "time")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.builds(
    Task, st.text(max_size=4), st.sampled_from(("input", "compute", "transfer")),
    st.sampled_from(("host", "gpu0", "cpu", "gpu0->gpu1")), st.integers(1, 2**40),
    st.lists(st.text(max_size=3), max_size=3).map(tuple),
    st.none() | st.sampled_from(("add", "matmul")),
    st.integers(0, 2**40) | st.floats(0, 1e15), st.none() | st.lists(
        st.integers(0, 9), max_size=3).map(tuple),
    st.sampled_from(("float32", "bfloat16")),
    st.none() | st.integers(0, 9) | st.floats(0, 9),
    st.sampled_from((UNKNOWN, *CATEGORIES))), max_size=12))
def test_hashed_vertices_encode_as_their_fields(tasks):
    """What content_hash encodes of each vertex (``_hashed``, copies where one differs) is the
    map of its fields but the category, ``flops`` and ``time`` as floats."""
    import msgspec

    def plain(t: Task) -> dict:
        fields = {f: getattr(t, f) for f in HASHED}
        fields["flops"] = float(t.flops)
        fields["time"] = None if t.time is None else float(t.time)
        return fields
    encode = msgspec.msgpack.encode
    assert encode(_hashed(tasks)) == encode([plain(t) for t in tasks])


def test_hashing_leaves_nothing_for_the_collector():
    """The copies a graph with categories is hashed through are not tracked by the cyclic
    collector: hashing a large graph made a copy per vertex that triggered full collections
    over the whole heap (3 s of planning 7B LoRA at batch 8)."""
    g = build_workload("llama-lora-train:model=tiny,seq=64,batch=2,gpus=1,block=32")
    hashed = _hashed(list(g))
    assert hashed and not any(gc.is_tracked(t) for t in hashed)


@pytest.mark.parametrize("planner", ["buildmemgraph", "levelwise", "cotrain"])
def test_plans_do_not_see_categories(planner):
    g = build_workload("gpt2-train:depth=3,iterations=2")
    machine = machine_from_spec("v100:gpu_memory=2GB")
    assert formats.to_json(plan(g, machine, planner)) == \
        formats.to_json(plan(strip(g), machine, planner))


# -- the anatomy of a training step -----------------------------------------------------------
@pytest.mark.parametrize("spec", TRAINING)
def test_anatomy_of_training_steps(spec):
    g = build_workload(spec)
    step = anatomy.training_step(g)
    compute = [t.id for t in g if t.kind == "compute"]
    assert sorted(step.forward + step.backward + step.updates) == sorted(compute)
    assert not set(step.forward) & set(step.backward)
    assert step.updates and all(g[u].category in ("weights", UNKNOWN) for u in step.updates)
    behind, ahead = set(step.backward), set(step.forward)
    succ = g.succ
    for v in step.saved:                            # read by the backward (maybe via a copy)
        readers = set(succ[v]) | {r for c in succ[v] if g[c].kind == "transfer"
                                  for r in succ[c]}
        assert readers & behind, v
    assert not set(step.saved) & set(step.outputs)
    assert all(not set(succ[v]) & ahead for v in step.outputs)
    assert step.saved and step.outputs
    cats = anatomy.category(g)
    assert set(step.weights) == {v for v, c in cats.items() if c == "weights"}
    assert set(step.updates) <= set(step.weights)
    assert set(step.backward) - {v for v in step.backward if g[v].category == "workspace"} \
        <= set(step.gradients)
    assert step.optimizer_state == []               # no builder has optimizer state vertices


@pytest.mark.parametrize("spec", ["training-chain:iterations=2", "gpt2-train:depth=3",
                                  "llama-lora-train:model=tiny,seq=64,batch=1,gpus=2,block=32,"
                                  "checkpoint=false"])
def test_anatomy_from_structure_agrees_with_categories(spec):
    """Without categories the structure gives the same parts (but the batch, which only its
    category tells from a frozen weight), and the same category to every compute vertex."""
    g = build_workload(spec)
    bare = strip(g)
    step, found = anatomy.training_step(g), anatomy.training_step(bare)
    assert found == replace(step, weights=found.weights,
                            saved=[v for v in step.saved if g[v].kind != "input"])
    cats = anatomy.category(bare)
    assert all(cats[t.id] == t.category for t in g if t.kind == "compute")


def test_chain_saved_activations():
    step = anatomy.training_step(build_workload("training-chain:iterations=1"))
    assert step.saved == ["a0@1", "F1@1", "F2@1", "F3@1"]
    assert step.outputs == ["F4@1"]                 # δ^L: the backward starts from it
    assert step.forward == ["F1@1", "F2@1", "F3@1", "F4@1"]
    assert step.updates == ["w4@1", "w3@1", "w2@1", "w1@1"]


@pytest.mark.parametrize("spec", ["llama-prefill:model=tiny,seq=32,batch=1,gpus=1,block=32",
                                  "matmul-chain:layers=2,gpus=1", "random:vertices=50,gpus=1",
                                  "model:name=mlp,mode=infer"])
def test_not_a_training_step(spec):
    with pytest.raises(GraphError) as err:
        anatomy.training_step(build_workload(spec))
    assert "\n" not in str(err.value)
