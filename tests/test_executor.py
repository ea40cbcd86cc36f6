"""The executor on the numpy backend: every planner's MemGraph computes the reference outputs
under every dispatch policy and many seeds with poisoning on; a missing memory edge is caught;
errors are clean; the measured trace respects the edges and the rate limits."""

from __future__ import annotations

import _thread
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import SETTINGS, machine_for, task_graphs

from offloadlab.core import Machine
from offloadlab.core.errors import VerificationError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.core.ops import arrays, elementwise, norm
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import (
    ExecutionError,
    KernelError,
    StallError,
    check_outputs,
    execute,
    kernels,
    reference_outputs,
    reference_spread,
    taskgraph_of,
)
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity

pytestmark = pytest.mark.slow

SEEDS = range(50)
# Runs per policy: a seed draws the order under ``random``; under ``dynamic`` and ``fixed`` it
# only repeats the run (the lanes' timing differs from run to run)
RUNS = {"dynamic": range(10), "fixed": range(10), "random": SEEDS}
POLICIES = ("dynamic", "fixed", "random")
GENERAL = ("buildmemgraph", "levelwise")
TRAINING = GENERAL + ("greedy-offload", "greedy-offload-nodiscount", "l2l", "ilp-select")
CHAIN = "w=400KB;300KB;400KB;500KB,a=100KB;60KB;100KB;80KB,uF=0.1;0.1;0.1;0.1,uB=0.2;0.2;0.2;0.2"

# (workload, machine with tight memory, planners): small enough for CI, tight enough that
# the plans offload and reload
CASES = [
    ("matmul-chain:layers=3,batch=64,hidden=256", "disco-example:gpu_memory=400KB", GENERAL),
    ("tp-matmul:n=64", "p100x4:gpus=3,gpu_memory=64KB", GENERAL),
    ("random:vertices=60,gpus=2,min_bytes=4096,max_bytes=65536,seed=5", "p100x4:gpus=2", GENERAL),
    (f"training-chain:{CHAIN}", "v100:gpu_memory=1600KB", TRAINING),
    ("gpt2-train:depth=3,batch=1,seq=8,weight_bytes=300000,iterations=2",
     "v100:gpu_memory=900KB", TRAINING),
]


def _tight(graph, spec: str) -> Machine:
    m = machine_from_spec(spec)
    if "gpu_memory" in spec:
        return m
    return machine_for(graph, m.gpus, 0.05)


def _lanes_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("offloadlab-")]


@pytest.mark.parametrize("workload,machine,planners", CASES,
                         ids=[c[0].split(":")[0] for c in CASES])
def test_every_planner_computes_the_reference(workload, machine, planners):
    graph = build_workload(workload)
    m = _tight(graph, machine)
    reference = reference_outputs(graph)
    for planner in planners:
        mg = plan(graph, m, planner)
        verify(mg, graph, m)
        assert mg.count("offload") + mg.count("reload") + mg.count("load") > 0
        for policy in POLICIES:
            for seed in RUNS[policy]:
                result = execute(mg, m, policy=policy, seed=seed, poison=True, rate_limit=False)
                wrong = check_outputs(result.outputs, reference)
                assert wrong is None, f"{planner}, {policy}, seed {seed}: {wrong}"
    assert not _lanes_alive()


@settings(max_examples=60, **SETTINGS)
@given(graph=task_graphs(), slack=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
       planner=st.sampled_from(["buildmemgraph", "buildmemgraph:victim=lru",
                                "buildmemgraph:ahead=false", "levelwise"]),
       policy=st.sampled_from(POLICIES), seed=st.integers(0, 2**16), streams=st.integers(1, 5))
def test_arbitrary_dags_compute_the_reference(graph, slack, planner, policy, seed, streams):
    m = machine_for(graph, 4, slack)
    mg = plan(graph, m, planner)
    result = execute(mg, m, policy=policy, seed=seed, streams=streams, poison=True,
                     rate_limit=False)
    assert check_outputs(result.outputs, reference_outputs(graph)) is None


def test_memgraph_alone_gives_its_taskgraph():
    graph = build_workload(f"training-chain:{CHAIN}")
    mg = plan(graph, machine_from_spec("v100:gpu_memory=1600KB"), "buildmemgraph")
    rebuilt = taskgraph_of(mg)
    assert set(rebuilt.tasks) == set(graph.tasks)
    assert all(rebuilt[t].inputs == graph[t].inputs for t in graph.tasks)
    assert sorted(rebuilt.outputs()) == sorted(graph.outputs())


def _racy_load_edge(mg):
    """A memory edge from a matmul into the load that overwrites the weight it reads."""
    for u, v, kind in mg.edges():
        if kind == "memory" and mg[v].kind == "load" and mg[u].kind == "compute":
            loc = mg[v].loc
            for w in mg[u].inputs:
                other = mg[w].loc
                if other and other.device == loc.device and other.offset < loc.end \
                        and loc.offset < other.end:
                    return u, v
    raise AssertionError("no such edge")


def test_a_removed_memory_edge_gives_a_wrong_answer():
    """The weight load of the next level may then overwrite the weight a matmul is reading:
    the verifier rejects the MemGraph, and some seed of random dispatch computes garbage."""
    graph = build_workload("matmul-chain:layers=3,batch=64,hidden=256")
    m = machine_from_spec("disco-example:gpu_memory=400KB")
    mg = plan(graph, m, "buildmemgraph")
    u, v = _racy_load_edge(mg)
    del mg.succ[u][v], mg.pred[v][u]
    with pytest.raises(VerificationError, match="rule 3"):
        verify(mg, graph, m)
    reference = reference_outputs(graph)
    wrong = [seed for seed in SEEDS if check_outputs(
        execute(mg, m, policy="random", seed=seed, poison=True, rate_limit=False,
                verify=False).outputs,
        reference)]
    assert wrong, "no seed exposed the race"


def test_measured_trace_respects_the_edges_and_memory():
    graph = build_workload("random:vertices=80,gpus=2,min_bytes=4096,max_bytes=65536,seed=2")
    m = machine_for(graph, 2, 0.0)
    mg = plan(graph, m, "buildmemgraph")
    result = execute(mg, m, policy="random", seed=3, rate_limit=False)
    trace = result.trace
    assert set(trace["source"]) == {"measured"}
    assert len(trace) == sum(v.kind != "input" for v in mg)
    start = dict(zip(trace["vertex"], trace["start"]))
    end = dict(zip(trace["vertex"], trace["end"]))
    assert all(start[v] <= end[v] for v in start)
    for u, v, _ in mg.edges():
        if u in end and v in start:
            assert end[u] <= start[v], f"{v} started before {u} ended"
    assert all(result.peak_memory[d] <= m.gpu_memory for d in m.gpu_names())
    assert result.makespan == pytest.approx(trace["end"].max())
    assert set(result.busy) == set(trace["resource"])


def test_copies_keep_to_the_rate_limit():
    graph = build_workload("matmul-chain:layers=2,batch=64,hidden=512")
    m = machine_from_spec("disco-example:h2d_bandwidth=100e6,host_bus_bandwidth=0,"
                          "gpu_gpu_bandwidth=1e9")
    result = execute(plan(graph, m, "buildmemgraph"), m)
    loads = result.trace[result.trace["kind"] == "load"]
    assert len(loads) == 4
    for row in loads.itertuples():
        assert row.end - row.start >= 0.99 * row.bytes / 100e6


def _loads(*gpus: int, nbytes: int = 2 * 10**6) -> MemGraph:
    """One load of a host input onto each of ``gpus``, all ready at once."""
    mg = MemGraph()
    mg.add_vertex(MemVertex("x", "input", "host", nbytes))
    for order, g in enumerate(gpus, 1):
        mg.add_vertex(MemVertex(f"L{g}", "load", f"gpu{g}", nbytes, Loc(f"gpu{g}", 0, nbytes),
                                of="x", inputs=("x",), order=order))
        mg.add_edge("x", f"L{g}", "data")
    return mg


def test_copies_of_gpus_behind_one_bus_take_turns_as_simulated():
    """p100x4 puts GPUs 0-1 and 2-3 behind two PCIe switches: the loop holds a GPU's bus
    for its copy, so loads onto one pair never overlap and loads onto two pairs do."""
    m = machine_from_spec("p100x4:h2d_bandwidth=100e6,host_bus_bandwidth=100e6")
    for gpus, overlap in (((0, 1), False), ((1, 2), True)):
        trace = execute(_loads(*gpus), m).trace
        first, second = trace.sort_values("start").itertuples()
        assert (second.start < first.end) == overlap, trace
        assert set(trace["resource"]) == {f"h2d:gpu{g}" for g in gpus}


def test_simulator_and_executor_share_the_random_policy():
    from offloadlab.simulator import simulate
    graph = build_workload("random:vertices=60,gpus=2,seed=1")
    m = machine_for(graph, 2, 0.1)
    mg = plan(graph, m, "buildmemgraph")
    orders = {tuple(simulate(mg, m, "random", seed=s).trace.sort_values("start")["vertex"])
              for s in range(5)}
    assert len(orders) > 1


# -- errors -----------------------------------------------------------------------------------
def _small():
    graph = build_workload("random:vertices=40,gpus=2,min_bytes=4096,max_bytes=65536,seed=4")
    m = machine_for(graph, 2, 0.0)
    return graph, m, plan(graph, m, "buildmemgraph")


def test_a_failing_kernel_names_the_vertex(monkeypatch):
    graph, m, mg = _small()
    victim = next(v.id for v in mg if v.kind == "compute")

    def broken(xp, out, args, scratch):
        if out.size == mg[victim].bytes // 4 and broken.calls == 0:
            broken.calls += 1
            raise FloatingPointError("boom")
        elementwise.combine(xp, out, args, scratch)
    broken.calls = 0
    monkeypatch.setitem(kernels.KERNELS, "mix",
                        kernels.Kernel(broken, kernels.KERNELS["mix"].scratch))
    with pytest.raises(ExecutionError, match="failed: FloatingPointError: boom"):
        execute(mg, m, rate_limit=False)
    assert not _lanes_alive()


def test_an_unknown_op_names_the_vertex_and_the_known_ops():
    graph, m, mg = _small()
    victim = next(v for v in mg if v.kind == "compute")
    victim.op = "frobnicate"
    with pytest.raises(KernelError, match=f"vertex '{victim.id}': no kernel for op "
                                          "'frobnicate'; known ops: .*matmul"):
        execute(mg, m)
    assert not _lanes_alive()


def test_memory_too_small_names_the_vertex():
    graph, m, mg = _small()
    smaller = Machine(gpus=2, gpu_memory=min_capacity(graph) // 2)
    with pytest.raises(ExecutionError, match="vertex '.*': location .* lies outside"):
        execute(mg, smaller, verify=False)      # the executor's own check, past rule 4
    offloads = [v for v in mg if v.kind == "offload"]
    if offloads:
        with pytest.raises(ExecutionError, match="the host block"):
            execute(mg, m, host_memory=1, rate_limit=False)
    assert not _lanes_alive()


def test_a_fixed_order_against_the_edges_stalls():
    graph, m, mg = _small()
    computes = sorted((v for v in mg if v.kind == "compute" and v.device == "gpu0"),
                      key=lambda v: v.order)
    first, last = computes[0], computes[-1]
    first.order, last.order = last.order, first.order   # gpu0 must now run `last` first
    with pytest.raises(StallError, match="execution stalled"):
        execute(mg, m, policy="fixed", streams=1, rate_limit=False, verify=False)
    assert not _lanes_alive()


def test_the_watchdog_names_a_hung_vertex(monkeypatch):
    graph, m, mg = _small()
    monkeypatch.setitem(kernels.KERNELS, "mix", kernels.Kernel(lambda *a: time.sleep(0.6)))
    with pytest.raises(StallError, match=r"no vertex completed for 0.2 s.*running"):
        execute(mg, m, watchdog=0.2, rate_limit=False)
    assert not _lanes_alive()


def test_a_copy_paced_to_an_absurdly_slow_link_is_stopped_by_the_watchdog():
    """One wait of a copy at 1e-30 B/s overflowed ``time.sleep`` (an OverflowError for the
    vertex); it now waits in slices, and the watchdog stops it, saying what may be slow."""
    graph = build_workload("matmul-chain:layers=2,gpus=1")
    m = machine_from_spec("p100x4:gpus=1,h2d_bandwidth=1e-30")
    mg = plan(graph, m, "buildmemgraph")
    assert mg.count("load")
    with pytest.raises(StallError, match=r"no vertex completed for 0.5 s; .*a copy paced to a "
                       r"very slow link.*'load:.*running"):
        execute(mg, m, watchdog=0.5)
    assert not _lanes_alive()


def test_ctrl_c_stops_within_a_second(monkeypatch, ctrl_c):
    graph, m, mg = _small()
    # kernels of 0.2 s: the run takes seconds, so the interrupt lands in it however late a
    # loaded machine wakes the timer; the bound counts from the interrupt
    monkeypatch.setitem(kernels.KERNELS, "mix", kernels.Kernel(lambda *a: time.sleep(0.2)))
    fired: list[float] = []

    def interrupt() -> None:
        fired.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(0.3, interrupt)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        execute(mg, m, rate_limit=False)
    assert time.perf_counter() - fired[0] < 1.0
    assert not _lanes_alive()


# -- kernels ----------------------------------------------------------------------------------
def _run(op: str, out: np.ndarray, *args: np.ndarray) -> np.ndarray:
    k = kernels.KERNELS[op]
    k.fn(np, out, args, np.empty(k.scratch(out, args), np.uint8))
    return out


def test_kernels_against_plain_formulas():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    w = rng.standard_normal((12, 5))
    x = x.astype(np.float32)
    y = y.astype(np.float32)
    w = w.astype(np.float32)
    out = np.empty((8, 6), np.float32)
    assert np.allclose(_run("matmul", np.empty((8, 5), np.float32), x, y, w), np.hstack([x, y]) @ w,
                       atol=1e-5)
    assert np.allclose(_run("add", out, x, y), x + y)
    assert np.allclose(_run("mul", out, x, y), x * y)
    assert np.allclose(_run("relu", out, x), np.maximum(x, 0))
    assert np.allclose(_run("silu", out, x), x / (1 + np.exp(-x)), atol=1e-6)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert np.allclose(_run("gelu", out, x), gelu, atol=1e-6)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert np.allclose(_run("softmax", out, x), e / e.sum(axis=1, keepdims=True), atol=1e-6)
    rms = x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + norm.NORM_EPS)
    assert np.allclose(_run("rmsnorm", out, x), rms, atol=1e-5)
    gain = rng.standard_normal(6).astype(np.float32)
    ln = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True)
                                                       + norm.NORM_EPS)
    assert np.allclose(_run("layernorm", out, x, gain), ln * gain, atol=1e-4)
    adam = x - elementwise.ADAM_LR * y / (np.abs(y) + elementwise.ADAM_EPS)
    assert np.allclose(_run("adam_update", out, x, y), adam, atol=1e-6)
    assert np.allclose(_run("sgd_update", out, x, y), x - elementwise.SGD_LR * y)


def test_synthetic_ops_read_every_input_element():
    out = np.empty(10, np.float32)
    a, b = np.ones(25, np.float32), np.ones(4, np.float32)
    base = _run("mix", out.copy(), a, b).copy()
    for x in (a, b):
        for i in range(x.size):
            x[i] = 2.0
            assert not np.array_equal(_run("mix", out.copy(), a, b), base)
            x[i] = 1.0


def test_matmul_without_shapes_is_a_clear_error():
    with pytest.raises(KernelError, match="2-D shapes"):
        _run("matmul", np.empty(16, np.float32), np.empty(16, np.float32),
             np.empty(16, np.float32))


def test_a_host_tensor_read_twice_by_one_vertex_lives_until_its_last_reader():
    """``b`` reads the offloaded ``a`` twice; ``c`` reads it after: the host copy must not be
    freed (and poisoned) when ``b`` completes."""
    from offloadlab.core import TaskGraph
    g = TaskGraph(name="twice")
    g.add_input("i", 4096, home="gpu0")
    g.add_compute("a", "mix", ["i"], "gpu0", 4096)
    g.add_compute("b", "mix", ["a", "a"], "cpu", 4096)
    g.add_compute("c", "mix", ["a"], "cpu", 4096)
    m = Machine(gpus=1, gpu_memory=2**20)
    mg = plan(g, m, "buildmemgraph")
    assert [u for u in mg["b"].inputs] == [mg["c"].inputs[0]] * 2
    for policy in POLICIES:
        result = execute(mg, m, policy=policy, poison=True, rate_limit=False)
        assert check_outputs(result.outputs, reference_outputs(g)) is None


def test_a_run_larger_than_the_ram_available_is_refused_before_allocating(monkeypatch):
    from offloadlab.executor import loop
    graph, m, mg = _small()
    monkeypatch.setattr(loop, "ram_available", lambda: 1000)
    with pytest.raises(ExecutionError, match="needs about .* bytes of RAM .* but 1000 are"):
        execute(mg, m)
    assert not _lanes_alive()


def test_progress_is_reported_up_to_every_vertex():
    graph, m, mg = _small()
    seen: list[int] = []
    execute(mg, m, rate_limit=False, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == len(mg)


def test_outputs_are_copied_into_host_arrays_made_before_the_run():
    """Capturing an output allocates nothing during the run (a fresh multi-megabyte array
    there cost up to 16 ms of page faults on the lane, and skewed measured makespans)."""
    from offloadlab.executor import make_backend
    from offloadlab.executor.loop import EventLoop
    graph, m, mg = _small()
    loop = EventLoop(mg, m, make_backend("numpy", m, False), "dynamic", 0, m.streams, True,
                     set(taskgraph_of(mg).outputs()), None, 60.0)
    before = {name: id(array) for name, array in loop.outputs.items()}
    assert set(before) == set(taskgraph_of(mg).outputs())
    loop.run()
    assert {name: id(array) for name, array in loop.outputs.items()} == before
    assert check_outputs(loop.outputs, reference_outputs(graph)) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_many_lanes_and_tiny_jobs_lose_no_completion(policy):
    """Completions reported while another lane takes the loop's turn are handled by that lane
    (a lost one would stall the run, and the watchdog would stop it)."""
    graph = build_workload("random:vertices=400,gpus=3,min_bytes=16,max_bytes=256,seed=7")
    m = machine_for(graph, 3, 0.05)
    mg = plan(graph, m, "buildmemgraph")
    assert any(v.kind == "offload" for v in mg)
    for seed in range(10):
        result = execute(mg, m, policy=policy, seed=seed, streams=5, poison=True,
                         rate_limit=False, watchdog=10.0)
        assert check_outputs(result.outputs, reference_outputs(graph)) is None
    assert not _lanes_alive()


@pytest.mark.parametrize("workload,machine,planners", [c for c in CASES if "train" in c[0]],
                         ids=[c[0].split(":")[0] for c in CASES if "train" in c[0]])
def test_training_plans_are_aligned_for_a_gpu(workload, machine, planners):
    """Every tensor of every training plan starts at a multiple of its element size, as a
    CUDA kernel needs (the cupy backend refuses anything else): a^0 and δ^0, which the model
    sizes at 0, are one float32 element, not a 1-byte stand-in that shifts what follows."""
    graph = build_workload(workload)
    m = _tight(graph, machine)
    for planner in planners:
        mg = plan(graph, m, planner)
        assert not [v.id for v in mg if v.loc is not None
                    and v.loc.offset % np.dtype(v.dtype).itemsize], planner


def test_the_spread_widens_the_tolerance_of_ill_conditioned_outputs_only(monkeypatch):
    """A 2-element output folding a million elements is the sine of two sums of half a
    million terms each: float32 rounding alone moves it far, and another summation order (the
    fold as one reduction instead of row by row, as a GPU would) lands elsewhere, accepted
    within four times that spread; a well-conditioned output keeps the fixed tolerance, and
    NaN never passes."""
    g = TaskGraph(name="fold")
    g.add_input("x", 4 << 20, home="gpu0")
    g.add_compute("sum", "mix", ["x"], "gpu0", 8, flops=1.0)
    g.add_compute("copy", "mix", ["x"], "gpu0", 4 << 20, flops=1.0)
    reference = reference_outputs(g)
    spread = reference_spread(g, reference)
    assert spread["sum"] > 1e-3 > spread["copy"]
    monkeypatch.setattr(arrays, "FOLD_ROWS", 10**9)    # the same sums in another order
    other = reference_outputs(g)
    assert not np.array_equal(other["sum"], reference["sum"])
    assert check_outputs(other, reference, "cupy") is not None
    assert check_outputs(other, reference, "cupy", spread) is None
    moved = {"sum": reference["sum"], "copy": reference["copy"] + 1e-3}
    assert "'copy'" in check_outputs(moved, reference, "cupy", spread)
    moved = {"sum": np.full(2, np.nan, np.float32), "copy": reference["copy"]}
    assert "'sum'" in check_outputs(moved, reference, "cupy", spread)


def test_an_output_rounding_alone_moves_past_a_percent_is_only_checked_to_be_finite():
    """The sine of a float32 sum of 80 million terms (a 1-element output of a training chain
    whose first activation is one element) moves by tenths between two orders of summation:
    any finite value passes, NaN and infinity do not, and the other outputs keep their
    tolerance."""
    from offloadlab.executor import ILL_CONDITIONED
    reference = {"scalar": np.array([0.27], np.float32), "rows": np.zeros(4, np.float32)}
    spread = {"scalar": 0.089, "rows": 0.0}
    assert spread["scalar"] > ILL_CONDITIONED
    got = {"scalar": np.array([-0.9], np.float32), "rows": np.zeros(4, np.float32)}
    assert check_outputs(got, reference, "cupy", spread) is None
    for bad in (np.nan, np.inf):
        got["scalar"] = np.array([bad], np.float32)
        assert "'scalar'" in check_outputs(got, reference, "cupy", spread)
    got = {"scalar": reference["scalar"], "rows": np.full(4, 1e-3, np.float32)}
    assert "'rows'" in check_outputs(got, reference, "cupy", spread)


def _numpy_backend_like_a_gpu(m, free=None, warm=False):
    """The numpy backend, but with a GPU's free memory and warm-up, recording what it ran
    before the clock started (a CPU stand-in for the cupy backend's set-up)."""
    from offloadlab.executor.numpy_backend import NumpyBackend

    class Backend(NumpyBackend):
        warm_up = warm
        lane_reserve = 1000

        def __init__(self):
            super().__init__(m, False)
            self.warmed: list[tuple[str, int]] = []
            self.began = False

        def free_memory(self, gpu):
            return free

        def untimed(self, stream, work):
            assert not self.began
            self.warmed.append((threading.current_thread().name, id(work)))
            work()

        def begin(self):
            self.began = True
            super().begin()

    return Backend()


def test_a_plan_past_the_free_gpu_memory_is_refused_naming_the_numbers():
    from offloadlab.executor.loop import EventLoop
    graph, m, mg = _small()
    extent = max(v.loc.end for v in mg if v.loc is not None and v.loc.device == "gpu0")
    backend = _numpy_backend_like_a_gpu(m, free=extent)
    with pytest.raises(ExecutionError, match=rf"gpu0: the run needs [0-9]+ bytes of GPU memory "
                                             rf"\(the plan's {extent}, 1 lane workspace\(s\) "
                                             rf"of [0-9]+ and 1 x 1000 for the lanes' cuBLAS "
                                             rf"handles\) but {extent} are free"):
        EventLoop(mg, m, backend, "dynamic", 0, m.streams, False,
                  set(taskgraph_of(mg).outputs()), None, 60.0)


def test_every_lane_runs_each_kernel_signature_before_the_clock_starts():
    """The warm-up a GPU backend asks for: each compute lane runs every signature of its
    engine once, untimed, before begin(); the run still computes the reference."""
    from offloadlab.executor.loop import EventLoop
    graph, m, mg = _small()
    backend = _numpy_backend_like_a_gpu(m, warm=True)
    loop = EventLoop(mg, m, backend, "dynamic", 0, m.streams, True,
                     set(taskgraph_of(mg).outputs()), None, 60.0)
    signatures = {gpu: {s for v, s in zip(loop.vertices, loop.signature)
                        if s is not None and v.device == gpu} for gpu in ("gpu0", "gpu1")}
    loop.run()
    ran: dict[str, int] = {}
    for thread, _ in backend.warmed:
        ran[thread] = ran.get(thread, 0) + 1
    for gpu, wanted in signatures.items():
        assert ran[f"offloadlab-{gpu}"] == len(wanted) > 0
    assert check_outputs(loop.outputs, reference_outputs(graph)) is None
