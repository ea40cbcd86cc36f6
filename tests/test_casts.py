"""Issue 19, dtype casts: the ``cast`` op's kernel against NumPy's ``astype``, its price (no
flops, its bytes read and written), a plan with casts forward and back executed against the
reference and a plain NumPy evaluation, and, with torch installed, import-torch mapping
ATen's conversions to it (``x.half()``, autocast and its backward) while a conversion that
changes nothing costs no vertex."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import need_torch

from offloadlab.core.machine import Machine
from offloadlab.core.ops import op_flops, touched_bytes
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.verify import verify
from offloadlab.executor import KernelError, check_outputs, execute, reference_outputs
from offloadlab.executor.kernels import initial_value, kernel
from offloadlab.planner import plan
from offloadlab.planner.buildmemgraph import min_capacity

PAIRS = [("float32", "float16"), ("float16", "float32"), ("float64", "float32"),
         ("float32", "float64"), ("float64", "float16"), ("float16", "float64")]


@pytest.mark.parametrize("source,target", PAIRS)
def test_cast_equals_numpy_astype(source, target):
    x = np.random.default_rng(0).standard_normal((6, 5)) * 1e3
    x[0, :3] = [np.inf, -np.inf, 7e4]                     # 7e4 overflows float16
    k = kernel("cast", "v")
    out = np.full(x.shape, np.nan, target)
    with np.errstate(over="ignore"):
        x = x.astype(source)
        k.fn(np, out, [x], np.empty(k.scratch(out, [x]), np.uint8))
        np.testing.assert_array_equal(out, x.astype(target))
        flat = np.full(x.size, np.nan, target)              # read in order, any shape
        k.fn(np, flat, [x], np.empty(0, np.uint8))
        np.testing.assert_array_equal(flat, x.astype(target).reshape(-1))


def test_cast_refuses_what_is_not_a_float_conversion():
    k = kernel("cast", "v")
    for x, out, message in [(np.zeros(4, np.int32), np.empty(4, np.float32), "int32 to float32"),
                            (np.zeros(4, np.float32), np.empty(5, np.float16), "5 elements"),
                            (np.zeros(4, np.float32), np.empty(4, np.bool_), "to bool")]:
        with pytest.raises(KernelError, match=message):
            k.fn(np, out, [x], np.empty(0, np.uint8))


def test_a_cast_is_priced_by_the_bytes_it_reads_and_writes():
    n = 1 << 20
    assert op_flops("cast", (1024, 1024), [(1024, 1024)]) == 0.0
    assert touched_bytes("cast", 2 * n, [4 * n]) == 6 * n         # float32 -> float16
    m = Machine()
    seconds = m.duration("compute", "gpu0", 2 * n, 0.0, touched_bytes("cast", 2 * n, [4 * n]),
                         op="cast")
    assert seconds == pytest.approx(m.kernel_latency + 6 * n / m.gpu_mem_bandwidth)


def mixed_precision() -> TaskGraph:
    """``relu(x16 @ w16)`` in float16 from float32 inputs, cast back to float32 (as the
    backward of a cast casts a gradient back) and on to float64."""
    g = TaskGraph(name="mixed")
    g.add_input("x", 64 * 48 * 4, shape=(64, 48))
    g.add_input("w", 48 * 32 * 4, shape=(48, 32))
    g.add_compute("x16", "cast", ["x"], "gpu0", 64 * 48 * 2, shape=(64, 48), dtype="float16")
    g.add_compute("w16", "cast", ["w"], "gpu0", 48 * 32 * 2, shape=(48, 32), dtype="float16")
    g.add_compute("y16", "matmul", ["x16", "w16"], "gpu0", 64 * 32 * 2, shape=(64, 32),
                  dtype="float16", flops=op_flops("matmul", (64, 32), [(64, 48), (48, 32)]))
    g.add_compute("r16", "relu", ["y16"], "gpu0", 64 * 32 * 2, shape=(64, 32), dtype="float16")
    g.add_compute("r32", "cast", ["r16"], "gpu0", 64 * 32 * 4, shape=(64, 32))
    g.add_compute("r64", "cast", ["r32"], "gpu0", 64 * 32 * 8, shape=(64, 32), dtype="float64")
    g.add_compute("twice", "add", ["r64", "r64"], "gpu0", 64 * 32 * 8, shape=(64, 32),
                  dtype="float64")
    return g


def test_a_plan_with_casts_executes_to_the_reference_and_to_numpy():
    graph = mixed_precision()
    x, w = (initial_value(v, graph[v].shape, "float32") for v in ("x", "w"))
    want = 2 * np.maximum(x.astype(np.float16) @ w.astype(np.float16), 0).astype(np.float64)
    reference = reference_outputs(graph)
    assert reference["twice"].dtype == np.float64
    np.testing.assert_array_equal(reference["twice"], want)
    tight = min_capacity(graph)
    machine = Machine(gpus=1, gpu_memory=tight + tight // 8)
    for planner in ("buildmemgraph", "levelwise"):
        mg = plan(graph, machine, planner)
        verify(mg, graph, machine)
        for policy in ("dynamic", "fixed", "random"):
            result = execute(mg, machine, policy=policy, poison=True, rate_limit=False)
            assert check_outputs(result.outputs, reference) is None, (planner, policy)


# -- import-torch (needs torch) ---------------------------------------------------------------
def computes(graph: TaskGraph) -> dict[str, tuple[str | None, str]]:
    return {t.id: (t.op, t.dtype) for t in graph if t.kind == "compute"}


def test_half_and_float_become_casts_and_execute():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch

    class Half(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x.half()).to(torch.float32).double()

    graph = from_torch(Half(), torch.empty(4, 8, device="meta"))
    assert computes(graph) == {"_to_copy": ("cast", "float16"), "relu": ("relu", "float16"),
                               "_to_copy_1": ("cast", "float32"),
                               "_to_copy_2": ("cast", "float64")}
    assert graph["_to_copy"].flops == 0.0 and graph["_to_copy"].bytes == 4 * 8 * 2
    x = initial_value("input", (4, 8), "float32")
    want = np.maximum(x.astype(np.float16), 0).astype(np.float64)
    np.testing.assert_array_equal(reference_outputs(graph)["_to_copy_2"], want)


def test_a_cast_reads_its_input_through_a_reshape():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch

    class Reshaped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.empty(8, 8))

        def forward(self, x):
            return (x @ self.w).view(2, 8, 8).half()

    graph = from_torch(Reshaped(), torch.empty(16, 8))
    assert computes(graph) == {"mm": ("matmul", "float32"), "_to_copy": ("cast", "float16")}
    assert graph["mm"].shape == (16, 8) and graph["_to_copy"].shape == (2, 8, 8)
    x, w = initial_value("input", (16, 8), "float32"), initial_value("w", (8, 8), "float32")
    np.testing.assert_allclose(reference_outputs(graph)["_to_copy"],
                               (x @ w).astype(np.float16).reshape(2, 8, 8), rtol=1e-3)


def test_autocast_and_its_backward_are_casts():
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch

    class Autocast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 16, bias=False)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.float16):
                h = self.lin(x)
            return torch.relu(h.float())

    with torch.device("meta"):
        module = Autocast()
    x = torch.empty(4, 8, device="meta")
    infer = computes(from_torch(module, x))
    assert [v for v in infer.values() if v[0] == "cast"] == \
        [("cast", "float16"), ("cast", "float16"), ("cast", "float32")]   # w, x, then h
    train = from_torch(module, x, train=True)
    grad = train["lin.weight@updated"].inputs[1]
    assert train[grad].op == "cast" and train[grad].dtype == "float32"   # cast back
    assert train[train[grad].inputs[0]].dtype == "float16"
    assert reference_outputs(train)


def test_a_copy_that_changes_nothing_is_no_vertex():
    """``copy=True`` without a dtype change is ATen's ``_to_copy`` too: no vertex and no bytes,
    yet a write into the copy leaves the original as it was."""
    torch = need_torch()
    from offloadlab.core.workloads.from_torch import from_torch

    class Copy(torch.nn.Module):
        def forward(self, x):
            y = x.to(torch.float32, copy=True)
            y.mul_(3)
            return y + x

    graph = from_torch(Copy(), torch.empty(4, 8))
    assert computes(graph) == {"mul_": ("mix", "float32"), "add": ("add", "float32")}
    assert graph["mul_"].inputs == ("input",) and graph["add"].inputs == ("mul_", "input")

    class Contiguous(torch.nn.Module):
        def forward(self, x):
            return x.t().to(torch.float32, copy=True)       # this one moves the elements

    moved = computes(from_torch(Contiguous(), torch.empty(4, 8)))
    assert moved == {"_to_copy": ("mix", "float32")}
