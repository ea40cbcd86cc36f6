"""docs/extending.md, followed: a planner, a workload, a machine preset, a dispatch policy, an op
with its kernel and a backend registered in a test, each in one place, then listed by
``offloadlab list`` and used."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pytest

from offloadlab.core.dispatch import POLICIES, Queues, ReadyQueue, policy
from offloadlab.core.errors import PlanError
from offloadlab.core.machine import PRESETS, Machine, MiB
from offloadlab.core.ops import KERNELS, OPS, op, op_flops, parse_op
from offloadlab.core.ops.arrays import same
from offloadlab.core.ops.base import per_element
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.workloads import WORKLOADS, build_workload, matmul_chain
from offloadlab.core.workloads.registry import VERTICES, workload
from offloadlab.executor import (
    BACKENDS,
    backend,
    check_outputs,
    execute,
    make_backend,
    reference_outputs,
)
from offloadlab.executor.kernels import initial_value
from offloadlab.lab.cli import main
from offloadlab.planner import PLANNERS, plan
from offloadlab.planner.registry import Hooks, Options, option, register
from offloadlab.simulator import simulate


@pytest.fixture
def registries():
    """Every registry as it was once the test has registered its toys."""
    saved = [(registry, dict(registry)) for registry in (PLANNERS, WORKLOADS, PRESETS,
                                                           POLICIES, OPS, KERNELS, BACKENDS)]
    yield
    for registry, entries in saved:
        registry.clear()
        registry.update(entries)
    VERTICES.pop("toy-chain", None)
    parse_op.cache_clear()


def _register_toys() -> None:
    @dataclass(frozen=True)
    class ToyOptions(Options):
        slack: int = option(0, "bytes of GPU memory left unused")

        def __post_init__(self) -> None:
            if self.slack < 0:
                raise PlanError(f"slack must be >= 0, got {self.slack}")

    @register("toy-planner", ToyOptions)
    def run(graph, machine, options: ToyOptions, hooks: Hooks):
        """Level-wise planning with some memory left unused."""
        levelwise = PLANNERS["levelwise"]
        smaller = replace(machine, gpu_memory=machine.gpu_memory - options.slack)
        return levelwise.run(graph, smaller, levelwise.options(), hooks)

    @workload("toy-chain", vertices=lambda o: o["layers"] * 2 + 2)
    def toy_chain(layers: int = 3):
        """A short matmul chain on one GPU."""
        return matmul_chain(layers=layers, gpus=1, batch=32, hidden=64)

    PRESETS["toy-box"] = Machine(name="toy-box", source="a test's machine: one GPU of 1 MiB",
                                 gpus=1, gpu_memory=MiB)

    class LatestReady:
        def __init__(self) -> None:
            self.stack: list[int] = []

        def push(self, now: float, vertex: int) -> None:
            self.stack.append(vertex)

        def pop(self) -> int | None:
            return self.stack.pop() if self.stack else None

    @policy("latest-ready", "The latest-ready vertex first")
    def _latest_ready(queues: Queues, sequence: Sequence[int],
                      wake: Callable[[], None]) -> ReadyQueue:
        return LatestReady()

    @op("axpb", "a x + b, elementwise (inputs x, b)", params=(("a", 2),),
        flops=per_element(2.0), scratch=lambda out, args: 0)
    def axpb(xp, out, args, scratch, a: int = 2) -> None:
        """``a x + b``."""
        same("axpb", out, args, 2)
        xp.multiply(args[0], a, out=out)
        xp.add(out, args[1], out=out)

    @backend("toy-cpu", doc="the numpy backend, unpaced (a test's)", tolerance=(1e-5, 1e-6))
    def make(machine: Machine, rate_limit: bool = True):
        """A numpy backend whose copies run as fast as they can."""
        return make_backend("numpy", machine, rate_limit=False)


def test_what_the_page_adds_is_listed(registries, capsys):
    _register_toys()
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "toy-planner    Level-wise planning with some memory left unused" in listed
    assert "slack=0" in listed and "bytes of GPU memory left unused" in listed
    assert "toy-chain      A short matmul chain on one GPU\n" in listed
    assert "toy-box        1 GPU(s) x 1 MiB" in listed
    assert main(["list", "policies"]) == 0
    assert "latest-ready   The latest-ready vertex first" in capsys.readouterr().out
    assert main(["list", "ops"]) == 0
    assert "  axpb           a x + b, elementwise (inputs x, b)\n" + " " * 17 + "a=2\n" in \
        capsys.readouterr().out
    assert main(["list", "backends"]) == 0
    assert "toy-cpu        the numpy backend, unpaced (a test's)" in capsys.readouterr().out


def test_what_the_page_adds_plans_simulates_and_runs(registries, tmp_path, capsys):
    _register_toys()
    graph = build_workload("toy-chain:layers=2")
    machine = PRESETS["toy-box"]
    memgraph = plan(graph, machine, "toy-planner:slack=1024")
    assert memgraph.graph["planner"] == "toy-planner"
    assert memgraph.graph["options"] == {"slack": 1024}
    simulated = simulate(memgraph, machine, policy="latest-ready")
    assert simulated.makespan > 0
    result = execute(memgraph, machine, policy="latest-ready", rate_limit=False)
    assert check_outputs(result.outputs, reference_outputs(graph)) is None
    out = tmp_path / "mg.json"
    assert main(["-q", "plan", "--workload", "toy-chain", "--machine", "toy-box", "--planner",
                 "toy-planner", "--out", str(out)]) == 0
    assert main(["-q", "simulate", str(out), "--machine", "toy-box",
                 "--policy", "latest-ready"]) == 0
    assert main(["-q", "plan", "--workload", "toy-chain", "--machine", "toy-box", "--planner",
                 "toy-planner:slack=-1", "--out", str(out)]) == 2
    assert "slack must be >= 0, got -1" in capsys.readouterr().err


def test_the_op_and_the_backend_run_a_graph(registries):
    """The op declared with its kernel in one place is priced, planned, simulated and run (on
    the backend declared in one place), and its output is the reference's."""
    _register_toys()
    graph = TaskGraph("axpb")
    graph.add_input("x", 4 * 64 * 32, home="gpu0", shape=(64, 32))
    graph.add_input("b", 4 * 64 * 32, shape=(64, 32))
    graph.add_compute("y", "axpb:a=3", ["x", "b"], "gpu0", 4 * 64 * 32,
                      op_flops("axpb:a=3", (64, 32), [(64, 32), (64, 32)]), shape=(64, 32))
    assert graph.tasks["y"].flops == 2 * 64 * 32
    machine = PRESETS["toy-box"]
    memgraph = plan(graph, machine, "buildmemgraph")
    assert simulate(memgraph, machine).makespan > 0
    result = execute(memgraph, machine, backend="toy-cpu")
    reference = reference_outputs(graph)
    assert check_outputs(result.outputs, reference, "toy-cpu") is None
    x, b = (initial_value(v, (64, 32), "float32") for v in ("x", "b"))
    assert (reference["y"] == 3 * x + b).all()
