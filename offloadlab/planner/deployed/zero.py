"""DeepSpeed ZeRO-Offload (ZeRO stage 2 with ``offload_optimizer``), registered as
``zero-offload`` (deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641,
``deepspeed/runtime/zero/stage_1_and_2.py``; Ren et al., "ZeRO-Offload: Democratizing
Billion-Scale Model Training", USENIX ATC 2021, Sec. 4).  What DeepSpeed does, how it is
modelled on the :class:`~.emit.Emitter`, ``dpu``: docs/deployed.md, zero-offload.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.devices import CPU, HOST
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import MemGraph
from ...core.ops import DTYPES, UPDATE_OPS
from ...core.taskgraph import TaskGraph
from ..registry import Hooks, Options, option, register
from .emit import Emitter
from .step import cpu_step, step_of

NAME = "zero-offload"


@dataclass(frozen=True)
class ZeroOffloadOptions(Options):
    reduce_bucket_size: int = option(500_000_000, "gradient elements a bucket gathers before "
                                                  "it is copied to host RAM (DeepSpeed's 5e8)")
    overlap_comm: bool = option(False, "copy the buckets on a side stream (false, DeepSpeed's "
                                       "stage-2 default: on the compute stream, which waits)")
    dpu: bool = option(False, "the one-step delayed parameter update (ZeRO-Offload Sec. 4.2): "
                              "the next iteration does not wait for the CPU step, only for "
                              "the weights it reads")

    def __post_init__(self) -> None:
        if type(self.reduce_bucket_size) is not int or self.reduce_bucket_size <= 0:
            raise PlanError(f"{NAME}: reduce_bucket_size must be a positive number of "
                            f"elements, got {self.reduce_bucket_size!r}")


def applies(graph: TaskGraph) -> None:
    """Refuse a graph with no optimizer update on a GPU: ZeRO-Offload plans training steps.

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


@register(NAME, ZeroOffloadOptions, applies=applies)
def zero_offload(graph: TaskGraph, machine: Machine, options: ZeroOffloadOptions,
                 hooks: Hooks) -> MemGraph:
    """DeepSpeed ZeRO-Offload (stage 2, offload_optimizer to the CPU): weights resident on the
    GPU, gradients copied to host RAM by buckets during the backward, the optimizer step on
    the CPU after the backward, the updated weights copied back; dpu: the one-step delayed
    parameter update's overlap.

    Parameters
    ----------
    graph : TaskGraph
        A training step: an optimizer update on a GPU.
    machine : Machine
        The machine it runs on.
    options : ZeroOffloadOptions
        The gradient bucket, its overlap, and ``dpu``.
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
    em = Emitter(NAME, placed, machine, schedule)
    updates = set(step.updates)
    grads = {graph[u].inputs[1] for u in updates}
    host_inputs = [(positions[0], slot) for slot, positions in em.readers.items()
                   if placed[slot[0]].kind == "input" and placed[slot[0]].device == HOST]
    for _, (t, gpu) in sorted(host_inputs):         # the fp16 model (and batch) on the GPU
        em.load(t, gpu)
    bucket = _Buckets(em, options)
    copied: list[str] = []                           # the new weights' loads, this iteration
    iteration, stepping = 1, False
    for i, t in enumerate(schedule):
        task = placed[t]
        if loop.iteration[t] != iteration:           # the next iteration's first vertex
            iteration, stepping = loop.iteration[t], False
            if not options.dpu:
                for gpu in em.memory:
                    em.wait(gpu, copied)
            copied = []
        if t in updates and not stepping:            # the backward has ended: step()
            stepping = True
            em.wait(CPU, bucket.flush_all()
                    + [last for device, last in em.last.items() if device != CPU])
        em.run(t)
        if t in grads and task.out_device != HOST:
            bucket.add(t, task.out_device)
        if t in updates:
            copied.append(em.load(t, graph[t].device))
        em.release(i)
        if hooks.progress is not None and not i & 4095:
            hooks.progress(i)
    return em.finish()


class _Buckets:
    """The gradients of each GPU waiting in its bucket, copied to host RAM when the next would
    overflow it (``reduce_independent_p_g_buckets_and_remove_grads``) or at the end of the
    backward."""

    def __init__(self, em: Emitter, options: ZeroOffloadOptions):
        self.em, self.size, self.overlap = em, options.reduce_bucket_size, options.overlap_comm
        self.held: dict[str, list[str]] = {}
        self.elements: dict[str, int] = {}
        self.offloads: list[str] = []                # this iteration's, not yet waited for

    def add(self, t: str, gpu: str) -> None:
        task = self.em.g[t]
        n = task.bytes // DTYPES[task.dtype]
        if self.held.get(gpu) and self.elements[gpu] + n > self.size:
            self.flush(gpu, t)
        self.held.setdefault(gpu, []).append(t)
        self.elements[gpu] = self.elements.get(gpu, 0) + n
        self.em.held.add((t, gpu))

    def flush(self, gpu: str, after: str) -> None:
        em = self.em
        moves = [em.offload(t, gpu, after=[after]) for t in self.held.pop(gpu, [])]
        self.elements[gpu] = 0
        if not self.overlap:
            em.wait(gpu, moves)
        for move in moves:
            slot = (em.mg[move].of or "", gpu)
            em.held.discard(slot)
            if slot in em.resident and slot[0] not in em.kept \
                    and em.next_reader(slot, em.at) is None:
                em.free(slot)
        self.offloads += moves

    def flush_all(self) -> list[str]:
        """Copy what every bucket holds (after its GPU's last vertex); every gradient copy of
        the iteration, which the CPU step waits for."""
        for gpu in list(self.held):
            self.flush(gpu, self.em.last[gpu])
        done, self.offloads = self.offloads, []
        return done
