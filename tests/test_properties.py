"""Property tests: every planner's MemGraph passes the verifier on random DAGs, GPU counts
and capacities from tight (the smallest that can work) to generous."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadlab.core import Machine, TaskGraph
from offloadlab.core.errors import VerificationError
from offloadlab.core.verify import verify
from offloadlab.core.workloads import random_dag
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import simulate

PLANNERS = ["buildmemgraph", "buildmemgraph:victim=lru", "buildmemgraph:ahead=false",
            "buildmemgraph:order=topological", "levelwise"]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def task_graphs(draw) -> TaskGraph:
    """Arbitrary DAGs: inputs on host or GPUs, kernels on GPUs or the CPU, transfers."""
    gpus = draw(st.integers(1, 4))
    g = TaskGraph(name="hypothesis")
    n = draw(st.integers(1, 40))
    for i in range(n):
        size = draw(st.integers(1, 64)) * 1024
        earlier = list(g.tasks)
        kind = draw(st.sampled_from(["input", "compute", "compute", "compute", "transfer"])
                    if earlier else st.just("input"))
        gpu = f"gpu{draw(st.integers(0, gpus - 1))}"
        if kind == "input":
            g.add_input(f"t{i}", size, home=draw(st.sampled_from(["host", gpu])))
        elif kind == "transfer":
            on_gpu = [u for u in earlier if g[u].out_device.startswith("gpu")]
            others = [f"gpu{k}" for k in range(gpus)]
            if not on_gpu or gpus == 1:
                g.add_input(f"t{i}", size, home="host")
                continue
            src = draw(st.sampled_from(on_gpu))
            dst = draw(st.sampled_from([d for d in others if d != g[src].out_device]))
            g.add_transfer(f"t{i}", src, dst)
        else:
            device = draw(st.sampled_from([gpu, gpu, gpu, "cpu"]))
            reads = "host" if device == "cpu" else device
            readable = [u for u in earlier if g[u].out_device in (reads, "host")
                        or (device == "cpu" and g[u].out_device.startswith("gpu"))]
            inputs = draw(st.lists(st.sampled_from(readable), max_size=3, unique=True)) \
                if readable else []
            g.add_compute(f"t{i}", "mix", inputs, device, size, flops=float(size))
    return g


def machine_for(graph: TaskGraph, gpus: int, slack: float) -> Machine:
    tight = max(min_capacity(graph), 1)
    total = sum(t.bytes for t in graph)
    return Machine(gpus=gpus, gpu_memory=int(tight + slack * max(total - tight, 0)))


@settings(max_examples=1200, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.2, 0.5, 1.0]),
       planner=st.sampled_from(PLANNERS), policy=st.sampled_from(["dynamic", "fixed"]))
def test_planners_verify_on_arbitrary_dags(graph, slack, planner, policy):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    verify(mg, graph, m)
    assert sum(v.kind in ("input", "compute", "transfer") for v in mg) == len(graph)
    result = simulate(mg, m, policy)       # runs to the end without exceeding any GPU's memory
    assert len(result.trace) == sum(v.kind != "input" for v in mg)
    assert all(result.peak_memory[d] <= m.gpu_memory for d in m.gpu_names())


@settings(max_examples=600, **SETTINGS)
@given(seed=st.integers(0, 10**6), vertices=st.integers(2, 150), gpus=st.integers(1, 4),
       slack=st.sampled_from([0.0, 0.02, 0.1, 0.3, 1.0]), planner=st.sampled_from(PLANNERS),
       host_fraction=st.sampled_from([0.5, 0.9, 1.0]))
def test_planners_verify_on_layered_random_dags(seed, vertices, gpus, slack, planner,
                                                host_fraction):
    graph = random_dag(vertices=vertices, gpus=gpus, seed=seed, min_bytes=1024,
                       max_bytes=64 * 1024, host_fraction=host_fraction)
    m = machine_for(graph, gpus, slack)
    mg = plan(graph, m, planner)
    verify(mg, graph, m)


def races(mg) -> list[tuple[str, str]]:
    """Rule 3 by its definition (docs/design.md): every pair of vertices writing overlapping
    bytes, the earlier in planner order ``x``, the later ``y``, where ``x`` or a data reader of
    ``x`` other than ``y`` is not an ancestor of ``y`` (networkx, all pairs)."""
    import networkx as nx
    g = nx.DiGraph(list((u, v) for u, v, _ in mg.edges()))
    g.add_nodes_from(v.id for v in mg)
    writers = sorted((v for v in mg if v.loc is not None), key=lambda v: v.order)
    found = []
    for k, y in enumerate(writers):
        before = nx.ancestors(g, y.id)
        for x in writers[:k]:
            if x.loc.device == y.loc.device and x.loc.offset < y.loc.end \
                    and y.loc.offset < x.loc.end:
                readers = [r for r, kind in mg.succ[x.id].items() if kind == "data" and r != y.id]
                if not before.issuperset([x.id, *readers]):
                    found.append((x.id, y.id))
    return found


@settings(max_examples=300, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.05, 1.0]),
       planner=st.sampled_from(PLANNERS), cut=st.data())
def test_rule_3_finds_exactly_the_races_its_definition_finds(graph, slack, planner, cut):
    """Plans with some of their memory edges removed: the verifier reports a race (rule 3)
    exactly when some pair of writers races by the rule's definition."""
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    memory = sorted((u, v) for u, v, kind in mg.edges() if kind == "memory")
    if memory:
        for u, v in cut.draw(st.lists(st.sampled_from(memory), max_size=4, unique=True)):
            del mg.succ[u][v], mg.pred[v][u]
    expected = races(mg)
    try:
        verify(mg, machine=m)
    except VerificationError as exc:
        assert str(exc).startswith("rule 3") and expected, str(exc)
    else:
        assert not expected, expected



def damage(mg, data) -> None:
    """Break a plan in one to three random ways: a vertex reading another, an edge added (a
    cycle, perhaps) or removed, two orders swapped, a device or kind changed, a vertex gone."""
    from offloadlab.core.memgraph import MemVertex
    ids = list(mg.vertices)
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["inputs", "edge", "cut", "order", "device", "kind",
                                         "drop", "unknown input"]))
        v = mg[data.draw(st.sampled_from(ids))]
        u = mg[data.draw(st.sampled_from(ids))]
        if how == "inputs" and v.inputs:
            v.inputs = (u.id, *v.inputs[1:])
        elif how == "edge":
            mg.add_edge(v.id, u.id, data.draw(st.sampled_from(["data", "memory"])))
        elif how == "cut" and mg.pred[v.id]:
            w = data.draw(st.sampled_from(sorted(mg.pred[v.id])))
            del mg.pred[v.id][w], mg.succ[w][v.id]
        elif how == "order":
            v.order, u.order = u.order, v.order
        elif how == "device":
            v.device = data.draw(st.sampled_from(["gpu0", "gpu1", "cpu", "host"]))
        elif how == "kind":
            v.kind = data.draw(st.sampled_from(["compute", "input", "load", "offload", "odd"]))
        elif how == "drop" and len(ids) > 1 and v.id in ids:
            for w in list(mg.pred[v.id]):
                del mg.succ[w][v.id]
            for w in list(mg.succ[v.id]):
                del mg.pred[w][v.id]
            del mg.vertices[v.id], mg.succ[v.id], mg.pred[v.id]
            ids.remove(v.id)
        elif how == "unknown input":
            v.inputs = (*v.inputs, "nowhere")
    assert all(isinstance(v, MemVertex) for v in mg)


def verdict(check) -> str | None:
    try:
        check()
    except VerificationError as exc:
        return str(exc)
    return None


@settings(max_examples=300, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.2, 1.0]), data=st.data())
def test_rule_2_alone_holds_up_on_any_damage_and_verify_reports_the_rest_first(graph, slack,
                                                                                data):
    """``verify_against`` (rule 2, which the plan command checks beside the child verifying
    the other rules) raises only VerificationError, on any damage; ``verify`` raises the
    other rules' verdict first, else rule 2's, and verifying beside gives the same verdict."""
    from offloadlab.core.verify import verify_against
    from offloadlab.lab import beside

    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, "buildmemgraph")
    damage(mg, data)
    alone = verdict(lambda: verify(mg, None, m))
    against = verdict(lambda: verify_against(mg, graph))
    assert verdict(lambda: verify(mg, graph, m)) == (alone or against)
    def checked_beside():
        with beside.verifying(mg, graph, m, beside=data.draw(st.booleans(), label="beside")):
            pass
    old, beside.BESIDE_AT = beside.BESIDE_AT, 0      # forks for any graph (where it can)
    try:
        assert verdict(checked_beside) == (alone or against)
    finally:
        beside.BESIDE_AT = old
