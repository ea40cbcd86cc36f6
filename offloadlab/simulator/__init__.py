"""simulator: MemGraph + Machine -> Trace, a SimPy discrete-event model of GPUs, links, CPU.

Follows docs/design.md, Execution semantics.  A vertex starts once all its MemGraph
predecessors (data and memory edges) have finished and its resources are free: a GPU's compute
engine, the CPU, a link direction and, with host buses, the GPU's bus.  Durations come from the
machine's cost model, optionally times a seeded lognormal noise factor; the dispatch policies
are :mod:`offloadlab.core.dispatch`'s, shared with the executor.  The trace has one row per
executed vertex, in planner order (``input`` vertices have none).  The resources, the policies
and host RAM: docs/execution.md, Simulator, and docs/host-memory.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from ..core.dispatch import POLICIES, PolicyError, check_policy
from ..core.errors import SpecError
from ..core.host import host_overflow
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.memory import run_host_lifetimes, run_host_peak, run_memory_and_peaks
from ..core.trace import run_trace
from ..core.util import no_gc
from .model import DeadlockError, Model

__all__ = ["simulate", "makespan", "makespan_and_host_peak", "SimResult", "POLICIES",
           "DeadlockError", "PolicyError", "MAX_NOISE", "NoiseError", "check_noise"]


@dataclass
class SimResult:
    """A simulated run: its trace, makespan (s), seconds each resource had work running,
    memory in use over time, peak bytes per GPU (every GPU of the machine) and host, and the
    machine's ``host_memory`` (None: unlimited)."""

    trace: pd.DataFrame
    makespan: float
    busy: dict[str, float]
    memory: pd.DataFrame
    peak_memory: dict[str, int]
    host_memory: int | None = None

    @property
    def host_peak(self) -> int:
        """The most bytes the run held in host RAM at once."""
        return self.peak_memory.get("host", 0)

    @property
    def out_of_memory(self) -> str | None:
        """Why the run does not fit in the machine's host RAM (one line with the numbers), or
        None if it does: the papers' out-of-memory outcome."""
        return host_overflow(self.host_peak, self.host_memory)


def simulate(memgraph: MemGraph, machine: Machine, policy: str = "dynamic", noise: float = 0.0,
             seed: int = 0, streams: int | None = None, run: int = 0,
             progress: Callable[[int], None] | None = None) -> SimResult:
    """Simulate ``memgraph`` on ``machine`` (docs/design.md, Execution semantics).

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        Its GPUs, links and cost model.
    policy : str
        The dispatch policy (:data:`offloadlab.core.dispatch.POLICIES`).
    noise : float
        If > 0, each duration is multiplied by ``exp(noise * z - noise**2 / 2)``,
        z ~ N(0, 1) drawn from ``numpy.random.default_rng(seed)`` in planner order (mean
        factor 1).
    seed : int
        Seeds the noise and the seeded policies.
    streams : int, optional
        Overrides ``machine.streams``.
    run : int
        Labels the trace rows.
    progress : callable, optional
        ``progress(done)`` hears now and then how many vertices have finished.

    Returns
    -------
    SimResult
        The trace (a row per vertex), the makespan, each resource's busy time, each GPU's
        memory in use over time, the host peak and whether it exceeds ``machine.host_memory``
        (an outcome, not an error: :attr:`SimResult.out_of_memory`).

    Raises
    ------
    PolicyError
        An unknown policy (a ValueError).
    DeadlockError
        Some vertices can never start (a cycle, or a ``fixed`` order against the edges).
    RuntimeError
        A GPU's memory in use exceeds ``machine.gpu_memory``.

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> from offloadlab.planner import plan
    >>> machine = machine_from_spec("v100:gpu_memory=1.5GB")
    >>> memgraph = plan(build_workload("training-chain"), machine)
    >>> round(simulate(memgraph, machine).makespan, 4)
    3.6667
    """
    check_policy(policy)
    check_noise(noise)
    streams = machine.streams if streams is None else streams
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    with no_gc():
        model = Model(memgraph, machine, policy, noise, seed, streams, progress)
        model.run()
        trace = run_trace(model.vertices, [e.name if e is not None else None
                                           for e in model.engine],
                          model.stream, model.start, model.end, "sim", run)
        memory, peaks = run_memory_and_peaks(model.vertices, model.data, model.start, model.end,
                                             machine.gpu_names())
    over = {gpu: peaks[gpu] for gpu in machine.gpu_names() if peaks[gpu] > machine.gpu_memory}
    if over:
        raise RuntimeError(f"simulated memory exceeds the machine's {machine.gpu_memory} bytes per "
                           f"GPU: peak {over}; the MemGraph's locations or edges are inconsistent")
    return SimResult(trace=trace, makespan=float(max(trace["end"], default=0.0)),
                     busy={name: r.busy for name, r in model.resources.items()},
                     memory=memory, peak_memory=peaks, host_memory=machine.host_memory)


def makespan(memgraph: MemGraph, machine: Machine, policy: str = "dynamic", noise: float = 0.0,
             seed: int = 0) -> float:
    """The simulated makespan alone (no trace, no memory accounting).

    How planners that search (``buildmemgraph:search=N``) score a candidate, passed to them
    as ``evaluate``, and what ablations repeat many times.

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine.
    policy : str
        The dispatch policy.
    noise : float
        The lognormal noise's sigma, as in :func:`simulate` (0: none).
    seed : int
        Seeds the noise and the seeded policies.

    Returns
    -------
    float
        Seconds.

    Raises
    ------
    PolicyError
        An unknown policy (a ValueError).
    ValueError
        A negative ``noise``.
    DeadlockError
        Some vertices can never start (a cycle, or a ``fixed`` order against the edges).
    """
    return _run(memgraph, machine, policy, noise, seed).makespan


def makespan_and_host_peak(memgraph: MemGraph, machine: Machine, policy: str = "dynamic",
                           noise: float = 0.0, seed: int = 0) -> tuple[float, int]:
    """The simulated makespan and host peak, without a trace or the GPUs' memory accounting.

    As :func:`makespan`; the host peak as :attr:`SimResult.host_peak`: what the TURNIP grids
    report per point.

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine.
    policy : str
        The dispatch policy.
    noise : float
        The lognormal noise's sigma, as in :func:`simulate` (0: none).
    seed : int
        Seeds the noise and the seeded policies.

    Returns
    -------
    (float, int)
        Seconds and bytes.

    Raises
    ------
    PolicyError
        An unknown policy (a ValueError).
    ValueError
        A negative ``noise``.
    DeadlockError
        Some vertices can never start (a cycle, or a ``fixed`` order against the edges).
    """
    model = _run(memgraph, machine, policy, noise, seed)
    since, until, size = run_host_lifetimes(model.vertices, model.data, model.start, model.end,
                                            model.makespan)
    return model.makespan, run_host_peak(since, until, size)



MAX_NOISE = 10.0
"""The largest duration noise: a log-normal sigma; beyond it the factors (e^(sigma z -
sigma^2/2)) leave the floating-point range and no timeline is left."""


class NoiseError(SpecError, ValueError):
    """A duration noise outside 0 to :data:`MAX_NOISE` (or not a number)."""


def check_noise(noise: float) -> None:
    """:class:`NoiseError` unless 0 <= ``noise`` <= :data:`MAX_NOISE`.

    Parameters
    ----------
    noise : float
        The duration noise.

    Raises
    ------
    NoiseError
        Naming the noise and the range.
    """
    if not 0 <= noise <= MAX_NOISE:
        raise NoiseError(f"noise must be between 0 and {MAX_NOISE:g}, got {noise}")


def _run(memgraph: MemGraph, machine: Machine, policy: str, noise: float, seed: int) -> Model:
    check_policy(policy)
    check_noise(noise)
    with no_gc():
        model = Model(memgraph, machine, policy, noise, seed, machine.streams)
        model.run()
    return model
