"""Simulated against measured: run one MemGraph in the simulator and in the executor and
compare the makespan and each component, because end-to-end errors can cancel.

Components: the makespan; per resource its busy time (the union of its vertices' intervals)
and idle time (makespan minus busy); per vertex kind the mean duration of its vertices.  The
error of a component is ``(simulated - measured) / measured``.  The measured figure is taken
from the run with the median makespan among ``runs`` runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from ..core.trace import busy_time
from ..executor import ExecResult, check_outputs, check_runnable, execute, reference_outputs
from ..planner import plan
from ..simulator import makespan, simulate

COLUMNS = ["planner", "component", "simulated", "measured", "error"]


@dataclass
class Validation:
    """One planner's comparison: the component table, both traces, every measured makespan,
    and whether the measured outputs equal the reference."""

    planner: str
    table: pd.DataFrame
    simulated: pd.DataFrame
    measured: pd.DataFrame
    makespans: list[float]
    correct: bool
    #: What was measured (:func:`~offloadlab.lab.compare.provenance`, with the policy and
    #: backend): the first columns of :meth:`row` and :meth:`components`.
    labels: dict[str, object] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """The makespan's relative error."""
        return float(self.table.loc[self.table["component"] == "makespan", "error"].iloc[0])

    def components(self) -> pd.DataFrame:
        """The component table with the :attr:`labels` columns first."""
        return self.table.assign(**self.labels)[[*self.labels, *self.table.columns]]

    def row(self) -> dict:
        """A JSON-ready summary of this planner's validation."""
        span = self.table.set_index("component")
        return {**self.labels, "planner": self.planner,
                "sim_makespan": float(span.at["makespan", "simulated"]),
                "measured_makespan": float(span.at["makespan", "measured"]),
                "error": self.error, "measured_makespans": self.makespans,
                "correct": self.correct,
                "components": self.table.drop(columns="planner").to_dict(orient="records")}


def components(trace: pd.DataFrame) -> dict[str, float]:
    """Makespan, busy and idle seconds per resource, mean duration per vertex kind."""
    span = float(trace["end"].max()) if len(trace) else 0.0
    out = {"makespan": span}
    for resource, busy in busy_time(trace).items():
        out[f"busy {resource}"] = busy
        out[f"idle {resource}"] = span - busy
    durations = trace["end"] - trace["start"]
    for kind, mean in durations.groupby(trace["kind"]).mean().items():
        out[f"mean {kind}"] = float(mean)
    return out


def compare_traces(planner: str, simulated: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """The component table of one simulated and one measured trace."""
    sim, real = components(simulated), components(measured)
    rows = [{"planner": planner, "component": name, "simulated": sim.get(name, 0.0),
             "measured": value, "error": (sim.get(name, 0.0) - value) / value if value else 0.0}
            for name, value in real.items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def validate_memgraph(mg: MemGraph, machine: Machine, graph: TaskGraph | None, planner: str,
                      runs: int = 3, backend: str = "numpy", policy: str = "dynamic",
                      rate_limit: bool = True) -> Validation:
    """Simulate ``mg`` on ``machine`` and execute it ``runs`` times.  Profiled vertex times
    are dropped first: the (calibrated) machine prices every vertex."""
    for v in mg:
        v.time = None
    sim = simulate(mg, machine, policy=policy)
    results: list[ExecResult] = [execute(mg, machine, backend=backend, policy=policy, seed=r,
                                         rate_limit=rate_limit, run=r) for r in range(runs)]
    spans = [r.makespan for r in results]
    median = results[spans.index(statistics.median_low(spans))]
    correct = True
    if graph is not None:
        correct = check_outputs(median.outputs, reference_outputs(graph), backend) is None
    return Validation(planner, compare_traces(planner, sim.trace, median.trace), sim.trace,
                      median.trace, spans, correct)


def validate(graph: TaskGraph, machine: Machine, planners: Sequence[str], runs: int = 3,
             backend: str = "numpy", policy: str = "dynamic", rate_limit: bool = True,
             progress: Callable[[str], None] | None = None, workload: str | None = None,
             machine_text: str | None = None) -> list[Validation]:
    """:func:`validate_memgraph` for each planner's MemGraph of ``graph`` (a graph the
    executor cannot run is refused before planning), each labelled with what it measured
    (``workload`` and ``machine_text``: the specs as the caller gave them)."""
    from .compare import provenance
    check_runnable(graph)
    out = []
    for spec in planners:
        if progress:
            progress(spec)
        memgraph = plan(graph, machine, spec, evaluate=makespan)
        out.append(validate_memgraph(memgraph, machine, graph, spec, runs, backend, policy,
                                     rate_limit))
        out[-1].labels = {**provenance(graph, machine, workload, machine_text),
                          "policy": policy, "backend": backend, "runs": runs}
    return out
