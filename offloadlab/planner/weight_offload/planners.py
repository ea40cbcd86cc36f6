"""The weight-offloading planners (Beaumont et al.): ``greedy-offload`` (Algorithms 1 and 2),
``greedy-offload-nodiscount`` (Greedy*: no discount, each deletion offloads), ``l2l``
(Layer-to-Layer [19]) and ``ilp-select`` (the MILP's selection scheduled by Algorithm 2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...core.cycle import TrainingChain
from ...core.errors import PlanError, SpecError
from ...core.machine import Machine
from ...core.memgraph import MemGraph
from ...core.taskgraph import TaskGraph
from ...ilp import lower_bound as milp_lower_bound
from ..registry import Hooks, Options, option, register
from .memgraph import to_memgraph
from .schedule import Schedule, algorithm2, l2l
from .selection import Choice, check_fits, greedy_selection


def _greedy(chain: TrainingChain, machine: Machine, reserved: int) -> Schedule:
    memory = machine.gpu_memory - reserved
    return algorithm2(chain, machine, greedy_selection(chain, memory), capacity=machine.gpu_memory,
                      reserved=reserved)


def _greedy_nodiscount(chain: TrainingChain, machine: Machine, reserved: int) -> Schedule:
    memory = machine.gpu_memory - reserved
    return algorithm2(chain, machine, greedy_selection(chain, memory, discount=False),
                      capacity=machine.gpu_memory, reserved=reserved, discount=False,
                      planner="greedy-offload-nodiscount")


def _l2l(chain: TrainingChain, machine: Machine, reserved: int) -> Schedule:
    return l2l(chain, machine, capacity=machine.gpu_memory, reserved=reserved)


def ilp_selection(chain: TrainingChain, machine: Machine, memory: int, *, solver: str = "auto",
                  time_limit: float = 0.0) -> frozenset[Choice]:
    """The MILP's D(0), D(1) (Sec. 6) for ``memory`` bytes and the machine's bandwidths.

    Less the choices of layers it never offloads (O* = 0: a deletion undone by a prefetch in
    the same interval, which saves nothing).

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    machine : Machine
        Its bandwidths.
    memory : int
        M_GPU, in bytes.
    solver : str
        As for :func:`~offloadlab.ilp.milp.lower_bound`.
    time_limit : float
        Seconds; 0 for none.

    Returns
    -------
    frozenset of (int, int)
        The (layer, d) choices.

    Raises
    ------
    PlanError
        As :func:`~offloadlab.ilp.milp.lower_bound`.
    """
    result = milp_lower_bound(chain, memory, machine.h2d_bandwidth,
                         offload_bandwidth=machine.d2h_bandwidth, solver=solver,
                         time_limit=time_limit or None)
    return frozenset((int(k), int(d)) for k, d in result.selection if k in result.offloaded)


def _ilp(chain: TrainingChain, machine: Machine, reserved: int, *, solver: str = "auto",
         time_limit: float = 0.0) -> Schedule:
    selection = ilp_selection(chain, machine, machine.gpu_memory - reserved, solver=solver,
                              time_limit=time_limit)
    return algorithm2(chain, machine, selection, capacity=machine.gpu_memory, reserved=reserved,
                      planner="ilp-select")


SCHEDULERS: dict[str, Callable[..., Schedule]] = {
    "greedy-offload": _greedy,
    "greedy-offload-nodiscount": _greedy_nodiscount,
    "l2l": _l2l,
    "ilp-select": _ilp,
}


def schedule_for(planner: str, chain: TrainingChain, machine: Machine, *, reserved: int = 0,
                 **options) -> Schedule:
    """The analytic steady-state schedule of ``planner`` for ``chain`` on ``machine``.

    Parameters
    ----------
    planner : str
        ``greedy-offload``, ``greedy-offload-nodiscount``, ``l2l`` or ``ilp-select``.
    chain : TrainingChain
        The chain.
    machine : Machine
        The machine.
    reserved : int
        Bytes of GPU memory held besides eq. (1)'s needs (the planners pass the other
        iterations' batches of the unrolled TaskGraph).
    **options
        The planner's (``solver``, ``time_limit`` for ``ilp-select``).

    Returns
    -------
    Schedule

    Raises
    ------
    SpecError
        An unknown planner.
    PlanError
        Some operation does not fit, or no schedule does.
    """
    if planner not in SCHEDULERS:
        raise SpecError(f"unknown weight-offloading planner {planner!r}; known: "
                        f"{', '.join(SCHEDULERS)}")
    check_fits(chain, machine.gpu_memory, reserved)
    return SCHEDULERS[planner](chain, machine, reserved, **options)


def training_chain(graph: TaskGraph) -> TrainingChain:
    """The chain whose unrolled iterations ``graph`` is; PlanError if it is not one (the
    weight-offloading planners plan only these).

    Parameters
    ----------
    graph : TaskGraph
        A TaskGraph a weight-offloading planner is asked to plan.

    Returns
    -------
    TrainingChain
        The chain.

    Raises
    ------
    PlanError
        ``graph`` is not unrolled iterations of a chain.
    """
    chain = TrainingChain.from_taskgraph(graph)
    iterations = graph.meta.get("iterations", 0)
    if len(graph) != chain.unrolled_size(iterations):
        raise PlanError(f"TaskGraph {graph.name!r} is not {iterations} unrolled iterations of "
                        f"its meta['chain'] (use training-chain, gpt2-train or bert-train)")
    return chain


def _plan_training(planner: str, graph: TaskGraph, machine: Machine, **options) -> MemGraph:
    """Plan an unrolled training TaskGraph: the analytic schedule laid out as a MemGraph,
    recording the schedule's ``analytic_iteration_time``, ``selection`` and ``cut``."""
    chain = training_chain(graph)
    iterations = graph.meta.get("iterations", 0)
    reserved = iterations * chain.batch - chain.a0
    schedule = schedule_for(planner, chain, machine, reserved=reserved, **options)
    mg = to_memgraph(graph, schedule)
    mg.graph.update(analytic_iteration_time=schedule.iteration_time,
                    selection=sorted([k, d] for k, d in schedule.selection), cut=schedule.cut)
    return mg


@register("greedy-offload", applies=training_chain)
def greedy_offload(graph: TaskGraph, machine: Machine, options: Options,
                   hooks: Hooks) -> MemGraph:
    """Beaumont et al.'s greedy: Algorithm 1's selection (profit = memory saved over the
    covered operations / bytes moved, a second choice of a layer at half cost), scheduled by
    Algorithm 2 (prefetch in order of need, FIFO offloads, early offloads, best cutting
    point).

    Parameters
    ----------
    graph : TaskGraph
        Unrolled iterations of a training chain (``graph.meta["chain"]``).
    machine : Machine
        Its GPU memory bounds the selection, its links the schedule.
    options : Options
        ``greedy-offload`` takes none.
    hooks : Hooks
        Unused.

    Returns
    -------
    MemGraph
        The plan; ``graph["analytic_iteration_time"]``, ``["selection"]`` and ``["cut"]``
        record its analytic schedule.

    Raises
    ------
    PlanError
        The weights cannot be scheduled within the GPU's memory.
    """
    return _plan_training("greedy-offload", graph, machine)


@register("greedy-offload-nodiscount", applies=training_chain)
def greedy_offload_nodiscount(graph: TaskGraph, machine: Machine, options: Options,
                              hooks: Hooks) -> MemGraph:
    """Greedy* of Sec. 7: no discount in the selection (every choice costs 2|w_k|) and a
    weight is offloaded every time it is deleted (the CPU copy is never reused).

    Parameters
    ----------
    graph, machine, options, hooks
        As :func:`greedy_offload` takes them.

    Returns
    -------
    MemGraph
        The plan, recording its analytic schedule as :func:`greedy_offload`'s does.

    Raises
    ------
    PlanError
        No schedule of the weights fits.
    """
    return _plan_training("greedy-offload-nodiscount", graph, machine)


@register("l2l", applies=training_chain)
def l2l_planner(graph: TaskGraph, machine: Machine, options: Options, hooks: Hooks) -> MemGraph:
    """Layer-to-Layer [19]: only the layer being computed keeps its weights on the GPU.

    Parameters
    ----------
    graph, machine, options, hooks
        As :func:`greedy_offload` takes them (``l2l`` has no options either).

    Returns
    -------
    MemGraph
        Its plan, with the schedule recorded as :func:`greedy_offload` records it.

    Raises
    ------
    PlanError
        A layer's weights and the activations do not fit together.
    """
    return _plan_training("l2l", graph, machine)


@dataclass(frozen=True)
class IlpSelectOptions(Options):
    solver: str = option("auto", "the MILP solver: auto (HiGHS if installed, else CBC), "
                                 "highs or cbc")
    time_limit: float = option(0.0, "seconds the MILP solver may take (0: no limit)")


@register("ilp-select", IlpSelectOptions, applies=training_chain)
def ilp_select(graph: TaskGraph, machine: Machine, options: IlpSelectOptions,
               hooks: Hooks) -> MemGraph:
    """The MILP's selection (Sec. 6, ``offloadlab.ilp.lower_bound``) scheduled by
    Algorithm 2.

    Parameters
    ----------
    graph, machine, hooks
        As :func:`greedy_offload` takes them.
    options : IlpSelectOptions
        The MILP's solver and time limit.

    Returns
    -------
    MemGraph
        The MILP selection's plan, its schedule recorded as by :func:`greedy_offload`.

    Raises
    ------
    PlanError
        The selection cannot be scheduled within the GPU's memory.
    """
    return _plan_training("ilp-select", graph, machine, solver=options.solver,
                          time_limit=options.time_limit)


def steady_state_iteration_time(result, graph: TaskGraph) -> float:
    """The steady-state iteration time of a run of an unrolled training TaskGraph.

    The mean time between the ends of consecutive backward passes ``B1@t``, leaving out the
    first iteration when there are three or more: ``(end(B1@T) - end(B1@2)) / (T - 2)``.

    Parameters
    ----------
    result : SimResult or ExecResult
        The run; its ``trace`` is read.
    graph : TaskGraph
        The unrolled training TaskGraph.

    Returns
    -------
    float
        Seconds.

    Raises
    ------
    ValueError
        The graph has too few iterations for a steady state.
    """
    trace = result.trace if hasattr(result, "trace") else result
    T = graph.meta.get("iterations", 0)
    if T < 2:
        raise ValueError(f"TaskGraph {graph.name!r} has {T} iteration(s); the steady state "
                         f"needs at least 2")
    end = dict(zip(trace["vertex"], trace["end"]))
    first = 2 if T >= 3 else 1
    last_b1, first_b1 = TrainingChain.vertex("B", 1, T), TrainingChain.vertex("B", 1, first)
    return (end[last_b1] - end[first_b1]) / (T - first)
