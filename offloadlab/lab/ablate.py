"""Ablations: how much a work-conserving runtime gains over a fixed order (TURNIP Sec. 8,
Figure 14), in the simulator (and on the executor), and what each part of BuildMemGraph
contributes (:func:`ablate_parts`).

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
from dataclasses import replace
from typing import TYPE_CHECKING

from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .compare import provenance, stamped

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
                       measured: bool = False, backend: str = "numpy",
                       rate_limit: bool = True,
                       progress: Callable[[str], None] | None = None,
                       workload: str | None = None,
                       machine_text: str | None = None) -> pd.DataFrame:
    """Each planner's MemGraph under ``dynamic`` and a replayed ``fixed`` order
    (:func:`replayed`), ``seeds`` noisy runs per noise level: one row per planner and noise
    with the mean speedup of ``dynamic`` over ``fixed`` and its 95% confidence interval
    (``source`` ``sim``).  ``measured`` adds a row per planner from the executor
    (``backend``), where the noise is real: ``seeds`` runs of each policy, alternating, the
    ``noise`` column empty (``source`` ``measured``).  Each row carries the
    :func:`~offloadlab.lab.compare.provenance` columns (``workload`` and ``machine_text``: the
    specs as the caller gave them)."""
    import pandas as pd

    from ..core.verify import verify
    from ..planner import plan
    from ..simulator import makespan

    say = progress or (lambda line: None)
    if measured:
        from ..executor import check_runnable, execute
        check_runnable(graph)               # before any planning
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
            rows.append(_row(spec, noise, a, b, "sim"))
        if measured:
            say(f"{spec}: {seeds} runs of each policy on the {backend} backend ...")
            a, b = [], []
            for _ in range(seeds):
                for policy, out in (("dynamic", a), ("fixed", b)):
                    out.append(execute(mg, machine, backend=backend, policy=policy,
                                       rate_limit=rate_limit).makespan)
            rows.append(_row(spec, None, a, b, "measured"))
    return stamped(pd.DataFrame(rows), provenance(graph, machine, workload, machine_text))


def _row(planner: str, noise: float | None, a: Sequence[float], b: Sequence[float],
         source: str) -> dict[str, object]:
    """A row of :func:`ablate_determinism` from the paired makespans under ``dynamic`` (a)
    and ``fixed`` (b)."""
    mean, low, high = mean_ci([fb / fa - 1 for fa, fb in zip(a, b)])
    return {"planner": planner, "source": source, "policy_a": "dynamic", "policy_b": "fixed",
            "noise": noise, "seeds": len(a), "mean_speedup": mean, "ci_low": low,
            "ci_high": high, "mean_makespan_a": sum(a) / len(a),
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
