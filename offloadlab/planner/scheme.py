"""A fixed offload scheme laid out as a MemGraph: the deployed schemes (docs/deployed.md) decide
what moves when; this module places it.

A scheme hands over its :class:`Step`\\ s in the order they are issued: each TaskGraph vertex run
(``run``), and the offloads, reloads and holds it adds.  Host-resident inputs are loaded where
a GPU reads them and no copy is there (on demand, as a framework that keeps its model on the GPU
has it there before the step; the link may bring it ahead, as nothing but memory orders a
load).  Every GPU copy of a tensor is freed after its last use in that order (a ``hold`` is a
use that moves nothing: a framework keeping a reference), like PyTorch's allocator frees a
tensor whose last reference goes.  Locations come from the planners' offset allocator
(:class:`~.allocator.GpuMemory`): a writer waits for the readers of whatever last held its bytes
(memory edges), so every plan passes the verifier.  A scheme's own orderings (a stream waiting
for an event) are memory edges given by ``Step.after``.  When a GPU has no room, the scheme does
not fit: a :class:`PlanError` names the shortfall, as the deployed scheme would run out of
memory there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.devices import HOST, is_gpu
from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import Loc, MemGraph, MemVertex
from ..core.taskgraph import Task, TaskGraph
from .allocator import GpuMemory

KINDS = ("run", "offload", "reload", "hold")


@dataclass(eq=False)
class Step:
    """One thing a scheme issues: ``run`` the TaskGraph vertex ``tensor``; ``offload`` its copy
    on ``gpu`` to host RAM; ``reload`` it to ``gpu`` (a ``load`` of a host-resident input);
    ``hold`` its copy on ``gpu`` (a use that moves nothing).  ``after``: steps whose vertices this
    one waits for (memory edges)."""

    kind: str
    tensor: str
    gpu: str | None = None
    after: list[Step] = field(default_factory=list)
    vertex: str | None = None            # its MemGraph vertex, once emitted

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


class Emitter:
    """Lays a scheme's steps out as a MemGraph on ``machine`` (``name``: the scheme, for its
    errors)."""

    def __init__(self, graph: TaskGraph, machine: Machine, name: str):
        self.g, self.machine, self.name = graph, machine, name
        self.mg = MemGraph()
        self.memory = {gpu: GpuMemory(gpu, machine.gpu_memory) for gpu in graph.gpus()}
        self.copy: dict[tuple[str, str], str] = {}     # (tensor, GPU) -> vertex holding it
        self.host: dict[str, str] = {}                 # tensor -> its latest copy in host RAM
        self.moves = 0

    def run(self, steps: list[Step]) -> MemGraph:
        """The MemGraph of ``steps`` (each TaskGraph vertex run once), with loads added.

        Parameters
        ----------
        steps : list of Step
            The scheme's steps, in program order.

        Returns
        -------
        MemGraph

        Raises
        ------
        PlanError
            A step finds no room on its GPU, naming the shortfall.
        """
        steps = self._with_loads(steps)
        last = _last_uses(self.g, steps)
        for i, step in enumerate(steps):
            self._emit(step)
            for key in last.get(i, ()):
                self._free(key, i)
        return self.mg

    # -- the steps -------------------------------------------------------------------------------
    def _with_loads(self, steps: list[Step]) -> list[Step]:
        """``steps`` with a reload (a load) before each run that reads a host-resident input on
        a GPU where it has never been: a copy, once made, lives until its last use."""
        tasks, out, made = self.g.tasks, [], set()
        for step in steps:
            if step.kind == "reload":
                made.add((step.tensor, step.gpu))
            elif step.kind == "run":
                t = tasks[step.tensor]
                for u in dict.fromkeys(t.inputs):
                    key = (u, t.read_device)
                    if tasks[u].out_device == HOST and key not in made:
                        out.append(Step("reload", *key))
                        made.add(key)
            out.append(step)
        return out

    def _emit(self, step: Step) -> None:
        x, gpu = step.tensor, step.gpu or ""
        if step.kind == "run":
            step.vertex = self._task(self.g[x])
        elif step.kind == "offload":
            step.vertex = self.host[x] = self._move("offload", x, gpu, self.copy[x, gpu])
        elif step.kind == "reload":
            home = self.g[x].out_device == HOST
            step.vertex = self.copy[x, gpu] = self._move(
                "load" if home else "reload", x, gpu, x if home else self.host[x])
        if step.vertex is not None:
            self.mg.add_edges([b.vertex for b in step.after if b.vertex is not None],
                              step.vertex, "memory")

    def _task(self, t: Task) -> str:
        gpu = t.out_device
        inputs = tuple(self.copy[u, t.read_device] for u in t.inputs)
        self.mg.add_vertex(MemVertex(t.id, t.kind, t.device, t.bytes, task=t.id, op=t.op,
                                     flops=t.flops, inputs=inputs, order=len(self.mg),
                                     time=t.time))
        self.mg.add_edges(inputs, t.id, "data")
        if is_gpu(gpu):
            self._place(t.id, gpu)
            self.copy[t.id, gpu] = t.id
        return t.id

    def _move(self, kind: str, x: str, gpu: str, source: str) -> str:
        """An offload of ``source`` (a GPU copy of ``x``), or a load or reload of ``x`` to
        ``gpu`` from ``source`` (its host copy)."""
        id = f"{kind}:{x}@{gpu}#{self.moves}"
        self.moves += 1
        self.mg.add_vertex(MemVertex(id, kind, gpu, self.g[x].bytes, of=x, inputs=(source,),
                                     order=len(self.mg)))
        self.mg.add_edge(source, id, "data")
        if kind != "offload":
            self._place(id, gpu)
        return id

    # -- memory ----------------------------------------------------------------------------------
    def _place(self, writer: str, gpu: str) -> None:
        """A location on ``gpu`` for ``writer``'s tensor, which waits for the readers of what
        last held those bytes."""
        v = self.mg[writer]
        memory = self.memory[gpu]
        offset = memory.find_free(v.bytes)
        if offset is None:
            largest = max([s.end - s.start for s in memory.segments if s.owner is None],
                          default=0)
            raise PlanError(f"{self.name}: no room on {gpu} for {v.task or v.of!r} ({v.bytes} "
                            f"bytes; {memory.free} free, at most {largest} in one piece): "
                            f"{v.bytes - largest} bytes short, so the deployed scheme would "
                            f"run out of memory here (GPU memory {self.machine.gpu_memory})")
        covered = memory.place(offset, v.bytes, writer)
        v.loc = Loc(gpu, offset, v.bytes)
        self.mg.add_edges([g for s in covered for g in s.guard], writer, "memory")

    def _free(self, key: tuple[str, str], now: int) -> None:
        vertex = self.copy.pop(key)
        loc = self.mg[vertex].loc
        assert loc is not None
        readers = tuple(r for r, kind in self.mg.succ[vertex].items() if kind == "data")
        self.memory[key[1]].release(vertex, loc.offset, readers or (vertex,), now)


def _last_uses(graph: TaskGraph, steps: list[Step]) -> dict[int, list[tuple[str, str]]]:
    """The step after which each GPU copy is used no more: step index -> the copies
    ``(tensor, GPU)`` to free there.  A copy nothing uses after its writer (a graph output)
    stays."""
    tasks = graph.tasks
    last: dict[tuple[str, str], int] = {}          # live copy -> its last use so far (-1: none)
    ends: dict[int, list[tuple[str, str]]] = {}

    def close(key: tuple[str, str]) -> None:
        used = last.pop(key, -1)
        if used >= 0:
            ends.setdefault(used, []).append(key)

    def make(key: tuple[str, str]) -> None:
        close(key)                                  # the previous copy there, if any
        last[key] = -1

    for i, step in enumerate(steps):
        if step.kind == "run":
            t = tasks[step.tensor]
            for u in t.inputs:
                if (u, t.read_device) in last:
                    last[u, t.read_device] = i
            if is_gpu(t.out_device):
                make((t.id, t.out_device))
        elif step.kind == "reload":
            make((step.tensor, step.gpu or ""))
        else:
            last[step.tensor, step.gpu or ""] = i
    for key in list(last):
        close(key)
    return ends
