"""Plan and simulate one workload under several (planner, dispatch policy) pairs and tabulate
the outcome: the building block of the demo and of sweeps."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.devices import is_gpu
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph

if TYPE_CHECKING:
    import pandas as pd

    from ..simulator import SimResult


def machine_spec(machine: Machine) -> str:
    """``machine`` as a spec with its overrides.

    The preset it is named after with each field that differs from it
    (``p100x4:gpus=2,gpu_memory=60000000``); a machine of no preset (a calibrated one) with
    each field that differs from :class:`Machine`'s defaults.

    Parameters
    ----------
    machine : Machine
        The machine.

    Returns
    -------
    str
    """
    from ..core.machine import PRESETS
    base = PRESETS.get(machine.name, Machine())
    changed = [f"{key}={value!r}" for key, value in machine.options().items()
               if value != getattr(base, key)]
    return machine.name + (":" + ",".join(changed) if changed else "")


def provenance(graph: TaskGraph, machine: Machine, workload: str | None = None,
               machine_text: str | None = None) -> dict[str, str]:
    """The columns that say what a result row measured.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine.
    workload : str, optional
        The spec or file the graph was built from, as given; default the graph's name.
    machine_text : str, optional
        The machine's spec as given, overrides included; default :func:`machine_spec`.

    Returns
    -------
    dict of str to str
        ``workload``, ``machine`` and the toolkit's ``version``.
    """
    from .. import __version__
    return {"workload": workload or graph.name,
            "machine": machine_text or machine_spec(machine), "version": __version__}


def stamped(table: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """``table`` with the :func:`provenance` columns.

    ``workload`` and ``machine`` first, ``version`` last but for ``error``, which stays last.

    Parameters
    ----------
    table : pandas.DataFrame
        The results.
    labels : dict of str to str
        Its :func:`provenance`.

    Returns
    -------
    pandas.DataFrame
        A copy.
    """
    out = table.copy()
    for i, key in enumerate(("workload", "machine")):
        out.insert(i, key, labels[key])
    out.insert(len(out.columns) - ("error" in out.columns), "version", labels["version"])
    return out


#: Columns of :func:`table` / :func:`compare`, in order.
COLUMNS = ("planner", "policy", "makespan", "bytes_moved", "offloads", "reloads", "loads",
           "peak_gpu_memory")


@dataclass
class Run:
    """One planned and simulated combination."""

    planner: str
    policy: str
    memgraph: MemGraph
    result: SimResult

    def row(self) -> dict[str, object]:
        """This run as a row of :func:`table`.

        ``bytes_moved`` counts host<->GPU traffic (offloads, reloads, loads); GPU->GPU transfers
        are TaskGraph vertices every plan has.

        Returns
        -------
        dict of str to object
            The :data:`COLUMNS`.
        """
        gpu_peaks = [b for d, b in self.result.peak_memory.items() if is_gpu(d)]
        return {
            "planner": self.planner,
            "policy": self.policy,
            "makespan": float(self.result.makespan),
            "bytes_moved": self.memgraph.host_bytes(),
            "offloads": self.memgraph.count("offload"),
            "reloads": self.memgraph.count("reload"),
            "loads": self.memgraph.count("load"),
            "peak_gpu_memory": int(max(gpu_peaks, default=0)),
        }


def run_all(graph: TaskGraph, machine: Machine, runs: Iterable[tuple[str, str]], *,
            noise: float = 0.0, seed: int = 0, verify: bool = True,
            progress: Callable[[str], None] | None = None) -> list[Run]:
    """Plan ``graph`` with each planner spec (once per spec), verify, and simulate each policy.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine.
    runs : iterable of (str, str)
        ``(planner_spec, policy)`` pairs.
    noise : float
        The simulation's noise, as in :func:`~offloadlab.simulator.simulate`.
    seed : int
        Seeds the noise and the seeded policies.
    verify : bool
        Verify each MemGraph (:func:`~offloadlab.core.verify.verify`).
    progress : callable, optional
        ``progress(line)`` receives a line per step.

    Returns
    -------
    list of Run
        One per pair, in order.

    Raises
    ------
    SpecError
        An unknown planner, option or policy.
    PlanError
        A planner cannot plan the problem.
    VerificationError
        With ``verify``, a MemGraph breaks a rule.
    """
    from ..core.verify import verify as verify_memgraph
    from ..planner import plan
    from ..simulator import makespan, simulate

    say = progress or (lambda line: None)
    plans: dict[str, MemGraph] = {}
    out: list[Run] = []
    for planner, policy in runs:
        if planner not in plans:
            say(f"planning with {planner} ...")
            plans[planner] = mg = plan(graph, machine, planner, evaluate=makespan)
            if verify:
                verify_memgraph(mg, graph, machine)
            say(f"  {len(mg)} vertices, {mg.count('offload')} offloads, "
                f"{mg.count('reload')} reloads, {mg.count('load')} loads")
        say(f"simulating {planner} with {policy} dispatch ...")
        result = simulate(plans[planner], machine, policy=policy, noise=noise, seed=seed)
        say(f"  makespan {result.makespan:.6g} s")
        out.append(Run(planner, policy, plans[planner], result))
    return out


def table(runs: Iterable[Run]) -> pd.DataFrame:
    """One row per run with the :data:`COLUMNS`.

    Parameters
    ----------
    runs : iterable of Run
        The runs.

    Returns
    -------
    pandas.DataFrame
    """
    import pandas as pd
    return pd.DataFrame([r.row() for r in runs], columns=list(COLUMNS))


def compare(graph: TaskGraph, machine: Machine, runs: Iterable[tuple[str, str]], *,
            noise: float = 0.0, seed: int = 0, verify: bool = True) -> pd.DataFrame:
    """Plan and simulate each ``(planner_spec, policy)`` pair; one row per pair (:data:`COLUMNS`).

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine.
    runs : iterable of (str, str)
        ``(planner_spec, policy)`` pairs.
    noise : float
        The simulation's noise, as in :func:`~offloadlab.simulator.simulate`.
    seed : int
        Seeds the noise and the seeded policies.
    verify : bool
        Verify each MemGraph (:func:`~offloadlab.core.verify.verify`).

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    SpecError
        An unknown planner, option or policy.
    PlanError
        A planner cannot plan the problem.
    VerificationError
        With ``verify``, a MemGraph breaks a rule.
    """
    return table(run_all(graph, machine, runs, noise=noise, seed=seed, verify=verify))


def compare_planners(graph: TaskGraph, machine: Machine, planners: Iterable[str] | None = None,
                     *, policy: str = "dynamic", measured: bool = False,
                     backend: str = "numpy", rate_limit: bool = True, milp_time_limit: float = 60.0,
                     progress: Callable[[str], None] | None = None, workload: str | None = None,
                     machine_text: str | None = None) -> pd.DataFrame:
    """Every planner (default: all registered, with their default options) on one problem,
    simulated with ``policy`` (``offloadlab compare``).

    One row each with the makespan, each GPU's idle share
    (``idle_gpu0``, ...), the share of host copies hidden under compute (``overlap``) and of
    the GPUs' time idle on each cause (``wait_load``, ... :func:`why`), bytes moved
    host->GPU and GPU->host, the offload/reload/load counts,
    peak GPU memory, the host peak (``host_peak``: the most bytes the run held in host RAM at
    once, docs/host-memory.md), planning seconds, the plan's own lower bound
    (:func:`offloadlab.core.bound.lower_bound`) and its gap to the problem's
    (:func:`offloadlab.core.bound.problem_bound`, the same in every row).  A planner that cannot
    plan the problem gets a row with ``error`` and no figures; an unknown planner or option
    raises :class:`SpecError` before any work.  ``measured`` also runs each plan on the
    executor (``backend``): ``measured_makespan``, ``sim_error`` (simulated over measured,
    less one) and ``correct`` (its outputs against a NumPy evaluation of the graph).  Each
    row starts with the :func:`provenance` columns (``workload`` and ``machine_text``: the
    specs as the caller gave them) and ends with the version and ``error`` (empty if none).
    ``outcome`` is ``ok``, ``OOM`` (the planner refused a plan over the machine's
    ``host_memory``, with ``error`` saying so, or the simulated host peak exceeds it, with the
    figures as simulated) or ``error`` (the planner failed otherwise).

    On an unrolled training chain (``training-chain``, ``gpt2-train``, ``bert-train``), where
    Beaumont et al.'s MILP applies, each row also has ``iteration_time`` (the simulated
    steady state), ``milp_bound`` (the MILP's lower bound on it, solved within
    ``milp_time_limit`` seconds: the best proven bound) and ``milp_gap``.  The MILP bounds
    schedules of Beaumont et al.'s model, each iteration's operations in sequence; a plan of
    the unrolled graph that overlaps iterations (BuildMemGraph runs ``B_1``, whose result
    nobody reads, beside the next forward) can beat it: a negative ``milp_gap``.

    Parameters
    ----------
    graph : TaskGraph
        The problem's computation.
    machine : Machine
        The problem's machine.
    planners : iterable of str, optional
        Planner specs (``NAME[:key=value,...]``); default every registered planner.
    policy : str
        The dispatch policy of every simulation (and measured run).
    measured : bool
        Also run each plan on the executor.
    backend : str
        The executor's backend, with ``measured``.
    rate_limit : bool
        Pace the numpy backend's copies to the machine's bandwidths, with ``measured``.
    milp_time_limit : float
        Seconds for the MILP bound on a training chain.
    progress : callable, optional
        ``progress(planner)`` hears each planner as its row starts.
    workload, machine_text : str, optional
        The specs as the caller gave them, for the provenance columns.

    Returns
    -------
    pandas.DataFrame
        One row per planner, in the order given.

    Raises
    ------
    SpecError
        An unknown planner, option or value (before any work).
    GraphError
        No plan of the problem could finish (its lower bound is not finite; before any work).

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> table = compare_planners(build_workload("training-chain"),
    ...                          machine_from_spec("v100:gpu_memory=1.5GB"),
    ...                          ["buildmemgraph", "levelwise"])
    >>> print(table[["planner", "makespan", "offloads"]].round(4).to_string(index=False))
          planner  makespan  offloads
    buildmemgraph    3.6667        11
        levelwise    3.7667        11
    """
    import time

    import pandas as pd

    from ..core.bound import lower_bound, problem_bound
    from ..core.errors import HostMemoryError, OffloadlabError
    from ..core.verify import verify
    from ..planner import PLANNERS, plan
    from ..planner.registry import check_spec
    from ..simulator import makespan, simulate

    say = progress or (lambda line: None)
    specs = list(planners) if planners is not None else sorted(PLANNERS)
    for spec in specs:
        check_spec(spec)                    # a typo stops here, not as an error row
    machine.check_devices(graph.gpus())     # as does a machine without the graph's GPUs
    if measured:
        from ..executor import check_outputs, check_runnable, execute, expected_outputs
        check_runnable(graph)               # and a graph the executor cannot run
    reference = spread = None                # computed once, for the first run measured
    best = problem_bound(graph, machine, finite=True)   # and a problem no plan can finish
    milp = _milp_bound(graph, machine, milp_time_limit, say)
    rows: list[dict[str, object]] = []
    for spec in specs:
        row: dict[str, object] = {"planner": spec, "policy": policy, "outcome": "ok",
                                  "problem_bound": best.value, "bound_limit": best.limit}
        say(f"{spec}: planning ...")
        start = time.perf_counter()
        try:
            mg = plan(graph, machine, spec, evaluate=makespan)
        except OffloadlabError as exc:
            say(f"{spec}: {exc}")
            rows.append(row | {"error": str(exc), "outcome": "OOM" if isinstance(
                exc, HostMemoryError) else "error"})
            continue
        seconds = time.perf_counter() - start
        verify(mg, graph, machine)
        say(f"{spec}: simulating {len(mg)} vertices ...")
        result = simulate(mg, machine, policy=policy)
        moved = mg.moved_bytes()
        span = float(result.makespan)
        row.update(
            makespan=span, bytes_h2d=moved["load"] + moved["reload"], bytes_d2h=moved["offload"],
            offloads=mg.count("offload"), reloads=mg.count("reload"), loads=mg.count("load"),
            peak_memory=max((b for d, b in result.peak_memory.items() if is_gpu(d)), default=0),
            host_peak=result.host_peak, plan_seconds=seconds,
            outcome="ok" if result.out_of_memory is None else "OOM",
            lower_bound=lower_bound(mg, machine),
            gap=span / best.value - 1 if best.value > 0 else 0.0,
            **{f"idle_{gpu}": 1 - result.busy.get(gpu, 0.0) / span if span > 0 else 0.0
               for gpu in machine.gpu_names()},
            **why(result.trace, mg, len(machine.gpu_names())))
        if milp is not None:
            from ..planner.weight_offload import steady_state_iteration_time
            period = steady_state_iteration_time(result, graph)
            row.update(iteration_time=period, milp_bound=milp, milp_gap=period / milp - 1)
        if measured:
            say(f"{spec}: running on the {backend} backend ...")
            run = execute(mg, machine, backend=backend, policy=policy, rate_limit=rate_limit)
            if reference is None:
                reference, spread = expected_outputs(graph, backend)
            row.update(measured_makespan=run.makespan, sim_error=span / run.makespan - 1,
                       correct=check_outputs(run.outputs, reference, backend, spread) is None)
        rows.append(row)
    table = pd.DataFrame(rows)
    table["error"] = table.pop("error") if "error" in table else None   # always, and last
    return stamped(typed(table), provenance(graph, machine, workload, machine_text))


def why(trace: pd.DataFrame, memgraph: MemGraph, gpus: int) -> dict[str, float]:
    """:mod:`.explain`'s answer in a row.

    Parameters
    ----------
    trace : pandas.DataFrame
        The run's trace.
    memgraph : MemGraph
        The plan.
    gpus : int
        The machine's GPUs.

    Returns
    -------
    dict of str to float
        ``overlap``, the share of all host copies' time hidden under compute (NaN if nothing
        is copied), and ``wait_<cause>``, the share of the GPUs' time (each GPU for the whole
        makespan) idle for each cause.
    """
    from .explain import CAUSES, explain
    table = explain(trace, memgraph)
    transfer = float(table["transfer"].sum())
    total = float(table["makespan"].max()) * gpus if len(table) else 0.0
    return {"overlap": float(table["hidden"].sum()) / transfer if transfer > 0 else math.nan,
            **{f"wait_{c}": float(table[f"idle_{c}"].sum()) / total if total > 0 else 0.0
               for c in CAUSES}}


def typed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its :data:`COUNTS` as integers and ``error`` as text.

    Counts are missing in error rows; ``error`` is missing where there was none (an empty
    cell in CSV, null in JSON).

    Parameters
    ----------
    table : pandas.DataFrame
        A :func:`compare_planners` table.

    Returns
    -------
    pandas.DataFrame
    """
    import pandas as pd
    for column in COUNTS:
        if column in table:
            table[column] = table[column].astype("Int64")
    if "error" in table:
        table["error"] = table["error"].astype(pd.StringDtype())
    return table


def _milp_bound(graph: TaskGraph, machine: Machine, time_limit: float,
                say: Callable[[str], None]) -> float | None:
    """The MILP's bound on the iteration time if ``graph`` is an unrolled training chain that
    the MILP can take (every operation fits on the GPU), else None."""
    from ..core.errors import PlanError
    from ..ilp import lower_bound
    from ..planner.weight_offload.planners import training_chain
    try:
        chain = training_chain(graph)
    except PlanError:
        return None
    iterations = graph.meta.get("iterations", 0)
    memory = machine.gpu_memory - (iterations * max(chain.a0, 1) - chain.a0)
    say(f"solving the MILP bound ({chain.L} layers, at most {time_limit:g} s) ...")
    try:
        return lower_bound(chain, memory, machine.h2d_bandwidth,
                           offload_bandwidth=machine.d2h_bandwidth,
                           time_limit=time_limit or None).bound
    except PlanError:
        return None


#: The integer columns of :func:`compare_planners`.
COUNTS = ("bytes_h2d", "bytes_d2h", "offloads", "reloads", "loads", "peak_memory",
          "host_peak")
