"""The ``offloadlab`` CLI, run in-process through ``main(argv)`` and as a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from offloadlab.core import formats
from offloadlab.core.workloads import build_workload
from offloadlab.lab.cli import main

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def fails(capsys, *argv: str) -> str:
    """Run a command that must fail as a user error; return its stderr message."""
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    return err


# -- demo -----------------------------------------------------------------------------------
def test_demo_prints_table_and_writes_gantt_and_chrome_traces(capsys, tmp_path):
    code, out, err = run(capsys, "demo", "--layers", "3", "--out", tmp_path / "out")
    assert code == 0, err
    for word in ("planner", "makespan", "bytes_moved", "peak_gpu_memory", "levelwise",
                 "buildmemgraph"):
        assert word in out
    png = tmp_path / "out" / "gantt.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for planner in ("levelwise", "buildmemgraph"):
        trace = tmp_path / "out" / f"{planner}.trace.json"
        events = json.loads(trace.read_text())["traceEvents"]
        assert any(e["ph"] == "X" for e in events)
        assert str(trace) in out
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_demo_rejects_nonpositive_layers(capsys, tmp_path):
    err = fails(capsys, "demo", "--layers", "0", "--out", tmp_path)
    assert "--layers" in err and "positive" in err
    assert list(tmp_path.iterdir()) == []


# -- plan -> simulate -----------------------------------------------------------------------
@pytest.fixture
def memgraph_file(capsys, tmp_path) -> Path:
    path = tmp_path / "mg.json"
    code, out, err = run(capsys, "plan", "--workload", "matmul-chain:layers=3",
                         "--machine", "disco-example", "--planner", "buildmemgraph", "--out", path)
    assert code == 0, err
    assert str(path) in out and "vertices" in out and "offloads" in out
    return path


def test_plan_then_simulate_json(capsys, memgraph_file):
    code, out, err = run(capsys, "simulate", memgraph_file, "--json")
    assert code == 0, err
    summary = json.loads(out)  # exactly one JSON object, nothing else on stdout
    for key in ("makespan", "busy", "peak_memory", "policy", "noise", "seed", "vertices"):
        assert key in summary
    assert summary["policy"] == "dynamic" and summary["machine"] == "disco-example"
    assert summary["makespan"] > 0
    assert {"gpu0", "gpu1"} <= set(summary["peak_memory"])
    assert all(0 < summary["peak_memory"][g] <= 80 * 2**20 for g in ("gpu0", "gpu1"))
    assert {"gpu0", "gpu1"} <= set(summary["busy"])
    assert summary["vertices"] == len(json.loads(memgraph_file.read_text())["nodes"])


def test_simulate_options_and_outputs(capsys, memgraph_file, tmp_path):
    code, out, err = run(capsys, "simulate", memgraph_file, "--machine", "disco-example",
                         "--policy", "fixed", "--noise", "0.2", "--seed", "7", "--streams", "2",
                         "--json", "--gantt", tmp_path / "g.png", "--chrome", tmp_path / "c.json",
                         "--memory", tmp_path / "m.png")
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["policy"], summary["noise"], summary["seed"], summary["streams"]) == \
           ("fixed", 0.2, 7, 2)
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"]


def test_simulate_noise_depends_on_seed(capsys, memgraph_file):
    spans = []
    for seed in ("1", "1", "2"):
        code, out, err = run(capsys, "simulate", memgraph_file, "--noise", "0.3", "--seed", seed,
                             "--json")
        assert code == 0, err
        spans.append(json.loads(out)["makespan"])
    assert spans[0] == spans[1] != spans[2]


def test_simulate_human_summary(capsys, memgraph_file):
    code, out, err = run(capsys, "simulate", memgraph_file)
    assert code == 0, err
    assert "makespan" in out and "busy" in out and "peak memory" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_plan_from_taskgraph_file(capsys, tmp_path):
    from offloadlab.core.workloads import build_workload
    tg = tmp_path / "tg.json"
    formats.to_json(build_workload("tp-matmul:n=64"), tg)
    out_path = tmp_path / "mg.json"
    code, out, err = run(capsys, "plan", "--taskgraph", tg, "--machine", "p100x4",
                         "--planner", "levelwise", "--out", out_path)
    assert code == 0, err
    assert json.loads(out_path.read_text())["graph"]["planner"] == "levelwise"


def test_list(capsys):
    code, out, err = run(capsys, "list")
    assert code == 0, err
    for name in ("matmul-chain", "tp-matmul", "random", "disco-example", "v100", "p100x4",
                 "a100x8", "buildmemgraph", "levelwise", "layers=8", "DISCO Sec. 2"):
        assert name in out
    code, out, _ = run(capsys, "list", "machines")
    assert "a100x8" in out and "matmul-chain" not in out


# -- user errors: message on stderr, exit status 2, nothing written ---------------------------
def plan_fails(capsys, tmp_path, *argv: str) -> str:
    out_path = tmp_path / "mg.json"
    args = {"--workload": "matmul-chain:layers=2", "--machine": "disco-example",
            "--planner": "buildmemgraph", "--out": str(out_path)}
    it = iter(argv)
    args.update(zip(it, it))
    if "--taskgraph" in args:
        del args["--workload"]
    err = fails(capsys, "plan", *[x for kv in args.items() for x in kv])
    assert err.startswith("offloadlab: error: ")
    assert not [p for p in tmp_path.iterdir() if "mg.json" in p.name]  # nor a temporary file
    return err


def test_unknown_workload(capsys, tmp_path):
    err = plan_fails(capsys, tmp_path, "--workload", "transformer:layers=2")
    assert "unknown workload 'transformer'" in err and "matmul-chain" in err


def test_unknown_machine(capsys, tmp_path):
    err = plan_fails(capsys, tmp_path, "--machine", "tpu-v9")
    assert "'tpu-v9'" in err and "disco-example" in err


def test_unknown_planner(capsys, tmp_path):
    err = plan_fails(capsys, tmp_path, "--planner", "magic")
    assert "unknown planner 'magic'" in err and "buildmemgraph" in err


@pytest.mark.parametrize("flag,spec", [("--workload", "matmul-chain:layerz=2"),
                                       ("--machine", "disco-example:layerz=2"),
                                       ("--planner", "buildmemgraph:layerz=2")])
def test_unknown_option_key(capsys, tmp_path, flag, spec):
    err = plan_fails(capsys, tmp_path, flag, spec)
    assert "unknown option(s) layerz" in err


def test_bad_option_value(capsys, tmp_path):
    err = plan_fails(capsys, tmp_path, "--machine", "disco-example:gpu_memory=lots")
    assert "gpu_memory" in err and "'lots'" in err


def test_tensor_larger_than_its_gpu(capsys, tmp_path):
    err = plan_fails(capsys, tmp_path, "--machine", "disco-example:gpu_memory=1MiB")
    assert re.search(r"'[XY]\d[^']*'", err), err  # names the tensor that cannot fit ...
    assert re.search(r"gpu[01]", err) and "capacity" in err  # ... and where


def test_missing_taskgraph_file(capsys, tmp_path):
    err = plan_fails(capsys, tmp_path, "--taskgraph", str(tmp_path / "nope.json"))
    assert "nope.json" in err and "cannot read" in err


def test_malformed_taskgraph_json(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [')
    err = plan_fails(capsys, tmp_path, "--taskgraph", str(bad))
    assert "bad.json" in err and "malformed JSON" in err


def test_cyclic_taskgraph(capsys, tmp_path):
    cyclic = tmp_path / "cyclic.json"
    node = {"kind": "compute", "device": "gpu0", "op": "add", "bytes": 1024}
    cyclic.write_text(json.dumps({"directed": True, "graph": {}, "nodes": [
        {"id": "a", **node, "inputs": ["b"]}, {"id": "b", **node, "inputs": ["a"]}],
        "edges": [{"source": "b", "target": "a"}, {"source": "a", "target": "b"}]}))
    err = plan_fails(capsys, tmp_path, "--taskgraph", str(cyclic))
    assert "cycle" in err and "a" in err and "b" in err


@pytest.mark.parametrize("field, value, message", [
    ("op", "conv9", "vertex 'b': unknown op 'conv9'"),
    ("bytes", 0, "vertex 'b': bytes must be a positive integer, got 0"),
    ("bytes", -4096, "vertex 'b': bytes must be a positive integer, got -4096"),
])
def test_bad_vertex_in_taskgraph_file(capsys, tmp_path, field, value, message):
    path = tmp_path / "bad-vertex.json"
    b = {"id": "b", "kind": "compute", "device": "gpu0", "op": "add", "bytes": 1024,
         "inputs": ["a"], field: value}
    path.write_text(json.dumps({"directed": True, "graph": {}, "nodes": [
        {"id": "a", "kind": "input", "device": "gpu0", "bytes": 1024}, b],
        "edges": [{"source": "a", "target": "b"}]}))
    err = plan_fails(capsys, tmp_path, "--taskgraph", str(path))
    assert message in err
    assert not (tmp_path / "mg.json").exists()


def test_unwritable_output(capsys, tmp_path):
    err = fails(capsys, "plan", "--workload", "matmul-chain:layers=2", "--machine",
                "disco-example", "--out", tmp_path / "no" / "such" / "dir" / "mg.json")
    assert "no/such/dir" in err


def test_simulate_missing_and_malformed_memgraph(capsys, tmp_path):
    err = fails(capsys, "simulate", tmp_path / "absent.json")
    assert "absent.json" in err
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    err = fails(capsys, "simulate", bad)
    assert "bad.json" in err and "neither a JSON object or array nor Parquet" in err


def test_simulate_without_stored_machine(capsys, memgraph_file, tmp_path):
    data = json.loads(memgraph_file.read_text())
    del data["graph"]["machine"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    err = fails(capsys, "simulate", bare)
    assert "--machine" in err
    code, out, err = run(capsys, "simulate", bare, "--machine", "disco-example", "--json")
    assert code == 0, err


def test_simulate_on_too_small_machine(capsys, memgraph_file, tmp_path):
    err = fails(capsys, "simulate", memgraph_file, "--machine", "disco-example:gpu_memory=8MiB",
                "--gantt", tmp_path / "g.png")
    assert "capacity" in err or "8388608" in err
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("argv", [["simulate", "x.json", "--policy", "bogus"],
                                  ["simulate", "x.json", "--noise", "-1"],
                                  ["plan", "--workload", "random", "--machine", "v100"],
                                  ["frobnicate"], []])
def test_usage_errors_exit_2(capsys, argv):
    """One line, like every other error, pointing at --help."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.startswith("offloadlab: error: ") and err.count("\n") == 1
    assert "--help')" in err


def test_an_output_may_not_overwrite_an_input(capsys, tmp_path):
    mg = tmp_path / "mg.json"
    assert run(capsys, "plan", "--workload", "matmul-chain:layers=2", "--machine",
               "disco-example", "--out", mg)[0] == 0
    before = mg.read_bytes()
    code, out, err = run(capsys, "simulate", mg, "--chrome", mg)
    assert code == 2 and "--chrome name the same file" in err and mg.read_bytes() == before
    tg = tmp_path / "tg.json"
    formats.to_json(build_workload("matmul-chain:layers=2"), tg)
    before = tg.read_bytes()
    code, out, err = run(capsys, "plan", "--taskgraph", tg, "--machine", "disco-example",
                         "--out", tg)
    assert code == 2 and "name the same file" in err and tg.read_bytes() == before


@pytest.mark.parametrize("text", ["[1, 2]", "null", "3"])
def test_a_json_file_that_is_not_an_object_is_refused(capsys, tmp_path, text):
    path = tmp_path / "x.json"
    path.write_text(text)
    for argv in (["simulate", path], ["plan", "--taskgraph", path, "--machine", "p100x4",
                                      "--out", tmp_path / "o.json"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and ("expected a JSON object" in err or   # [1, 2]
                              "neither a JSON object or array nor Parquet" in err), err


def test_numbers_beyond_the_float_range_are_refused(capsys, tmp_path):
    mg = tmp_path / "mg.json"
    assert run(capsys, "plan", "--workload", "matmul-chain:layers=2", "--machine",
               "disco-example", "--out", mg)[0] == 0
    text = mg.read_text()
    i = text.index('"flops":') + len('"flops":')
    j = min(text.index(",", i), text.index("}", i))
    mg.write_text(text[:i] + "1" + "0" * 400 + text[j:])
    code, out, err = run(capsys, "simulate", mg)
    assert code == 2 and "flops must be a finite number" in err, err


def test_a_plan_that_fails_verification_names_its_file(capsys, tmp_path):
    mg = tmp_path / "mg.json"
    assert run(capsys, "plan", "--workload", "matmul-chain:layers=2", "--machine",
               "disco-example", "--out", mg)[0] == 0
    code, out, err = run(capsys, "simulate", mg, "--machine", "disco-example:gpu_memory=1KiB")
    assert code == 2 and f"MemGraph JSON file {str(mg)!r} is not a correct plan: rule 4" in err


# -- bad input (issue 16): one line, exit 2, the file, vertex and field named ------------------
def one_line_error(err: str) -> str:
    assert err.startswith("offloadlab: error: ") and err.endswith("\n"), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def taskgraph_file(tmp_path, **b_fields) -> Path:
    """A two-vertex TaskGraph file written by Python's json (which writes NaN, Infinity)."""
    b = {"id": "b", "kind": "compute", "device": "gpu0", "op": "add", "bytes": 1024,
         "inputs": ["a"], **b_fields}
    path = tmp_path / "tg.json"
    path.write_text(json.dumps({"directed": True, "graph": {}, "nodes": [
        {"id": "a", "kind": "input", "device": "gpu0", "bytes": 1024}, b],
        "edges": [{"source": "a", "target": "b"}]}))
    return path


@pytest.mark.parametrize("field, value, message", [
    ("bytes", "abc", "bytes must be a positive integer, got 'abc'"),
    ("bytes", 1.5, "bytes must be a positive integer, got 1.5"),
    ("bytes", -3, "bytes must be a positive integer, got -3"),
    ("bytes", True, "bytes must be a positive integer, got True"),
    ("bytes", float("nan"), "bytes must be a positive integer, got nan"),
    ("flops", "x", "flops must be a finite number >= 0, got 'x'"),
    ("flops", float("nan"), "flops must be a finite number >= 0, got nan"),
    ("flops", float("inf"), "flops must be a finite number >= 0, got inf"),
    ("time", float("-inf"), "time must be a finite number >= 0, got -inf"),
    ("time", float("nan"), "time must be a finite number >= 0, got nan"),
    ("kind", "conv", "unknown kind 'conv'"),
    ("device", "gpu_1", "compute device must be 'cpu' or a GPU ('gpu0', 'gpu1', ...), got 'gpu_1'"),
    ("dtype", "complex64", "unknown dtype 'complex64'"),
])
def test_bad_field_in_taskgraph_file(capsys, tmp_path, field, value, message):
    path = taskgraph_file(tmp_path, **{field: value})
    err = one_line_error(plan_fails(capsys, tmp_path, "--taskgraph", str(path)))
    assert f"TaskGraph JSON file '{path}': vertex 'b': {message}" in err


def test_cross_gpu_read_without_transfer(capsys, tmp_path):
    path = taskgraph_file(tmp_path, device="gpu1")
    for planner in ("buildmemgraph", "levelwise"):                  # KeyError before issue 16
        err = one_line_error(plan_fails(capsys, tmp_path, "--taskgraph", str(path),
                                        "--planner", planner))
        assert "vertex 'b' on gpu1 reads 'a', which lives on gpu0: add a transfer vertex" in err
        assert "TaskGraph.add_transfer" in err


def test_links_instead_of_edges(capsys, tmp_path):
    from offloadlab.core.workloads import build_workload
    data = formats.to_dict(build_workload("matmul-chain:layers=2"))
    for node in data["nodes"]:
        del node["inputs"]
    data["links"] = data.pop("edges")
    path = tmp_path / "links.json"
    path.write_text(json.dumps(data))
    out_path = tmp_path / "mg.json"
    code, out, err = run(capsys, "plan", "--taskgraph", path, "--machine", "disco-example",
                         "--out", out_path)
    assert code == 0, err
    expected = tmp_path / "expected.json"
    assert run(capsys, "plan", "--workload", "matmul-chain:layers=2", "--machine",
               "disco-example", "--out", expected)[0] == 0
    assert json.loads(out_path.read_text())["edges"] == json.loads(expected.read_text())["edges"]
    del data["links"]
    path.write_text(json.dumps(data))
    out_path.unlink()
    err = one_line_error(plan_fails(capsys, tmp_path, "--taskgraph", str(path)))
    assert "links.json" in err and "needs an 'edges' list" in err


@pytest.mark.parametrize("field, value, message", [
    ("gpu_memory", "abc", "gpu_memory must be a positive integer, got 'abc'"),
    ("gpu_memory", float("nan"), "gpu_memory must be a positive integer, got nan"),
    ("gpu_memory", -1, "gpu_memory must be a positive integer, got -1"),
    ("h2d_bandwidth", float("nan"), "h2d_bandwidth must be a number > 0, not NaN"),
    ("link_latency", float("inf"), "link_latency must be a finite number >= 0, got inf"),
    ("colour", "red", "unknown field(s): colour"),
])
def test_bad_value_in_stored_machine(capsys, memgraph_file, tmp_path, field, value, message):
    data = json.loads(memgraph_file.read_text())
    data["graph"]["machine"][field] = value
    bad = tmp_path / "bad-machine.json"
    bad.write_text(json.dumps(data))
    err = one_line_error(fails(capsys, "simulate", bad, "--json", "--chrome", tmp_path / "c.json"))
    assert f"MemGraph JSON file '{bad}': graph.machine: " in err and message in err
    assert not (tmp_path / "c.json").exists()


def test_nan_in_memgraph_file(capsys, memgraph_file, tmp_path):
    data = json.loads(memgraph_file.read_text())
    data["nodes"][5]["time"] = float("nan")
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps(data))
    err = one_line_error(fails(capsys, "simulate", bad, "--json"))
    assert f"vertex {data['nodes'][5]['id']!r}: time must be a finite number >= 0, got nan" in err


@pytest.mark.parametrize("flag, spec, message", [
    ("--workload", "random:vertices=abc", "option vertices: cannot read 'abc'"),
    ("--workload", "random:vertices=1.5", "option vertices: cannot read '1.5'"),
    ("--workload", "random:vertices=-1", "must be positive"),
    ("--workload", "random:vertices=nan", "option vertices: cannot read 'nan'"),
    ("--workload", "random:vertices=10,vertices=20", "option 'vertices' given twice"),
    ("--workload", "random:vertex=10", "unknown option(s) vertex"),
    ("--machine", "p100x4:gpu_memory=nan", "option gpu_memory: cannot read 'nan'"),
    ("--machine", "p100x4:link_latency=inf", "option link_latency: cannot read 'inf'"),
    ("--machine", "p100x4:gpus=inf", "option gpus: cannot read 'inf'"),
    ("--machine", "p100x4:gpus_per_bus=-2", "gpus_per_bus must be an integer >= 0, got -2"),
    ("--machine", "p100x4:gpus_per_bus=1.5", "option gpus_per_bus: cannot read '1.5'"),
    ("--machine", "a100x8:gpu_half_flops=-1", "gpu_half_flops must be a number >= 0"),
    ("--machine", "a100x8:cost=guess", "cost must be one of roofline, fitted, got 'guess'"),
    ("--machine", "p100x4:cost=fitted", "cost=fitted needs the fitted kernel parameters"),
    ("--planner", "buildmemgraph:victim=foo", "unknown victim policy 'foo'"),
    ("--planner", "buildmemgraph:ahead=perhaps", "option ahead: cannot read 'perhaps'"),
    ("--planner", "buildmemgraph:order=bogus", "unknown order 'bogus'; use given, topological"),
    ("--planner", "buildmemgraph:reserve=-1", "reserve must be a finite number >= 0"),
    ("--planner", "buildmemgraph:retry=maybe", "option retry: cannot read 'maybe'"),
])
def test_bad_spec_values(capsys, tmp_path, flag, spec, message):
    err = one_line_error(plan_fails(capsys, tmp_path, flag, spec))
    assert message in err


# -- outputs: checked first, written all or none ----------------------------------------------
@pytest.mark.parametrize("option, bad, message", [
    ("--gantt", "missing/g.png", "--gantt: cannot write 'missing/g.png': directory 'missing' "
                                 "does not exist"),
    ("--memory", ".", "--memory: cannot write '.': it is a directory"),
    ("--chrome", "sub", "--chrome: cannot write 'sub': it is a directory"),
    ("--gantt", "g.txt", "an image needs one of the suffixes"),
    ("--chrome", "plan.json/c.json", "'plan.json' is not a directory"),
])
def test_outputs_are_checked_before_any_work(capsys, tmp_path, monkeypatch, option, bad, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "plan.json").write_text("{}")
    # the MemGraph does not exist either: the output's error must come first
    err = one_line_error(fails(capsys, "simulate", "absent.json", option, bad))
    assert message in err


@pytest.mark.parametrize("argv, message", [
    (["plan", "--workload", "nope", "--machine", "v100", "--out", "missing/mg.json"],
     "--out: cannot write 'missing/mg.json'"),
    (["plan", "--workload", "nope", "--machine", "v100", "--out", "."], "it is a directory"),
    (["run", "--workload", "nope", "--machine", "v100", "--chrome", "missing/c.json"],
     "--chrome: cannot write"),
    (["validate", "--workload", "nope", "--machine", "v100", "--table", "missing/t.csv"],
     "--table: cannot write"),
    (["validate", "--workload", "nope", "--machine", "v100", "--plot", "p.csv"], "suffixes"),
    (["calibrate", "--machine", "nope", "--out", "cal.csv"], "--out and --table name the same"),
    (["calibrate", "--machine", "nope", "--out", "missing/cal.json"], "--out: cannot write"),
    (["demo", "--out", "plan.json"], "--out: cannot write into 'plan.json'"),
    (["reproduce", "beaumont-table1", "--only", "gpt2-38x16", "--out", "plan.json/x"],
     "'plan.json' is not a directory"),
])
def test_every_command_checks_its_outputs_first(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text("{}")
    err = one_line_error(fails(capsys, *argv))
    assert message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_failed_command_leaves_none_of_its_outputs(capsys, memgraph_file, tmp_path,
                                                     monkeypatch):
    """simulate writes the Gantt chart and the Chrome trace, then fails on the memory plot."""
    from offloadlab.core.errors import OffloadlabError
    from offloadlab.lab import plots

    def broken(*args, **kw):
        raise OffloadlabError("memory plot failed")
    monkeypatch.setattr(plots, "memory_plot", broken)
    out = tmp_path / "out"
    out.mkdir()
    err = one_line_error(fails(capsys, "simulate", memgraph_file, "--gantt", out / "g.png",
                               "--chrome", out / "c.json", "--memory", out / "m.png"))
    assert "memory plot failed" in err
    assert list(out.iterdir()) == []


def test_demo_that_fails_leaves_no_directory(capsys, tmp_path, monkeypatch):
    from offloadlab.lab import plots

    def broken(*args, **kw):
        raise OSError(28, "No space left on device", str(args[1]))
    monkeypatch.setattr(plots, "gantt", broken)
    err = one_line_error(fails(capsys, "demo", "--layers", "2", "--out", tmp_path / "a" / "b"))
    assert "No space left on device" in err
    assert list(tmp_path.iterdir()) == []


def test_errors_name_the_users_path_not_a_temporary_file(capsys, tmp_path, monkeypatch):
    def full(mg, path):
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(formats, "write_memgraph", full)
    out_path = tmp_path / "mg.json"
    err = one_line_error(fails(capsys, "plan", "--workload", "matmul-chain:layers=2",
                               "--machine", "disco-example", "--out", out_path))
    assert err == f"offloadlab: error: {out_path}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


def test_strict_json_everywhere(capsys, memgraph_file, tmp_path):
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    machine = strict(memgraph_file.read_text())["graph"]["machine"]
    assert machine["gpu_gpu_bandwidth"] is None                # disco-example: unlimited
    code, out, err = run(capsys, "simulate", memgraph_file, "--json", "--chrome",
                         tmp_path / "c.json")
    assert code == 0, err
    strict(out)
    strict((tmp_path / "c.json").read_text())


def test_absurd_times_do_not_make_infinite_json(capsys, tmp_path):
    path = taskgraph_file(tmp_path, time=1e308)
    data = json.loads(path.read_text())
    data["nodes"].append({**data["nodes"][1], "id": "c", "inputs": ["b"]})
    data["edges"].append({"source": "b", "target": "c"})
    path.write_text(json.dumps(data))
    mg = tmp_path / "mg.json"
    assert run(capsys, "plan", "--taskgraph", path, "--machine", "p100x4", "--out", mg)[0] == 0
    err = one_line_error(fails(capsys, "simulate", mg, "--json"))
    assert "makespan is inf" in err


def test_reproduce_json_has_nothing_else_on_stdout():
    """HiGHS prints a banner from C the first time a process creates a solver."""
    proc = _program("reproduce", "beaumont-table1", "--only", "gpt2-38x16", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows[0]["network"] == "gpt2" and rows[0]["ilp"] > 0
    assert "HiGHS" not in proc.stderr


# -- interrupts, --version, --quiet -----------------------------------------------------------
def test_ctrl_c_prints_one_line_and_exits_130(capsys, memgraph_file, tmp_path, monkeypatch):
    from offloadlab.core import trace

    def interrupted(*args, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(trace, "to_chrome_trace", interrupted)
    code, out, err = run(capsys, "simulate", memgraph_file, "--gantt", tmp_path / "g.png",
                         "--chrome", tmp_path / "c.json")
    assert code == 130 and err == "offloadlab: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mg.json"]


def test_version(capsys):
    code, out, err = run(capsys, "--version")
    assert code == 0 and out == "offloadlab 0.1.0\n"


class Ended(Exception):
    """What the tests' stand-in for os._exit raises: the status, and what was left."""


def ending(monkeypatch) -> list[str]:
    """Replace what cli.run ends the process with (os._exit: raise Ended) and how it runs the
    exit handlers (this test process's are not to be run); returns the handlers' calls."""
    from offloadlab.lab import cli

    handled: list[str] = []

    def end(code: int):
        raise Ended(code, list(cli._left or ()))

    monkeypatch.setattr(cli, "_exit", end)
    monkeypatch.setattr(cli, "_exit_handlers", lambda: handled.append("ran"))
    monkeypatch.setattr(cli, "_left", None)
    return handled


def test_the_command_ends_with_mains_status_keeping_what_commands_leave(monkeypatch):
    """run() ends the process with main's status, after the exit handlers, the objects a
    command left unfreed; main called in a process that goes on keeps nothing."""
    from offloadlab.lab import cli

    def leave_and_fail() -> int:
        cli._leave("a graph")
        return 2

    handled = ending(monkeypatch)
    monkeypatch.setattr(cli, "main", leave_and_fail)
    with pytest.raises(Ended) as ended:
        cli.run()
    assert ended.value.args == (2, ["a graph"]) and handled == ["ran"]
    monkeypatch.setattr(cli, "_left", None)
    assert leave_and_fail() == 2 and cli._left is None


def test_ctrl_c_as_the_command_ends_is_one_line_and_130(monkeypatch, capfd):
    """Ctrl-C while the output is flushed: ``offloadlab: interrupted`` and status 130; the
    exit handlers still run."""
    from offloadlab.lab import cli

    class Interrupted:
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            raise KeyboardInterrupt

    handled = ending(monkeypatch)
    monkeypatch.setattr(cli, "main", lambda: 0)
    monkeypatch.setattr(sys, "stdout", Interrupted())
    with pytest.raises(Ended) as ended:
        cli.run()
    assert ended.value.args[0] == 130 and handled == ["ran"]
    assert capfd.readouterr().err == "offloadlab: interrupted\n"


def buffered() -> dict[str, str]:
    """This environment without PYTHONUNBUFFERED: stdout to a pipe is then block-buffered."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_the_command_flushes_its_output_and_runs_exit_handlers(tmp_path):
    """The process ends without the interpreter's teardown, but its buffered stdout (a pipe)
    is written and the exit handlers run: a temporary directory's finalizer removes it."""
    script = ("import atexit, sys, tempfile\n"
              "keep = tempfile.TemporaryDirectory(dir=sys.argv[1])\n"
              "atexit.register(print, 'handler ran', file=sys.stderr)\n"
              "sys.argv = ['offloadlab', 'list', 'machines']\n"
              "from offloadlab.lab.cli import run\n"
              "run()\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, env=buffered())
    assert done.returncode == 0, done.stderr
    assert "a100x8" in done.stdout and done.stderr == "handler ran\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_the_command_says_when_its_output_cannot_be_written():
    """``offloadlab list machines > /dev/full``: the output, still in stdout's buffer when
    the command returns, does not fit; one error line and status 2 (the interpreter's own
    flush at exit said "Exception ignored" and gave 120)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "offloadlab", "list", "machines"],
                              stdout=full, stderr=subprocess.PIPE, text=True, env=buffered())
    assert done.returncode == 2
    assert done.stderr == "offloadlab: error: stdout: No space left on device\n"


def test_the_command_runs_with_its_standard_streams_closed():
    """Started with stdout, or stdout and stderr, closed (``offloadlab list >&-``): Python
    gives it no stream objects; it ends as usual, status 0."""
    for closed in ("1", "1 2"):
        script = (f"import os, sys, runpy\nfor fd in ({closed.replace(' ', ',')},): "
                  f"os.close(fd)\nsys.argv = ['offloadlab', 'list', 'machines']\n"
                  f"os.execv(sys.executable, [sys.executable, '-m', 'offloadlab', 'list', "
                  f"'machines'])\n")
        done = subprocess.run([sys.executable, "-c", script], stderr=subprocess.PIPE,
                              text=True)
        assert done.returncode == 0 and done.stderr == "", (closed, done.stderr)


def test_the_command_ends_quietly_when_stdout_is_closed():
    """``offloadlab list machines | head -c0``: the output, still in stdout's buffer when the
    command returns, cannot be written; status 141, no message (the interpreter's own flush
    at exit said "Exception ignored" and gave 120)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "offloadlab", "list", "machines"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env=buffered())
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == ""


def test_python_m_offloadlab_runs_the_command():
    done = subprocess.run([sys.executable, "-m", "offloadlab", "simulate", "no-such.json"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("offloadlab: error: ") and done.stderr.count("\n") == 1


def test_quiet(capsys, tmp_path, monkeypatch):
    code, out, err = run(capsys, "demo", "--layers", "2", "--out", tmp_path / "a")
    assert code == 0 and "planning with levelwise" in out
    for argv in (["--quiet", "demo"], ["demo", "-q"]):
        code, out, err = run(capsys, *argv, "--layers", "2", "--out", tmp_path / "b")
        assert code == 0, err
        assert "planning" not in out and "makespan" in out and err == ""
    # progress bars show on a terminal, unless --quiet
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    run_argv = ["run", "--workload", "tp-matmul:n=64", "--machine", "p100x4:gpus=3",
                "--no-rate-limit"]
    code, out, err = run(capsys, *run_argv)
    assert code == 0 and "running" in err
    code, out, err = run(capsys, *run_argv, "--quiet")
    assert code == 0 and err == ""


def test_progress_bars_on_stderr_for_every_long_phase(capsys, tmp_path):
    """--progress shows a bar per phase on stderr (even off a terminal); stdout is unchanged
    and --quiet wins."""
    mg = tmp_path / "mg.json"
    plan_argv = ["plan", "--workload", "random:vertices=9000,gpus=2,min_bytes=4096,host_fraction=1,"
                 "max_bytes=65536", "--machine", "p100x4:gpus=2,gpu_memory=4MiB", "--out", mg]
    code, quiet_out, err = run(capsys, *plan_argv)
    assert code == 0 and err == ""                      # not a terminal: no bars
    code, out, err = run(capsys, "--progress", *plan_argv)
    assert code == 0 and out == quiet_out
    for phase in ("building random", "planning with buildmemgraph", "verifying", "writing"):
        assert phase in err, phase
    assert re.search(r"planning with buildmemgraph: +\d+%", err)   # a bar that counts
    assert err.count("\n") == 4 and err.endswith("\n")     # off a terminal each phase ends its line
    code, out, err = run(capsys, "simulate", mg, "--progress")
    assert code == 0 and "reading" in err and re.search(r"simulating \(dynamic\): +\d+%", err)
    code, out, err = run(capsys, "simulate", mg, "--progress", "--quiet")
    assert code == 0 and err == ""


def test_an_interrupt_as_a_bar_is_made_leaves_no_line_open(capsys, monkeypatch, tmp_path):
    """Ctrl-C that lands while a bar is being drawn (before it can be closed): the command's
    last line starts a line of its own."""
    import tqdm

    made = tqdm.tqdm.__init__

    def interrupted(self, *args, **kwargs):
        made(self, *args, **kwargs)
        if str(kwargs.get("desc", "")).startswith("verifying"):
            raise KeyboardInterrupt
    monkeypatch.setattr(tqdm.tqdm, "__init__", interrupted)
    code, out, err = run(capsys, "--progress", "plan", "--workload", "matmul-chain:layers=4",
                         "--machine", "p100x4", "--out", tmp_path / "mg.json")
    assert code == 130
    assert err.split("\n")[-2] == "offloadlab: interrupted", err
    assert not (tmp_path / "mg.json").exists()


@pytest.mark.slow
def test_planner_and_simulator_report_progress(disco):
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.simulator import simulate

    graph = build_workload("random:vertices=20000,gpus=2,min_bytes=4096,max_bytes=65536,"
                           "host_fraction=1")
    machine = machine_from_spec("p100x4:gpus=2,gpu_memory=4MiB")
    heard: list[int] = []
    mg = plan(graph, machine, "buildmemgraph", progress=heard.append)
    assert len(heard) >= 3 and heard == sorted(heard) and heard[-1] <= len(graph)
    assert formats.to_json(plan(graph, machine, "buildmemgraph")) == formats.to_json(mg)  # same
    levels: list[int] = []
    plan(graph, machine, "levelwise", progress=levels.append)
    assert levels
    finished: list[int] = []
    simulate(mg, machine, progress=finished.append)
    assert finished == list(range(4096, len(mg) + 1, 4096))


# -- as a program ---------------------------------------------------------------------------
def _program(*argv: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "offloadlab.lab.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=300, **kw)


def test_program_reports_user_error_without_traceback():
    proc = _program("plan", "--workload", "nope", "--machine", "v100", "--out", "x.json")
    assert proc.returncode == 2
    assert proc.stderr.startswith("offloadlab: error: unknown workload 'nope'")
    assert "Traceback" not in proc.stderr


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, contextlib, io\n"
            "from offloadlab.lab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['--help']) == 0\n"
            "heavy = [m for m in ('pandas', 'matplotlib', 'simpy', 'networkx', 'pyarrow',\n"
            "                     'numpy')\n"
            "         if m in sys.modules]\n"
            "print(heavy)\n")
    assert _fresh(code) == "[]"


def test_help_reads_no_graph_format():
    """The readers' typed records (msgspec) are built on first use, not at start-up."""
    code = ("import sys, contextlib, io\n"
            "from offloadlab.lab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['--help']) == 0\n"
            "print([m for m in sys.modules if m.startswith('offloadlab.core.formats.')])\n")
    assert _fresh(code) == "['offloadlab.core.formats.nodelink']"


def test_plan_imports_no_numpy(tmp_path):
    """Planning a TaskGraph needs none of numpy (0.05 s of every plan command's start-up)."""
    code = ("import sys, contextlib, io\n"
            "from offloadlab.lab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['plan', '--workload', 'random:vertices=300,gpus=2', '--machine',\n"
            f"                 'a100x8', '--out', {str(tmp_path / 'mg.json')!r}]) == 0\n"
            "print('numpy' in sys.modules)\n")
    assert _fresh(code) == "False"


def _fresh(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter that imports this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_list_writes_options_as_specs_do_and_plans_name_their_taskgraph_file(capsys, tmp_path):
    code, out, err = run(capsys, "list", "planners")
    assert code == 0 and "ahead=true" in out and "True" not in out
    tg = tmp_path / "model.json"
    graph = build_workload("matmul-chain:layers=2")
    graph.name = ""
    formats.to_json(graph, tg)
    mg = tmp_path / "mg.json"
    assert run(capsys, "plan", "--taskgraph", tg, "--machine", "disco-example", "--out", mg)[0] == 0
    assert json.loads(mg.read_text())["graph"]["taskgraph"] == "model"


# -- issue 42: bounds at the boundary, long work ----------------------------------------------
def test_specs_and_options_are_refused_by_the_ram_they_would_take(capsys, tmp_path, monkeypatch):
    """With 1 GB available: the estimate (measured bytes per vertex, GPU, stream slot, file
    byte; offloadlab.core.budget) refuses what would not fit and names value and estimate,
    and lets through what would."""
    from offloadlab.core import budget
    monkeypatch.setattr(budget, "ram_available", lambda: 10**9)
    out = tmp_path / "mg.json"
    for argv, message in [
        (["plan", "--workload", "random:vertices=1e6", "--machine", "p100x4", "--out", out],
         "workload 'random:vertices=1e6' (about 1e+06 vertices) would need about 1.956 GiB "
         "of RAM, more than the 953.7 MiB available"),
        (["plan", "--workload", "matmul-chain", "--machine", "p100x4:gpus=1e6", "--out", out],
         "machine 'p100x4:gpus=1e6' (1000000 GPUs, 5 streams each) would need about"),
        (["simulate", REPO / "nope.json", "--streams", "1e8"], "argument --streams"),
    ]:
        err = fails(capsys, *argv)
        assert message in err, err
    assert run(capsys, "plan", "--workload", "random:vertices=1e4,host_fraction=1",
               "--machine", "p100x4", "--out", out)[0] == 0
    err = fails(capsys, "simulate", out, "--streams", "10000000")
    assert "--streams 10000000 on 4 GPU(s) would need about 2.235 GiB of RAM" in err
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * 200_000_000)
    err = fails(capsys, "simulate", big)
    assert f"reading MemGraph JSON file '{big}' (200000001 bytes) would need about" in err


def test_ablate_validate_and_run_show_counted_steps_with_a_time_left(capsys, tmp_path):
    """--progress: a bar of steps with the count and the time left, on stderr only."""
    code, out, err = run(capsys, "--progress", "ablate", "parts", "--workload",
                         "matmul-chain:layers=2", "--machine", "disco-example", "--json")
    assert code == 0 and json.loads(out)
    assert re.search(r"ablating parts: \d+/15 steps, \S+ so far, \S+ left, \w+=", err), err
    code, out, err = run(capsys, "--progress", "ablate", "determinism", "--workload",
                         "matmul-chain:layers=2", "--machine", "disco-example", "--seeds", "2",
                         "--noise", "0,0.1", "--json")
    assert code == 0 and json.loads(out)
    assert re.search(r"ablating: \d+/6 steps", err), err
    code, out, err = run(capsys, "--progress", "validate", "--workload", "tp-matmul:n=64",
                         "--machine", "p100x4:gpus=3", "--runs", "1", "--no-rate-limit",
                         "--json")
    assert code in (0, 1) and json.loads(out)
    assert re.search(r"validating: \d+/2 steps, .* left, levelwise: planning", err), err
    code, out, err = run(capsys, "--progress", "run", "--workload", "tp-matmul:n=64",
                         "--machine", "p100x4:gpus=3", "--no-rate-limit", "--json")
    assert code == 0 and json.loads(out)
    assert re.search(r"running on the numpy backend: +\d+%", err), err
