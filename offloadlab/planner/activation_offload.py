"""Two activation-offloading schemes that PyTorch users deploy, as planners (issue 45):
``torch-compile-offload`` and ``torchtune-offload``.

Both move the activations a training step saves for its backward pass
(:func:`offloadlab.core.anatomy.saved`) to host RAM during the forward pass and bring them back
for the backward, on a copy stream beside the compute stream, and keep everything else where
PyTorch keeps it, in program order.  Neither plans for the GPU's memory: :class:`~.scheme.Emitter`
refuses a plan that does not fit, naming the shortfall.  What they share and how each is
modelled: docs/deployed.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..core import anatomy
from ..core.devices import HOST, is_gpu
from ..core.errors import GraphError, PlanError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from .registry import Hooks, Options, option, register
from .scheme import Emitter, Step

GIB = 2**30


@dataclass(frozen=True)
class Saved:
    """A saved activation ``tensor`` as GPU ``gpu`` holds it: the forward and backward vertices
    that read it there, in program order."""

    tensor: str
    gpu: str
    forward: list[str]
    backward: list[str]


class Training:
    """A training step as the schemes see it: program order, what runs on each GPU, the saved
    activations; and the steps of a scheme, run steps in program order with moves beside them.
    ``name`` (the scheme) opens its refusals."""

    def __init__(self, graph: TaskGraph, name: str):
        self.g, self.name = graph, name
        self.parts = training_step(graph, name)
        self.order = graph.topological_order()
        self.at = {v: i for i, v in enumerate(self.order)}
        self.forward = set(self.parts.forward) | {
            v for v in anatomy.forward_tensors(graph) if graph[v].kind == "transfer"}
        self.runs: dict[str, list[str]] = {}     # GPU -> what reads there, in program order
        for v in self.order:
            if graph[v].kind != "input":
                self.runs.setdefault(graph[v].read_device, []).append(v)
        self.place = {v: i for runs in self.runs.values() for i, v in enumerate(runs)}
        self.pass_of: dict[str, int] = {}      # vertex -> its iteration on its GPU
        self.bounds: dict[str, list[list[int]]] = {}    # GPU -> each backward stretch's first
        for gpu, runs in self.runs.items():             # and last place in runs
            count, bounds = 0, self.bounds.setdefault(gpu, [])
            for i, v in enumerate(runs):
                ahead = v in self.forward
                if not ahead and (i == 0 or runs[i - 1] in self.forward):
                    bounds.append([i, len(runs) - 1])
                if i and ahead and runs[i - 1] not in self.forward:
                    bounds[count][1] = i - 1
                    count += 1
                self.pass_of[v] = count
        self.compute_at: dict[tuple[str, bool], list[int]] = {}   # (GPU, backward only) ->
        for gpu in self.runs:                                      # positions in program order
            for only in (False, True):
                self.compute_at[gpu, only] = [
                    self.at[v] for v in self.runs[gpu] if graph[v].kind == "compute"
                    and not (only and v in self.forward)]
        self.run = {v: Step("run", v) for v in self.order}
        self.before: dict[str, list[Step]] = {}  # vertex -> steps issued before it runs
        self.after: dict[str, list[Step]] = {}   # vertex -> steps issued after it runs

    def saved(self) -> list[Saved]:
        """The saved activations each GPU holds (not weights, not the forward's outputs).

        In the order their first forward reader runs: the order PyTorch saves them in.

        Returns
        -------
        list of Saved
        """
        g, succ, found = self.g, self.g.succ, []
        for x in self.parts.saved:
            if g[x].category == "weights":
                continue
            readers: dict[str, tuple[list[str], list[str]]] = {}
            for r in succ[x]:
                readers.setdefault(g[r].read_device, ([], []))[r not in self.forward].append(r)
            for gpu, (fwd, bwd) in readers.items():
                if fwd and bwd and g[x].out_device in (gpu, HOST):
                    found.append(Saved(x, gpu, fwd, bwd))
        return sorted(found, key=lambda s: (self.at[s.forward[0]], self.at[s.tensor]))

    def computes(self, gpu: str) -> list[str]:
        """The compute vertices on ``gpu``, in program order.

        Parameters
        ----------
        gpu : str
            The GPU.

        Returns
        -------
        list of str
        """
        return [self.order[i] for i in self.compute_at.get((gpu, False), [])]

    def neighbour(self, v: str, gpu: str, later: bool, backward: bool = False) -> str | None:
        """The compute vertex on ``gpu`` just before ``v``, or None.

        Parameters
        ----------
        v : str
            A compute vertex.
        gpu : str
            The GPU.
        later : bool
            Just after ``v`` instead.
        backward : bool
            With ``later``, the first after ``v`` outside the forward pass.

        Returns
        -------
        str or None
        """
        at, found = self.at[v], self.compute_at.get((gpu, backward), [])
        k = bisect.bisect_right(found, at) if later else bisect.bisect_left(found, at) - 1
        return self.order[found[k]] if 0 <= k < len(found) else None

    def stretch(self, v: str, gpu: str) -> list[str]:
        """The backward stretch holding ``v`` on ``gpu``.

        What runs there between two forward vertices (an iteration's backward pass and updates).

        Parameters
        ----------
        v : str
            A compute vertex.
        gpu : str
            The GPU.

        Returns
        -------
        list of str
        """
        start, end = self.bounds[gpu][self.pass_of[v]]
        return self.runs[gpu][start:end + 1]

    def wait(self, first: Step, then: str | None) -> None:
        """The run of ``then`` (if any) waits for ``first``.

        Parameters
        ----------
        first : Step
            The step waited for.
        then : str or None
            The vertex whose run waits.
        """
        if then is not None:
            self.run[then].after.append(first)

    def plan(self, machine: Machine) -> MemGraph:
        """The scheme's MemGraph: each vertex's run with the steps placed before and after it.

        Parameters
        ----------
        machine : Machine
            The machine.

        Returns
        -------
        MemGraph

        Raises
        ------
        PlanError
            A step finds no room on its GPU, naming the shortfall.
        """
        steps: list[Step] = []
        for v in self.order:
            steps += self.before.get(v, [])
            steps.append(self.run[v])
            steps += self.after.get(v, [])
        return Emitter(self.g, machine, self.name).run(steps)


def training_step(graph: TaskGraph, name: str) -> anatomy.TrainingStep:
    """The anatomy of ``graph``, a training step run on GPUs.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    name : str
        The scheme, opening the error.

    Returns
    -------
    TrainingStep

    Raises
    ------
    PlanError
        Opening with ``name``, saying why it is not one.
    """
    try:
        parts = anatomy.training_step(graph)
    except GraphError as exc:
        raise PlanError(f"{name} plans training steps: {exc}") from None
    cpu = next((t.id for t in graph if t.kind == "compute" and not is_gpu(t.device)), None)
    if cpu is not None:
        raise PlanError(f"{name} plans training steps run on GPUs; TaskGraph "
                        f"{graph.name!r} runs {cpu!r} on the CPU")
    return parts


def applies_torch_compile(graph: TaskGraph) -> None:
    """Refuse a graph that is not a training step run on GPUs.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Raises
    ------
    PlanError
        Saying why.
    """
    training_step(graph, "torch-compile-offload")


def applies_torchtune(graph: TaskGraph) -> None:
    """Refuse a graph that is not a training step run on GPUs.

    Parameters
    ----------
    graph : TaskGraph
        The computation.

    Raises
    ------
    PlanError
        Saying why.
    """
    training_step(graph, "torchtune-offload")


# -- torch-compile-offload ------------------------------------------------------------------------
@dataclass(frozen=True)
class TorchCompileOptions(Options):
    activation_offload_separate_stream: bool = option(
        True, "offloads and reloads on their own stream (false: on the compute stream, "
              "which waits for each)")
    activation_offload_sink_wait: bool = option(
        True, "with a separate stream, the compute stream waits for the offloads at the end "
              "of the forward pass (false: right after each)")
    activation_reload_prefetch: bool = option(
        True, "with a separate stream, each reload moves earlier until the compute before its "
              "first use covers its estimated transfer time (false: just before it)")
    cpu_gpu_bw: float = option(50.0, "GB/s (2^30 bytes) the transfer-time estimate assumes")

    def __post_init__(self) -> None:
        if not 0 < self.cpu_gpu_bw < float("inf"):
            raise PlanError(f"torch-compile-offload: cpu_gpu_bw must be a positive number of "
                            f"GB/s, got {self.cpu_gpu_bw!r}")


@register("torch-compile-offload", TorchCompileOptions, applies=applies_torch_compile)
def torch_compile_offload(graph: TaskGraph, machine: Machine, options: TorchCompileOptions,
                          hooks: Hooks) -> MemGraph:
    """PyTorch's compiler pass for activation offloading
    (torch/_functorch/_activation_offloading, pytorch/pytorch@447dbce0): every saved activation
    (not a view, not a model output) offloaded after its last forward use on a side stream,
    reloaded before its first backward use, each reload moved earlier by its estimated transfer
    time.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine the plan must fit.
    options : TorchCompileOptions
        The planner's options.
    hooks : Hooks
        Progress and, for planners that search, the evaluator.

    Returns
    -------
    MemGraph
        The plan; :func:`~offloadlab.planner.registry.plan` closes it.

    Raises
    ------
    PlanError
        The plan does not fit the machine's memory.
    """
    step = Training(graph, "torch-compile-offload")
    separate = options.activation_offload_separate_stream
    sink = separate and options.activation_offload_sink_wait
    for s in step.saved():
        last = max(s.forward, key=step.at.__getitem__)
        if step.g[s.tensor].out_device != HOST:     # record_event after the last use
            off = Step("offload", s.tensor, s.gpu, after=[step.run[r] for r in s.forward])
            step.after.setdefault(last, []).append(off)
            step.wait(off, step.neighbour(last, s.gpu, later=True, backward=sink))
    reloads = [(s, min(s.backward, key=step.at.__getitem__)) for s in step.saved()]
    if separate and options.activation_reload_prefetch:
        placed = _prefetched(step, machine, reloads, options.cpu_gpu_bw * GIB)
    else:
        placed = [(s, first) for s, first in reloads]
    for s, at in placed:
        reload = Step("reload", s.tensor, s.gpu)      # wait_stream: after the compute issued
        previous = step.neighbour(at, s.gpu, later=False)
        if previous is not None:
            reload.after.append(step.run[previous])
        step.before.setdefault(at, []).append(reload)
    return step.plan(machine)


def _prefetched(step: Training, machine: Machine, reloads: list[tuple[Saved, str]],
                rate: float) -> list[tuple[Saved, str]]:
    """Each reload with the vertex it is issued before: torch's ``reorder_for_prefetch``
    walks each backward stretch from its end, queues each reload where its first use is, and
    takes off the first queued one's estimated transfer time (``bytes / rate``) each compute
    vertex's time (the cost model's, for torch's benchmark); when it is covered the reload goes
    before that vertex, one per vertex; at the stretch's start the rest go there."""
    placed: list[tuple[Saved, str]] = []
    by_stretch: dict[tuple[str, int], dict[str, list[Saved]]] = {}
    for s, first in reloads:
        key = (s.gpu, step.pass_of[first])
        by_stretch.setdefault(key, {}).setdefault(first, []).append(s)
    for (gpu, _), uses in by_stretch.items():
        stretch = step.stretch(next(iter(uses)), gpu)
        queue: list[tuple[Saved, float]] = []
        for v in reversed(stretch):
            if queue and step.g[v].kind == "compute":
                s, left = queue[0]
                left -= machine.task_seconds(step.g, step.g[v])
                queue[0] = (s, left)
                if left <= 0:
                    placed.append((queue.pop(0)[0], v))
            for s in reversed(uses.get(v, [])):
                queue.append((s, step.g[s.tensor].bytes / rate))
        placed += [(s, stretch[0]) for s, _ in queue]
    return placed


# -- torchtune-offload ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TorchtuneOptions(Options):
    use_streams: bool = option(True, "offload and reload on a second stream, overlapping "
                                     "compute (false: on the compute stream)")
    max_fwd_stash_size: int = option(5, "saved tensors kept alive on the GPU after their "
                                        "offload started (at least 1); the ones still kept "
                                        "when the backward starts are not reloaded")
    min_offload_size: int = option(1024, "bytes a saved activation needs to be offloaded")

    def __post_init__(self) -> None:
        if type(self.max_fwd_stash_size) is not int or self.max_fwd_stash_size < 1:
            raise PlanError(f"torchtune-offload: max_fwd_stash_size should be at least 1 but "
                            f"is {self.max_fwd_stash_size!r}")
        if type(self.min_offload_size) is not int or self.min_offload_size < 0:
            raise PlanError(f"torchtune-offload: min_offload_size must be an integer >= 0, got "
                            f"{self.min_offload_size!r}")


@register("torchtune-offload", TorchtuneOptions, applies=applies_torchtune)
def torchtune_offload(graph: TaskGraph, machine: Machine, options: TorchtuneOptions,
                      hooks: Hooks) -> MemGraph:
    """torchtune's OffloadActivations (torchtune/training/_activation_offloading.py,
    pytorch/torchtune@bd2a0fc7): every saved activation of at least ``min_offload_size``
    bytes offloaded to pinned host memory on a separate stream as it is saved, the last
    ``max_fwd_stash_size`` kept on the GPU, the backward prefetching the next one.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    machine : Machine
        The machine the plan must fit.
    options : TorchtuneOptions
        The planner's options.
    hooks : Hooks
        Progress and, for planners that search, the evaluator.

    Returns
    -------
    MemGraph
        The plan; :func:`~offloadlab.planner.registry.plan` closes it.

    Raises
    ------
    PlanError
        The plan does not fit the machine's memory.
    """
    step = Training(graph, "torchtune-offload")
    size, streams = options.max_fwd_stash_size, options.use_streams
    by_pass: dict[tuple[str, int], list[Saved]] = {}
    for s in step.saved():                      # each GPU's forward passes (iterations)
        by_pass.setdefault((s.gpu, step.pass_of[s.forward[0]]), []).append(s)
    kept: set[tuple[str, str]] = set()
    for (gpu, _), saved in by_pass.items():
        stash: list[tuple[int, Saved, Step | None]] = []    # offloads in flight, by tensor id
        for tensor_id, s in enumerate(saved, 1):            # ids count every saved tensor
            if step.g[s.tensor].bytes < options.min_offload_size:
                continue
            saver = s.forward[0]                # the op saving it packs it
            then = step.neighbour(saver, gpu, later=True)
            moves = step.after.setdefault(saver, [])
            for entry in [e for e in stash if e[0] <= tensor_id - size]:
                stash.remove(entry)             # s0 waits for its offload, drops the GPU copy
                moves.append(Step("hold", entry[1].tensor, gpu))
                if entry[2] is not None:
                    step.wait(entry[2], then)
            off = None
            if step.g[s.tensor].out_device != HOST:
                off = Step("offload", s.tensor, gpu, after=[step.run[saver]])
                moves.append(off)
                if not streams:
                    step.wait(off, then)
            if streams:
                stash.append((tensor_id, s, off))
        if stash:                               # still on the GPU when the backward starts:
            last = max(step.at[e[1].forward[0]] for e in stash)
            first = step.neighbour(step.order[last], gpu, later=True, backward=True)
            second = first and step.neighbour(first, gpu, later=True)
            for _, s, off in stash:             # used as they are; the first node's hook
                kept.add((s.tensor, gpu))       # makes the compute stream wait the offloads
                if off is not None:
                    step.wait(off, second or first)
    for s in step.saved():
        if step.g[s.tensor].bytes >= options.min_offload_size and (s.tensor, s.gpu) not in kept:
            _reload(step, s, streams)
    return step.plan(machine)


def _reload(step: Training, s: Saved, streams: bool) -> None:
    """The reload of ``s`` for its first backward reader: with streams, issued once the
    backward vertex two before it has run, so that it overlaps the one just before (the
    autograd engine unpacks a node's tensors as it reaches the node, while the GPU still runs
    the previous one); else on the compute stream just before the reader."""
    first = min(s.backward, key=step.at.__getitem__)
    start = step.bounds[s.gpu][step.pass_of[first]][0]
    k = step.place[first] - start
    at = step.runs[s.gpu][start + k - 1] if streams and k >= 1 else first
    reload = Step("reload", s.tensor, s.gpu)
    waits = step.neighbour(at, s.gpu, later=False)
    if waits is not None:
        reload.after.append(step.run[waits])
    step.before.setdefault(at, []).append(reload)
