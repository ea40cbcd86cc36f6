"""PyTorch FSDP with ``CPUOffload(offload_params=True)``, registered as ``fsdp-cpu-offload``.

Sources: pytorch/pytorch, ``torch/distributed/fsdp/_runtime_utils.py``,
``_flat_param.py`` and ``wrap.py`` (``size_based_auto_wrap_policy``).  What FSDP does, and how
its units and their windows are modelled on the :class:`~.emit.Emitter`: docs/deployed.md,
fsdp-cpu-offload.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ...core.devices import CPU, HOST
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import MemGraph
from ...core.ops import DTYPES, UPDATE_OPS
from ...core.taskgraph import TaskGraph
from ..registry import Hooks, Options, option, register
from .emit import Emitter, Slot
from .step import Schedule, Step, cpu_step, step_of

NAME = "fsdp-cpu-offload"
INFLIGHT = 2
"""Unshards in flight under ``limit_all_gathers`` (``_FreeEventQueue``)."""


@dataclass(frozen=True)
class FsdpOptions(Options):
    min_num_params: int = option(100_000_000, "parameter elements at which a unit is closed "
                                              "(size_based_auto_wrap_policy's 1e8)")
    limit_all_gathers: bool = option(True, "an unshard waits for the free two frees back "
                                           "(false: only for the memory it reuses)")

    def __post_init__(self) -> None:
        if type(self.min_num_params) is not int or self.min_num_params <= 0:
            raise PlanError(f"{NAME}: min_num_params must be a positive number of elements, "
                            f"got {self.min_num_params!r}")


def applies(graph: TaskGraph) -> None:
    """Refuse a graph with no optimizer update on a GPU: FSDP's offload plans training steps.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Raises
    ------
    PlanError
        Saying why.
    """
    if not step_of(graph).updates:
        raise PlanError(f"{NAME} plans training steps: TaskGraph {graph.name!r} has no "
                        f"optimizer update ({', '.join(UPDATE_OPS)}) on a GPU")


Window = tuple[int, str, int, bool]
"""A unit's stretch of the schedule: (unit, GPU, iteration, backward)."""


def units(graph: TaskGraph, step: Step, min_num_params: int) -> tuple[dict[str, int], int]:
    """Each parameter's unit, and the root's number.

    Parameters in the order of their first reader, a unit closed at ``min_num_params``
    elements; the root is the unit left unclosed.

    Parameters
    ----------
    graph : TaskGraph
        A training step.
    step : Step
        Its anatomy.
    min_num_params : int
        The elements that close a unit.

    Returns
    -------
    tuple of dict of str to int, and int
        Each parameter's unit; the root's number (-1 if none).
    """
    unit: dict[str, int] = {}
    count, elements = 0, 0
    for t in graph:
        for u in t.inputs:
            root = step.parameter.get(u)
            if root is None or root in unit:
                continue
            unit[root] = count
            elements += graph[root].bytes // DTYPES[graph[root].dtype]
            if elements >= min_num_params:
                count, elements = count + 1, 0
    return unit, count if elements else -1


Slots = dict[tuple[int, str, int], set[Slot]]
"""Each (unit, GPU, iteration)'s parameter slots."""


def unit_windows(loop: Schedule, step: Step, unit: dict[str, int], root: int,
                 grad_of: dict[str, str | None]
                 ) -> tuple[Slots, dict[int, list[Window]], dict[int, list[Window]]]:
    """Each unit's windows in ``loop``'s order.

    The root's forward window starts with its iteration and does not end (the root is kept
    for the backward).

    Parameters
    ----------
    loop : Schedule
        The training loop's order.
    step : Step
        The graph's anatomy.
    unit : dict of str to int
        Each parameter's unit (:func:`units`).
    root : int
        The root's unit (-1 if none).
    grad_of : dict of str to str or None
        Each gradient's parameter.

    Returns
    -------
    tuple
        The parameter slots of each (unit, GPU, iteration), and the windows that start (the
        unit's pre-forward or pre-backward unshard) and end (its reshard) at each position.
    """
    placed, schedule = loop.placed, loop.order
    windows: dict[Window, list[int]] = {}           # a window's positions
    slots: Slots = {}
    for i, t in enumerate(schedule):
        task = placed[t]
        if task.read_device == HOST:
            continue
        iteration, backward = loop.iteration[t], t in step.backward
        for u in task.inputs:
            r = step.parameter.get(u)
            if r is not None:
                key = (unit[r], task.read_device, iteration)
                slots.setdefault(key, set()).add((u, task.read_device))
                windows.setdefault((*key, backward), []).append(i)
        r = grad_of.get(t)
        if r is not None and task.out_device != HOST:
            windows.setdefault((unit[r], task.out_device, iteration, True), []).append(i)
    begins: dict[int, int] = {}                      # iteration -> its first position
    for i, t in enumerate(schedule):
        begins.setdefault(loop.iteration[t], i)
    starts: dict[int, list[Window]] = {}
    ends: dict[int, list[Window]] = {}
    for w, positions in windows.items():
        root_forward = w[0] == root and not w[3]    # the root's pre-forward comes first
        starts.setdefault(begins[w[2]] if root_forward else positions[0], []).append(w)
        if w[0] != root or w[3]:                    # the root is not freed after its forward
            ends.setdefault(positions[-1], []).append(w)
    return slots, starts, ends


@register(NAME, FsdpOptions, applies=applies)
def fsdp_cpu_offload(graph: TaskGraph, machine: Machine, options: FsdpOptions,
                     hooks: Hooks) -> MemGraph:
    """PyTorch FSDP offloading its parameters (CPUOffload's offload_params): each unit's
    parameters copied from host RAM for its forward and again for its backward and dropped
    after each, gradients copied to host RAM after each unit's backward, the optimizer step on
    the CPU.

    Parameters
    ----------
    graph : TaskGraph
        A training step: an optimizer update on a GPU.
    machine : Machine
        The machine it runs on.
    options : FsdpOptions
        The units' size (``min_num_params``) and ``limit_all_gathers``.
    hooks : Hooks
        Progress and, for planners that search, the evaluator.

    Returns
    -------
    MemGraph

    Raises
    ------
    PlanError
        Where the scheme runs out of memory on a GPU, naming the GPU, the vertex and the bytes.
    """
    step = step_of(graph)
    loop = cpu_step(graph, step)
    placed, schedule = loop.placed, loop.order
    unit, root = units(graph, step, options.min_num_params)
    em = Emitter(NAME, placed, machine, schedule)
    updates = set(step.updates)
    grad_of = {graph[u].inputs[1]: step.parameter.get(graph[u].inputs[0]) for u in updates}
    slots, starts, ends = unit_windows(loop, step, unit, root, grad_of)
    grads: dict[tuple[int, str, int], list[str]] = {}
    frees: dict[str, deque[str]] = {gpu: deque() for gpu in em.memory}
    stepped: list[str] = []                         # the previous iteration's CPU step
    iteration, stepping = 1, False
    offloads: list[str] = []                        # gradient copies the step waits for
    for i, t in enumerate(schedule):
        task = placed[t]
        if loop.iteration[t] != iteration:
            iteration, stepping = loop.iteration[t], False
            stepped = [em.last[CPU]] if CPU in em.last else []
            for gpu in em.memory:
                em.wait(gpu, stepped)
        if t in updates and not stepping:           # the backward has ended: step()
            stepping = True
            em.wait(CPU, offloads + [v for d, v in em.last.items() if d != CPU])
            offloads = []
        for w in starts.get(i, ()):                 # pre-forward / pre-backward: unshard
            unit_id, gpu, at, _ = w
            after = list(stepped)
            if options.limit_all_gathers and len(frees[gpu]) >= INFLIGHT:
                after.append(frees[gpu].popleft())
            for u, _ in sorted(slots.get((unit_id, gpu, at), ())):
                if u in em.host:                    # held unsharded to the window's end
                    if (u, gpu) not in em.resident:
                        em.load(u, gpu, after)
                    em.held.add((u, gpu))
        em.run(t)
        r = grad_of.get(t)
        if r is not None and task.out_device != HOST:
            em.held.add((t, task.out_device))
            grads.setdefault((unit[r], task.out_device, iteration), []).append(t)
        for w in ends.get(i, ()):                   # post-forward / post-backward: reshard
            unit_id, gpu, at, backward = w
            for slot in slots.get((unit_id, gpu, at), ()):
                em.held.discard(slot)
                if slot in em.resident and slot[0] in em.host and slot[0] not in em.kept:
                    em.free(slot)
            frees[gpu].append(t)
            if backward:
                for g in grads.pop((unit_id, gpu, at), []):
                    offloads.append(em.offload(g, gpu, after=[t]))
                    em.held.discard((g, gpu))
                    if em.next_reader((g, gpu), i) is None:
                        em.free((g, gpu))
        em.release(i)
        if hooks.progress is not None and not i & 4095:
            hooks.progress(i)
    return em.finish()
