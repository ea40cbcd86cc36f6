"""Ablations: how much a work-conserving runtime gains over a fixed order (TURNIP Sec. 8,
Figure 14), in the simulator (and on the executor), and what each part of BuildMemGraph
contributes (:func:`ablate_parts`).

The fixed order is one of :data:`FIXED`: ``planned``, TURNIP's definition (Sec. 8 (3)), each
GPU's kernels chained in the planner's order (:func:`planned`), or ``replay``, each resource in
the order a noiseless ``dynamic`` run started its vertices (:func:`replayed`).  The two runs
are paired by seed; a seed's speedup is ``fixed / dynamic - 1``.  What each order leaves alone
and why: docs/ablation.md, The two runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..core.devices import is_gpu_name
from ..core.errors import SpecError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .compare import provenance, stamped

if TYPE_CHECKING:
    import pandas as pd

#: Resamples of the bootstrap confidence interval of a mean speedup.
RESAMPLES = 10_000

#: The fixed orders of :func:`ablate_determinism`, the default (TURNIP's) first.
FIXED = ("planned", "replay")


def check_fixed(fixed: str) -> None:
    """Refuse an unknown fixed order.

    Parameters
    ----------
    fixed : str
        One of :data:`FIXED`.

    Raises
    ------
    SpecError
        Listing the valid orders.
    """
    if fixed not in FIXED:
        raise SpecError(f"unknown fixed order {fixed!r}; valid: {', '.join(FIXED)}")


def check_seeds(seeds: int) -> None:
    """Refuse, in one line, a number of seeds whose bootstrap would not fit in the RAM available.

    :func:`mean_ci` draws :data:`RESAMPLES` x ``seeds`` values (an int64 index and a float64
    value each).

    Parameters
    ----------
    seeds : int
        The number of seeds.

    Raises
    ------
    SpecError
        Naming the seeds, the bytes they need and the RAM available.
    """
    from ..core.budget import check_ram
    check_ram(f"{seeds} seeds ({RESAMPLES} bootstrap resamples each)", 16 * RESAMPLES * seeds)


def planned(memgraph: MemGraph) -> MemGraph:
    """``memgraph`` with each GPU's kernels chained in planner order (TURNIP's fixed order).

    A memory edge from each kernel (a ``compute`` vertex on a GPU) to the next kernel on its
    GPU in planner order: under any policy each GPU then runs its kernels one at a time in
    that order (Sec. 8 (3)); every other vertex keeps its edges alone.

    Parameters
    ----------
    memgraph : MemGraph
        The plan.

    Returns
    -------
    MemGraph
        A copy sharing ``memgraph``'s vertex objects (it changes none of them), with its own
        edges.
    """
    out = MemGraph(memgraph.graph)
    out.vertices = dict(memgraph.vertices)
    out.succ = {u: dict(targets) for u, targets in memgraph.succ.items()}
    out.pred = {v: dict(sources) for v, sources in memgraph.pred.items()}
    last: dict[str, str] = {}               # GPU -> its latest kernel so far
    for v in sorted(memgraph, key=lambda v: v.order):
        if v.kind == "compute" and is_gpu_name(v.device):
            before = last.get(v.device)
            if before is not None:
                out.add_edge(before, v.id, "memory")
            last[v.device] = v.id
    return out


def replayed(memgraph: MemGraph, machine: Machine) -> MemGraph:
    """A copy of ``memgraph`` in the order its vertices started in a noiseless ``dynamic`` run.

    That order (ties in the old order) becomes the copy's planner order, so that ``fixed``
    dispatch of the copy replays the run.

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine it is simulated on.

    Returns
    -------
    MemGraph
    """
    from ..simulator import simulate
    trace = simulate(memgraph, machine, policy="dynamic").trace
    start = dict(zip(trace["vertex"], trace["start"]))
    out = copy.deepcopy(memgraph)
    for i, v in enumerate(sorted(out, key=lambda v: (start.get(v.id, -1.0), v.order))):
        v.order = i
    return out


@dataclass
class Pair:
    """The two runs of the ablation: the MemGraph ``dynamic`` dispatch runs, and the MemGraph
    and policy of the fixed run (:func:`pair`)."""

    dynamic: MemGraph
    fixed: MemGraph
    policy: str


def pair(memgraph: MemGraph, machine: Machine, fixed: str = "planned") -> Pair:
    """The runs that compare ``dynamic`` dispatch of ``memgraph`` with the ``fixed`` order.

    ``planned``: the same runtime on :func:`planned`'s MemGraph; ``replay``: the ``fixed``
    policy on :func:`replayed`'s, which the dynamic run then runs too (a seed draws the same
    noise for a vertex under either).

    Parameters
    ----------
    memgraph : MemGraph
        The plan.
    machine : Machine
        The machine.
    fixed : str
        One of :data:`FIXED`.

    Returns
    -------
    Pair
    """
    check_fixed(fixed)
    if fixed == "planned":
        return Pair(memgraph, planned(memgraph), "dynamic")
    again = replayed(memgraph, machine)
    return Pair(again, again, "fixed")


def simulated(runs: Pair, machine: Machine, noise: float, seeds: int
              ) -> tuple[list[float], list[float]]:
    """The simulated makespans of ``seeds`` runs of each of ``runs``, paired by seed.

    Without noise a seed changes nothing, so each is simulated once.

    Parameters
    ----------
    runs : Pair
        The two runs.
    machine : Machine
        The machine.
    noise : float
        The lognormal noise's sigma.
    seeds : int
        Runs of each.

    Returns
    -------
    (list of float, list of float)
        The dynamic and the fixed makespans, in seconds.
    """
    from ..simulator import makespan
    draws = seeds if noise > 0 else 1
    a = [makespan(runs.dynamic, machine, "dynamic", noise, seed) for seed in range(draws)]
    b = [makespan(runs.fixed, machine, runs.policy, noise, seed) for seed in range(draws)]
    return a * (seeds // draws), b * (seeds // draws)


def mean_ci(values: Sequence[float], level: float = 0.95, seed: int = 0
            ) -> tuple[float, float, float]:
    """The mean of ``values`` and a percentile bootstrap confidence interval for it.

    Parameters
    ----------
    values : sequence of float
        The sample.
    level : float
        The confidence level.
    seed : int
        Seeds the resampling.

    Returns
    -------
    (float, float, float)
        The mean and the interval's low and high ends.
    """
    import numpy as np
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), float(x.mean()), float(x.mean())
    means = np.random.default_rng(seed).choice(x, (RESAMPLES, len(x))).mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(low), float(high)


def ablate_determinism(graph: TaskGraph, machine: Machine, planners: Iterable[str],
                       noises: Iterable[float] = (0.0, 0.05, 0.1, 0.2), seeds: int = 30,
                       measured: bool = False, backend: str = "numpy",
                       rate_limit: bool = True,
                       progress: Callable[[str], None] | None = None,
                       workload: str | None = None,
                       machine_text: str | None = None,
                       fixed: str = "planned") -> pd.DataFrame:
    """Each planner's MemGraph under ``dynamic`` dispatch and in the ``fixed`` order.

    ``seeds`` noisy runs per noise level: one row per planner and noise with the mean speedup
    of ``dynamic`` over the fixed order and its 95% confidence interval (``source`` ``sim``).
    ``measured`` adds a row per planner from the executor, where the noise is real: ``seeds``
    runs of each, alternating, the ``noise`` column empty (``source`` ``measured``).  Each row
    carries ``fixed`` and the :func:`~offloadlab.lab.compare.provenance` columns.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine.
    planners : iterable of str
        Planner specs.
    noises : iterable of float
        Noise levels (the lognormal sigma).
    seeds : int
        Runs per noise level.
    measured : bool
        Also run on the executor.
    backend : str
        The executor's backend, with ``measured``.
    rate_limit : bool
        Pace the numpy backend's copies to the machine's bandwidths.
    progress : callable, optional
        ``progress(line)`` hears each step.
    workload, machine_text : str, optional
        The specs as the caller gave them, for the provenance columns.
    fixed : str
        One of :data:`FIXED` (:func:`pair`).

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    SpecError
        An unknown fixed order, planner or option.
    PlanError
        A planner cannot plan the problem.
    """
    import pandas as pd

    from ..core.verify import verify
    from ..planner import plan
    from ..simulator import makespan

    check_fixed(fixed)
    check_seeds(seeds)
    say = progress or (lambda line: None)
    if measured:
        from ..executor import check_runnable, execute
        check_runnable(graph)               # before any planning
    rows = []
    for spec in planners:
        say(f"{spec}: planning ...")
        mg = plan(graph, machine, spec, evaluate=makespan)
        verify(mg, graph, machine)
        runs = pair(mg, machine, fixed)
        for noise in noises:
            say(f"{spec}: noise {noise:g}, {seeds} seeds ...")
            a, b = simulated(runs, machine, noise, seeds)
            rows.append(_row(spec, fixed, noise, a, b, "sim"))
        if measured:
            say(f"{spec}: {seeds} runs of each policy on the {backend} backend ...")
            a, b = [], []
            for _ in range(seeds):
                for memgraph, policy, out in ((runs.dynamic, "dynamic", a),
                                              (runs.fixed, runs.policy, b)):
                    out.append(execute(memgraph, machine, backend=backend, policy=policy,
                                       rate_limit=rate_limit).makespan)
            rows.append(_row(spec, fixed, None, a, b, "measured"))
    return stamped(pd.DataFrame(rows), provenance(graph, machine, workload, machine_text))


def speedups(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Each seed's speedup of ``dynamic`` over the fixed order: ``fixed / dynamic - 1``.

    Parameters
    ----------
    a : sequence of float
        The dynamic makespans.
    b : sequence of float
        The fixed ones, paired by seed.

    Returns
    -------
    list of float
    """
    return [fb / fa - 1 for fa, fb in zip(a, b)]


def _row(planner: str, fixed: str, noise: float | None, a: Sequence[float],
         b: Sequence[float], source: str) -> dict[str, object]:
    """A row of :func:`ablate_determinism` from the paired makespans under ``dynamic`` (a)
    and in the fixed order (b)."""
    mean, low, high = mean_ci(speedups(a, b))
    return {"planner": planner, "source": source, "policy_a": "dynamic", "policy_b": "fixed",
            "fixed": fixed, "noise": noise, "seeds": len(a), "mean_speedup": mean,
            "ci_low": low, "ci_high": high, "mean_makespan_a": sum(a) / len(a),
            "mean_makespan_b": sum(b) / len(b)}


#: The parts of BuildMemGraph :func:`ablate_parts` varies one at a time: (part, settings);
#: the first setting of each is the default.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("victim", ("belady", "cost", "lru")), ("ahead", ("true", "false")),
    ("reserve", ("1", "0")), ("order", ("given", "topological", "levels")),
    ("retry", ("true", "false")), ("streams", ("default", "1", "2")))


def ablate_parts(graph: TaskGraph, machine: Machine, policy: str = "dynamic",
                 progress: Callable[[str], None] | None = None, workload: str | None = None,
                 machine_text: str | None = None) -> pd.DataFrame:
    """BuildMemGraph with its defaults, then with one part changed at a time.

    The parts (:data:`PARTS`): the victim policy, allocation ahead and its bound, the serial
    order, the retry, and the number of streams per GPU that the plan runs with.  One row
    per setting with the simulated makespan, host<->GPU traffic, and ``change``, the
    makespan over the default's less one; with the planner spec, the policy and the
    :func:`~offloadlab.lab.compare.provenance` columns.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine.
    policy : str
        The dispatch policy.
    progress : callable, optional
        ``progress(line)`` hears each step.
    workload, machine_text : str, optional
        The specs as the caller gave them, for the provenance columns.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    PlanError
        BuildMemGraph cannot plan the problem.
    """
    import pandas as pd

    from ..core.verify import verify
    from ..planner import plan
    from ..simulator import makespan

    say = progress or (lambda line: None)
    rows = []
    base: float | None = None
    for part, settings in PARTS:
        for setting in settings:
            spec = "buildmemgraph" if part == "streams" or setting == settings[0] else \
                f"buildmemgraph:{part}={setting}"
            say(f"{part}={setting}: planning and simulating ...")
            mg = plan(graph, machine, spec)
            verify(mg, graph, machine)
            run_on = machine if setting == "default" or part != "streams" else \
                replace(machine, streams=int(setting))
            span = makespan(mg, run_on, policy)
            base = span if base is None else base
            rows.append({"part": part, "setting": setting if setting != "default" else
                         str(machine.streams), "default": setting == settings[0],
                         "planner": spec, "policy": policy, "streams": run_on.streams,
                         "makespan": span, "change": span / base - 1,
                         "bytes_moved": mg.host_bytes()})
    return stamped(pd.DataFrame(rows), provenance(graph, machine, workload, machine_text))
