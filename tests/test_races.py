"""A runtime that catches a broken plan (docs/races.md): execute() verifies by default, the race
detector, the adversarial dispatch policy, and the TaskGraph hash a MemGraph records."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import fails, run
from test_properties import SETTINGS, machine_for, task_graphs

from offloadlab.core import formats
from offloadlab.core.dispatch import POLICIES, Hazards, PolicyError, Queues
from offloadlab.core.errors import GraphError, VerificationError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import MemGraph
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import (
    RaceError,
    check_outputs,
    execute,
    kernels,
    reference_outputs,
)
from offloadlab.executor import races as races_module
from offloadlab.executor.races import checksum, racy_edges
from offloadlab.planner import plan
from offloadlab.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_races import broken_plans, plan_copy, plans  # noqa: E402

REPORT = re.compile(r"race on gpu\d+ \[\d+, \d+\): '([^']+)' (?:reads|offloads|copies) the "
                    r"tensor '([^']+)' wrote, whose bytes were .*?'([^']+)'")
SQUARE = "matmul-chain:layers=3,batch=64,hidden=64"     # swapped operands keep their shapes
SQUARE_MACHINE = "disco-example:gpu_memory=100KB"


def _broken(name_part: str = ""):
    """The corpus's first broken plan whose name contains ``name_part``."""
    return next(b for b in broken_plans(2) if name_part in b[0])


# -- the checksum --------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=1, max_size=80), offset=st.integers(0, 7))
def test_the_checksum_sums_little_endian_words_at_any_alignment(data, offset):
    buffer = np.zeros(offset + len(data), np.uint8)
    buffer[offset:] = np.frombuffer(data, np.uint8)
    out = np.zeros((), np.uint64)
    checksum(np, buffer[offset:], out)
    padded = data + bytes(-len(data) % 4)
    words = [int.from_bytes(padded[k:k + 4], "little") for k in range(0, len(padded), 4)]
    assert int(out) == sum(words) % 2**64


# -- the policies --------------------------------------------------------------------------------
def test_the_policies_are_one_registry():
    assert list(POLICIES) == ["dynamic", "fixed", "random", "adversarial"]
    with pytest.raises(PolicyError, match="valid policies: dynamic, fixed, random, adversarial"):
        Queues("bogus", [], [])


def test_adversarial_is_random_on_a_correct_plan():
    """No vertex of a correct plan threatens one that has not started when it is ready, and
    none is held: the simulated order is ``random``'s, seed for seed."""
    for name, _graph, m, mg in plans():
        vertices = sorted(mg, key=lambda v: v.order)
        index = {v.id: i for i, v in enumerate(vertices)}
        hazards = Hazards(vertices, [[index[w] for w in mg.succ[v.id]] for v in vertices])
        assert not any(hazards.holds), name
        for seed in range(3):
            a = simulate(mg, m, "adversarial", seed=seed).trace
            r = simulate(mg, m, "random", seed=seed).trace
            assert a.equals(r), (name, seed)


def test_adversarial_holds_the_reader_a_missing_edge_leaves_unordered():
    name, graph, m, mg, (u, v) = _broken()
    vertices = sorted(mg, key=lambda x: x.order)
    index = {x.id: i for i, x in enumerate(vertices)}
    hazards = Hazards(vertices, [[index[w] for w in mg.succ[x.id]] for x in vertices])
    assert hazards.holds[index[u]] > 0 and index[u] in hazards.holders[index[v]]
    roomy = replace(m, gpu_memory=4 * m.gpu_memory)   # the race overfills memory in use
    for seed in range(5):          # the simulator: the overwriter starts no later than u
        start = simulate(mg, roomy, "adversarial", seed=seed).trace.set_index("vertex")["start"]
        assert start[v] <= start[u]


# -- the detector ----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_each_broken_plan_is_reported_under_adversarial_dispatch(seed):
    """Each report is one line naming a reader, the writer of a tensor it reads, and a vertex
    whose planned location overlaps that tensor's, launched over it."""
    count = 0
    for name, _graph, m, mg, _edge in broken_plans(2):
        with pytest.raises(RaceError) as caught:
            execute(mg, m, policy="adversarial", seed=seed, rate_limit=False, verify=False,
                    check_races=True)
        message = str(caught.value)
        found = REPORT.match(message)
        assert found and "\n" not in message, (name, message)
        reader, writer, overwriter = found.groups()
        a, b = mg[writer].loc, mg[overwriter].loc
        assert writer in mg[reader].inputs and overwriter != writer, (name, message)
        assert a.device == b.device and a.offset < b.end and b.offset < a.end, (name, message)
        count += 1
    assert count >= 5


def test_checksums_alone_see_an_overwrite_that_happens(monkeypatch):
    """Without the last-writer map, the checksums report a broken plan whose overwriter runs
    on the reader's GPU before it (its lane runs them in launch order)."""
    monkeypatch.setattr(races_module.RaceDetector, "_check_writers", lambda *args: None)
    found = 0
    for _name, _graph, m, mg, (u, v) in broken_plans(2):
        if not (mg[u].kind == mg[v].kind == "compute" and mg[u].device == mg[v].device):
            continue
        for seed in range(3):
            with pytest.raises(RaceError, match="changed before it started by '"):
                execute(mg, m, policy="adversarial", seed=seed, rate_limit=False, verify=False,
                        check_races=True)
        found += 1
    assert found


def test_a_kernel_that_changes_its_input_is_reported_by_its_checksum(monkeypatch):
    """A write no vertex of the plan makes: the reader's own checksum after its work."""
    from offloadlab.executor import workspace

    def add_in_place(xp, out, args, scratch):
        xp.add(args[0], args[1], out=out)
        args[0][...] = 0

    monkeypatch.setattr(workspace, "kernel", lambda op, vertex: kernels.Kernel(add_in_place)
                        if op == "add" else kernels.kernel(op, vertex))
    graph = build_workload("tp-matmul:n=64")
    m = machine_from_spec("p100x4:gpus=3")
    with pytest.raises(RaceError, match="changed while it ran, by no vertex the plan launched"):
        execute(plan(graph, m, "buildmemgraph"), m, rate_limit=False, check_races=True)


@pytest.mark.parametrize("policy", ["adversarial", "random", "dynamic", "fixed"])
def test_correct_plans_are_never_reported(policy):
    for name, graph, m, mg in plans():
        reference = reference_outputs(graph)
        for seed in range(2):
            result = execute(mg, m, policy=policy, seed=seed, rate_limit=False,
                             check_races=True, poison=True)
            assert check_outputs(result.outputs, reference) is None, (name, policy, seed)


@settings(max_examples=25, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 0.3]),
       planner=st.sampled_from(["buildmemgraph", "levelwise"]), seed=st.integers(0, 2**16),
       streams=st.integers(1, 4))
def test_arbitrary_correct_plans_are_never_reported(graph, slack, planner, seed, streams):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    result = execute(mg, m, policy="adversarial", seed=seed, streams=streams,
                     rate_limit=False, check_races=True)
    assert check_outputs(result.outputs, reference_outputs(graph)) is None


def test_racy_edges_break_rule_3_and_leave_the_plan_as_it_was():
    graph = build_workload("matmul-chain:layers=3,batch=64,hidden=256")
    m = machine_from_spec("disco-example:gpu_memory=400KB")
    mg = plan(graph, m, "buildmemgraph")
    before = sorted(mg.edges())
    edges = racy_edges(mg, m)
    assert edges and sorted(mg.edges()) == before
    for u, v in edges:
        broken = plan_copy(mg)
        del broken.succ[u][v], broken.pred[v][u]
        with pytest.raises(VerificationError, match="rule 3"):
            verify(broken, graph, m)


# -- verifying by default --------------------------------------------------------------------------
def test_execute_verifies_by_default():
    name, graph, m, mg, (u, v) = _broken()
    with pytest.raises(VerificationError, match=r"^rule 3: race on gpu\d+: '[^']+' overwrites"):
        execute(mg, m, rate_limit=False)


def test_run_refuses_a_broken_plan_unless_told_not_to_verify(capsys, tmp_path):
    name, graph, m, mg, (u, v) = _broken("matmul-chain")
    path = tmp_path / "broken.json"
    formats.to_json(mg, path)
    err = fails(capsys, "run", path, "--no-rate-limit")
    assert "is not a correct plan: rule 3: race on" in err and len(err.splitlines()) == 1
    code, out, err = run(capsys, "run", path, "--no-rate-limit", "--no-verify", "--policy",
                         "adversarial", "--check")
    assert code == 1
    assert err.splitlines()[-1].startswith("offloadlab: check failed: race on gpu")


# -- the TaskGraph a MemGraph was planned from --------------------------------------------------
def _swapped(mg: MemGraph) -> str:
    """Swap the operands of ``mg``'s first matmul; its id."""
    v = next(x for x in sorted(mg, key=lambda x: x.order) if x.op == "matmul")
    v.inputs = v.inputs[::-1]
    return v.id


def test_a_memgraph_with_swapped_matmul_operands_is_refused_given_the_workload(capsys,
                                                                               tmp_path):
    graph = build_workload(SQUARE)
    m = machine_from_spec(SQUARE_MACHINE)
    mg = plan(graph, m, "buildmemgraph")
    _swapped(mg)
    path = tmp_path / "swapped.json"
    formats.to_json(mg, path)
    # the file alone: it verifies and computes what it says (the reference is its own)
    code, out, err = run(capsys, "run", path, "--check", "--no-rate-limit")
    assert code == 0 and "warning: --check compares the outputs with the TaskGraph" in err
    # given the workload it was planned from: rule 2 refuses it, or its outputs do
    assert "rule 2" in fails(capsys, "run", path, "--check", "--workload", SQUARE)
    code, out, err = run(capsys, "run", path, "--check", "--workload", SQUARE, "--no-verify",
                         "--no-rate-limit")
    assert code == 1 and "check failed: output" in err


def test_a_memgraph_planned_from_another_taskgraph_is_refused(capsys, tmp_path):
    graph = build_workload(SQUARE)
    m = machine_from_spec(SQUARE_MACHINE)
    other = formats.taskgraph_from_json(formats.to_json(graph))
    swapped = next(t for t in other if t.op == "matmul")
    swapped.inputs = swapped.inputs[::-1]
    path = tmp_path / "other.json"
    formats.to_json(plan(other, m, "buildmemgraph"), path)
    formats.to_json(graph, tmp_path / "tg.json")
    for reference in (["--workload", SQUARE], ["--taskgraph", tmp_path / "tg.json"]):
        err = fails(capsys, "run", path, "--check", *reference)
        assert re.fullmatch(r"offloadlab: error: .*other\.json was planned from TaskGraph "
                            r"sha256:[0-9a-f]{12}\.\.\., not from .* \(sha256:[0-9a-f]{12}"
                            r"\.\.\.\)\n", err), err


def test_taskgraph_writes_the_file_whose_hash_plans_record(capsys, tmp_path):
    out = tmp_path / "tg.json"
    code, text, err = run(capsys, "taskgraph", "--workload", SQUARE, "--out", out)
    assert code == 0, err
    graph = formats.taskgraph_from_json(out)
    digest = build_workload(SQUARE).content_hash()
    assert graph.content_hash() == digest and digest in text
    assert run(capsys, "plan", "--taskgraph", out, "--machine", SQUARE_MACHINE, "--out",
               tmp_path / "mg.json")[0] == 0
    assert formats.read_memgraph(tmp_path / "mg.json").graph["taskgraph_hash"] == digest
    code, text, err = run(capsys, "run", tmp_path / "mg.json", "--check", "--taskgraph", out,
                          "--no-rate-limit", "--policy", "adversarial")
    assert code == 0 and "outputs: equal to the reference" in text
    assert "only" in fails(capsys, "taskgraph", "--workload", SQUARE, "--out",
                           tmp_path / "tg.parquet")
    assert not (tmp_path / "tg.parquet").exists()


@settings(max_examples=60, **SETTINGS)
@given(graph=task_graphs())
def test_the_content_hash_survives_a_file_and_ignores_the_name(graph):
    digest = graph.content_hash()
    back = formats.taskgraph_from_json(formats.to_json(graph))
    back.name = "renamed"
    assert back.content_hash() == digest
    reordered = next((t for t in back if len(set(t.inputs)) > 1), None)
    if reordered is not None:
        reordered.inputs = reordered.inputs[::-1]
        assert back.content_hash() != digest


def test_json_and_parquet_keep_the_hash_and_refuse_a_malformed_one(tmp_path):
    graph = build_workload(SQUARE)
    mg = plan(graph, machine_from_spec(SQUARE_MACHINE), "buildmemgraph")
    assert mg.graph["taskgraph_hash"] == graph.content_hash()
    formats.write_memgraph(mg, tmp_path / "mg.parquet")
    assert formats.read_memgraph(tmp_path / "mg.parquet").graph["taskgraph_hash"] == \
        graph.content_hash()
    data = json.loads(formats.to_json(mg))
    data["graph"]["taskgraph_hash"] = "md5:abc"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(GraphError, match=r"bad\.json'?: graph\.taskgraph_hash must be "
                                         r"'sha256:' and 64 lowercase hex digits.*'md5:abc'"):
        formats.read_memgraph(tmp_path / "bad.json")
    table = pq.read_table(tmp_path / "mg.parquet")
    meta = dict(table.schema.metadata)
    stored = json.loads(meta[b"offloadlab.graph"])
    stored["taskgraph_hash"] = 7
    meta[b"offloadlab.graph"] = json.dumps(stored).encode()
    pq.write_table(pa.Table.from_batches(table.to_batches(), table.schema.with_metadata(meta)),
                   tmp_path / "bad.parquet")
    with pytest.raises(GraphError, match=r"graph\.taskgraph_hash must be .*got 7"):
        formats.read_memgraph(tmp_path / "bad.parquet")
