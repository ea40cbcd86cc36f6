"""Profiling: every distinct kernel of a TaskGraph timed on a backend at its own shapes, its
seconds written into the graph as its vertices' ``time`` (docs/validation.md, Profiled kernels).

Each *signature* (a compute vertex's op, device, output and input shapes and dtypes) is run
``repeats`` times one at a time, each run on inputs of its own, and the median seconds become
the ``time`` of every vertex of that signature, overriding the cost model
(:meth:`~offloadlab.core.machine.Machine.duration`), as vidur's per-operator profiles and
TURNIP's profiled kernels do.  Why shapes and fresh inputs matter: docs/validation.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from ..core.budget import TASK_VERTEX, check_ram
from ..core.devices import CPU
from ..core.machine import Machine, MiB
from ..core.memgraph import MemGraph
from ..core.ops import KERNELS, op_name
from ..core.taskgraph import Task, TaskGraph
from . import execute
from .calibrate import KernelGraph, Template, template

REPEATS = 5
BATCH_MEMORY = 512 * MiB


@dataclass(frozen=True)
class Signature:
    """What decides a kernel's time: where it runs (``gpu`` or ``cpu``) and its shapes."""

    device: str
    template: Template


@dataclass
class Profile:
    """A profiled TaskGraph (``graph``) and a row per signature (``table``): op, device,
    shape, dtype, inputs, the vertices of that signature, and the median, least and greatest
    seconds of its ``repeats`` runs (NaN for an op without a kernel, which keeps its cost
    model)."""

    graph: TaskGraph
    table: pd.DataFrame


def signatures(graph: TaskGraph) -> dict[Signature, list[str]]:
    """The compute vertices of ``graph`` by signature, in graph order.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Returns
    -------
    dict of Signature to list of str
        Each signature's vertex ids.
    """
    found: dict[Signature, list[str]] = {}
    for task in graph:
        if task.kind == "compute" and task.op is not None:
            where = "cpu" if task.device == CPU else "gpu"
            found.setdefault(Signature(where, template(graph, task)), []).append(task.id)
    return found


def _batches(sigs: list[Signature], repeats: int, memory: int) -> list[list[Signature]]:
    """``sigs`` in order, cut where a batch's arena would pass ``memory`` bytes."""
    batches: list[list[Signature]] = []
    used = memory
    for sig in sigs:
        size = repeats * sig.template.touched
        if used + size > memory:
            batches.append([])
            used = 0
        batches[-1].append(sig)
        used += size
    return batches


def _graph(batch: list[Signature], repeats: int) -> tuple[MemGraph, dict[str, int]]:
    """``repeats`` kernels of each signature of ``batch``, each on inputs of its own (on gpu0,
    or the CPU); returns the graph and each kernel's index in ``batch``."""
    b = KernelGraph()
    which: dict[str, int] = {}
    for k, sig in enumerate(batch):
        t = sig.template
        device, at = ("cpu", None) if sig.device == "cpu" else ("gpu0", "gpu0")
        home = "host" if device == "cpu" else "gpu0"
        for r in range(repeats):
            args = tuple(b.add(f"s{k}#{r}.in{i}", "input", home, s, at=at, dtype=d)
                         for i, (s, d) in enumerate(t.inputs))
            which[b.add(f"s{k}#{r}", "compute", device, t.shape, args, t.op, t.flops, at=at,
                        dtype=t.dtype)] = k
    return b.mg, which


def profile(graph: TaskGraph, machine: Machine, backend: str = "numpy",
            repeats: int = REPEATS, memory: int = BATCH_MEMORY,
            progress: Callable[[int, int], None] | None = None) -> Profile:
    """Time every distinct kernel of ``graph`` on ``backend`` and return the graph with each
    compute vertex's ``time`` set to its signature's median seconds.

    Parameters
    ----------
    graph : TaskGraph
        The graph whose kernels to time (it is not changed).
    machine : Machine
        The machine whose copy rates pace the numpy backend; its GPU memory is not a limit.
    backend : str
        ``numpy`` or ``cupy``.
    repeats : int
        Runs of each signature (at least 1); the median is kept.
    memory : int
        The most arena bytes one batch of signatures takes.
    progress : callable, optional
        ``progress(done, total)`` after each batch, in signatures.

    Returns
    -------
    Profile
        The profiled graph and a row per signature.

    Raises
    ------
    ValueError
        ``repeats`` or ``memory`` below 1.
    SpecError
        One kernel's ``repeats`` runs would not fit in the RAM available.
    ExecutionError
        A kernel failed on the backend (naming its vertex) or the RAM does not suffice.
    """
    if repeats < 1 or memory < 1:
        raise ValueError(f"profile needs repeats >= 1 and memory >= 1, got {repeats}, {memory}")
    found = signatures(graph)
    runnable = [s for s in found if op_name(s.template.op) in KERNELS]
    # the largest batch is one signature's runs: their tensors twice (the arena and the
    # outputs' copies) and their vertices
    check_ram(f"profiling {repeats} runs of each kernel", repeats * max(
        (2 * s.template.touched + (2 + len(s.template.inputs)) * TASK_VERTEX for s in runnable),
        default=0))
    probe = replace(machine, gpus=max(machine.gpus, 1), gpu_memory=2**62, streams=1)
    seconds: dict[Signature, list[float]] = {}
    done = 0
    for batch in _batches(runnable, repeats, memory):
        mg, which = _graph(batch, repeats)
        trace = execute(mg, probe, backend=backend, policy="fixed").trace
        for vertex, start, end in zip(trace["vertex"], trace["start"], trace["end"]):
            if vertex in which:
                seconds.setdefault(batch[which[vertex]], []).append(float(end - start))
        done += len(batch)
        if progress is not None:
            progress(done, len(runnable))
    rows, time_of = [], {}
    for sig, ids in found.items():
        runs = pd.Series(seconds.get(sig, []), dtype=float)     # none: NaN below
        median = float(runs.median())
        t = sig.template
        rows.append(dict(op=t.op, device=sig.device, shape=t.shape, dtype=t.dtype,
                         inputs=t.inputs, vertices=len(ids), seconds=median,
                         least=float(runs.min()), greatest=float(runs.max())))
        if len(runs):
            time_of.update(dict.fromkeys(ids, median))
    profiled = TaskGraph(graph.name, dict(graph.meta))
    for task in graph:
        profiled.add(_timed(task, time_of.get(task.id)))
    return Profile(profiled, pd.DataFrame(rows))


def _timed(task: Task, seconds: float | None) -> Task:
    return task if seconds is None else replace(task, time=seconds)
