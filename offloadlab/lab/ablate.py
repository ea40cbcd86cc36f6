"""Ablations: how much a work-conserving runtime gains over a fixed order (TURNIP Sec. 8,
Figure 14), in the simulator (and on the executor), and what each part of BuildMemGraph
contributes (:func:`ablate_parts`).

The fixed order is one of :data:`FIXED`:

- ``planned`` (TURNIP's definition, the default): "we add dependencies to fix the order of
  operations at each of the GPUs to be exactly the order that is input into BUILDMEMGRAPH"
  (Sec. 8 (3)).  :func:`planned` adds a memory edge from each kernel to the next one on its
  GPU in the planner's order (for BuildMemGraph, its input list V), and the fixed run is the
  same ``dynamic`` runtime on that MemGraph.  Offloads, reloads and loads are not in the list
  BuildMemGraph is given (it makes them), and GPU->GPU transfers and CPU ops are not
  operations of a GPU's kernel stream: they get no new edge and are still dispatched as soon
  as they are ready.  Without noise the two runs can differ: a kernel whose reload is late
  holds up the kernels after it, where the dynamic runtime runs another one.
- ``replay``: each resource runs its vertices in the order in which they started in a
  noiseless ``dynamic`` run of the same MemGraph (:func:`replayed` makes that the planner
  order, which the ``fixed`` policy then runs): the order a static scheduler with a perfect
  cost model would pick, so that without noise the two runs tie.

Both runs are paired by seed: they run the same vertices in the same planner order, so a seed
draws the same noise (each duration times a seeded lognormal factor) for a vertex in either.
The speedup of a seed is ``fixed / dynamic - 1``.
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
    if fixed not in FIXED:
        raise SpecError(f"unknown fixed order {fixed!r}; valid: {', '.join(FIXED)}")


def check_seeds(seeds: int) -> None:
    """Refuse, in one line, a number of seeds whose bootstrap would not fit in the RAM
    available: :func:`mean_ci` draws :data:`RESAMPLES` x ``seeds`` values (an int64 index and
    a float64 value each)."""
    from ..core.budget import check_ram
    check_ram(f"{seeds} seeds ({RESAMPLES} bootstrap resamples each)", 16 * RESAMPLES * seeds)


def planned(memgraph: MemGraph) -> MemGraph:
    """``memgraph`` with a memory edge from each kernel (a ``compute`` vertex on a GPU) to the
    next kernel on its GPU in planner order: under any policy each GPU then runs its kernels
    one at a time in that order (TURNIP's fixed order, Sec. 8 (3)); every other vertex keeps
    its edges alone.  The copy shares ``memgraph``'s vertex objects (it changes none of them)
    and has its own edges."""
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
    """A copy of ``memgraph`` whose planner order is the order its vertices started in a
    noiseless ``dynamic`` simulation (ties in the old order), so that ``fixed`` dispatch of
    the copy replays that run."""
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
    """The runs that compare ``dynamic`` dispatch of ``memgraph`` with the ``fixed`` order
    (:data:`FIXED`): ``planned``, the same runtime on :func:`planned`'s MemGraph; ``replay``,
    the ``fixed`` policy on :func:`replayed`'s, which the dynamic run then runs too (a seed
    draws the same noise for a vertex under either)."""
    check_fixed(fixed)
    if fixed == "planned":
        return Pair(memgraph, planned(memgraph), "dynamic")
    again = replayed(memgraph, machine)
    return Pair(again, again, "fixed")


def simulated(runs: Pair, machine: Machine, noise: float, seeds: int
              ) -> tuple[list[float], list[float]]:
    """The simulated makespans of ``seeds`` runs of each of ``runs``, paired by seed: dynamic
    and fixed.  Without noise a seed changes nothing, so each is simulated once."""
    from ..simulator import makespan
    draws = seeds if noise > 0 else 1
    a = [makespan(runs.dynamic, machine, "dynamic", noise, seed) for seed in range(draws)]
    b = [makespan(runs.fixed, machine, runs.policy, noise, seed) for seed in range(draws)]
    return a * (seeds // draws), b * (seeds // draws)


def mean_ci(values: Sequence[float], level: float = 0.95, seed: int = 0
            ) -> tuple[float, float, float]:
    """The mean of ``values`` and a percentile bootstrap confidence interval for it."""
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
    """Each planner's MemGraph under ``dynamic`` dispatch and in the ``fixed`` order
    (:data:`FIXED`; :func:`pair`), ``seeds`` noisy runs per noise level: one row per planner
    and noise with the mean speedup of ``dynamic`` over the fixed order and its 95%
    confidence interval (``source`` ``sim``).  ``measured`` adds a row per planner from the
    executor (``backend``), where the noise is real: ``seeds`` runs of each, alternating,
    the ``noise`` column empty (``source`` ``measured``).  Each row carries ``fixed`` and
    the :func:`~offloadlab.lab.compare.provenance` columns (``workload`` and
    ``machine_text``: the specs as the caller gave them)."""
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
    """Each seed's speedup of ``dynamic`` (makespans ``a``) over the fixed order (``b``)."""
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
    """BuildMemGraph with its defaults, then with one part changed at a time (:data:`PARTS`:
    the victim policy, allocation ahead and its bound, the serial order, the retry, and the
    number of streams per GPU that the plan runs with): one row per setting with the
    simulated makespan, host<->GPU traffic, and ``change``, the makespan over the default's
    less one; with the planner spec, the policy and the
    :func:`~offloadlab.lab.compare.provenance` columns."""
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
