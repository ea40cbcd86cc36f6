"""MemGraphs as Parquet tables (core/formats/parquet.py, issue 16): the same graph back as node-link
JSON gives, the same checks with the same kind of message, and the CLI's contract on malformed
tables (exit 2, one line, nothing left behind)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_malformed import run_cli, simulate_file
from test_properties import machine_for, task_graphs

import offloadlab
from offloadlab.core import formats
from offloadlab.core.errors import GraphError
from offloadlab.core.formats import nodelink, parquet
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.core.workloads import build_workload, random_dag
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.simulator import simulate

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])


def same(a: MemGraph, b: MemGraph) -> None:
    """``b`` is ``a``: vertices, every field, edges with their kinds, in the same orders."""
    assert a.graph == b.graph
    assert list(a.vertices.items()) == list(b.vertices.items())
    assert [list(d.items()) for d in a.succ.values()] == \
        [list(d.items()) for d in b.succ.values()]
    assert [list(d.items()) for d in a.pred.values()] == \
        [list(d.items()) for d in b.pred.values()]
    assert list(a.succ) == list(b.succ) and list(a.pred) == list(b.pred)


def back(mg: MemGraph, tmp: Path) -> MemGraph:
    formats.write_memgraph(mg, tmp / "mg.parquet")
    return formats.read_memgraph(tmp / "mg.parquet")


@pytest.mark.parametrize("workload,planner,machine", [
    ("matmul-chain:layers=4", "buildmemgraph", "disco-example"),
    ("matmul-chain:layers=4", "levelwise", "disco-example"),
    ("model:name=gpt2,mode=train,gpus=2", "gemini:chunk_size=4MiB", "p100x4:gpus=2"),
    ("gpt2-train:depth=6", "greedy-offload", "v100"),
    ("llama-prefill:model=tiny,seq=16,block=8,gpus=2", "buildmemgraph", "p100x4:gpus=2"),
])
def test_a_parquet_file_reads_back_what_json_reads_back(workload, planner, machine, tmp_path):
    from offloadlab.core.machine import machine_from_spec
    mg = plan(build_workload(workload), machine_from_spec(machine), planner)
    formats.write_memgraph(mg, tmp_path / "mg.json")
    from_json = formats.read_memgraph(tmp_path / "mg.json")
    from_parquet = back(mg, tmp_path)
    same(from_json, from_parquet)
    assert formats.to_json(from_parquet) == formats.to_json(mg)
    ids = {id(v.id): v.id for v in from_parquet}        # one string object per id
    assert all(id(v.task) in ids for v in from_parquet if v.task is not None)
    assert all(id(x) in ids for v in from_parquet for x in v.inputs)


def test_equal_shapes_read_as_one_tuple(tmp_path):
    """Memory per vertex (issue 46): a shape that many vertices share is one tuple, as the
    file holds it once (sizes and flops need no sharing: the compiled MemVertex holds them
    unboxed)."""
    from offloadlab.core.machine import machine_from_spec
    mg = plan(build_workload("llama-prefill:model=tiny,seq=16,block=8,gpus=2"),
              machine_from_spec("p100x4:gpus=2"))
    read = back(mg, tmp_path)
    assert formats.to_json(read) == formats.to_json(mg)
    shapes = [v.shape for v in read.vertices.values() if v.shape is not None]
    assert len(set(shapes)) < len(shapes) / 2                   # repeated shapes ...
    assert len({id(x) for x in shapes}) == len(set(shapes))     # ... one tuple each


def test_the_writers_arrays_are_what_pyarrow_makes_of_the_same_values():
    from offloadlab.core.formats import arrow
    words = ["a", None, "bé", "", "a", None, "\U0001f600"]
    assert arrow.strings(words, pa).equals(pa.array(words, pa.string()))
    assert arrow.names(words, pa).equals(pa.array(words, pa.string()).dictionary_encode())
    assert arrow.names([None, None], pa).to_pylist() == [None, None]
    for kind, values in (("int64", [3, None, -2**63, 2**63 - 1]), ("int32", [0, 7]),
                         ("float64", [0.5, None, -0.0, 1e300])):
        assert arrow.numbers(values, kind, pa).equals(pa.array(values, getattr(pa, kind)()))
    flat = arrow.numbers([1, 2, 3], "int64", pa)
    listed = arrow.lists(flat, [2, 0, 1, 0], [True, True, True, False], pa)
    assert listed.to_pylist() == [[1, 2], [], [3], None]
    assert arrow.booleans([True, False, True], pa).to_pylist() == [True, False, True]
    with pytest.raises(OverflowError):
        arrow.numbers([2**63], "int64", pa)
    with pytest.raises(UnicodeEncodeError):
        arrow.strings(["\ud800"], pa)


def test_plan_writing_parquet_imports_no_pandas(tmp_path):
    """``pyarrow.array`` imports pandas on its first call (0.4-0.55 s, 46 MB): the writer
    builds its arrays from their buffers (core/formats/arrow.py), so ``plan`` pays neither."""
    out = tmp_path / "mg.parquet"
    code = ("import sys\nfrom offloadlab.lab.cli import main\n"
            f"assert main(['plan', '--workload', 'matmul-chain:layers=3', '--machine', "
            f"'disco-example', '--out', {str(out)!r}, '-q']) == 0\n"
            "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=True,
                          env={"PYTHONPATH": str(Path(offloadlab.__file__).parents[1])})
    assert done.stdout.split("\n")[-2] == "['pyarrow']", done.stdout
    assert formats.to_json(formats.read_memgraph(out)) == formats.to_json(
        plan(build_workload("matmul-chain:layers=3"), machine_from_spec("disco-example")))


@settings(max_examples=60, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 1.0]),
       planner=st.sampled_from(["buildmemgraph", "levelwise"]))
def test_random_plans_survive_parquet_and_simulate_alike(graph, slack, planner):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    with tempfile.TemporaryDirectory() as tmp:
        again = back(mg, Path(tmp))
    same(formats.memgraph_from_json(formats.to_json(mg)), again)
    assert simulate(again, m).makespan == simulate(mg, m).makespan


def test_self_loops_and_repeated_edges_read_as_json_reads_them(tmp_path):
    mg = plan(random_dag(vertices=30, gpus=2, seed=3), machine_for(random_dag(
        vertices=30, gpus=2, seed=3), 2, 0.0), "buildmemgraph")
    formats.write_memgraph(mg, tmp_path / "mg.parquet")
    table = pq.read_table(tmp_path / "mg.parquet")
    succ = table.column("succ").to_pylist()
    data = table.column("succ_data").to_pylist()
    u = next(i for i, s in enumerate(succ) if s)
    succ[u] = succ[u] + [u, succ[u][0]]           # a self-loop and the first edge again,
    data[u] = data[u] + [True, not data[u][0]]    # as the other kind
    bad = table.set_column(table.schema.get_field_index("succ"), "succ",
                           pa.array(succ, pa.list_(pa.int32())))
    bad = bad.set_column(bad.schema.get_field_index("succ_data"), "succ_data",
                         pa.array(data, pa.list_(pa.bool_())))
    pq.write_table(bad, tmp_path / "bad.parquet")
    got = formats.read_memgraph(tmp_path / "bad.parquet")
    expected = formats.memgraph_from_json(formats.to_json(mg))
    ids = list(expected.vertices)
    expected.add_edge(ids[u], ids[u], "data")
    expected.add_edge(ids[u], ids[succ[u][0]], "memory" if data[u][0] else "data")
    same(expected, got)


def test_a_graph_without_vertices(tmp_path):
    mg = MemGraph({"planner": "none"})
    same(mg, back(mg, tmp_path))


def test_pandas_reads_the_table(tmp_path):
    import pandas as pd
    mg = plan(build_workload("matmul-chain:layers=2"), machine_for(build_workload(
        "matmul-chain:layers=2"), 2, 1.0), "buildmemgraph")
    formats.write_memgraph(mg, tmp_path / "mg.parquet")
    frame = pd.read_parquet(tmp_path / "mg.parquet")
    assert list(frame["id"]) == list(mg.vertices)
    assert list(frame.columns) == list(parquet.COLUMNS)


# -- what the writer refuses --------------------------------------------------------------------
def small() -> MemGraph:
    mg = MemGraph({"planner": "by hand"})
    mg.add_vertex(MemVertex("a", "input", "gpu0", 64, Loc("gpu0", 0, 64), task="a"))
    mg.add_vertex(MemVertex("b", "compute", "gpu0", 64, Loc("gpu0", 64, 64), task="b",
                            op="mix", inputs=("a",), flops=1.0, order=1))
    mg.add_edge("a", "b")
    return mg


@pytest.mark.parametrize("change,message", [
    (lambda mg: setattr(mg["b"], "flops", math.nan), "vertex 'b': flops = nan is not a finite"),
    (lambda mg: setattr(mg["b"], "time", math.inf), "vertex 'b': time = inf is not a finite"),
    (lambda mg: setattr(mg["b"], "inputs", ("zz",)), "vertex 'b' names 'zz', which is not"),
    (lambda mg: mg.graph.update(x=[1.0, -math.inf]), "graph.x[1] = -inf is not a finite"),
])
def test_the_writer_refuses_what_json_cannot_hold(change, message, tmp_path):
    mg = small()
    change(mg)
    with pytest.raises(GraphError, match=re.escape(f"cannot write MemGraph as Parquet: {message}")):
        formats.write_memgraph(mg, tmp_path / "mg.parquet")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_names_the_file():
    with pytest.raises(OSError) as info:
        parquet.write(small(), "/dev/full")
    assert info.value.filename == "/dev/full" and info.value.errno == 28


# -- what the reader refuses --------------------------------------------------------------------
def table_of(mg: MemGraph):
    return parquet._table(mg, pa)


def with_column(table, name, values, kind=None):
    array = pa.array(values, kind) if not isinstance(values, (pa.Array, pa.ChunkedArray)) \
        else values
    if name in table.column_names:
        return table.set_column(table.schema.get_field_index(name), name, array)
    return table.append_column(name, array)


@pytest.mark.parametrize("edit,message", [
    (lambda t: with_column(t, "flops", [0.0, math.nan]),
     "vertex 'b': flops must be a finite number >= 0, got nan"),
    (lambda t: with_column(t, "bytes", [64, -1]),
     "vertex 'b': bytes must be a positive integer, got -1"),
    (lambda t: with_column(t, "bytes", [64, None], pa.int64()),
     "vertex 'b': bytes must be a positive integer, got missing or null"),
    (lambda t: with_column(t, "bytes", [64.0, 64.0]),
     "column 'bytes' must hold an integer, got double"),
    (lambda t: with_column(t, "order", [True, False]),
     "column 'order' must hold an integer, got bool"),
    (lambda t: with_column(t, "time", [None, -2.0]),
     "vertex 'b': time must be a finite number >= 0, got -2.0"),
    (lambda t: with_column(t, "id", ["a", "a"]), "duplicate vertex id 'a'"),
    (lambda t: with_column(t, "id", ["a", None], pa.string()), "row 1 has no id"),
    (lambda t: t.drop_columns(["device"]), "no 'device' column"),
    (lambda t: with_column(t, "kind", ["input", "nope"]), "vertex 'b': unknown kind 'nope'"),
    (lambda t: with_column(t, "device", ["gpu0", "gpu01"]),
     "vertex 'b': compute device must be 'cpu' or a GPU ('gpu0', 'gpu1', ...), got 'gpu01'"),
    (lambda t: with_column(t, "op", [None, "nosuchop"]), "vertex 'b': unknown op 'nosuchop'"),
    (lambda t: with_column(t, "dtype", ["float32", "complex64"]),
     "vertex 'b': unknown dtype 'complex64'"),
    (lambda t: with_column(t, "loc_size", [64, None], pa.int64()),
     "vertex 'b': loc_device, loc_offset and loc_size must be all given or all null"),
    (lambda t: with_column(t, "loc_device", ["gpu0", "host"]),
     "vertex 'b': loc.device must be a GPU"),
    (lambda t: with_column(t, "loc_offset", [0, -64]),
     "vertex 'b': loc_offset must be an integer >= 0, got -64"),
    (lambda t: with_column(t, "inputs", [[], [7]], pa.list_(pa.int32())),
     "vertex 'b': inputs names row 7, but the file has 2 rows"),
    (lambda t: with_column(t, "succ", [[-1], []], pa.list_(pa.int32())),
     "vertex 'a': succ names row -1"),
    (lambda t: with_column(t, "succ_data", [[True, False], []], pa.list_(pa.bool_())),
     "vertex 'a': succ_data must give one kind per successor in succ (1), got 2"),
    (lambda t: with_column(t, "shape", [None, [4, 5]], pa.list_(pa.int64())),
     "vertex 'b': shape [4, 5] of float32 needs 80 bytes, more than its 64 bytes"),
    (lambda t: with_column(t, "shape", [None, [-4]], pa.list_(pa.int64())),
     "vertex 'b': shape must be a list of integers >= 0"),
    (lambda t: with_column(t, "shape", [None, [4, None]], pa.list_(pa.int64())),
     "vertex 'b': shape must be a list of integers, got [4, None]"),
    (lambda t: with_column(t, "inputs", [[], [0, None]], pa.list_(pa.int32())),
     "vertex 'b': inputs must be a list of row numbers, got [0, None]"),
    (lambda t: with_column(t, "succ", [[None], []], pa.list_(pa.int32())),
     "vertex 'a': succ must be a list of row numbers, got [None]"),
    (lambda t: with_column(t, "succ_data", [[None], []], pa.list_(pa.bool_())),
     "vertex 'a': succ_data must be a list of booleans, got [None]"),
    (lambda t: with_column(t, "id", pa.array([b"a", b"b\xff"], pa.binary()).view(pa.string())),
     "not a readable Parquet file ("),
    (lambda t: t.append_column("flops", pa.array([0.0, 2.0])), "column 'flops' appears 2 times"),
    (lambda t: with_column(t, "inputs", [[], [2**40]], pa.list_(pa.int64())),
     "vertex 'b': inputs names row 1099511627776, but the file has 2 rows"),
    (lambda t: with_column(t, "bytes", [64, 2**63], pa.uint64()),
     "vertex 'b': bytes must be a positive integer, got 9.223e+18 (a count must be below 2**63)"),
    (lambda t: with_column(t, "inputs", [None, [0, None]], pa.list_(pa.int32())),
     "vertex 'b': inputs must be a list of row numbers, got [0, None]"),
    (lambda t: t.replace_schema_metadata({}), "not a MemGraph Parquet file of offloadlab"),
    (lambda t: t.replace_schema_metadata({parquet.FORMAT_KEY: parquet.FORMAT,
                                          parquet.GRAPH_KEY: b'{"type": "TaskGraph"}'}),
     "holds a 'TaskGraph', not a MemGraph"),
    (lambda t: t.replace_schema_metadata({parquet.FORMAT_KEY: parquet.FORMAT,
                                          parquet.GRAPH_KEY: b'{"x": NaN}'}),
     "offloadlab.graph is not strict JSON"),
])
def test_the_reader_names_the_file_the_vertex_and_the_field(edit, message, tmp_path):
    path = tmp_path / "mg.parquet"
    pq.write_table(edit(table_of(small())), path)
    with pytest.raises(GraphError) as info:
        formats.read_memgraph(path)
    assert str(info.value).startswith(f"MemGraph Parquet file {str(path)!r}: ")
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["damaged-dictionary-index", "damaged-utf8"])
def test_damaged_files_found_by_fuzzing(capsys, name):
    """Bytes flipped in a valid file: a dictionary index out of range, a string not UTF-8
    (they passed pyarrow's reader and crashed ours before the table was validated)."""
    path = Path(__file__).parent / "data" / f"{name}.parquet"
    code, out, err = run_cli(capsys, ["simulate", str(path)])
    assert code == 2 and err.count("\n") == 1, err
    assert "not a readable Parquet file" in err


def test_json_and_parquet_mixed_up_say_so(capsys, tmp_path):
    formats.write_memgraph(small(), tmp_path / "mg.json")
    (tmp_path / "mg.json").rename(tmp_path / "json.parquet")
    with pytest.raises(GraphError, match="it begins with '{': node-link JSON"):
        formats.read_memgraph(tmp_path / "json.parquet")
    formats.write_memgraph(small(), tmp_path / "mg.parquet")
    code, out, err = run_cli(capsys, ["plan", "--taskgraph", str(tmp_path / "mg.parquet"),
                                      "--machine", "disco-example", "--out",
                                      str(tmp_path / "out.json")])
    assert code == 2 and "a Parquet file, not node-link JSON" in err


def test_messages_are_the_json_readers(tmp_path):
    """The same defect as a JSON node and as a Parquet cell: the same message after the file."""
    for field, value in (("device", "gpu01"), ("op", "nosuchop"), ("dtype", "complex64"),
                         ("flops", math.nan), ("bytes", -1), ("time", -2.0)):
        mg = small()
        data = formats.to_dict(mg)
        data["nodes"][1][field] = value
        with pytest.raises(GraphError) as from_json:
            formats.memgraph_from_dict(data, "F")
        values = table_of(mg).column(field).to_pylist()
        values[1] = value
        pq.write_table(with_column(table_of(mg), field, values), tmp_path / "mg.parquet")
        with pytest.raises(GraphError) as from_parquet:
            formats.read_memgraph(tmp_path / "mg.parquet")
        assert str(from_parquet.value).split(": ", 1)[1] == str(from_json.value).split(": ", 1)[1]


def test_other_arrow_layouts_read_alike(tmp_path):
    """Row groups of three rows, large strings and lists, other dictionary index types,
    integers where floats go, an empty dtype (float32, as JSON reads it), and times."""
    mg = plan(build_workload("matmul-chain:layers=2"), machine_for(build_workload(
        "matmul-chain:layers=2"), 2, 1.0), "buildmemgraph")
    for i, v in enumerate(mg):
        v.time = None if i % 2 else 0.25 * i
    table = table_of(mg)
    pq.write_table(table, tmp_path / "plain.parquet")
    table = with_column(table, "id", table.column("id").cast(pa.large_string()))
    table = with_column(table, "succ", table.column("succ").cast(pa.large_list(pa.int64())))
    table = with_column(table, "kind", table.column("kind").cast(pa.string()).dictionary_encode()
                        .cast(pa.dictionary(pa.int8(), pa.string())))
    table = with_column(table, "order", table.column("order").cast(pa.uint16()))
    table = with_column(table, "dtype", [""] * table.num_rows)
    table = with_column(table, "flops", pa.array(
        [int(x) for x in table.column("flops").to_pylist()], pa.int64()))
    pq.write_table(table, tmp_path / "odd.parquet", row_group_size=3)
    mg = formats.read_memgraph(tmp_path / "plain.parquet")
    for v in mg:
        v.flops = float(int(v.flops))
    same(mg, formats.read_memgraph(tmp_path / "odd.parquet"))


def test_optional_columns_may_be_left_out(tmp_path):
    table = table_of(small()).drop_columns(["task", "of", "time", "shape", "dtype", "flops",
                                            "order", "loc_device", "loc_offset", "loc_size"])
    pq.write_table(table, tmp_path / "mg.parquet")
    mg = formats.read_memgraph(tmp_path / "mg.parquet")
    assert mg["b"].flops == 0.0 and mg["b"].order == 0 and mg["b"].dtype == "float32"
    assert mg["b"].loc is None and mg["b"].time is None and mg.succ["a"] == {"b": "data"}


def test_a_file_is_parquet_by_its_suffix_or_its_first_bytes(tmp_path):
    formats.write_memgraph(small(), tmp_path / "plan.bin")   # no .parquet: written as JSON
    assert not nodelink.is_parquet(tmp_path / "plan.bin")
    formats.write_memgraph(small(), tmp_path / "mg.parquet")
    (tmp_path / "mg.parquet").rename(tmp_path / "mg.data")
    assert nodelink.is_parquet(tmp_path / "mg.data")
    same(formats.read_memgraph(tmp_path / "mg.data"), formats.read_memgraph(tmp_path / "plan.bin"))


# -- the CLI ------------------------------------------------------------------------------------
def test_plan_then_simulate_through_parquet(capsys, tmp_path):
    code, out, err = run_cli(capsys, ["plan", "--workload", "matmul-chain:layers=3", "--machine",
                                      "disco-example", "--out", str(tmp_path / "mg.parquet")])
    assert code == 0, err
    code, out, err = run_cli(capsys, ["simulate", str(tmp_path / "mg.parquet")])
    assert code == 0, err
    assert "makespan" in out


def test_parquet_without_pyarrow_fails_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)      # import pyarrow raises ImportError
    code, out, err = run_cli(capsys, ["plan", "--workload", "matmul-chain:layers=3",
                                      "--machine", "disco-example", "--out",
                                      str(tmp_path / "mg.parquet")])
    assert code == 2 and err.count("\n") == 1
    assert "need pyarrow, which is missing here: pip install pyarrow (or write .json)" in err
    assert list(tmp_path.iterdir()) == []
    formats.write_memgraph(small(), tmp_path / "mg.json")
    code, out, err = run_cli(capsys, ["simulate", str(tmp_path / "mg.json"), "--machine",
                                      "p100x4:gpus=1"])                 # JSON needs none
    assert code == 0, err


@pytest.fixture(scope="module")
def valid_table(tmp_path_factory):
    d = tmp_path_factory.mktemp("valid")
    assert main(["plan", "--workload", "matmul-chain:layers=3", "--machine", "disco-example",
                 "--out", str(d / "mg.parquet"), "--quiet"]) == 0
    return pq.read_table(d / "mg.parquet")


WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                  st.sampled_from([math.nan, math.inf, -1.5, 0.5, 1e308]),
                  st.sampled_from(["", "gpu0", "gpu9", "host", "compute", "offload", "matmul",
                                   "float16", "data", "x"]),
                  st.lists(st.integers(-3, 40), max_size=3))


@st.composite
def malformed_table(draw, table) -> bytes:
    """A valid table changed in one to three ways: a cell set to a value of any type (its
    column rebuilt with whatever type fits), a column dropped, repeated or its type changed, a
    row dropped or repeated, the metadata changed; then perhaps the file's bytes damaged."""
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(table.column_names)) if table.column_names else None
        what = draw(st.sampled_from(["cell", "cell", "cell", "drop column", "retype",
                                     "drop row", "repeat row", "metadata"]))
        if what == "cell" and name is not None and table.num_rows:
            values = table.column(name).to_pylist()
            values[draw(st.integers(0, len(values) - 1))] = draw(WEIRD)
            try:
                column = pa.array(values)
            except (pa.ArrowException, OverflowError):
                column = pa.array([repr(x) for x in values])
            table = with_column(table, name, column)
        elif what == "drop column" and name is not None:
            table = table.drop_columns([name])
        elif what == "retype" and name is not None:
            table = with_column(table, name, pa.array([repr(x) for x in
                                                       table.column(name).to_pylist()]))
        elif what in ("drop row", "repeat row") and table.num_rows:
            i = draw(st.integers(0, table.num_rows - 1))
            rows = [j for j in range(table.num_rows) if j != i or what == "repeat row"]
            table = table.take(rows + ([i] if what == "repeat row" else []))
        elif what == "metadata":
            table = table.replace_schema_metadata({
                parquet.FORMAT_KEY: draw(st.sampled_from([b"1", b"2", b""])),
                parquet.GRAPH_KEY: draw(st.sampled_from([
                    b"{}", b"[]", b"{", b'{"type": "MemGraph", "machine": 3}',
                    b'{"type": "TaskGraph"}', b'{"machine": {"gpus": -1}}']))})
    if table.column_names and draw(st.sampled_from([False] * 7 + [True])):
        name = draw(st.sampled_from(table.column_names))    # last: names are then ambiguous
        table = table.append_column(name, table.column(name))
    out = pa.BufferOutputStream()
    pq.write_table(table, out)
    data = out.getvalue().to_pybytes()
    damage = draw(st.sampled_from(["none"] * 5 + ["truncate", "flip", "flip", "random"]))
    at = draw(st.integers(0, len(data) - 1))
    if damage == "truncate":
        data = data[:at]
    elif damage == "flip":                        # one to three bytes changed
        for at in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=3)):
            data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    elif damage == "random":
        data = b"PAR1" + draw(st.binary(max_size=64))
    return data


@settings(max_examples=120, **SETTINGS)
@given(data=st.data())
def test_malformed_parquet_files(capsys, valid_table, data):
    simulate_file(capsys, data.draw(malformed_table(valid_table)), "mg.parquet")
