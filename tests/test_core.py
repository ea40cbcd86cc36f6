import gc
import json

import pytest

from offloadlab.core import GraphError, MemGraph, SpecError, TaskGraph
from offloadlab.core.machine import PRESETS, MiB, machine_from_spec
from offloadlab.core.spec import parse_bytes, parse_spec
from offloadlab.core.util import no_gc
from offloadlab.core.workloads import WORKLOADS, build_workload
from offloadlab.planner import plan


def test_parse_spec_and_sizes():
    assert parse_spec("v100:h2d_bandwidth=4e9, gpu_memory=64MiB") == (
        "v100", {"h2d_bandwidth": "4e9", "gpu_memory": "64MiB"})
    assert parse_bytes("64MiB") == 64 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("4096") == 4096
    with pytest.raises(SpecError, match="not a byte size"):
        parse_bytes("lots")
    with pytest.raises(SpecError, match="expected key=value"):
        parse_spec("v100:oops")


def test_machine_presets_and_overrides():
    for name, m in PRESETS.items():
        assert m.name == name and m.source, f"preset {name} needs a one-line source"
    m = machine_from_spec("disco-example:gpu_memory=64MiB")
    assert m.gpu_memory == 64 * MiB and m.gpus == 2
    assert machine_from_spec("v100:h2d_bandwidth=4e9").h2d_bandwidth == 4e9
    with pytest.raises(SpecError, match="unknown machine preset 'nope'"):
        machine_from_spec("nope")
    with pytest.raises(SpecError, match="unknown option.*colour"):
        machine_from_spec("v100:colour=red")
    with pytest.raises(SpecError, match="gpu_memory must be > 0"):
        machine_from_spec("v100:gpu_memory=0")


def test_disco_example_assumptions():
    """DISCO Sec. 2: a shard's transfer takes as long as its matmul; one shard fits per GPU."""
    m = machine_from_spec("disco-example")
    g = build_workload("matmul-chain")
    w, mm = g["Y1.0"], g["X2.0"]
    touched = mm.bytes + sum(g[u].bytes for u in mm.inputs)
    assert m.duration("load", "gpu0", w.bytes) == 1.0
    assert m.duration("compute", "gpu0", mm.bytes, mm.flops, touched) == 1.0
    activations = 4 * mm.bytes           # X(i) and X(i+1), two shards each
    assert activations + w.bytes <= m.gpu_memory < activations + 2 * w.bytes


def test_taskgraph_json_round_trip(tmp_path):
    g = build_workload("matmul-chain:layers=2")
    path = tmp_path / "tg.json"
    g.to_json(path)
    data = json.loads(path.read_text())
    assert data["directed"] is True and {"nodes", "edges", "graph"} <= set(data)
    h = TaskGraph.from_json(path)
    assert [t.id for t in h] == [t.id for t in g]
    assert all(h[t.id] == t for t in g)
    nx_graph = g.to_networkx()
    assert nx_graph.number_of_nodes() == len(g)
    assert nx_graph.has_edge("Y1.0", "X2.0")


def test_memgraph_json_round_trip(disco):
    g = build_workload("matmul-chain:layers=2")
    mg = plan(g, disco, "buildmemgraph")
    back = MemGraph.from_json(mg.to_json())
    assert list(back.vertices) == list(mg.vertices)
    assert all(back[v.id] == v for v in mg)
    assert sorted(back.edges()) == sorted(mg.edges())
    assert back.graph["planner"] == "buildmemgraph"
    assert back.to_networkx().number_of_edges() == len(list(mg.edges()))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_builds_and_validates(name):
    g = build_workload(name)
    g.validate()
    assert len(g) > 0 and g.outputs()


def test_workload_spec_errors():
    with pytest.raises(SpecError, match="unknown workload 'resnet'"):
        build_workload("resnet")
    with pytest.raises(SpecError, match="unknown option.*depth"):
        build_workload("matmul-chain:depth=3")
    with pytest.raises(SpecError, match="layers must be positive"):
        build_workload("matmul-chain:layers=0")
    with pytest.raises(SpecError, match="divisible"):
        build_workload("matmul-chain:hidden=10,gpus=3")


def test_matmul_chain_structure():
    g = build_workload("matmul-chain:layers=3,gpus=2")
    assert g["X2.0"].inputs == ("X1.0", "X1.1>gpu0", "Y1.0")
    assert g["X1.1>gpu0"].device == "gpu1->gpu0"
    assert g["Y3.1"].device == "host"
    assert sorted(g.outputs()) == ["X4.0", "X4.1"]
    assert len(build_workload("random:vertices=321,gpus=3,seed=4")) == 321


def _bad(nodes, edges=()):
    return {"directed": True, "graph": {}, "nodes": nodes, "edges": list(edges)}


def test_taskgraph_validation_errors():
    a = {"id": "a", "kind": "input", "device": "gpu0", "bytes": 8}
    with pytest.raises(GraphError, match="cycle"):
        TaskGraph.from_dict(_bad([a, {"id": "b", "kind": "compute", "device": "gpu0", "op": "add",
                                      "bytes": 8, "inputs": ["a", "c"]},
                                  {"id": "c", "kind": "compute", "device": "gpu0", "op": "add",
                                   "bytes": 8, "inputs": ["b"]}]))
    with pytest.raises(GraphError, match="vertex 'b': unknown op 'conv9'"):
        TaskGraph.from_dict(_bad([a, {"id": "b", "kind": "compute", "device": "gpu0",
                                      "op": "conv9", "bytes": 8, "inputs": ["a"]}]))
    with pytest.raises(GraphError, match="vertex 'a': bytes must be a positive integer"):
        TaskGraph.from_dict(_bad([dict(a, bytes=0)]))
    with pytest.raises(GraphError, match="vertex 'a': bytes must be a positive integer"):
        TaskGraph.from_dict(_bad([dict(a, bytes=-5)]))
    with pytest.raises(GraphError, match="input 'zz' is not a vertex"):
        TaskGraph.from_dict(_bad([a, {"id": "b", "kind": "compute", "device": "gpu0",
                                      "op": "add", "bytes": 8, "inputs": ["zz"]}]))
    with pytest.raises(GraphError, match="malformed JSON"):
        TaskGraph.from_json('{"nodes": [')


def test_from_json_names_the_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(GraphError, match="broken.json.*malformed JSON"):
        TaskGraph.from_json(bad)
    with pytest.raises(GraphError, match="cannot read.*missing.json"):
        MemGraph.from_json(tmp_path / "missing.json")


def test_training_chain_from_csv_and_lists(tmp_path):
    from offloadlab.core.workloads import TrainingChain
    csv = tmp_path / "layers.csv"
    csv.write_text("uF,uB,w,a\n0.1,0.2,400MB,20MB\n0.3,0.6,1GB,10MB\n")
    g = build_workload(f"training-chain:csv_path={csv},iterations=2")
    chain = TrainingChain.from_taskgraph(g)
    assert chain.uF == (0.1, 0.3) and chain.uB == (0.2, 0.6)
    assert chain.w == (400_000_000, 1_000_000_000) and chain.a == (20_000_000, 10_000_000)
    assert chain.memory_backward(2) == 2 * 10**9 + 30_000_000       # eq. (1)
    assert g["F2@2"].inputs == ("F1@2", "w2@1") and g["F2@2"].time == 0.3
    assert g["w1@2"].inputs == ("w1@1", "G1@2") and g["w1@0"].device == "host"
    same = build_workload("training-chain:uF=0.1;0.3,uB=0.2;0.6,w=400MB;1GB,a=20MB;10MB,"
                          "iterations=2")
    assert TrainingChain.from_taskgraph(same).uF == chain.uF and len(same) == len(g)


def test_training_chain_errors(tmp_path):
    with pytest.raises(SpecError, match="one value per layer"):
        build_workload("training-chain:uF=0.1;0.1,uB=0.2,w=1MB;1MB,a=1MB;1MB")
    with pytest.raises(SpecError, match="w of layer 2 must be > 0"):
        build_workload("training-chain:uF=0.1;0.1,uB=0.2;0.2,w=1MB;0,a=1MB;1MB")
    bad = tmp_path / "bad.csv"
    bad.write_text("uF,uB,w\n0.1,0.2,1MB\n")
    with pytest.raises(SpecError, match="lacks column 'a'"):
        build_workload(f"training-chain:csv_path={bad}")
    with pytest.raises(SpecError, match="cannot read CSV"):
        build_workload(f"training-chain:csv_path={tmp_path / 'none.csv'}")


def test_no_gc_restores_the_collector_and_keeps_frozen_objects_frozen():
    with no_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with no_gc():
            pass
        assert gc.get_freeze_count() == frozen > 0
    finally:
        gc.unfreeze()
