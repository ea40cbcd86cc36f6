"""executor: run a MemGraph for real and measure it (docs/design.md, Executor; TURNIP Sec. 5).

:func:`execute` runs a MemGraph with real data on a device backend (``numpy``: arenas in host
RAM, worker threads for streams, paced copy engines for links; ``cupy``: one arena per GPU,
one pinned host block, CUDA streams and events) under a dispatch policy of
:mod:`offloadlab.core.dispatch`, and returns a measured Trace (``source="measured"``), memory
in use over time and the graph's outputs.  :func:`check_outputs` compares them with
:func:`reference_outputs`, a plain NumPy evaluation of the TaskGraph with unlimited memory.
It verifies the MemGraph first (:func:`offloadlab.core.verify.verify`) unless told not to, and
with ``check_races`` reports any overwrite of bytes a vertex still needed
(:mod:`.races`, docs/races.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.backends import SUFFIX, backend_names
from ..core.dispatch import check_policy
from ..core.errors import SpecError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.memory import memory_and_peaks
from ..core.taskgraph import TaskGraph
from ..core.trace import busy_time, run_trace
from ..core.verify import verify as verify_plan
from .device import BACKENDS, Backend, ExecutionError, StallError, backend
from .kernels import KERNELS, KernelError, check_runnable
from .loop import EventLoop
from .races import RaceError
from .reference import reference_outputs, reference_spread, taskgraph_of

ILL_CONDITIONED = 0.01     # spread / scale past which an output's float32 value means nothing

__all__ = ["execute", "ExecResult", "check_outputs", "expected_outputs", "reference_outputs",
           "ILL_CONDITIONED",
           "reference_spread",
           "taskgraph_of",
           "make_backend", "backend", "BACKENDS", "KERNELS", "ExecutionError", "StallError",
           "KernelError", "RaceError", "check_runnable"]


@dataclass
class ExecResult:
    """A measured run: its trace, makespan (s), seconds each resource was busy, memory in use
    over time, peak bytes per GPU and host, and the graph's outputs (TaskGraph vertex ->
    array)."""

    trace: pd.DataFrame
    makespan: float
    busy: dict[str, float]
    memory: pd.DataFrame
    peak_memory: dict[str, int]
    outputs: dict[str, np.ndarray]
    backend: str
    policy: str


def make_backend(name: str, machine: Machine, rate_limit: bool = True) -> Backend:
    """A fresh backend of :data:`~offloadlab.executor.device.BACKENDS`.

    Parameters
    ----------
    name : str
        ``numpy`` or ``cupy`` (needs an NVIDIA GPU and the ``gpu`` extra).
    machine : Machine
        The machine whose GPUs, memory and links it models.
    rate_limit : bool, default True
        Pace ``numpy``'s copies to the machine's bandwidths.

    Returns
    -------
    Backend

    Raises
    ------
    SpecError
        Listing the backends, for any other name.
    """
    BACKENDS.check(name)
    return BACKENDS[name].make(machine, rate_limit)


def execute(memgraph: MemGraph, machine: Machine, *, backend: str = "numpy",
            policy: str = "dynamic", seed: int = 0, streams: int | None = None,
            poison: bool = False, rate_limit: bool = True, host_memory: int | None = None,
            watchdog: float = 60.0, run: int = 0,
            progress: Callable[[int], None] | None = None, verify: bool = True,
            check_races: bool = False) -> ExecResult:
    """Run ``memgraph`` on ``machine`` with real data (TURNIP Sec. 5).

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        Its GPUs and links (the numpy backend paces copies to its bandwidths).
    backend : str
        ``numpy`` (the CPU) or ``cupy`` (NVIDIA GPUs).
    policy : str
        One of :data:`offloadlab.core.dispatch.POLICIES` (``dynamic``, ``fixed``, ``random``,
        ``adversarial``; the last two seeded by ``seed``).
    seed : int
        Seeds the seeded policies.
    streams : int, optional
        Overrides ``machine.streams``.
    poison : bool
        Fill every location with NaN bytes before it is written, and host ranges when freed,
        so that a race shows up as a wrong answer.
    rate_limit : bool
        Pace the numpy backend's copies to the machine's bandwidths.
    host_memory : int, optional
        Caps the host block (default: the host inputs plus every offload, which never runs
        out).
    watchdog : float
        Seconds the run may go without a completion before it stops, naming the vertices it
        waits for.
    run : int
        Labels the trace rows.
    progress : callable, optional
        Called with the number of vertices done, at most four times a second and once at
        the end.
    verify : bool
        First check the MemGraph against ``machine`` (docs/design.md rules 1, 3 and 4 and the
        order); pass False only to run a plan known to be broken.
    check_races : bool
        Run the race detector (:mod:`.races`): a vertex that reads bytes another vertex
        overwrote stops the run naming the three (slower: every tensor is checksummed as it
        is written, read and offloaded).

    Returns
    -------
    ExecResult
        The measured trace, makespan, busy times and memory, and the graph's outputs.

    Raises
    ------
    VerificationError
        An incorrect MemGraph (before anything is set up), naming the rule and the vertex.
    ExecutionError
        A kernel failed or memory does not suffice (naming the vertex).
    StallError
        No vertex can make progress.
    RaceError
        The race detector saw a race.
    KernelError
        An op without a kernel (a ``generic:...`` op), before anything is set up.

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> from offloadlab.planner import plan
    >>> graph = build_workload("matmul-chain:layers=4,batch=64,hidden=256")
    >>> machine = machine_from_spec("disco-example:gpu_memory=400KB")
    >>> result = execute(plan(graph, machine), machine, rate_limit=False)
    >>> check_outputs(result.outputs, reference_outputs(graph)) is None   # all correct
    True
    """
    check_runnable(memgraph)
    check_policy(policy)
    streams = machine.streams if streams is None else streams
    if streams < 1:
        raise SpecError(f"streams must be >= 1, got {streams}")
    if not watchdog > 0:
        raise SpecError(f"watchdog must be > 0 seconds, got {watchdog}")
    if verify:
        verify_plan(memgraph, None, machine)
    outputs = set(taskgraph_of(memgraph).outputs())
    device = make_backend(backend, machine, rate_limit)
    try:
        loop = EventLoop(memgraph, machine, device, policy, seed, streams, poison, outputs,
                         host_memory, watchdog, progress, check_races)
    except BaseException:         # set-up failed: no lane has started; release what is held
        device.close()
        raise
    loop.run()
    trace = run_trace(loop.vertices, [e.name if e is not None else None for e in loop.engine],
                      loop.slot, loop.start, loop.end, "measured", run)
    memory, peaks = memory_and_peaks(trace, memgraph, machine.gpu_names())
    return ExecResult(trace=trace, makespan=float(max(trace["end"], default=0.0)),
                      busy=busy_time(trace), memory=memory, peak_memory=peaks,
                      outputs=loop.outputs, backend=backend, policy=policy)


def expected_outputs(graph: TaskGraph, backend: str = "numpy") -> tuple[
        dict[str, np.ndarray], dict[str, float] | None]:
    """What :func:`check_outputs` compares a run on ``backend`` with.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    backend : str, default "numpy"
        The backend whose outputs will be checked.

    Returns
    -------
    tuple
        The reference outputs by name, and on any backend but ``numpy`` (which runs the
        reference's kernels in its order) their :func:`reference_spread`, else None.
    """
    reference = reference_outputs(graph)
    return reference, None if backend == "numpy" else reference_spread(graph, reference)


def check_outputs(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray],
                  backend: str = "numpy",
                  spread: dict[str, float] | None = None) -> str | None:
    """Whether every output equals the reference within the backend's tolerance.

    An output that rounding alone moves by more than :data:`ILL_CONDITIONED` of its scale
    (the sine of a float32 sum in the thousands, whose last bit is 5e-4) is only checked to be
    finite.  NaN never passes.

    Parameters
    ----------
    outputs : dict of str to numpy.ndarray
        A run's outputs by name.
    reference : dict of str to numpy.ndarray
        The reference outputs by name (:func:`expected_outputs`).
    backend : str, default "numpy"
        The backend that ran, whose tolerance applies.
    spread : dict of str to float, optional
        :func:`reference_spread`: widens the absolute tolerance of each output by four times
        the distance rounding alone puts between the reference and exact arithmetic; pass it
        for a backend that sums in another order than NumPy (``cupy``).

    Returns
    -------
    str or None
        None, or a message naming the first wrong (or missing) output.
    """
    rtol, atol = (BACKENDS[backend] if backend in BACKENDS else BACKENDS["cupy"]).tolerance
    for name, expected in reference.items():
        got = outputs.get(name)
        if got is None:
            return f"output {name!r} was not produced"
        if got.shape != expected.shape:
            return (f"output {name!r} has shape {got.shape}, the reference "
                    f"{expected.shape}")
        moved = spread.get(name, 0.0) if spread is not None else 0.0
        if expected.dtype.kind != "f":
            wrong = got != expected
        elif moved > ILL_CONDITIONED * max(1.0, float(np.max(np.abs(expected), initial=0.0))):
            wrong = ~np.isfinite(got)         # no float32 value can be judged against another
        else:
            wrong = ~(np.abs(got - expected) <= atol + 4 * moved + rtol * np.abs(expected))
        bad = int(np.count_nonzero(wrong))
        if bad:
            return (f"output {name!r} differs from the reference in {bad} of "
                    f"{expected.size} elements")
    return None


# Every backend module (``NAME_backend``) declares its backend when imported, numpy first (CuPy
# itself is imported only when a cupy backend is made).
for _name in backend_names():
    importlib.import_module(f"{__name__}.{_name}{SUFFIX}")
