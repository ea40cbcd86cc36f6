"""Simulated against measured: run one MemGraph in the simulator and in the executor and
compare the makespan and each component, because end-to-end errors can cancel.

Components: the makespan; per resource its busy time (the union of its vertices' intervals)
and idle time (makespan minus busy); per vertex kind the mean duration of its vertices.  The
error of a component is ``(simulated - measured) / measured``.  The measured figure is taken
from the run with the median makespan among ``runs`` runs, after one unmeasured run (a
warm-up: caches, page mappings, BLAS and lane threads).

An error is only as good as the machine is quiet: :func:`validate` first runs a noise probe,
a short fixed kernel (an n x n float32 matmul) repeated on the backend, and reports its
coefficient of variation beside each error.  Where that spread, or the spread of the measured
makespans, is at least half the makespan's error (:data:`NOISY`), the error cannot be told
from the noise, and :attr:`Validation.warning` says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from ..core.trace import busy_time
from ..executor import ExecResult, check_outputs, check_runnable, execute, expected_outputs
from ..executor.calibrate import matmuls
from ..planner import plan
from ..simulator import makespan, simulate

COLUMNS = ["planner", "component", "simulated", "measured", "error"]
PROBE_SIZE = 256        # the probe's matmul: n x n float32, about a millisecond on one core
PROBE_REPEATS = 50
NOISY = 0.5             # an error is within the noise where the spread is at least this share


@dataclass
class NoiseProbe:
    """The spread of one short fixed kernel repeated ``repeats`` times, one at a time, on a
    backend's gpu0 (after one unmeasured round): its durations' mean and standard deviation
    (seconds)."""

    kernel: str
    repeats: int
    mean: float
    std: float

    @property
    def cv(self) -> float:
        """The coefficient of variation, ``std / mean``."""
        return self.std / self.mean if self.mean > 0 else 0.0

    def row(self) -> dict:
        """A JSON-ready summary of the probe.

        Returns
        -------
        dict
            Its kernel, repeats, mean, standard deviation and coefficient of variation.
        """
        return {"kernel": self.kernel, "repeats": self.repeats, "mean": self.mean,
                "std": self.std, "cv": self.cv}

    def __str__(self) -> str:
        return (f"noise probe: {self.kernel} x {self.repeats}, mean {self.mean * 1e3:.3g} ms, "
                f"coefficient of variation {100 * self.cv:.1f}%")


def noise_probe(machine: Machine, backend: str = "numpy", n: int = PROBE_SIZE,
                repeats: int = PROBE_REPEATS) -> NoiseProbe:
    """Time ``repeats`` (at least 2) n x n float32 matmuls on ``backend``'s gpu0, one at a time.

    Parameters
    ----------
    machine : Machine
        The machine; the probe runs on a copy with one stream and unbounded GPU memory.
    backend : str, default "numpy"
        The executor backend to time.
    n : int, default PROBE_SIZE
        The matmul's side.
    repeats : int, default PROBE_REPEATS
        How many matmuls to time, at least 2.

    Returns
    -------
    NoiseProbe

    Raises
    ------
    ValueError
        If ``n < 1`` or ``repeats < 2``.
    """
    if repeats < 2 or n < 1:
        raise ValueError(f"a noise probe needs n >= 1 and repeats >= 2, got {n}, {repeats}")
    probe = replace(machine, gpus=max(machine.gpus, 1), gpu_memory=2**62, streams=1)
    mg = matmuls(n, repeats)
    execute(mg, probe, backend=backend, policy="fixed")            # warm-up
    trace = execute(mg, probe, backend=backend, policy="fixed").trace
    seconds = trace.loc[trace["kind"] == "compute", "end"] \
        - trace.loc[trace["kind"] == "compute", "start"]
    return NoiseProbe(f"{n}x{n} float32 matmul", repeats, float(seconds.mean()),
                      float(seconds.std(ddof=1)))


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
    noise: NoiseProbe | None = None
    #: What was measured (:func:`~offloadlab.lab.compare.provenance`, with the policy and
    #: backend): the first columns of :meth:`row` and :meth:`components`.
    labels: dict[str, object] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """The makespan's relative error."""
        return float(self.table.loc[self.table["component"] == "makespan", "error"].iloc[0])

    @property
    def spread(self) -> float:
        """The coefficient of variation of the measured makespans (0 for one run)."""
        return statistics.stdev(self.makespans) / statistics.mean(self.makespans) \
            if len(self.makespans) > 1 and statistics.mean(self.makespans) > 0 else 0.0

    @property
    def warning(self) -> str | None:
        """A plain sentence when the machine is too noisy for the error reported, else None."""
        probe = self.noise.cv if self.noise is not None else 0.0
        if max(probe, self.spread) < NOISY * abs(self.error):
            return None
        what = [f"the measured makespans vary by {100 * self.spread:.1f}%"]
        if self.noise is not None:
            what.insert(0, f"the noise probe ({self.noise.kernel}) varies by "
                           f"{100 * probe:.1f}%")
        return (f"too noisy to trust this error: {' and '.join(what)} (coefficient of "
                f"variation), not small against the makespan's error of "
                f"{100 * self.error:+.1f}%")

    def components(self) -> pd.DataFrame:
        """The component table with the :attr:`labels` columns first.

        Returns
        -------
        pandas.DataFrame
        """
        return self.table.assign(**self.labels)[[*self.labels, *self.table.columns]]

    def row(self) -> dict:
        """A JSON-ready summary of this planner's validation.

        Returns
        -------
        dict
            The labels, both makespans, the error and spread, the noise probe, whether it is
            too noisy, whether the outputs were correct, and every component.
        """
        span = self.table.set_index("component")
        return {**self.labels, "planner": self.planner,
                "sim_makespan": float(span.at["makespan", "simulated"]),
                "measured_makespan": float(span.at["makespan", "measured"]),
                "error": self.error, "measured_makespans": self.makespans,
                "makespan_spread": self.spread,
                "noise_probe": self.noise.row() if self.noise is not None else None,
                "too_noisy": self.warning is not None,
                "correct": self.correct,
                "components": self.table.drop(columns="planner").to_dict(orient="records")}


def components(trace: pd.DataFrame) -> dict[str, float]:
    """Makespan, busy and idle seconds per resource, mean duration per vertex kind.

    Parameters
    ----------
    trace : pandas.DataFrame
        A simulated or measured trace.

    Returns
    -------
    dict of str to float
        Seconds per component name (``makespan``, ``busy gpu0``, ``mean compute``, ...).
    """
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
    """The component table of one simulated and one measured trace.

    Parameters
    ----------
    planner : str
        The planner's spec, the table's first column.
    simulated : pandas.DataFrame
        The simulator's trace.
    measured : pandas.DataFrame
        The executor's trace.

    Returns
    -------
    pandas.DataFrame
        A row per component of the measured trace, with the :data:`COLUMNS`.
    """
    sim, real = components(simulated), components(measured)
    rows = [{"planner": planner, "component": name, "simulated": sim.get(name, 0.0),
             "measured": value, "error": (sim.get(name, 0.0) - value) / value if value else 0.0}
            for name, value in real.items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def validate_memgraph(mg: MemGraph, machine: Machine, graph: TaskGraph | None, planner: str,
                      runs: int = 3, backend: str = "numpy", policy: str = "dynamic",
                      rate_limit: bool = True, noise: NoiseProbe | None = None,
                      profiled: bool = False) -> Validation:
    """Simulate ``mg`` on ``machine`` and execute it ``runs`` times after one unmeasured run.

    Vertex times are dropped first, so that the (calibrated) machine prices every vertex,
    unless ``profiled``.

    Parameters
    ----------
    mg : MemGraph
        The plan to simulate and run.
    machine : Machine
        The (calibrated) machine.
    graph : TaskGraph or None
        The computation ``mg`` was planned from, whose reference outputs the measured ones are
        checked against; None skips the check.
    planner : str
        The planner's spec, a label.
    runs : int, default 3
        The measured runs; the one with the median makespan is compared.
    backend : str, default "numpy"
        The executor backend.
    policy : str, default "dynamic"
        The dispatch policy, in both the simulator and the executor.
    rate_limit : bool, default True
        Whether the executor paces transfers to the machine's bandwidths.
    noise : NoiseProbe, optional
        The machine's :func:`noise_probe`, carried into the result.
    profiled : bool, default False
        Keep the vertex times (they were measured on this backend:
        :func:`offloadlab.executor.profile.profile`).

    Returns
    -------
    Validation
    """
    if not profiled:
        for v in mg:
            v.time = None
    sim = simulate(mg, machine, policy=policy)
    execute(mg, machine, backend=backend, policy=policy, rate_limit=rate_limit)  # warm-up
    expected = expected_outputs(graph, backend) if graph is not None else None
    results: list[ExecResult] = []
    correct: list[bool] = []
    for r in range(runs):
        # each run's outputs are checked as it ends and dropped, not held for every run
        result = execute(mg, machine, backend=backend, policy=policy, seed=r,
                         rate_limit=rate_limit, run=r)
        correct.append(expected is None or check_outputs(result.outputs, expected[0],
                                                         backend, expected[1]) is None)
        results.append(replace(result, outputs={}))
    spans = [r.makespan for r in results]
    at = spans.index(statistics.median_low(spans))
    return Validation(planner, compare_traces(planner, sim.trace, results[at].trace), sim.trace,
                      results[at].trace, spans, correct[at], noise)


def validate(graph: TaskGraph, machine: Machine, planners: Sequence[str], runs: int = 3,
             backend: str = "numpy", policy: str = "dynamic", rate_limit: bool = True,
             progress: Callable[[str], None] | None = None,
             noise: NoiseProbe | None = None, workload: str | None = None,
             machine_text: str | None = None, profile: bool = False) -> list[Validation]:
    """:func:`validate_memgraph` for each planner's MemGraph of ``graph``.

    A graph the executor cannot run is refused before planning; a :func:`noise_probe` of the
    backend comes first.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The (calibrated) machine.
    planners : sequence of str
        The planner specs to validate.
    runs : int, default 3
        Measured runs per planner.
    backend : str, default "numpy"
        The executor backend.
    policy : str, default "dynamic"
        The dispatch policy.
    rate_limit : bool, default True
        Whether the executor paces transfers to the machine's bandwidths.
    progress : callable, optional
        Called with a line as each step starts.
    noise : NoiseProbe, optional
        A noise probe already taken; default: take one.
    workload : str, optional
        The workload's spec as the caller gave it, a label.
    machine_text : str, optional
        The machine's spec as the caller gave it, a label.
    profile : bool, default False
        First time every distinct kernel of ``graph`` on the backend
        (:func:`offloadlab.executor.profile.profile`), and simulate with those times.

    Returns
    -------
    list of Validation
        One per planner, in order, each labelled with what it measured.

    Raises
    ------
    KernelError
        If a compute vertex of ``graph`` has no kernel.
    PlanError
        If a planner finds no plan.
    """
    from .compare import provenance
    check_runnable(graph)
    if noise is None:
        noise = noise_probe(machine, backend)
    planned = graph
    if profile:
        from ..executor.profile import profile as timed
        if progress:
            progress("profiling the kernels")
        planned = timed(graph, machine, backend).graph
    out = []
    for spec in planners:
        if progress:
            progress(f"{spec}: planning, simulating and running {runs} time(s)")
        memgraph = plan(planned, machine, spec, evaluate=makespan)
        out.append(validate_memgraph(memgraph, machine, graph, spec, runs, backend, policy,
                                     rate_limit, noise, profiled=profile))
        out[-1].labels = {**provenance(graph, machine, workload, machine_text),
                          "policy": policy, "backend": backend, "runs": runs,
                          "profiled": profile}
    return out
