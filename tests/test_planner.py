"""BuildMemGraph and levelwise against the papers' hand-worked cases, plus the verifier."""

import pytest
from conftest import tp_machine
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core import MemGraph, PlanError, SpecError, VerificationError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import Loc
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.planner import PLANNERS, plan
from offloadlab.planner.levelwise import levels

FIG6_ORDER = list("ABCEDF") + ["1", "2", "4", "3", "5", "6", "7", "8", "9"]


def memory_edges(mg: MemGraph) -> set[tuple[str, str]]:
    return {(u, v) for u, v, k in mg.edges() if k == "memory"}


def slot(mg: MemGraph, v: str) -> int:
    return mg[v].loc.offset // mg[v].bytes


def test_figure4_five_locations(tp_graph):
    """TURNIP Figs. 3-5: A and 4 share GPU1-Loc1, 1 and 8 share Loc3; memory edge 3 -> 4
    (3 is A's only reader); 3 -> 8 is superfluous (already a data edge); no offload."""
    m = tp_machine(5)
    mg = plan(tp_graph, m, "buildmemgraph:reserve=0")   # the paper's look-ahead
    verify(mg, tp_graph, m)
    assert mg.count("offload") == mg.count("reload") == 0
    assert slot(mg, "A") == slot(mg, "4") == 0
    assert slot(mg, "1") == slot(mg, "8") == 2
    gpu0 = {v.id for v in mg if v.loc and v.loc.device == "gpu0"}
    assert {(u, v) for u, v in memory_edges(mg) if v in gpu0} == {("3", "4")}
    assert mg.succ["3"]["8"] == "data"


def test_figure6_four_locations(tp_graph):
    """TURNIP Figs. 6-7: with four locations A is offloaded so that 4 can overwrite it, then
    reloaded over 2; edges offload_A -> 4 and 4 -> reload_A; four pairs share locations."""
    m = tp_machine(4)
    mg = plan(tp_graph, m, "buildmemgraph:reserve=0", order=FIG6_ORDER)
    verify(mg, tp_graph, m)
    (off,) = [v for v in mg if v.kind == "offload"]
    (rel,) = [v for v in mg if v.kind == "reload"]
    assert off.of == rel.of == "A"
    assert (off.id, "4") in memory_edges(mg)
    assert ("4", rel.id) in memory_edges(mg)
    assert mg.succ["A"][off.id] == "data" and mg.succ[off.id][rel.id] == "data"
    assert mg["3"].inputs == (rel.id, "1")
    pairs = {frozenset((a, b)) for a in ("A", "B", "1", "2") for b in ("4", "3", "8", rel.id)
             if slot(mg, a) == slot(mg, b)}
    assert pairs == {frozenset(p) for p in (("A", "4"), ("B", "3"), ("1", "8"), ("2", rel.id))}


def test_tensor_larger_than_gpu_names_vertex():
    from offloadlab.core.machine import machine_from_spec
    g = build_workload("matmul-chain:layers=2")
    m = machine_from_spec("disco-example:gpu_memory=40MiB")  # X2.0 needs 3 x 8 + 32 MiB
    with pytest.raises(PlanError, match=r"vertex 'X2.0' .* need\(s\) 58720256 bytes on gpu0 .* "
                                        r"capacity of 41943040 bytes"):
        plan(g, m, "buildmemgraph")


def test_gpu_inputs_that_cannot_coexist():
    from offloadlab.core import TaskGraph
    g = TaskGraph()
    for name in "abc":
        g.add_input(name, 4 * 2**20, home="gpu0")
    g.add_compute("d", "relu", ["a"], "gpu0", 4 * 2**20)
    with pytest.raises(PlanError, match=r"inputs living on gpu0 need\(s\) 12582912 bytes"):
        plan(g, tp_machine(2.5), "buildmemgraph")


def test_unknown_planner_and_options(tp_graph):
    m = tp_machine(5)
    with pytest.raises(SpecError, match="unknown planner 'magic'"):
        plan(tp_graph, m, "magic")
    with pytest.raises(SpecError, match="unknown option.*speed"):
        plan(tp_graph, m, "buildmemgraph:speed=11")
    for planner in ("buildmemgraph", "levelwise"):
        with pytest.raises(PlanError, match="unknown victim policy 'random'"):
            plan(tp_graph, m, f"{planner}:victim=random")
    with pytest.raises(SpecError, match="has 2 GPU"):
        plan(tp_graph, tp_machine(5).__class__(gpus=2), "buildmemgraph")


def test_order_must_be_topological(tp_graph):
    with pytest.raises(PlanError, match="not topological: '3' comes before its input '1'"):
        plan(tp_graph, tp_machine(5), "buildmemgraph", order=list("ABCEDF") + list("312456789"))
    mg = plan(tp_graph, tp_machine(5), "buildmemgraph:order=topological")
    verify(mg, tp_graph, tp_machine(5))


@pytest.mark.parametrize("spec", ["buildmemgraph", "buildmemgraph:victim=lru",
                                  "buildmemgraph:ahead=false", "levelwise"])
@pytest.mark.parametrize("memory", ["24MiB", "40MiB", "1GiB"])
def test_planners_verify_on_random_graphs(spec, memory):
    from offloadlab.core.machine import machine_from_spec
    g = build_workload("random:vertices=300,gpus=3,seed=7,max_bytes=4MiB,host_fraction=0.9")
    m = machine_from_spec(f"p100x4:gpus=3,gpu_memory={memory}")
    mg = plan(g, m, spec)
    verify(mg, g, m)


def test_allocation_ahead_adds_slack(tp_graph):
    """Without allocation ahead, every output is placed just before it runs: the same
    memory is reused at least as often, so there are at least as many memory edges."""
    g = build_workload("random:vertices=200,gpus=2,seed=3,max_bytes=4MiB")
    from offloadlab.core.machine import machine_from_spec
    m = machine_from_spec("p100x4:gpus=2,gpu_memory=64MiB")
    ahead, lazy = plan(g, m, "buildmemgraph"), plan(g, m, "buildmemgraph:ahead=false")
    for mg in (ahead, lazy):
        verify(mg, g, m)
    assert ahead.graph["options"]["ahead"] is True and lazy.graph["options"]["ahead"] is False


def test_levelwise_barriers(disco):
    g = build_workload("matmul-chain:layers=3")
    mg = plan(g, disco, "levelwise")
    verify(mg, g, disco)
    lv = levels(g)
    assert lv[1] == ["X2.0", "X2.1"] and lv[3] == ["X3.0", "X3.1"]
    loads = [v for v in mg if v.kind == "load" and v.of.startswith("Y2.")]
    assert len(loads) == 2
    for load in loads:            # all level-2 weights load before either matmul of layer 2
        assert {"X3.0", "X3.1"} <= set(mg.succ[load.id])
        assert {"X2.0>gpu1", "X2.1>gpu0"} <= set(mg.pred[load.id])  # after the previous level


@given(seed=st.integers(0, 2**16), vertices=st.integers(1, 150))
@settings(max_examples=40, deadline=None)
def test_levels_are_networkx_topological_generations(seed, vertices):
    """levels() against networkx's topological generations of the graph without its inputs,
    each generation in the TaskGraph's order."""
    import networkx as nx
    g = build_workload(f"random:vertices={vertices},gpus=2,seed={seed}")
    computed = nx.DiGraph()
    computed.add_nodes_from(t for t, task in g.tasks.items() if task.kind != "input")
    computed.add_edges_from((u, t) for t in computed for u in g[t].inputs if u in computed)
    position = {t: i for i, t in enumerate(g.tasks)}
    want = [sorted(level, key=position.__getitem__)
            for level in nx.topological_generations(computed)]
    assert levels(g) == want


def test_registry_lists_both():
    assert {"buildmemgraph", "levelwise"} <= set(PLANNERS)


# -- the verifier must catch each kind of broken MemGraph ------------------------------------

@pytest.fixture
def planned(tp_graph):
    m = tp_machine(4)
    return plan(tp_graph, m, "buildmemgraph", order=FIG6_ORDER), m


def test_verifier_catches_cycle(planned, tp_graph):
    mg, m = planned
    mg.add_edge("8", "3", "memory")
    with pytest.raises(VerificationError, match="rule 1"):
        verify(mg, tp_graph, m)


def test_verifier_catches_missing_data_edge(planned, tp_graph):
    mg, m = planned
    mg["8"].inputs = ("3", "3")
    with pytest.raises(VerificationError, match="rule 2: data edge '4' -> '8' is missing"):
        verify(mg, tp_graph, m)


def test_verifier_catches_race(planned, tp_graph):
    mg, m = planned
    rel = next(v.id for v in mg if v.kind == "reload")
    del mg.succ["4"][rel], mg.pred[rel]["4"]          # reload_A may now clobber 2 before 4 reads it
    with pytest.raises(VerificationError, match=f"rule 3: race on gpu0: '{rel}' overwrites '2'"):
        verify(mg, tp_graph, m)


def test_verifier_catches_out_of_capacity(planned, tp_graph):
    mg, m = planned
    mg["8"].loc = Loc("gpu0", m.gpu_memory - 100, mg["8"].bytes)
    with pytest.raises(VerificationError, match="rule 4: vertex '8'"):
        verify(mg, tp_graph, m)


def test_verifier_catches_wrong_device(planned, tp_graph):
    mg, m = planned
    mg["8"].loc = Loc("gpu1", 0, mg["8"].bytes)
    with pytest.raises(VerificationError, match="vertex '8': location on gpu1"):
        verify(mg, tp_graph, m)


def test_verifier_catches_order_against_edges(planned, tp_graph):
    mg, m = planned
    mg["8"].order, mg["3"].order = mg["3"].order, mg["8"].order
    with pytest.raises(VerificationError, match="order: data edge '3' -> '8'"):
        verify(mg, tp_graph, m)


def test_verifier_names_a_stored_capacity_that_is_no_number(planned, tp_graph):
    mg, _ = planned
    mg.graph["machine"] = {"gpu_memory": "16GB"}
    with pytest.raises(VerificationError, match="gpu_memory is '16GB', not a whole number"):
        verify(mg, tp_graph)


# -- the planner contract (issue 20) -------------------------------------------------------
def test_every_planner_follows_the_contract():
    """Typed options with a default and a description each, and plan() closes every MemGraph
    the same way: planner, TaskGraph, options and machine first in ``graph``."""
    from dataclasses import fields

    from offloadlab.planner import PLANNERS
    from offloadlab.planner.registry import Options
    chain, chain_machine = build_workload("training-chain"), machine_from_spec("v100")
    dag, dag_machine = build_workload("matmul-chain:layers=3"), machine_from_spec("disco-example")
    prefill = build_workload("llama-prefill:model=tiny,seq=8")
    for name, planner in PLANNERS.items():
        assert issubclass(planner.options, Options) and planner.doc
        assert all(f.metadata["doc"] for f in fields(planner.options))
        graph, machine = (chain, chain_machine) if planner.applies else (dag, dag_machine)
        if name == "flexgen":           # the one planner of inference
            graph = prefill
        mg = plan(graph, machine, name)
        assert list(mg.graph)[:4] == ["planner", "taskgraph", "options", "machine"]
        assert mg.graph["planner"] == name and mg.graph["machine"] == machine.to_dict()
        assert set(mg.graph["options"]) == {f.name for f in fields(planner.options)} - {"search"}


def test_options_are_checked_before_any_work():
    from offloadlab.planner.registry import check_spec
    for spec, message in (("buildmemgraph:victim=fifo", "unknown victim policy 'fifo'"),
                          ("buildmemgraph:search=0", "search must be an integer from 1"),
                          ("buildmemgraph:colour=red", "unknown option"),
                          ("ilp-select:time_limit=soon", "cannot read 'soon'"),
                          ("levelwise:victim=fifo", "unknown victim policy 'fifo'")):
        with pytest.raises((PlanError, SpecError), match=message):
            check_spec(spec)
