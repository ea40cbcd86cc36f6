"""Property test of the CLI's contract on bad input (issue 16): malformed TaskGraph and MemGraph
files, made by mutating valid files the toolkit wrote, thrown at ``plan --taskgraph`` and
``simulate`` in-process.  Every run must exit 0 (the mutation left the file valid) or 2 with
exactly one line ``offloadlab: error: ...`` on stderr, never a traceback, and a failed run
must leave no output file behind."""

from __future__ import annotations

import json
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadlab.core import formats
from offloadlab.core.errors import OffloadlabError
from offloadlab.core.formats import nodelink, typed
from offloadlab.core.workloads import build_workload
from offloadlab.lab import beside
from offloadlab.lab.cli import main

SETTINGS = dict(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

NAMES = ["gpu0", "gpu1", "gpu7", "gpu01", "gpu", "host", "cpu", "gpu0->gpu1", "gpu1->gpu1",
         "input", "compute", "transfer", "offload", "reload", "load", "matmul", "add", "nope",
         "float32", "float64", "complex64", "X1.0", "Y1.0", "X2.0", "", "data", "memory"]
WEIRD = st.one_of(
    st.none(), st.booleans(), st.sampled_from(NAMES), st.text(max_size=6),
    st.integers(-2**70, 2**70), st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf,
                                                                     1.5, -0.0, 1e308]),
    st.lists(st.integers(-2, 4096), max_size=3), st.dictionaries(st.sampled_from(NAMES),
                                                                 st.integers(), max_size=2))
NODE_FIELDS = ["id", "kind", "device", "op", "bytes", "flops", "inputs", "shape", "dtype", "time",
               "loc", "task", "of", "order", "loc.device", "loc.offset", "loc.size"]
MACHINE_FIELDS = ["gpus", "gpu_memory", "gpu_flops", "h2d_bandwidth", "gpu_gpu_bandwidth",
                  "kernel_latency", "duplex", "streams", "op_rates", "name", "colour"]


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory) -> dict[str, dict]:
    """A TaskGraph and a MemGraph as the toolkit writes them (node-link JSON, parsed)."""
    d = tmp_path_factory.mktemp("valid")
    formats.to_json(build_workload("matmul-chain:layers=3"), d / "tg.json")
    assert main(["plan", "--workload", "matmul-chain:layers=3", "--machine", "disco-example",
                 "--out", str(d / "mg.json")]) == 0
    return {kind: json.loads((d / f"{kind}.json").read_text()) for kind in ("tg", "mg")}


@st.composite
def mutation(draw, data: dict) -> None:
    """Change ``data`` (node-link JSON, in place) in one way a broken or hand-edited file
    might differ from a valid one."""
    nodes, edges = data["nodes"], data.get("edges", [])
    what = draw(st.sampled_from(["set", "set", "set", "delete", "drop node", "duplicate node",
                                 "edge", "drop edge", "links", "graph"]))
    if what in ("set", "delete") and nodes:
        node = nodes[draw(st.integers(0, len(nodes) - 1))]
        field = draw(st.sampled_from(NODE_FIELDS))
        if field.startswith("loc.") and isinstance(node.get("loc"), dict):
            node = node["loc"]
            field = field[4:]
        if what == "delete":
            node.pop(field, None)
        else:
            node[field] = draw(WEIRD)
    elif what == "drop node" and nodes:
        del nodes[draw(st.integers(0, len(nodes) - 1))]
    elif what == "duplicate node" and nodes:
        node = draw(st.sampled_from(nodes))
        nodes.append(json.loads(json.dumps(node)))
    elif what == "edge" and edges:
        edge = edges[draw(st.integers(0, len(edges) - 1))]
        edge[draw(st.sampled_from(["source", "target", "kind"]))] = draw(WEIRD)
    elif what == "drop edge" and edges:
        del edges[draw(st.integers(0, len(edges) - 1))]
    elif what == "links":
        data["links"] = data.pop("edges", [])
        if draw(st.booleans()):                     # and the nodes forget their inputs
            for node in nodes:
                node.pop("inputs", None)
        if draw(st.booleans()):
            data["edges"] = data["links"][1:]       # both, differing
    elif what == "graph" and isinstance(data.get("graph"), dict):
        graph = data["graph"]
        if isinstance(graph.get("machine"), dict) and draw(st.booleans()):
            graph["machine"][draw(st.sampled_from(MACHINE_FIELDS))] = draw(WEIRD)
        else:
            graph[draw(st.sampled_from(["type", "name", "machine", "layers"]))] = draw(WEIRD)


@st.composite
def malformed(draw, data: dict, compact: bool = False) -> bytes:
    """The bytes of a mutated copy of ``data``: one to three mutations, then perhaps text-level
    damage (truncation, random bytes, invalid UTF-8, NaN where a number was).  ``compact``:
    laid out as the toolkit writes (no spaces), so that a large file is read in blocks."""
    data = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(1, 3))):
        draw(mutation(data))
    sep = (",", ":") if compact else (", ", ": ")
    text = json.dumps(data, separators=sep).encode()   # Python's json writes NaN and Infinity
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "insert", "utf8", "nan", "random"]))
    at = draw(st.integers(0, len(text)))
    if damage == "truncate":
        text = text[:at]
    elif damage == "insert":
        text = text[:at] + draw(st.binary(min_size=1, max_size=4)) + text[at:]
    elif damage == "utf8":
        text = text[:at] + b"\xff\xfe" + text[at:]
    elif damage == "nan":
        colon = sep[1].encode()
        text = text.replace(colon + b"0", colon + b"NaN", 1).replace(colon + b"8388608",
                                                                    colon + b"-Infinity", 1)
    elif damage == "random":
        text = draw(st.binary(max_size=64))
    return text


def check_contract(code: int, out: str, err: str, out_dir: Path) -> None:
    """Exit 0, or 2 with one ``offloadlab: error:`` line and no output left behind."""
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("offloadlab: error: ") and err.endswith("\n"), err
        assert err.count("\n") == 1 and err.strip() != "offloadlab: error:", err
        assert list(out_dir.iterdir()) == [], err
    else:
        assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]   # no temporaries


def run_cli(capsys, argv: list[str], fork: bool = False) -> tuple[int, str, str]:
    """Run the CLI in-process; ``fork``: verifying in a child process however small the graph
    (offloadlab.lab.beside), as the plan and simulate commands do for large ones."""
    capsys.readouterr()
    saved = beside.BESIDE_AT
    beside.BESIDE_AT = 0 if fork else saved
    try:
        code = main(argv)
    finally:
        beside.BESIDE_AT = saved
    out, err = capsys.readouterr()
    return code, out, err


@settings(**SETTINGS)
@given(data=st.data(), fork=st.booleans())
def test_malformed_taskgraph_files(capsys, valid_files, data, fork):
    text = data.draw(malformed(valid_files["tg"]))
    with tempfile.TemporaryDirectory() as tmp:
        path, out_dir = Path(tmp) / "tg.json", Path(tmp) / "out"
        path.write_bytes(text)
        out_dir.mkdir()
        code, out, err = run_cli(capsys, ["plan", "--taskgraph", str(path), "--machine",
                                          "disco-example", "--out", str(out_dir / "mg.json")],
                                    fork)
        check_contract(code, out, err, out_dir)
        if code == 0:
            assert (out_dir / "mg.json").is_file()


def simulate_file(capsys, raw: bytes, name: str, fork: bool = False) -> None:
    """``simulate`` a file of the bytes ``raw`` named ``name``, writing a Chrome trace: the
    contract holds, and a run that succeeds prints a strict JSON summary and writes the trace."""
    with tempfile.TemporaryDirectory() as tmp:
        path, out_dir = Path(tmp) / name, Path(tmp) / "out"
        path.write_bytes(raw)
        out_dir.mkdir()
        code, out, err = run_cli(capsys, ["simulate", str(path), "--json", "--chrome",
                                          str(out_dir / "trace.json")], fork)
        check_contract(code, out, err, out_dir)
        if code == 0:
            summary = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
            assert summary["makespan"] >= 0
            assert (out_dir / "trace.json").is_file()


@settings(**SETTINGS)
@given(data=st.data(), fork=st.booleans())
def test_malformed_memgraph_files(capsys, valid_files, data, fork):
    simulate_file(capsys, data.draw(malformed(valid_files["mg"])), "mg.json", fork)


@settings(**SETTINGS)
@given(data=st.data(), kind=st.sampled_from(["tg", "mg"]), block=st.sampled_from([7, 64, 4096]))
def test_files_read_in_blocks_give_what_a_whole_read_gives(valid_files, data, kind, block):
    """A large file the toolkit wrote is read a block and a batch of items at a time
    (``nodelink.STREAM_AT``); on any file, valid or not, that gives the same graph or the same
    error as reading it whole."""
    text = data.draw(malformed(valid_files[kind], compact=True))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.json"
        path.write_bytes(text)
        assert outcome(FROM_JSON[kind], path) == outcome(FROM_JSON[kind], path, block)


@contextmanager
def in_blocks(block: int | None):
    """Files of any size read in blocks of ``block`` bytes by both readers (None: as usual)."""
    saved = nodelink.STREAM_AT, typed.STREAM_AT, nodelink.BLOCK
    if block is not None:
        nodelink.STREAM_AT, typed.STREAM_AT, nodelink.BLOCK = 0, 0, block
    try:
        yield
    finally:
        nodelink.STREAM_AT, typed.STREAM_AT, nodelink.BLOCK = saved


def outcome(read, path: Path, block: int | None = None) -> str:
    """What ``read(path)`` gives, read in blocks of ``block`` bytes (:func:`in_blocks`): the
    graph's JSON, or its error."""
    with in_blocks(block):
        try:
            return formats.to_json(read(path))
        except OffloadlabError as exc:
            return f"error: {exc}"


FROM_JSON = {"tg": formats.taskgraph_from_json, "mg": formats.memgraph_from_json}
FROM_DICT = {"tg": formats.taskgraph_from_dict, "mg": formats.memgraph_from_dict}


def checking_reader(kind: str):
    """The checking reader alone of ``kind`` (``tg``, ``mg``): ``*_from_dict`` on the data
    ``nodelink.read`` parses."""
    what = "TaskGraph JSON" if kind == "tg" else "MemGraph JSON"
    return lambda path: FROM_DICT[kind](*nodelink.read(path, what))


def test_the_toolkits_own_large_files_are_read_in_blocks(valid_files, tmp_path, monkeypatch):
    monkeypatch.setattr(nodelink, "STREAM_AT", 0)
    monkeypatch.setattr(nodelink, "BLOCK", 16)
    for kind in ("tg", "mg"):
        path = tmp_path / f"{kind}.json"
        formats.to_json(FROM_DICT[kind](valid_files[kind]), path)
        data, _ = nodelink.read(path, "graph", stream=True)
        assert type(data["nodes"]) is nodelink.Items and type(data["edges"]) is nodelink.Items
        assert formats.to_json(FROM_JSON[kind](path)) == path.read_text()
        path.write_text(json.dumps(valid_files[kind]))            # spaces: another tool's
        assert type(nodelink.read(path, "graph", stream=True)[0]["nodes"]) is list


def test_the_unmutated_files_are_valid(capsys, valid_files, tmp_path):
    """The starting points succeed, so the property tests exercise both outcomes."""
    for kind, argv in (("tg", ["plan", "--taskgraph", "{}", "--machine", "disco-example",
                               "--out", str(tmp_path / "out.json")]),
                       ("mg", ["simulate", "{}", "--json"])):
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(valid_files[kind]))
        code, out, err = run_cli(capsys, [str(path) if a == "{}" else a for a in argv])
        assert code == 0, err


@settings(**SETTINGS)
@given(data=st.data(), kind=st.sampled_from(["tg", "mg"]), stream=st.booleans())
def test_the_typed_reader_gives_what_the_checking_reader_gives(valid_files, data, kind, stream):
    """``*_from_json`` decodes typed records first (:mod:`offloadlab.core.formats.typed`) and
    falls back to checking every field; on any file, valid or not, that gives the same graph
    or the same error as the checking reader alone."""
    text = data.draw(malformed(valid_files[kind], compact=stream))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.json"
        path.write_bytes(text)
        block = 64 if stream else None
        assert outcome(FROM_JSON[kind], path, block) == outcome(checking_reader(kind), path, block)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["tg", "mg"])
def test_a_valid_file_is_read_as_typed_records(valid_files, tmp_path, monkeypatch, kind, stream):
    """The toolkit's own files never need the checking reader (the fast path is taken)."""
    path = tmp_path / "g.json"
    formats.to_json(FROM_DICT[kind](valid_files[kind]), path)
    if stream:
        monkeypatch.setattr(typed, "STREAM_AT", 0)
        monkeypatch.setattr(nodelink, "BLOCK", 16)

    def checking(*args):
        raise AssertionError("the checking reader ran")
    monkeypatch.setattr(nodelink, "load", checking)     # the checking reader's way in
    assert formats.to_json(FROM_JSON[kind](path)) == path.read_text()
    assert formats.to_json(FROM_JSON[kind](path.read_text())) == path.read_text()


@pytest.mark.parametrize("workload,machine,planner", [
    ("random:vertices=300,gpus=4,seed=3,transfer_fraction=0.3", "a100x8:gpus=4,gpu_memory=80MB",
     "buildmemgraph"),
    ("random:vertices=300,gpus=2,seed=4,host_fraction=1", "p100x4:gpus=2", "levelwise"),
    ("llama-prefill:model=tiny,seq=32,gpus=2", "a100x8:gpus=2", "buildmemgraph"),
    ("llama-lora-train:model=tiny,seq=32", "v100", "gemini"),
    ("training-chain", "v100:gpu_memory=2GB", "cotrain:k=0"),
])
def test_every_planners_output_is_read_as_typed_records(tmp_path, monkeypatch, workload, machine,
                                                        planner):
    """Files of every planner and kind of vertex (transfers, host inputs, CPU updates, shapes,
    ops with parameters), and the TaskGraphs planned, take the typed path, and give what the
    checking reader gives."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.planner import plan

    graph = build_workload(workload)
    files = {"tg": tmp_path / "tg.json", "mg": tmp_path / "mg.json"}
    formats.to_json(graph, files["tg"])
    formats.to_json(plan(graph, machine_from_spec(machine), planner), files["mg"])
    checked = {kind: formats.to_json(checking_reader(kind)(path)) for kind, path in files.items()}

    def checking(*args):
        raise AssertionError("the checking reader ran")
    monkeypatch.setattr(nodelink, "load", checking)     # the checking reader's way in
    for kind, path in files.items():
        assert formats.to_json(FROM_JSON[kind](path)) == checked[kind] == path.read_text()


def _rename(data: dict, old: str, new: str) -> None:
    """Rename vertex ``old`` to ``new`` everywhere in node-link ``data``."""
    for node in data["nodes"]:
        for field in ("id", "task", "of"):
            if node.get(field) == old:
                node[field] = new
        node["inputs"] = [new if x == old else x for x in node.get("inputs") or []]
    for edge in data["edges"]:
        for end in ("source", "target"):
            if edge[end] == old:
                edge[end] = new


def _compute(data: dict) -> dict:
    return next(n for n in data["nodes"] if n["kind"] == "compute")


EDGE_CASES = {
    "an edge from an unknown vertex ''": lambda d: d["edges"].insert(
        0, {"source": "", "target": d["nodes"][1]["id"], "kind": "data"}),
    "a vertex named ''": lambda d: _rename(d, d["nodes"][0]["id"], ""),
    "a compute vertex with a null op": lambda d: _compute(d).__setitem__("op", None),
    "an integer beyond 64 bits in graph": lambda d: d["graph"].__setitem__("x", 10**30),
    "an integer beyond 64 bits as time": lambda d: d["nodes"][0].__setitem__("time", 10**30),
    "a shape of 2**64 by 0": lambda d: d["nodes"][0].__setitem__("shape", [2**64, 0]),
    "a shape of 2**63 by 0": lambda d: d["nodes"][0].__setitem__("shape", [2**63, 0]),
    "an extra field nested 990 deep": lambda d: d["nodes"][0].__setitem__("zz", "DEEP 990"),
    "a graph field nested 1100 deep": lambda d: d["graph"].__setitem__("zz", "DEEP 1100"),
}


@pytest.mark.parametrize("case", EDGE_CASES)
@pytest.mark.parametrize("kind", ["tg", "mg"])
def test_the_readers_agree_on_edge_cases(valid_files, tmp_path, kind, case):
    """Inputs a review found where the typed reader once accepted what the checking reader
    refused, or read it otherwise (with the default layout, and in blocks)."""
    data = json.loads(json.dumps(valid_files[kind]))
    EDGE_CASES[case](data)
    text = json.dumps(data, separators=(",", ":"))
    for depth in (990, 1100):                   # too deep for json.dumps to write
        text = text.replace(f'"DEEP {depth}"', "[" * depth + "]" * depth)
    path = tmp_path / "g.json"
    path.write_text(text)
    for block in (None, 64):
        assert outcome(FROM_JSON[kind], path, block) == \
            outcome(checking_reader(kind), path, block), (case, block)
