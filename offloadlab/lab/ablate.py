"""Ablations: how much a work-conserving runtime gains over a fixed order (TURNIP Sec. 8,
Figure 14), in the simulator.

The fixed order is the one a static scheduler with a perfect cost model would pick: each
resource runs its vertices in the order in which they started in a noiseless ``dynamic`` run of
the same MemGraph (:func:`replayed` makes that the planner order, which both policies then run,
so that a seed draws the same noise for a vertex under either).  Without noise the two policies
then give the same makespan; with noise (each duration times a seeded lognormal factor) the
dynamic runtime reorders around slow and fast vertices and the fixed one cannot.  The speedup
of a seed is ``fixed / dynamic - 1``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph

if TYPE_CHECKING:
    import pandas as pd

#: Resamples of the bootstrap confidence interval of a mean speedup.
RESAMPLES = 10_000


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
                       progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Each planner's MemGraph under ``dynamic`` and a replayed ``fixed`` order
    (:func:`replayed`), ``seeds`` noisy runs per noise level: one row per planner and noise
    with the mean speedup of ``dynamic`` over ``fixed`` and its 95% confidence interval."""
    import pandas as pd

    from ..core.verify import verify
    from ..planner import plan
    from ..simulator import makespan

    say = progress or (lambda line: None)
    rows = []
    for spec in planners:
        say(f"{spec}: planning ...")
        mg = plan(graph, machine, spec, evaluate=makespan)
        verify(mg, graph, machine)
        mg = replayed(mg, machine)     # both policies run it: a seed draws the same noise
        for noise in noises:
            say(f"{spec}: noise {noise:g}, {seeds} seeds ...")
            a = [makespan(mg, machine, "dynamic", noise, seed) for seed in range(seeds)]
            b = [makespan(mg, machine, "fixed", noise, seed) for seed in range(seeds)]
            mean, low, high = mean_ci([fb / fa - 1 for fa, fb in zip(a, b)])
            rows.append({"planner": spec, "policy_a": "dynamic", "policy_b": "fixed",
                         "noise": noise, "seeds": seeds, "mean_speedup": mean, "ci_low": low,
                         "ci_high": high, "mean_makespan_a": sum(a) / seeds,
                         "mean_makespan_b": sum(b) / seeds})
    return pd.DataFrame(rows)
