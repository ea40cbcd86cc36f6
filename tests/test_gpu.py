"""The executor on the cupy backend (needs CuPy and an NVIDIA GPU; skipped otherwise): every
planner's MemGraph computes the reference under every dispatch policy with poisoning on; no
device memory is allocated after start-up; the measured trace respects the edges; a plan with
tensors at offsets a CUDA kernel cannot load from is refused, naming the vertex.

Flat tensors may have any byte size (a training chain's activation of 100001 bytes), and the
planners then pack float32 tensors at offsets that are not multiples of 4; :func:`_aligned`
rounds every size up to whole elements, which makes every offset aligned, for the cases that
must compute the reference (the built-in workloads are aligned already).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception as exc:           # no driver, no device: CuPy raises CUDARuntimeError
    pytest.skip(f"no CUDA device visible: {exc}", allow_module_level=True)
if not GPUS:
    pytest.skip("no CUDA device visible", allow_module_level=True)

from kernel_cases import kernel_case  # noqa: E402
from test_executor import CHAIN, POLICIES  # noqa: E402
from test_properties import machine_for  # noqa: E402

from offloadlab.core import Machine  # noqa: E402
from offloadlab.core.errors import SpecError  # noqa: E402
from offloadlab.core.machine import machine_from_spec  # noqa: E402
from offloadlab.core.taskgraph import TaskGraph  # noqa: E402
from offloadlab.core.verify import verify  # noqa: E402
from offloadlab.core.workloads import build_workload  # noqa: E402
from offloadlab.executor import (  # noqa: E402
    ExecutionError,
    check_outputs,
    execute,
    kernels,
    reference_outputs,
    taskgraph_of,
)
from offloadlab.executor.cupy_backend import CupyBackend  # noqa: E402
from offloadlab.executor.loop import EventLoop  # noqa: E402
from offloadlab.planner import plan  # noqa: E402

pytestmark = pytest.mark.gpu

SEEDS = range(3)
PLANNERS = ("buildmemgraph", "levelwise")
RANDOM = "random:vertices=60,gpus={gpus},min_bytes=4096,max_bytes=65536,seed=5"

# (id, workload, machine with tight memory (None: the tightest the graph allows, plus 5% of
# the rest), GPUs it needs): small and tight, as tests/test_executor.py's CASES
CASES = [
    ("matmul-chain-1gpu", "matmul-chain:layers=3,batch=64,hidden=256,gpus=1", None, 1),
    ("matmul-chain", "matmul-chain:layers=3,batch=64,hidden=256",
     "disco-example:gpu_memory=400KB", 2),
    ("tp-matmul", "tp-matmul:n=64", "p100x4:gpus=3,gpu_memory=64KB", 3),
    ("random-1gpu", RANDOM.format(gpus=1), None, 1),
    ("random", RANDOM.format(gpus=2), None, 2),
    ("training-chain", f"training-chain:{CHAIN}", "v100:gpu_memory=1600KB", 1),
    ("gpt2-train", "gpt2-train:depth=3,batch=1,seq=8,weight_bytes=300000,iterations=2",
     "v100:gpu_memory=900KB", 1),
]
ONE_GPU = [c for c in CASES if c[3] == 1]


def _aligned(graph: TaskGraph) -> TaskGraph:
    """``graph`` with every flat tensor's size rounded up to whole elements."""
    out = TaskGraph(name=graph.name, meta=dict(graph.meta))
    for t in graph.tasks.values():
        size = np.dtype(t.dtype).itemsize
        out.add(t if t.shape is not None else replace(t, bytes=-(-t.bytes // size) * size))
    return out


def _setting(case) -> tuple[TaskGraph, Machine]:
    _, workload, spec, gpus = case
    if GPUS < gpus:
        pytest.skip(f"needs {gpus} GPUs, {GPUS} visible")
    graph = _aligned(build_workload(workload))
    return graph, machine_from_spec(spec) if spec else machine_for(graph, gpus, 0.05)


def _unaligned(mg) -> list[str]:
    return [v.id for v in mg if v.loc is not None and v.loc.offset % np.dtype(v.dtype).itemsize]


def _loop(mg, m: Machine, backend: CupyBackend, policy: str = "dynamic",
          seed: int = 0) -> EventLoop:
    """The event loop of :func:`execute`, on a backend made here."""
    return EventLoop(mg, m, backend, policy=policy, seed=seed, streams=m.streams, poison=True,
                     outputs=set(taskgraph_of(mg).outputs()), host_memory=None, watchdog=60.0)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_planner_computes_the_reference(case):
    graph, m = _setting(case)
    reference = reference_outputs(graph)
    for planner in PLANNERS:
        mg = plan(graph, m, planner)
        verify(mg, graph, m)
        assert mg.count("offload") + mg.count("reload") + mg.count("load") > 0
        assert not _unaligned(mg)
        for policy in POLICIES:
            for seed in SEEDS:
                result = execute(mg, m, backend="cupy", policy=policy, seed=seed, poison=True)
                wrong = check_outputs(result.outputs, reference, backend="cupy")
                assert wrong is None, f"{planner}, {policy}, seed {seed}: {wrong}"


UNALIGNED_RUN = """
import sys
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.executor import ExecutionError, execute
from offloadlab.planner import plan
machine = machine_from_spec(sys.argv[2])
try:
    execute(plan(build_workload(sys.argv[1]), machine, "buildmemgraph"), machine,
            backend="cupy", poison=True)
except ExecutionError as exc:
    print(exc)
"""


@pytest.mark.parametrize("workload,machine", [
    ("training-chain:" + CHAIN.replace("a=100KB;", "a=100001;"), "v100:gpu_memory=1600KB"),
], ids=["training-chain-odd-activation"])
def test_unaligned_offsets_are_refused_naming_the_vertex(workload, machine):
    """A CUDA kernel faults on a misaligned load (cudaErrorMisalignedAddress), and the fault
    ends the process's CUDA context: the plan must be refused before any kernel runs.  Run in
    a subprocess, so that a fault cannot take this process's context with it."""
    m = machine_from_spec(machine)
    assert _unaligned(plan(build_workload(workload), m, "buildmemgraph"))
    done = subprocess.run([sys.executable, "-c", UNALIGNED_RUN, workload, machine],
                          capture_output=True, text=True, timeout=600)
    message = done.stdout.strip()
    assert re.search(r"vertex '[^']+'.*align", message), done.stdout + done.stderr
    assert "cudaError" not in message, f"a kernel ran at an unaligned offset: {message}"


@pytest.mark.parametrize("case", ONE_GPU, ids=[c[0] for c in ONE_GPU])
def test_no_device_allocation_after_start_up(case):
    graph, m = _setting(case)
    previous = cupy.cuda.get_allocator()
    loop = _loop(plan(graph, m, "buildmemgraph"), m, CupyBackend(m, forbid_alloc=True),
                 "random", 1)
    loop.run()
    assert check_outputs(loop.outputs, reference_outputs(graph), backend="cupy") is None
    assert cupy.cuda.get_allocator() == previous


def test_an_allocation_during_the_run_fails_its_vertex(monkeypatch):
    """The control: the raising allocator reaches the lanes' threads."""
    graph, m = _setting(ONE_GPU[0])
    monkeypatch.setitem(kernels.KERNELS, "matmul", kernels.Kernel(
        lambda xp, out, args, scratch: xp.copyto(out, xp.zeros(out.shape, out.dtype))))
    loop = _loop(plan(graph, m, "buildmemgraph"), m, CupyBackend(m, forbid_alloc=True))
    with pytest.raises(ExecutionError, match="failed: DeviceAllocation: CuPy allocated [0-9]+ "
                                             "bytes of GPU memory during the run"):
        loop.run()


def test_measured_trace_respects_the_edges_and_memory():
    graph = _aligned(build_workload(
        f"random:vertices=80,gpus={min(GPUS, 2)},min_bytes=4096,max_bytes=65536,seed=2"))
    m = machine_for(graph, min(GPUS, 2), 0.0)
    mg = plan(graph, m, "buildmemgraph")
    result = execute(mg, m, backend="cupy", policy="random", seed=3)
    trace = result.trace
    assert set(trace["source"]) == {"measured"}
    assert len(trace) == sum(v.kind != "input" for v in mg)
    start = dict(zip(trace["vertex"], trace["start"]))
    end = dict(zip(trace["vertex"], trace["end"]))
    assert all(0 <= start[v] <= end[v] for v in start)
    for u, v, _ in mg.edges():
        if u in end and v in start:
            assert end[u] <= start[v], f"{v} started before {u} ended"
    assert all(result.peak_memory[d] <= m.gpu_memory for d in m.gpu_names())
    assert result.makespan == pytest.approx(trace["end"].max())


# -- the backend alone ------------------------------------------------------------------------
def test_backend_memory_copies_and_streams():
    backend = CupyBackend(Machine(gpus=1))
    runtime = cupy.cuda.runtime
    arena = backend.arena("gpu0", 1 << 20)
    assert (arena.dtype, arena.size, arena.device.id) == (np.uint8, 1 << 20, 0)
    assert backend.arena("gpu0:scratch2", 0).size == 0
    host = backend.host_block(1 << 20)
    assert runtime.pointerGetAttributes(host.ctypes.data).type == runtime.memoryTypeHost
    with pytest.raises(MemoryError):
        backend.arena("gpu0", 1 << 50)
    with pytest.raises(SpecError, match=f"gpu{GPUS} is not visible"):
        backend.stream(f"gpu{GPUS}", 0)
    assert backend.stream("cpu", 0) is None
    up, down = backend.stream("h2d:gpu0", 0), backend.stream("d2h:gpu0", 0)
    value = np.arange(256, dtype=np.float32)
    src, back = (kernels.view(host, offset, (256,), "float32") for offset in (0, 4096))
    dst = kernels.view(arena, 8192, (256,), "float32")
    np.copyto(src, value)
    backend.begin()
    t0, t1 = backend.timed(up, lambda: backend.copy(up, dst, src))
    t2, t3 = backend.timed(down, lambda: backend.copy(down, back, dst))
    assert 0 <= t0 <= t1 <= t2 <= t3
    copy = backend.host_array((256,), "float32")
    assert runtime.pointerGetAttributes(copy.ctypes.data).type == runtime.memoryTypeHost
    backend.download(down, dst, copy)
    assert np.array_equal(back, value) and np.array_equal(copy, value)
    with pytest.raises(ValueError, match="pinned"):
        backend.timed(up, lambda: backend.copy(up, dst, value))
    backend.close()


@pytest.mark.parametrize("op", sorted(kernels.KERNELS))
def test_every_kernel_matches_numpy_and_allocates_nothing(op):
    """kernels.py's promise on the GPU: ``out=`` everywhere, no device allocation."""
    shape, args = kernel_case(op)
    _matches_numpy_allocating_nothing(kernels.KERNELS[op], shape, args)


def _matches_numpy_allocating_nothing(k: kernels.Kernel, shape, args) -> None:
    """Run ``k`` on the GPU in its scratch, allocations forbidden, against NumPy."""
    expected = np.empty(shape, np.float32)
    k.fn(np, expected, args, np.empty(k.scratch(expected, args), np.uint8))
    backend = CupyBackend(Machine(gpus=1), forbid_alloc=True)
    slot = backend.stream("gpu0", 0)
    device_args = [cupy.asarray(a) for a in args]
    out = cupy.empty(shape, cupy.float32)
    scratch = backend.arena("gpu0:scratch0", k.scratch(expected, args))
    backend.begin()
    try:
        backend.timed(slot, lambda: k.fn(cupy, out, device_args, scratch))
    finally:
        backend.close()
    np.testing.assert_allclose(out.get(), expected, rtol=1e-3, atol=1e-4)


STRIDED = [("linear", (8, 6), [(8, 2), (8, 3), (6, 5)]),       # row slices of W^T
           ("linear_dx:col0=2", (5, 4), [(5, 6), (6, 8)]),      # a partial column slice of W
           ("linear_dx:col0=0", (5, 4), [(5, 6), (5, 6), (6, 8), (6, 8)])]


@pytest.mark.parametrize("op,shape,shapes", STRIDED, ids=[c[0] for c in STRIDED])
def test_strided_matmul_operands_are_copied_into_scratch(op, shape, shapes):
    """CuPy's matmul copies an operand that is neither C- nor F-contiguous into a fresh
    allocation; the kernels copy such a block into their scratch first."""
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    _matches_numpy_allocating_nothing(kernels.kernel(op, "v"), shape, args)


def test_times_are_seconds_from_each_slots_anchor(monkeypatch):
    """A slot measures from a new anchor once ANCHOR_SECONDS have passed; with a new anchor
    after every job, the times still agree with the GPU's origin (CUDA's float32 ms over a
    short span), and run forward."""
    from offloadlab.executor import cupy_backend
    monkeypatch.setattr(cupy_backend, "ANCHOR_SECONDS", 0.0)
    backend = CupyBackend(Machine(gpus=1))
    slot = backend.stream("gpu0", 0)
    a = backend.arena("gpu0", 1 << 24).view(cupy.float32)
    backend.begin()
    origin, offset = backend.origins[0]
    times = []
    try:
        for _ in range(20):
            start, end = backend.timed(slot, lambda: cupy.sin(a, out=a))
            direct = offset + cupy.cuda.get_elapsed_time(origin, slot.ends[slot.turn ^ 1]) / 1e3
            times.append((start, end, direct))
    finally:
        backend.close()
    assert all(type(t) is float for row in times for t in row)
    assert all(s <= e for s, e, _ in times)
    assert all(e1 <= s2 for (_, e1, _), (s2, _, _) in zip(times, times[1:]))
    assert all(abs(e - d) < 50e-6 for _, e, d in times)


def test_a_plan_larger_than_the_free_gpu_memory_is_refused_naming_the_numbers():
    graph, m = _setting(ONE_GPU[0])
    free = cupy.cuda.runtime.memGetInfo()[0]
    huge = Machine(gpus=1, gpu_memory=4 * free)
    mg = plan(graph, huge, "buildmemgraph")
    for v in mg:                       # move the last tensor past the free memory
        if v.loc is not None:
            last = v
    last.loc = replace(last.loc, offset=free + (1 << 20))
    with pytest.raises(ExecutionError, match=r"gpu0: the run needs [0-9]+ bytes of GPU memory "
                                             r".* but [0-9]+ are free on the device"):
        execute(mg, huge, backend="cupy", verify=False)


def test_the_race_detector_runs_on_the_gpu():
    """Issue 41's detector with CuPy: every aligned broken plan of bench/bench_races.py is
    reported under adversarial dispatch, and the correct plans run clean, checksums and all,
    with allocations forbidden."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_races import broken_plans, plans

    from offloadlab.executor import RaceError
    reported = 0
    for _name, _graph, m, mg, _edge in broken_plans(2):
        if _unaligned(mg) or m.gpus > GPUS:
            continue
        with pytest.raises(RaceError):
            execute(mg, m, backend="cupy", policy="adversarial", seed=0, verify=False,
                    check_races=True)
        reported += 1
    assert reported, "no broken plan of the corpus runs on this GPU"
    for name, graph, m, mg in plans():
        if _unaligned(mg) or m.gpus > GPUS:
            continue
        result = execute(mg, m, backend="cupy", policy="adversarial", seed=0,
                         check_races=True, poison=True)
        assert check_outputs(result.outputs, reference_outputs(graph), "cupy") is None, name
