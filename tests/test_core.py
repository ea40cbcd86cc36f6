import copy
import dataclasses
import gc
import json
import pickle
import re

import pytest

from offloadlab.core import GraphError, MemGraph, SpecError, TaskGraph, formats
from offloadlab.core.machine import PRESETS, Machine, MiB, machine_from_spec
from offloadlab.core.memgraph import Loc, MemVertex
from offloadlab.core.spec import parse_bytes, parse_spec
from offloadlab.core.util import no_gc
from offloadlab.core.workloads import WORKLOADS, build_workload
from offloadlab.planner import plan
from offloadlab.simulator import simulate


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
    with pytest.raises(SpecError, match="gpu_memory must be a positive integer"):
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
    formats.to_json(g, path)
    data = json.loads(path.read_text())
    assert data["directed"] is True and {"nodes", "edges", "graph"} <= set(data)
    h = formats.taskgraph_from_json(path)
    assert [t.id for t in h] == [t.id for t in g]
    assert all(h[t.id] == t for t in g)
    nx_graph = formats.to_networkx(g)
    assert nx_graph.number_of_nodes() == len(g)
    assert nx_graph.has_edge("Y1.0", "X2.0")


def test_memgraph_json_round_trip(disco):
    g = build_workload("matmul-chain:layers=2")
    mg = plan(g, disco, "buildmemgraph")
    back = formats.memgraph_from_json(formats.to_json(mg))
    assert list(back.vertices) == list(mg.vertices)
    assert all(back[v.id] == v for v in mg)
    assert sorted(back.edges()) == sorted(mg.edges())
    assert back.graph["planner"] == "buildmemgraph"
    assert formats.to_networkx(back).number_of_edges() == len(list(mg.edges()))


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
        formats.taskgraph_from_dict(_bad([a, {"id": "b", "kind": "compute", "device": "gpu0",
                                               "op": "add", "bytes": 8, "inputs": ["a", "c"]},
                                           {"id": "c", "kind": "compute", "device": "gpu0",
                                            "op": "add", "bytes": 8, "inputs": ["b"]}]))
    with pytest.raises(GraphError, match="vertex 'b': unknown op 'conv9'"):
        formats.taskgraph_from_dict(_bad([a, {"id": "b", "kind": "compute", "device": "gpu0",
                                               "op": "conv9", "bytes": 8, "inputs": ["a"]}]))
    with pytest.raises(GraphError, match="vertex 'a': bytes must be a positive integer"):
        formats.taskgraph_from_dict(_bad([dict(a, bytes=0)]))
    with pytest.raises(GraphError, match="vertex 'a': bytes must be a positive integer"):
        formats.taskgraph_from_dict(_bad([dict(a, bytes=-5)]))
    with pytest.raises(GraphError, match="input 'zz' is not a vertex"):
        formats.taskgraph_from_dict(_bad([a, {"id": "b", "kind": "compute", "device": "gpu0",
                                               "op": "add", "bytes": 8, "inputs": ["zz"]}]))
    with pytest.raises(GraphError, match="malformed JSON"):
        formats.taskgraph_from_json('{"nodes": [')


def test_from_json_names_the_file(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(GraphError, match="broken.json.*malformed JSON"):
        formats.taskgraph_from_json(bad)
    with pytest.raises(GraphError, match="cannot read.*missing.json"):
        formats.memgraph_from_json(tmp_path / "missing.json")


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


class _Cycle:
    def __init__(self):
        self.me = self


def _garbage_cycle():
    """A weak reference to a reference cycle that nothing else holds."""
    import weakref
    return weakref.ref(_Cycle())


def test_no_gc_leaves_a_small_blocks_garbage_to_the_young_collections():
    gc.collect()
    dead = _garbage_cycle()
    with no_gc():
        pass
    gc.collect(1)
    assert dead() is None


def test_no_gc_promotes_a_large_blocks_objects_and_then_collects_them_in_full(monkeypatch):
    from offloadlab.core import util
    monkeypatch.setattr(util, "PROMOTE_AT", 0)
    monkeypatch.setattr(util, "_promoted", 0)
    monkeypatch.setattr(util, "_largest", 0)
    gc.collect()
    dead = _garbage_cycle()
    kept = []
    with no_gc():
        kept.append([[] for _ in range(100)])
    gc.collect(1)
    assert dead() is not None          # promoted, out of the young collections' reach
    for _ in range(8):                 # blocks promoting as much: a full collection follows
        with no_gc():
            kept.append([[] for _ in range(100)])
    assert dead() is None


# -- bad input, at the readers (issue 16) ------------------------------------------------------
def _graph(**b_fields):
    """A two-vertex TaskGraph dict; ``b_fields`` override vertex 'b''s fields."""
    a = {"id": "a", "kind": "input", "device": "gpu0", "bytes": 1024}
    b = {"id": "b", "kind": "compute", "device": "gpu0", "op": "add", "bytes": 1024,
         "inputs": ["a"], **b_fields}
    return _bad([a, b], [{"source": "a", "target": "b"}])


@pytest.mark.parametrize("field, value, must", [
    ("bytes", "abc", "bytes must be a positive integer, got 'abc'"),
    ("bytes", 1.5, "bytes must be a positive integer, got 1.5"),
    ("bytes", 1024.0, "bytes must be a positive integer, got 1024.0"),
    ("bytes", -3, "bytes must be a positive integer, got -3"),
    ("bytes", True, "bytes must be a positive integer, got True"),
    ("bytes", None, "bytes must be a positive integer, got missing or null"),
    ("bytes", float("nan"), "bytes must be a positive integer, got nan"),
    ("bytes", 2**64, "bytes must be a positive integer"),
    ("flops", "x", "flops must be a finite number >= 0, got 'x'"),
    ("flops", True, "flops must be a finite number >= 0, got True"),
    ("flops", float("nan"), "flops must be a finite number >= 0, got nan"),
    ("flops", float("inf"), "flops must be a finite number >= 0, got inf"),
    ("flops", -1.0, "flops must be a finite number >= 0, got -1.0"),
    ("time", float("-inf"), "time must be a finite number >= 0, got -inf"),
    ("time", "1", "time must be a finite number >= 0, got '1'"),
])
def test_taskgraph_reader_checks_number_fields(field, value, must):
    with pytest.raises(GraphError) as info:
        formats.taskgraph_from_json(json.dumps(_graph(**{field: value})))
    assert f"TaskGraph JSON: vertex 'b': {must}" in str(info.value)


def test_taskgraph_file_errors_name_the_file(tmp_path):
    path = tmp_path / "tg.json"
    path.write_text(json.dumps(_graph(flops=float("nan"))))   # Python writes NaN
    assert "NaN" in path.read_text()
    with pytest.raises(GraphError, match=r"TaskGraph JSON file '.*tg\.json': vertex 'b': flops"):
        formats.taskgraph_from_json(path)


def test_validate_rejects_non_finite_numbers_from_the_api():
    g = TaskGraph()
    g.add_input("a", 1024, home="gpu0")
    g.add_compute("b", "add", ["a"], "gpu0", 1024, flops=float("nan"))
    with pytest.raises(GraphError, match="vertex 'b': flops must be a finite number >= 0, got nan"):
        g.validate()
    g["b"].flops, g["b"].time = 10, float("inf")      # an int is a number
    with pytest.raises(GraphError, match="vertex 'b': time must be a finite number >= 0, got inf"):
        g.validate()
    g["b"].time = 0.5
    g.validate()


@pytest.mark.parametrize("b_fields, message", [
    ({"kind": "conv"}, "vertex 'b': unknown kind 'conv'"),
    ({"kind": 3}, "vertex 'b': kind and device must be strings"),
    ({"device": "gpuX"}, "vertex 'b': compute device must be 'cpu' or a GPU"),
    ({"device": "gpu01"}, "vertex 'b': compute device must be 'cpu' or a GPU"),
    ({"device": "host"}, "vertex 'b': compute device must be 'cpu' or a GPU"),
    ({"kind": "transfer", "device": "gpu0->gpu0"}, "transfer device must be 'gpuI->gpuJ'"),
    ({"kind": "transfer", "device": "gpu0->"}, "transfer device must be 'gpuI->gpuJ'"),
    ({"dtype": "complex128"}, "vertex 'b': unknown dtype 'complex128'"),
    ({"op": ["add"]}, "vertex 'b': unknown op ['add']"),
    ({"kind": "transfer", "device": "gpu0->gpu1", "op": False},
     "vertex 'b': only compute vertices have an op; this transfer vertex has op False"),
    ({"shape": [16, "a"]}, "vertex 'b': shape must be a list of integers >= 0"),
    ({"shape": 16}, "vertex 'b': shape must be a list of integers >= 0"),
    ({"shape": [1024, 1024]}, "shape [1024, 1024] of float32 needs 4194304 bytes, more than"),
    ({"inputs": "a"}, "vertex 'b': inputs must be a list of vertex ids"),
    ({"id": ["b"]}, "has no 'id'"),
])
def test_taskgraph_reader_refuses_unknown_kinds_devices_and_shapes(b_fields, message):
    with pytest.raises(GraphError, match=re.escape(message)):
        formats.taskgraph_from_dict(_graph(**b_fields))


def test_taskgraph_reader_refuses_inconsistent_structure():
    a = {"id": "a", "kind": "input", "device": "gpu0", "bytes": 8}
    with pytest.raises(GraphError, match="duplicate vertex id 'a'"):
        formats.taskgraph_from_dict(_bad([a, a]))
    with pytest.raises(GraphError, match="edge 'a' -> 'zz' names unknown vertex 'zz'"):
        formats.taskgraph_from_dict(_bad([a], [{"source": "a", "target": "zz"}]))
    with pytest.raises(GraphError, match="does not list 'a' among its inputs"):
        formats.taskgraph_from_dict(_graph(inputs=[]))
    with pytest.raises(GraphError, match="lacks a 'source' or 'target'"):
        formats.taskgraph_from_dict(_bad([a], [{"source": "a"}]))
    with pytest.raises(GraphError, match="holds a 'MemGraph', not a TaskGraph"):
        formats.taskgraph_from_dict({**_bad([a]), "graph": {"type": "MemGraph"}})
    with pytest.raises(GraphError, match="not a JSON object"):
        formats.taskgraph_from_dict(_bad([a, 7]))
    with pytest.raises(GraphError, match=r"graph\.layers\[1\] is inf"):
        formats.taskgraph_from_dict({**_bad([a]), "graph": {"layers": [1, float("inf")]}})


def test_a_gpu_vertex_reading_another_gpus_tensor_needs_a_transfer(disco):
    g = TaskGraph()
    g.add_input("a", 1024, home="gpu0")
    g.add_compute("b", "add", ["a"], "gpu1", 1024)
    message = ("vertex 'b' on gpu1 reads 'a', which lives on gpu0: add a transfer vertex that "
               "copies it from gpu0 to gpu1 (TaskGraph.add_transfer)")
    with pytest.raises(GraphError, match=re.escape(message)):
        g.validate()
    for planner in ("buildmemgraph", "levelwise"):          # KeyError before issue 16
        with pytest.raises(GraphError, match=re.escape(message)):
            plan(g, disco, planner)
    with pytest.raises(GraphError, match="source 'zz' is not a vertex"):
        g.add_transfer("t", "zz", "gpu1")
    odd = TaskGraph()
    odd.add_input("a", 1024, home="gpuX")
    for planner in ("buildmemgraph", "levelwise"):          # ValueError before issue 16
        with pytest.raises(GraphError, match="input home must be 'host' or a GPU"):
            plan(odd, disco, planner)
    fixed = TaskGraph()
    fixed.add_input("a", 1024, home="gpu0")
    fixed.add_transfer("a>gpu1", "a", "gpu1")
    fixed.add_compute("b", "add", ["a>gpu1"], "gpu1", 1024)
    fixed.add_input("w", 1024)                               # host tensors are loaded
    fixed.add_compute("c", "add", ["b", "w"], "gpu1", 1024)
    fixed.add_compute("d", "add", ["b"], "cpu", 1024)        # the CPU reads GPU tensors too
    fixed.validate()
    plan(fixed, disco, "buildmemgraph")


def test_node_link_links_is_a_synonym_of_edges(disco):
    g = build_workload("matmul-chain:layers=2")
    data = formats.to_dict(g)
    for node in data["nodes"]:
        del node["inputs"]                                   # the edges are all there is
    data["links"] = data.pop("edges")
    assert formats.taskgraph_from_dict(data).tasks == g.tasks
    data["edges"] = data["links"]                            # both, the same: fine
    assert formats.taskgraph_from_dict(data).tasks == g.tasks
    data["edges"] = data["links"][1:]
    with pytest.raises(GraphError, match="both 'edges' and 'links', with different contents"):
        formats.taskgraph_from_dict(data)
    del data["edges"], data["links"]
    with pytest.raises(GraphError, match="needs an 'edges' list"):
        formats.taskgraph_from_dict(data)
    mg = plan(g, disco)
    mdata = formats.to_dict(mg)
    mdata["links"] = mdata.pop("edges")
    assert sorted(formats.memgraph_from_dict(mdata).edges()) == sorted(mg.edges())
    del mdata["links"]
    with pytest.raises(GraphError, match="needs an 'edges' list"):
        formats.memgraph_from_dict(mdata)


def _memgraph_dict(disco):
    return formats.to_dict(plan(build_workload("matmul-chain:layers=2"), disco))


@pytest.mark.parametrize("change, message", [
    (lambda n: n.update(bytes="abc"), "bytes must be a positive integer, got 'abc'"),
    (lambda n: n.update(bytes=1.5), "bytes must be a positive integer, got 1.5"),
    (lambda n: n.update(flops=float("nan")), "flops must be a finite number >= 0, got nan"),
    (lambda n: n.update(time=float("inf")), "time must be a finite number >= 0, got inf"),
    (lambda n: n.update(order=-1), "order must be an integer >= 0, got -1"),
    (lambda n: n["loc"].update(offset=-8), "loc.offset must be an integer >= 0, got -8"),
    (lambda n: n["loc"].update(size=True), "loc.size must be a positive integer, got True"),
    (lambda n: n["loc"].update(device="gpu"), "loc.device must be a GPU"),
    (lambda n: n.update(loc=[0, 8]), "loc must be null or an object"),
    (lambda n: n.update(kind="evict"), "unknown kind 'evict'"),
    (lambda n: n.update(device="tpu0"), "compute device must be 'cpu' or a GPU"),
    (lambda n: n.update(op="conv9"), "unknown op 'conv9'"),
    (lambda n: n.update(dtype="float8"), "unknown dtype 'float8'"),
    (lambda n: n.update(task=5), "task must be a string, got 5"),
    (lambda n: n.update(inputs="X1.0"), "inputs must be a list of vertex ids"),
])
def test_memgraph_reader_checks_every_field(disco, change, message):
    data = _memgraph_dict(disco)
    node = next(n for n in data["nodes"] if n["id"] == "X2.0")
    change(node)
    with pytest.raises(GraphError) as info:
        formats.memgraph_from_json(json.dumps(data))
    assert f"MemGraph JSON: vertex 'X2.0': {message}" in str(info.value)


def test_memgraph_reader_refuses_bad_edges_and_moves(disco):
    data = _memgraph_dict(disco)
    load = next(n for n in data["nodes"] if n["kind"] == "load")
    load["device"] = "cpu"
    with pytest.raises(GraphError, match="an load vertex's device must be a GPU|load vertex's"):
        formats.memgraph_from_dict(data)
    data = _memgraph_dict(disco)
    data["edges"][0]["kind"] = "control"
    with pytest.raises(GraphError, match="has unknown kind 'control'"):
        formats.memgraph_from_dict(data)
    data["edges"][0].update(kind="data", target="nowhere")
    with pytest.raises(GraphError, match="names unknown vertex 'nowhere'"):
        formats.memgraph_from_dict(data)
    data = _memgraph_dict(disco)
    data["nodes"].append(dict(data["nodes"][0]))
    with pytest.raises(GraphError, match="duplicate vertex id"):
        formats.memgraph_from_dict(data)
    data = _memgraph_dict(disco)
    data["graph"]["type"] = "TaskGraph"
    with pytest.raises(GraphError, match="holds a 'TaskGraph', not a MemGraph"):
        formats.memgraph_from_dict(data)


@pytest.mark.parametrize("field, value, message", [
    ("gpu_memory", "abc", "gpu_memory must be a positive integer, got 'abc'"),
    ("gpu_memory", float("nan"), "gpu_memory must be a positive integer, got nan"),
    ("gpu_memory", -1, "gpu_memory must be a positive integer, got -1"),
    ("gpu_memory", 10**30, "gpu_memory must be a positive integer, got 1.000e+30 (a count must "
                           "be below 2**63)"),
    ("gpus", True, "gpus must be a positive integer, got True"),
    ("h2d_bandwidth", float("nan"), "h2d_bandwidth must be a number > 0, not NaN"),
    ("h2d_bandwidth", -5, "h2d_bandwidth must be a number > 0"),
    ("kernel_latency", float("inf"), "kernel_latency must be a finite number >= 0, got inf"),
    ("duplex", float("nan"), "duplex must be a finite number > 0, got nan"),
    ("name", 7, "name must be a string, got 7"),
    ("op_rates", [["add", float("inf"), 1.0]], "op_rates entries must be"),
    ("op_rates", "fast", "op_rates must be a list"),
    ("gpus_per_bus", -1, "gpus_per_bus must be an integer >= 0, got -1"),
    ("gpus_per_bus", 1.5, "gpus_per_bus must be an integer >= 0, got 1.5"),
    ("gpu_half_flops", -5, "gpu_half_flops must be a number >= 0"),
    ("host_bus_bandwidth", float("nan"), "host_bus_bandwidth must be a number >= 0, not NaN"),
])
def test_machine_from_dict_checks_every_field(field, value, message):
    data = {**PRESETS["v100"].to_dict(), field: value}
    with pytest.raises(SpecError, match=re.escape(message)):
        Machine.from_dict(data, "somewhere")


def test_machine_file_with_nan_names_file_and_field(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**PRESETS["v100"].to_dict(), "gpu_flops": float("nan")}))
    with pytest.raises(SpecError, match=r"machine file '.*m\.json': .*gpu_flops must be"):
        Machine.from_json_file(path)


def test_unlimited_rates_are_written_as_null_and_read_back(tmp_path):
    m = machine_from_spec("disco-example")
    assert m.gpu_gpu_bandwidth == float("inf")
    text = m.to_json()
    assert "Infinity" not in text and json.loads(text)["gpu_gpu_bandwidth"] is None
    assert Machine.from_dict(json.loads(text)) == m
    old = json.dumps(m.to_dict() | {"gpu_gpu_bandwidth": float("inf")})   # older files
    assert "Infinity" in old and Machine.from_dict(json.loads(old)) == m
    assert machine_from_spec("v100:h2d_bandwidth=inf").h2d_bandwidth == float("inf")
    with pytest.raises(SpecError, match="gpu_memory must be a positive integer, got None"
                       "|gpu_memory must be a positive integer, got missing or null"):
        Machine.from_dict(m.to_dict() | {"gpu_memory": None})


def test_host_buses_per_group_of_gpus():
    """``gpus_per_bus`` consecutive GPUs share a bus per direction; 0, or as many as the
    machine has, is one bus for all (the behaviour of files written before the field)."""
    m = machine_from_spec("a100x8")
    assert m.resources("load", "gpu0") == ("h2d:gpu0", "bus0:h2d")
    assert m.resources("reload", "gpu5") == ("h2d:gpu5", "bus2:h2d")
    assert m.resources("offload", "gpu7") == ("d2h:gpu7", "bus3:d2h")
    assert m.resources("transfer", "gpu0->gpu1") == ("gpu0->gpu1",)
    for spec in ("a100x8:gpus_per_bus=0", "a100x8:gpus_per_bus=8", "a100x8:gpus=2"):
        assert machine_from_spec(spec).resources("load", "gpu1") == ("h2d:gpu1", "bus:h2d")
    assert machine_from_spec("a100x8:host_bus_bandwidth=0").resources("load", "gpu1") == \
        ("h2d:gpu1",)
    assert machine_from_spec("p100x4").resources("offload", "gpu2") == ("d2h:gpu2", "bus1:d2h")


def test_new_machine_fields_round_trip_and_old_files_load(tmp_path):
    m = machine_from_spec("p100x4:gpus_per_bus=1,gpu_half_flops=inf")
    data = json.loads(m.to_json())
    assert data["gpus_per_bus"] == 1 and data["gpu_half_flops"] is None
    assert Machine.from_dict(data) == m
    # a file written before the fields: one bus for all GPUs, float16 at the fp32 rate, and
    # (before cost) the roofline
    old = {k: v for k, v in machine_from_spec("a100x8:cost=roofline").to_dict().items()
           if k not in ("gpus_per_bus", "gpu_half_flops")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = machine_from_spec(str(path))
    assert loaded.gpus_per_bus == 0 and loaded.gpu_half_flops == 0
    assert loaded.resources("load", "gpu6") == ("h2d:gpu6", "bus:h2d")
    assert loaded.duration("compute", "gpu0", 2, 19.5e12, 6, dtype="float16") == \
        pytest.approx(loaded.kernel_latency + 1.0)


def test_float16_kernels_run_at_the_half_precision_rate():
    m = machine_from_spec("a100x8:cost=roofline")
    latency = m.kernel_latency
    # flop-bound: flops / the tensor cores' rate, against the fp32 rate for float32
    assert m.duration("compute", "gpu0", 2, 312e12, 6, dtype="float16") == \
        pytest.approx(latency + 1.0)
    assert m.duration("compute", "gpu0", 4, 312e12, 12, dtype="float32") == \
        pytest.approx(latency + 312 / 19.5)
    assert m.duration("compute", "gpu0", 4, 312e12, 12) == \
        m.duration("compute", "gpu0", 4, 312e12, 12, dtype="float32")
    # memory-bound: the bytes decide, whatever the dtype
    touched = 1555 * 10**9
    for dtype in ("float16", "float32"):
        assert m.duration("compute", "gpu0", touched // 3, 1e6, touched, dtype=dtype) == \
            pytest.approx(latency + 1.0)
    # a profiled time, the CPU and measured op rates ignore it
    assert m.duration("compute", "gpu0", 2, 312e12, 6, 0.25, dtype="float16") == 0.25
    assert m.duration("compute", "cpu", 2, 2e12, 6, dtype="float16") == 1.0
    # 0: the fp32 rate
    fp32 = machine_from_spec("a100x8:gpu_half_flops=0,cost=roofline")
    assert fp32.duration("compute", "gpu0", 2, 19.5e12, 6, dtype="float16") == \
        pytest.approx(latency + 1.0)


def test_llama_prefill_in_float16_simulates_faster_on_a100x8():
    """Half the bytes to load and the tensor cores' 312 TFLOP/s against 19.5 fp32: the
    float16 prefill is faster by more than its bytes alone explain (2x) and less than the
    rates' ratio (16x); its kernels by more than 2x too."""
    m = machine_from_spec("a100x8:gpus=2")
    runs = {}
    for dtype in ("float16", "float32"):
        graph = build_workload(f"llama-prefill:model=7b,seq=4096,gpus=2,dtype={dtype}")
        runs[dtype] = simulate(plan(graph, m), m)
    speedup = runs["float32"].makespan / runs["float16"].makespan
    assert 2.5 < speedup < 16, speedup
    assert runs["float32"].busy["gpu0"] > 4 * runs["float16"].busy["gpu0"]


def test_machine_files_written_with_the_dropped_cpu_cores_field_still_load():
    m = PRESETS["a100x8"]
    assert Machine.from_dict(m.to_dict() | {"cpu_cores": 96}) == m
    with pytest.raises(SpecError, match="unknown field.*cpu_threads"):
        Machine.from_dict(m.to_dict() | {"cpu_threads": 96})


def test_everything_written_is_strict_json(disco):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    mg = plan(build_workload("matmul-chain:layers=2"), disco)
    assert strict(formats.to_json(mg))["graph"]["machine"]["gpu_gpu_bandwidth"] is None
    strict(formats.to_json(build_workload("matmul-chain:layers=2")))
    g = build_workload("tp-matmul:n=64")
    g.meta["ratio"] = float("nan")
    with pytest.raises(GraphError, match=r"cannot write TaskGraph as JSON: graph\.ratio = nan"):
        formats.to_json(g)
    mg["X1.0"].flops = float("inf")     # orjson would write null: the writer checks floats
    with pytest.raises(GraphError, match=r"cannot write MemGraph as JSON: vertex 'X1.0': "
                                         r"flops = inf is not a finite number"):
        formats.to_json(mg)


@pytest.mark.parametrize("spec, message", [
    ("random:vertices=abc", "option vertices: cannot read 'abc' as an integer"),
    ("random:vertices=1.5", "option vertices: cannot read '1.5' as an integer"),
    ("random:vertices=nan", "option vertices: cannot read 'nan' as an integer"),
    ("random:vertices=inf", "option vertices: cannot read 'inf' as an integer"),
    ("random:vertices=-1", "random: vertices must be positive, got -1"),
    ("random:window=0", "random: window must be positive, got 0"),
    ("random:input_fraction=2", "random: input_fraction is a probability, between 0 and 1"),
    ("random:host_fraction=-0.5", "random: host_fraction is a probability"),
    ("random:vertices=10,vertices=20", "option 'vertices' given twice"),
    ("random:input_fraction=nan", "option input_fraction: cannot read 'nan' as a finite number"),
    ("random:flops_per_byte=inf", "option flops_per_byte: cannot read 'inf' as a finite number"),
    ("random:colour=red", "unknown option(s) colour"),
    ("training-chain:uF=nan;0.1;0.1;0.1", "uF of layer 1 must be a finite number >= 0, got nan"),
])
def test_workload_spec_values(spec, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        build_workload(spec)


@pytest.mark.parametrize("spec, message", [
    ("p100x4:gpu_memory=nan", "option gpu_memory: cannot read 'nan'"),
    ("p100x4:gpu_memory=1.5", "option gpu_memory: cannot read '1.5'"),
    ("p100x4:gpus=inf", "option gpus: cannot read 'inf'"),
    ("p100x4:kernel_latency=inf", "option kernel_latency: cannot read 'inf' as a finite number"),
    ("p100x4:h2d_bandwidth=nan",
     "option h2d_bandwidth: cannot read 'nan' as a finite number or inf"),
    ("p100x4:duplex=nan", "option duplex: cannot read 'nan'"),
    ("p100x4:gpus=2,gpus=3", "option 'gpus' given twice"),
])
def test_machine_spec_values(spec, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        machine_from_spec(spec)


def test_byte_sizes_are_whole():
    assert parse_bytes("1.5KiB") == 1536 and parse_bytes("4e9") == 4_000_000_000
    for text in ("1.5", "nan", "inf", "-inf", "1e400"):
        with pytest.raises(SpecError, match="byte"):
            parse_bytes(text)


@pytest.mark.parametrize("chunk", [1, 2, 3, 1000])
def test_graph_files_are_written_in_chunks_that_join_into_the_same_json(chunk, disco, tmp_path):
    import io

    from offloadlab.core.checks import write_node_link
    from offloadlab.core.formats.memgraph_json import memgraph_node_link
    mg = plan(build_workload("matmul-chain:layers=3"), disco)
    out = io.BytesIO()
    write_node_link(out, *memgraph_node_link(mg), "MemGraph", chunk=chunk)
    assert json.loads(out.getvalue()) == json.loads(formats.to_json(mg))
    assert len(json.loads(out.getvalue())["edges"]) == len(formats.to_dict(mg)["edges"]) > 0
    empty = io.BytesIO()
    write_node_link(empty, {}, [], [], "graph", chunk=chunk)
    assert json.loads(empty.getvalue()) == {"directed": True, "multigraph": False, "graph": {},
                                            "nodes": [], "edges": []}
    assert formats.to_json(mg, tmp_path / "mg.json") is None
    assert formats.to_json(formats.memgraph_from_json(tmp_path / "mg.json")) == formats.to_json(mg)


def test_numbers_of_float_and_int_subclasses_are_written_as_plain_ones():
    """validate takes numpy's float64 (a float), so writing, to_dict and a graph listed out of
    order (validate's cycle check goes through networkx) take it too."""
    np = pytest.importorskip("numpy")
    g = TaskGraph()
    g.add_input("a", 8)
    g.add_compute("c", "add", ["b"], "gpu0", 8, flops=np.float64(2.0))
    g.add_compute("b", "add", ["a"], "gpu0", 8, flops=np.float64(3.0))
    g.meta["scale"] = np.float64(0.5)
    assert g.topological_order() == ["a", "b", "c"]
    data = json.loads(formats.to_json(g))
    assert data["graph"]["scale"] == 0.5 and data["nodes"][1]["flops"] == 2.0
    assert formats.to_dict(g)["nodes"][1]["flops"] == 2.0
    g.meta["odd"] = object()
    with pytest.raises(TypeError, match="cannot hold a value of type .object."):
        formats.to_json(g)


def test_host_bytes_counts_offloads_reloads_and_loads_not_transfers():
    mg = MemGraph()
    mg.add_vertex(MemVertex("x", "input", "host", 8))
    for name, kind, size in (("L", "load", 8), ("O", "offload", 3), ("R", "reload", 5),
                             ("T", "transfer", 100)):
        mg.add_vertex(MemVertex(name, kind, "gpu0", size))
    assert mg.host_bytes() == 16
    moved = mg.moved_bytes()
    assert mg.host_bytes() == moved["load"] + moved["offload"] + moved["reload"]
    assert mg.counts() == {"input": 1, "load": 1, "offload": 1, "reload": 1, "transfer": 1}
    assert all(mg.count(kind) == n for kind, n in mg.counts().items())


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy,
                                   lambda v: pickle.loads(pickle.dumps(v))])
def test_a_memvertex_copies_and_pickles_with_every_field(clone):
    """MemVertex writes its __init__ out (compiled, it is native code); copies and pickles,
    which build a vertex before restoring its fields, keep every field."""
    v = MemVertex("load:x@gpu1#3", "load", "gpu1", 64, loc=Loc("gpu1", 128, 64), task=None,
                  of="x", op=None, flops=2.5, inputs=("x",), order=7, time=0.25, shape=(4, 4),
                  dtype="float32")
    w = clone(v)
    assert w == v and w is not v
    names = [f.name for f in dataclasses.fields(MemVertex)]
    assert len(names) == 14 and [getattr(w, f) for f in names] == [getattr(v, f) for f in names]
