"""The MemGraph of a deployed offload scheme, emitted in program order.

The schemes users deploy (Accelerate's hooks, DeepSpeed ZeRO-Offload, FSDP's CPU offload) run a
model eagerly: one compute stream per GPU runs the operators in program order, the scheme moves
tensors at fixed points of that order, and PyTorch's caching allocator places each tensor when
it is made and frees it after its last use.  :class:`Emitter` is that runtime in MemGraph form:
a scheme walks its schedule and calls :meth:`Emitter.run`, :meth:`Emitter.load`,
:meth:`Emitter.offload`, :meth:`Emitter.free` and :meth:`Emitter.release`.  The rules it
follows: docs/deployed.md ("How the eager schemes are modelled").
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...core.devices import HOST
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import Loc, MemGraph, MemVertex
from ...core.taskgraph import TaskGraph
from ..allocator import GpuMemory

Slot = tuple[str, str]
"""A tensor on a GPU: (TaskGraph vertex, GPU)."""


@dataclass(eq=False)
class Copy:
    """A tensor's copy on a GPU: where it is, the vertex that wrote it, who read it."""

    slot: Slot
    size: int
    writer: str
    offset: int | None
    readers: list[str] = field(default_factory=list)


@dataclass
class Peak:
    """The most bytes a GPU held at once, and the vertex being emitted then."""

    bytes: int = 0
    at: str = ""


class Emitter:
    """Builds the MemGraph of ``graph`` run in ``schedule`` order (its non-input vertices)."""

    def __init__(self, name: str, graph: TaskGraph, machine: Machine, schedule: list[str]):
        self.name, self.g, self.capacity = name, graph, machine.gpu_memory
        self.schedule = schedule
        self.position = {t: i for i, t in enumerate(schedule)}
        self.at = -1                                  # the position being emitted
        self.readers: dict[Slot, list[int]] = {}      # a GPU copy's readers, by position
        for i, t in enumerate(schedule):
            task = graph[t]
            if task.read_device != HOST:
                for u in dict.fromkeys(task.inputs):
                    self.readers.setdefault((u, task.read_device), []).append(i)
        self.kept = set(graph.outputs())
        self.to_cpu = {u for t in graph if t.kind == "compute" and t.read_device == HOST
                       for u in t.inputs}                # what CPU vertices read
        self.mg = MemGraph()
        self.memory = {gpu: GpuMemory(gpu, self.capacity) for gpu in machine.gpu_names()}
        self.used = dict.fromkeys(self.memory, 0)
        self.peak = {gpu: Peak() for gpu in self.memory}
        self.resident: dict[Slot, Copy] = {}
        self.host: dict[str, str] = {}                # tensor -> its MemGraph vertex in host RAM
        self.held: set[Slot] = set()                  # copies release() leaves to the scheme
        self.last: dict[str, str] = {}                # device -> its last compute vertex
        self.waits: dict[str, list[str]] = {}         # device -> what its next compute waits for
        self.now = ""                                 # the vertex being emitted
        self.short: tuple[str, str, int] | None = None   # (GPU, vertex, bytes): no block found
        self.moves = itertools.count()
        for task in graph:
            if task.kind == "input":
                self._add(MemVertex(task.id, "input", task.device, task.bytes, task=task.id))
                if task.device == HOST:
                    self.host[task.id] = task.id
                else:
                    self._place((task.id, task.device), task.id)

    # -- the scheme's moves -------------------------------------------------------------------
    def load(self, t: str, gpu: str, after: Iterable[str] = ()) -> str:
        """Copy ``t`` from host RAM to ``gpu`` once ``after`` have run.

        A ``load`` of a host input or CPU result, a ``reload`` of an offloaded tensor.

        Parameters
        ----------
        t : str
            The tensor.
        gpu : str
            Where to.
        after : iterable of str
            The vertices the copy waits for.

        Returns
        -------
        str
            The copy's vertex.

        Raises
        ------
        PlanError
            Where host RAM holds no copy of ``t`` (an internal error).
        """
        source = self.host.get(t)
        if source is None:
            raise PlanError(f"{self.name}: internal: {t!r} is loaded with no copy in host RAM")
        kind = "reload" if self.mg[source].kind == "offload" else "load"
        move = self._add(MemVertex(f"{kind}:{t}@{gpu}#{next(self.moves)}", kind, gpu,
                                   self.g[t].bytes, of=t, inputs=(source,)))
        self.mg.add_edge(source, move, "data")
        self.mg.add_edges(list(after), move, "memory")
        self._place((t, gpu), move)
        return move

    def offload(self, t: str, gpu: str, after: Iterable[str] = ()) -> str:
        """Copy ``t`` from ``gpu`` to host RAM once ``after`` have run.

        Parameters
        ----------
        t : str
            The tensor.
        gpu : str
            Where from.
        after : iterable of str
            The vertices the copy waits for.

        Returns
        -------
        str
            The copy's vertex.
        """
        copy = self.resident[t, gpu]
        move = self._add(MemVertex(f"offload:{t}@{gpu}#{next(self.moves)}", "offload", gpu,
                                   copy.size, of=t, inputs=(copy.writer,)))
        self.mg.add_edge(copy.writer, move, "data")
        self.mg.add_edges(list(after), move, "memory")
        copy.readers.append(move)
        self.host[t] = move
        return move

    def free(self, slot: Slot) -> None:
        """Drop a GPU copy: its bytes may be overwritten once its readers have run.

        Parameters
        ----------
        slot : Slot
            The tensor and its GPU.
        """
        copy = self.resident.pop(slot)
        self.held.discard(slot)
        self.used[slot[1]] -= copy.size
        if copy.offset is not None:
            self.memory[slot[1]].release(copy, copy.offset,
                                         tuple(copy.readers) or (copy.writer,), len(self.mg))

    def wait(self, device: str, vertices: Iterable[str]) -> None:
        """Make the next compute vertex on ``device`` wait for ``vertices``.

        Parameters
        ----------
        device : str
            The device.
        vertices : iterable of str
            The vertices to wait for.
        """
        self.waits.setdefault(device, []).extend(vertices)

    # -- the schedule ---------------------------------------------------------------------------
    def run(self, t: str) -> str:
        """Emit TaskGraph vertex ``t``, its output placed.

        Its inputs on its device (host tensors loaded on demand, after the device's previous
        vertex), after that vertex.

        Parameters
        ----------
        t : str
            The vertex.

        Returns
        -------
        str
            ``t``.

        Raises
        ------
        PlanError
            Where an input is neither on its device nor in host RAM (an internal error).
        """
        task = self.g[t]
        self.now, self.at = t, self.position[t]
        read = task.read_device
        inputs = []
        for u in task.inputs:
            if read == HOST:
                if u not in self.host:                  # a GPU's tensor: copied out first
                    gpu = next((g for g in self.memory if (u, g) in self.resident), None)
                    if gpu is None:
                        raise PlanError(f"{self.name}: internal: {t!r} on the CPU reads "
                                        f"{u!r}, which is neither in host RAM nor on a GPU")
                    self.offload(u, gpu)
                    if u not in self.kept and self.next_reader((u, gpu), self.at) is None:
                        self.free((u, gpu))
                inputs.append(self.host[u])
                continue
            if (u, read) not in self.resident:
                if u not in self.host:
                    raise PlanError(f"{self.name}: internal: {t!r} reads {u!r}, which is "
                                    f"neither on {read} nor in host RAM")
                previous = self.last.get(read)
                self.load(u, read, after=[] if previous is None else [previous])
            inputs.append(self.resident[u, read].writer)
        self._add(MemVertex(t, task.kind, task.device, task.bytes, task=t, op=task.op,
                            flops=task.flops, inputs=tuple(inputs), time=task.time))
        self.mg.add_edges(list(dict.fromkeys(inputs)), t, "data")
        if task.kind == "compute":
            previous = self.last.get(task.device)
            self.mg.add_edges(([] if previous is None else [previous])
                              + self.waits.pop(task.device, []), t, "memory")
            self.last[task.device] = t
        if read != HOST:
            for u in dict.fromkeys(task.inputs):
                self.resident[u, read].readers.append(t)
        if task.out_device == HOST:
            self.host[t] = t
        else:
            self._place((t, task.out_device), t)
        return t

    def release(self, i: int) -> None:
        """After the vertex at position ``i``: free the copies no later vertex reads.

        The copies it read or wrote that no later vertex reads on their GPU (not the graph's
        outputs, those the scheme holds, nor those a CPU vertex reads before host RAM has them).

        Parameters
        ----------
        i : int
            The vertex's position in the schedule.
        """
        task = self.g[self.schedule[i]]
        slots = [(u, task.read_device) for u in task.inputs] + [(task.id, task.out_device)]
        for slot in dict.fromkeys(slots):
            if slot in self.resident and slot not in self.held and slot[0] not in self.kept \
                    and self.next_reader(slot, i) is None \
                    and (slot[0] not in self.to_cpu or slot[0] in self.host):
                self.free(slot)

    def next_reader(self, slot: Slot, i: int) -> int | None:
        """The first position after ``i`` that reads ``slot``.

        Parameters
        ----------
        slot : Slot
            The tensor and its GPU.
        i : int
            A position in the schedule.

        Returns
        -------
        int or None
            None if no later vertex reads it.
        """
        positions = self.readers.get(slot, [])
        k = bisect.bisect_right(positions, i)
        return positions[k] if k < len(positions) else None

    def finish(self) -> MemGraph:
        """The MemGraph, or a PlanError if the scheme ran out of memory on a GPU.

        Returns
        -------
        MemGraph

        Raises
        ------
        PlanError
            Naming the GPU, the vertex and the bytes: more than the GPU holds, or a free block
            its fragmented memory lacks.
        """
        if self.short is not None:
            gpu, t, size = self.short
            peak = self.peak[gpu]
            if peak.bytes > self.capacity:
                raise PlanError(
                    f"{self.name}: the deployed scheme runs out of memory on {gpu}: it holds "
                    f"{peak.bytes} bytes there at vertex {peak.at!r}, {peak.bytes - self.capacity}"
                    f" more than the GPU's {self.capacity}")
            raise PlanError(
                f"{self.name}: the deployed scheme runs out of memory on {gpu} at vertex {t!r}: "
                f"{size} bytes find no free block (its memory is fragmented; it peaks at "
                f"{peak.bytes} of {self.capacity} bytes)")
        return self.mg

    # -- bookkeeping ----------------------------------------------------------------------------
    def _add(self, v: MemVertex) -> str:
        v.order = len(self.mg)
        self.mg.add_vertex(v)
        return v.id

    def _place(self, slot: Slot, writer: str) -> None:
        gpu, size = slot[1], self.g[slot[0]].bytes
        self.used[gpu] += size
        peak = self.peak[gpu]
        if self.used[gpu] > peak.bytes:
            peak.bytes, peak.at = self.used[gpu], self.now or writer
        offset = None if self.short is not None else self.memory[gpu].find_free(size)
        copy = Copy(slot, size, writer, offset)
        self.resident[slot] = copy
        if offset is None:
            if self.short is None:                 # go on counting bytes for the peak
                self.short = (gpu, self.now or writer, size)
            return
        covered = self.memory[gpu].place(offset, size, copy)
        self.mg.add_edges(list(dict.fromkeys(g for s in covered for g in s.guard)), writer,
                          "memory")
        self.mg[writer].loc = Loc(gpu, offset, size)
