"""Trace rows, Chrome trace export and memory over time, against values worked out by hand."""

import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.core.memory import memory_over_time, peak_memory
from offloadlab.core.trace import TRACE_COLUMNS, make_trace, to_chrome_trace, write_chrome_trace


def row(vertex, start, end, kind="compute", device="gpu0", resource="gpu0", stream=0,
        nbytes=1, run=0, source="sim"):
    return {"vertex": vertex, "kind": kind, "device": device, "resource": resource,
            "stream": stream, "start": start, "end": end, "bytes": nbytes, "flops": 0.0,
            "source": source, "run": run}


def test_make_trace_columns_and_types():
    trace = make_trace([row("a", 0, 1), row("b", 1, 2.5, stream=2)])
    assert list(trace.columns) == TRACE_COLUMNS
    assert trace["start"].dtype == "float64" and trace["stream"].dtype == "int64"
    assert trace["end"].tolist() == [1.0, 2.5]
    columns = {c: [r[c] for r in (row("a", 0, 1),)] for c in TRACE_COLUMNS}
    assert make_trace(columns).equals(make_trace([row("a", 0, 1)]))
    empty = make_trace([])
    assert list(empty.columns) == TRACE_COLUMNS and len(empty) == 0


def test_make_trace_rejects_bad_rows():
    with pytest.raises(ValueError, match="source"):
        make_trace([row("a", 0, 1, source="guess")])
    bad = row("a", 0, 1)
    del bad["stream"]
    with pytest.raises(ValueError, match="missing.*stream"):
        make_trace([bad])
    with pytest.raises(ValueError, match="unknown.*color"):
        make_trace([{**row("a", 0, 1), "color": "red"}])
    columns = {c: [r[c] for r in (row("a", 0, 1), row("b", 1, 2))] for c in TRACE_COLUMNS}
    columns["start"] = [0.0]
    with pytest.raises(ValueError, match="lengths differ"):
        make_trace(columns)


def test_chrome_trace_events(tmp_path):
    trace = make_trace([
        row("k", 0.5, 0.75, stream=3),
        row("L", 0.0, 2.0, kind="load", resource="h2d:gpu0", nbytes=64),
        row("k2", 1.0, 1.5, stream=1),
    ])
    chrome = to_chrome_trace(trace)
    spans = {e["name"]: e for e in chrome["traceEvents"] if e["ph"] == "X"}
    assert set(spans) == {"k", "L", "k2"}
    assert (spans["k"]["ts"], spans["k"]["dur"], spans["k"]["tid"]) == (500000.0, 250000.0, 3)
    assert (spans["L"]["ts"], spans["L"]["dur"], spans["L"]["tid"]) == (0.0, 2e6, 0)
    assert spans["L"]["args"]["bytes"] == 64 and spans["L"]["cat"] == "load"
    lanes = {e["pid"]: e["args"]["name"] for e in chrome["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(lanes.values()) == ["gpu0", "h2d:gpu0"]
    assert spans["k"]["pid"] == spans["k2"]["pid"] != spans["L"]["pid"]
    assert lanes[spans["L"]["pid"]] == "h2d:gpu0"
    path = tmp_path / "trace.json"
    write_chrome_trace(trace, path)
    assert json.loads(path.read_text()) == chrome


def test_chrome_trace_separates_runs():
    trace = make_trace([row("k", 0, 1, run=0), row("k", 0, 2, run=1)])
    lanes = sorted(e["args"]["name"] for e in to_chrome_trace(trace)["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "process_name")
    assert lanes == ["run 0 gpu0", "run 1 gpu0"]


def _graph() -> MemGraph:
    """x (input on gpu0, 10 B) -> C1 (20 B) -> {O (offload), C2 (5 B, a graph output)};
    D on gpu1 never ran (not in the trace)."""
    mg = MemGraph()
    for id, kind, device, nbytes, loc, inputs in [
            ("x", "input", "gpu0", 10, Loc("gpu0", 0, 10), ()),
            ("C1", "compute", "gpu0", 20, Loc("gpu0", 10, 20), ("x",)),
            ("O", "offload", "gpu0", 20, None, ("C1",)),
            ("C2", "compute", "gpu0", 5, Loc("gpu0", 30, 5), ("C1",)),
            ("D", "compute", "gpu1", 7, Loc("gpu1", 0, 7), ())]:
        mg.add_vertex(MemVertex(id, kind, device, nbytes, loc, inputs=inputs))
        for u in inputs:
            mg.add_edge(u, id, "data")
    mg.add_edge("x", "C2", "memory")  # memory edges do not extend lifetimes
    return mg


def _graph_trace():
    return make_trace([row("C1", 1.0, 2.0, nbytes=20),
                       row("O", 3.0, 5.0, kind="offload", resource="d2h:gpu0", nbytes=20),
                       row("C2", 2.0, 4.0, nbytes=5)])


def test_memory_over_time_by_hand():
    # gpu0: x [0, 2) 10 B (until C1 ends); C1 [1, 5) 20 B (until O ends, after C2 at 4);
    # C2 [2, 5) 5 B (no readers: to the end of the run, 5).  host: O's 20 B from 3 to the end.
    memory = memory_over_time(_graph_trace(), _graph())
    assert list(memory.columns) == ["time", "device", "bytes"]
    assert memory.values.tolist() == [
        [0.0, "gpu0", 10], [1.0, "gpu0", 30], [2.0, "gpu0", 25], [3.0, "host", 20],
        [5.0, "gpu0", 0], [5.0, "host", 0]]
    assert peak_memory(_graph_trace(), _graph()) == {"gpu0": 30, "gpu1": 0, "host": 20}


def reference_memory_over_time(trace, memgraph):
    """memory_over_time's docstring, followed vertex by vertex with dicts (how it was first
    written), to test the vectorized one against."""
    import bisect

    import pandas as pd

    start = dict(zip(trace["vertex"], trace["start"].tolist()))
    end = dict(zip(trace["vertex"], trace["end"].tolist()))
    run_end = max(end.values(), default=0.0)
    changes, unread = [], {}
    for v in memgraph:
        begin = start.get(v.id, 0.0 if v.kind == "input" else None)
        if begin is None:
            continue
        if v.loc is not None:
            ends = [end[w] for w, kind in memgraph.succ[v.id].items()
                    if kind == "data" and w in end]
            if ends:
                changes += [(v.loc.device, begin, v.loc.size), (v.loc.device, max(ends),
                                                                 -v.loc.size)]
            else:
                unread[v.id] = (begin, v.loc.device, v.loc.size)
        if v.kind == "input" and v.device == "host":         # host RAM: the whole run
            changes += [("host", 0.0, v.bytes), ("host", run_end, -v.bytes)]
        elif v.kind == "offload" or v.device == "cpu":        # until its last reader ends
            ends = [end[w] for w, kind in memgraph.succ[v.id].items()
                    if kind == "data" and w in end]
            changes += [("host", begin, v.bytes), ("host", max([end[v.id], *ends]), -v.bytes)]
    writers = sorted((start.get(v.id, 0.0), v.order, i, v.id, v.loc)
                     for i, v in enumerate(memgraph)
                     if v.loc is not None and (v.id in start or v.kind == "input"))
    alive: dict = {}
    overwritten = {}
    for time, _, _, vid, loc in writers:
        spans = alive.setdefault(loc.device, [])
        for span in [s for s in spans if s[0] < loc.end and s[1] > loc.offset]:
            spans.remove(span)
            overwritten[span[2]] = time
        if vid in unread:
            bisect.insort(spans, (loc.offset, loc.end, vid))
    for vid, (begin, device, size) in unread.items():
        changes += [(device, begin, size), (device, overwritten.get(vid, run_end), -size)]
    frame = pd.DataFrame(changes, columns=["device", "time", "bytes"])
    steps = frame.groupby(["device", "time"], sort=True)["bytes"].sum()
    steps = steps[steps != 0].groupby(level="device").cumsum().reset_index()
    return steps.sort_values(["time", "device"], kind="stable")[["time", "device", "bytes"]] \
                .reset_index(drop=True)


@given(seed=st.integers(0, 2**16), factor=st.sampled_from([1.0, 1.2, 3.0]),
       policy=st.sampled_from(["dynamic", "fixed", "random"]), noise=st.sampled_from([0, 0.3]),
       drop=st.integers(0, 5))
@settings(max_examples=40, deadline=None)
def test_memory_over_time_agrees_with_the_rule_vertex_by_vertex(seed, factor, policy, noise,
                                                                 drop):
    """Planned and simulated random DAGs (with copies dropped unread, outputs, offloads), and
    the same trace with every ``drop``-th row missing; the vectorized accounting gives the
    very rows the rule followed vertex by vertex gives."""
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity
    from offloadlab.simulator import simulate

    graph = build_workload(f"random:vertices=80,gpus=2,seed={seed},host_fraction=0.5")
    machine = machine_from_spec(f"p100x4:gpus=2,gpu_memory={int(min_capacity(graph) * factor)}")
    mg = plan(graph, machine, "buildmemgraph")
    trace = simulate(mg, machine, policy=policy, noise=noise, seed=seed).trace
    if drop:
        trace = trace.iloc[[i for i in range(len(trace)) if i % (drop + 1)]]
    got = memory_over_time(trace, mg)
    want = reference_memory_over_time(trace, mg)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_memory_needs_a_single_run():
    trace = make_trace([row("C1", 1.0, 2.0, run=0), row("C1", 1.0, 2.0, run=1)])
    with pytest.raises(ValueError, match="several runs"):
        memory_over_time(trace, _graph())


# -- the rules every Perfetto trace the CLI writes follows (issue 18) -----------------------
def check_perfetto(text: str, flows: bool = False) -> dict:
    """Strict JSON; every slice on a named thread of a named, sorted process, finite and
    non-negative, and the slices of a thread never overlap; every GPU that ran something has a
    memory counter track; with ``flows``, each flow starts no later than it ends."""
    from offloadlab.core.devices import is_gpu, lane_key
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a trace"))
    events = data["traceEvents"]
    assert {e["ph"] for e in events} <= {"M", "X", "C", "s", "f"}
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events
             if e["name"] == "process_sort_index"}
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    lanes = sorted({e["pid"] for e in slices}, key=order.__getitem__)
    assert [names[p] for p in lanes] == sorted((names[p] for p in lanes), key=lane_key)
    by_thread: dict = {}
    for e in slices:
        assert e["pid"] in names and (e["pid"], e["tid"]) in threads
        assert e["ts"] >= 0 and e["dur"] >= 0
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:])), spans
    counters = {e["pid"] for e in events if e["ph"] == "C"}
    assert {p for p in lanes if is_gpu(names[p])} <= counters
    assert all(e["args"]["bytes"] >= 0 for e in events if e["ph"] == "C")
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(ends) and (bool(starts) or not flows)
    assert all(starts[i]["ts"] <= ends[i]["ts"] + 1e-6 for i in starts)
    return data


def test_every_trace_the_cli_writes_follows_the_rules(tmp_path, capsys):
    from offloadlab.lab.cli import main
    assert main(["demo", "--layers", "3", "--out", str(tmp_path / "demo"), "-q"]) == 0
    for plan in ("levelwise", "buildmemgraph"):
        check_perfetto((tmp_path / "demo" / f"{plan}.trace.json").read_text(), flows=True)
    mg = tmp_path / "mg.json"
    assert main(["plan", "--workload", "random:vertices=60,gpus=2,seed=3", "--machine",
                 "p100x4:gpus=2,gpu_memory=40MB", "--out", str(mg), "-q"]) == 0
    for extra in ([], ["--flows"], ["--noise", "0.3", "--seed", "2", "--policy", "random"]):
        assert main(["simulate", str(mg), "--chrome", str(tmp_path / "s.json"), "-q",
                     *extra]) == 0
        check_perfetto((tmp_path / "s.json").read_text(), flows="--flows" in extra)
    assert main(["run", str(mg), "--chrome", str(tmp_path / "r.json"), "--no-rate-limit",
                 "--flows", "-q"]) == 0
    check_perfetto((tmp_path / "r.json").read_text(), flows=True)
    capsys.readouterr()
