"""How much GPU memory and host RAM a computation needs, and what more GPU memory buys
(``offloadlab estimate``, issue 45; the question DeepSpeed's
``estimate_zero2_model_states_mem_needs`` answers for ZeRO).

For each planner: the smallest GPU memory it can plan the TaskGraph in, found by bisection
between the least any plan needs (a kernel's inputs and output together,
:func:`~offloadlab.planner.buildmemgraph.min_capacity`) and the memory in which nothing need
move (every tensor at once), to a relative precision; the host RAM its plan peaks at there
(the simulated run's ``host`` peak); and its simulated makespan at GPU memories from the
tightest any planner manages to that roomiest (log-spaced), beside the problem's lower bound
(:func:`~offloadlab.core.bound.problem_bound`, the same at every memory).  The bisection
assumes that a planner that plans at some memory plans at any larger one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..core.errors import OffloadlabError

if TYPE_CHECKING:
    import pandas as pd

    from ..core.machine import Machine
    from ..core.taskgraph import TaskGraph

SMALLEST_COLUMNS = ["planner", "smallest_gpu_memory", "host_peak", "makespan", "probes", "error"]
CURVE_COLUMNS = ["planner", "gpu_memory", "makespan", "host_peak"]


@dataclass
class Estimate:
    """:func:`estimate`'s answer: a row per planner (:data:`SMALLEST_COLUMNS`), the curve (a
    row per planner and memory, :data:`CURVE_COLUMNS`; NaN where it cannot plan) and the
    problem's lower bound in seconds."""

    smallest: pd.DataFrame
    curve: pd.DataFrame
    bound: float


def _attempt(graph: TaskGraph, machine: Machine, planner: str, memory: int
             ) -> tuple[float, int] | str:
    """The simulated makespan and host peak of ``planner``'s plan at ``memory`` bytes per GPU,
    or why it cannot plan there."""
    from ..planner import plan
    from ..simulator import simulate
    m = replace(machine, gpu_memory=memory)
    try:
        result = simulate(plan(graph, m, planner), m)
    except OffloadlabError as exc:
        return str(exc)
    return result.makespan, int(result.peak_memory.get("host", 0))


def smallest_memory(graph: TaskGraph, machine: Machine, planner: str, low: int, high: int,
                    precision: float = 0.01, progress: Callable[[], None] | None = None
                    ) -> tuple[int | None, int, str]:
    """The smallest GPU memory in ``(low, high]`` at which ``planner`` plans ``graph``, to within
    ``precision`` of it.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine; its GPU memory is what the search changes.
    planner : str
        The planner spec.
    low, high : int
        The bytes the search starts between.
    precision : float
        The relative precision of the answer.
    progress : callable, optional
        Called after each plan the search makes.

    Returns
    -------
    tuple
        The smallest memory (None if it cannot plan at ``high``), how many plans the search
        made, and the last refusal (empty if none).
    """
    probes, error = 1, ""
    found = _attempt(graph, machine, planner, high)
    if isinstance(found, str):
        return None, probes, found
    if high > low + 1:                     # the least any plan needs is often enough
        probes += 1
        found = _attempt(graph, machine, planner, low + 1)
        if not isinstance(found, str):
            return low + 1, probes, error
        error = found
    while high - low > max(precision * high, 1):
        middle = (low + high) // 2
        probes += 1
        found = _attempt(graph, machine, planner, middle)
        if progress is not None:
            progress()
        if isinstance(found, str):
            low, error = middle, found
        else:
            high = middle
    return high, probes, error


def estimate(graph: TaskGraph, machine: Machine, planners: Iterable[str] | None = None,
             points: int = 8, precision: float = 0.01,
             progress: Callable[[str], None] | None = None) -> Estimate:
    """The smallest GPU memory each planner needs for ``graph`` on ``machine``'s GPUs, the host
    RAM it then needs, and makespan against GPU memory.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        Its ``gpu_memory`` is ignored: the estimate varies it.
    planners : iterable of str, optional
        Planner specs; default every registered planner.
    points : int
        GPU memories on the curve, spaced evenly on a log scale from the tightest any planner
        manages to the memory in which nothing need move.
    precision : float
        The bisection stops when the interval is this share of its upper end.
    progress : callable, optional
        ``progress(line)`` hears each planner and memory as it starts.

    Returns
    -------
    Estimate

    Raises
    ------
    SpecError
        An unknown planner, option or value (before any work), or ``points`` < 2.
    GraphError
        No plan of the problem could finish (its lower bound is not finite).

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> found = estimate(build_workload("training-chain"), machine_from_spec("v100"),
    ...                  ["buildmemgraph", "levelwise"], points=3)
    >>> print(found.smallest[["planner", "smallest_gpu_memory"]].to_string(index=False))
          planner  smallest_gpu_memory
    buildmemgraph           1200000000
        levelwise           1200000000
    """
    import numpy as np
    import pandas as pd

    from ..core.bound import problem_bound
    from ..core.budget import check_ram
    from ..core.errors import SpecError
    from ..planner import PLANNERS
    from ..planner.buildmemgraph import min_capacity
    from ..planner.registry import check_spec

    specs = list(planners) if planners is not None else sorted(PLANNERS)
    for spec in specs:
        check_spec(spec)
    if points < 2:
        raise SpecError(f"points must be at least 2, got {points}")
    # the memories' float and integer arrays (geomspace, astype, unique's sorted copy)
    check_ram(f"{points} points", 32 * points)
    floor = problem_bound(graph, machine, finite=True).value
    low = max(min_capacity(graph) - 1, 0)
    roomy = max(sum(t.bytes for t in graph), low + 1)
    say = progress or (lambda line: None)
    rows = []
    for spec in specs:
        say(f"{spec}: the smallest GPU memory")
        memory, probes, error = smallest_memory(graph, machine, spec, low, roomy, precision)
        if memory is None:
            rows.append(dict(planner=spec, probes=probes, error=error))
            continue
        found = _attempt(graph, machine, spec, memory)
        assert not isinstance(found, str)
        rows.append(dict(planner=spec, smallest_gpu_memory=memory, makespan=found[0],
                         host_peak=found[1], probes=probes, error=None))
    smallest = pd.DataFrame(rows, columns=SMALLEST_COLUMNS)
    planned = smallest["smallest_gpu_memory"].dropna()
    curve_rows = []
    if len(planned):
        memories = np.unique(np.geomspace(int(planned.min()), roomy, points).astype(np.int64))
        for spec, best in zip(smallest["planner"], smallest["smallest_gpu_memory"]):
            for memory in memories:
                say(f"{spec} at {int(memory)} bytes")
                found = _attempt(graph, machine, spec, int(memory)) \
                    if best == best and memory >= best else "below its smallest memory"
                curve_rows.append(dict(planner=spec, gpu_memory=int(memory),
                                       makespan=None if isinstance(found, str) else found[0],
                                       host_peak=None if isinstance(found, str) else found[1]))
    curve = pd.DataFrame(curve_rows, columns=CURVE_COLUMNS)
    return Estimate(smallest, curve, floor)


def curve_table(found: Estimate) -> pd.DataFrame:
    """The curve with a column per planner (makespans in seconds) and the bound, a row per
    GPU memory.

    Parameters
    ----------
    found : Estimate
        What :func:`estimate` found.

    Returns
    -------
    DataFrame
        The table.
    """
    wide = found.curve.pivot(index="gpu_memory", columns="planner", values="makespan")
    wide = wide[list(dict.fromkeys(found.curve["planner"]))]
    wide["bound"] = found.bound
    return wide.reset_index()
