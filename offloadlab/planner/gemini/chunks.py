"""Gemini's chunks: the model data, packed into chunks in the order the program first uses them.

*Chunks*: the page's StatefulTensorMgr keeps a state per tensor; Gemini groups tensors in chunks,
the idea it takes from PatrickStar ("Brief").  Each GPU's parameters are packed, in the order
the program first uses them, into chunks of at most ``chunk_size`` bytes of parameters (a
parameter counts its largest tensor; a larger one is a chunk of its own, so a tiny
``chunk_size`` gives the page's manager of single tensors).  A chunk holds its parameters'
live tensors on that GPU: the versions and gradients still to be read, and the model tensors
among the graph's outputs; a version or gradient is freed after its last reader (the update
writes the new version beside the old one: kernels do not update in place).  A chunk moves as
a whole: all its live tensors are on the GPU, or all in host RAM, with one ``load``/``reload``
or ``offload`` vertex per tensor; no chunk buffer is laid out, each tensor has its own
location.

"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ...core.devices import HOST
from ...core.ops import UPDATE_OPS
from ...core.taskgraph import TaskGraph
from ..buildmemgraph import serial_order

Slot = tuple[str, str]   # (TaskGraph vertex whose tensor it is, GPU)
NEVER = 2**62            # after every operator and event: no next use, never freed


@dataclass(eq=False)
class Chunk:
    """Tensors of some parameters on one GPU that move together; ``uses`` are the operators
    (positions in program order) it is COMPUTE for."""

    index: int
    device: str
    slots: list[Slot] = field(default_factory=list)
    uses: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Program:
    """What the program order fixes: the operators, what each reads, its COMPUTE chunks, the
    chunks of the model data and the readers of each slot."""

    ops: list[str]
    reads: list[list[Slot]]            # per operator: the slots it reads, each once
    compute: list[list[Chunk]]         # per operator: its COMPUTE chunks
    chunks: list[Chunk]
    chunk_of: dict[Slot, Chunk]        # the model data's slots
    readers: dict[Slot, list[int]]     # per slot: the operators that read it, in order



def parameters(graph: TaskGraph) -> dict[str, str]:
    """The model tensors, each mapped to its parameter.

    Host-resident inputs, and the tensors that optimizer updates read and write, grouped with
    the version each update reads; tensors living on a GPU before the run excluded.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    dict of str to str
        Each model tensor's parameter: one of its tensors, the same for all.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = x = parent[parent[x]]
        return x

    for t in graph:
        if t.kind == "input" and t.device == HOST:
            find(t.id)
        elif t.kind == "compute" and t.op in UPDATE_OPS:
            weight = find(t.inputs[0])
            for u in (t.id, *t.inputs[1:]):
                parent[find(u)] = weight
    return {t: find(t) for t in parent if graph[t].kind != "input" or graph[t].device == HOST}


@dataclass(frozen=True)
class Trace:
    """What the program order fixes before chunks are formed: the operators, the slots each
    reads and the model slots it touches, each parameter's slots on each GPU (in the order
    the program first touches them) and the readers of each slot."""

    ops: list[str]
    reads: list[list[Slot]]
    touched: list[list[Slot]]
    members: dict[tuple[str, str], list[Slot]]    # (parameter, GPU) -> its slots
    readers: dict[Slot, list[int]]
    grads: set[str]                                # the gradients the updates read

    def sizes(self, graph: TaskGraph) -> list[tuple[str, int]]:
        """Each parameter's GPU and size (its largest tensor), in order of first touch.

        Parameters
        ----------
        graph : TaskGraph
            The traced TaskGraph.

        Returns
        -------
        list of tuple of str and int
            ``(GPU, bytes)`` per parameter.
        """
        return [(dev, max(graph[t].bytes for t, _ in slots))
                for (_, dev), slots in self.members.items()]


def trace(graph: TaskGraph) -> Trace:
    """The program's operators and model data, in the TaskGraph's order.

    Parameters
    ----------
    graph : TaskGraph
        A training step.

    Returns
    -------
    Trace
    """
    ops = [t for t in serial_order(graph, "given") if graph[t].kind != "input"]
    param = parameters(graph)
    reads: list[list[Slot]] = []
    touched: list[list[Slot]] = []                 # per operator: its model slots
    members: dict[tuple[str, str], list[Slot]] = {}     # (parameter, GPU) -> its slots
    readers: dict[Slot, list[int]] = {}
    for i, t in enumerate(ops):
        task = graph[t]
        reads.append([(u, task.read_device) for u in dict.fromkeys(task.inputs)])
        for slot in reads[i]:
            readers.setdefault(slot, []).append(i)
        slots = [s for s in (*reads[i], (t, task.out_device)) if s[0] in param]
        touched.append(slots)
        for slot in slots:
            same = members.setdefault((param[slot[0]], slot[1]), [])
            if slot not in same:
                same.append(slot)
    grads = {u for t in graph if t.kind == "compute" and t.op in UPDATE_OPS
             for u in t.inputs[1:]}
    return Trace(ops, reads, touched, members, readers, grads)


def chunk_numbers(sizes: list[tuple[str, int]], chunk_size: int) -> list[int]:
    """The chunk of each parameter, numbered in the order chunks open.

    A parameter joins its GPU's open chunk if the chunk's parameters stay within
    ``chunk_size`` bytes, else opens the next (Colossal-AI's ChunkManager).

    Parameters
    ----------
    sizes : list of tuple of str and int
        Each parameter's GPU and size, in order of first touch.
    chunk_size : int
        The chunks' bytes of parameters.

    Returns
    -------
    list of int
        Each parameter's chunk number.
    """
    numbers: list[int] = []
    filling: dict[str, tuple[int, int]] = {}      # GPU -> its open chunk and its bytes
    opened = 0
    for dev, size in sizes:
        number, held = filling.get(dev, (-1, 0))
        if number < 0 or held + size > chunk_size:
            number, held, opened = opened, 0, opened + 1
        numbers.append(number)
        filling[dev] = number, held + size
    return numbers


def grouped(graph: TaskGraph, tr: Trace, chunk_size: int, grad_chunks: bool
            ) -> list[tuple[str, list[Slot]]]:
    """Each chunk's GPU and slots, in the order chunks open.

    Parameters
    ----------
    graph : TaskGraph
        The traced TaskGraph.
    tr : Trace
        Its trace.
    chunk_size : int
        The chunks' bytes of parameters.
    grad_chunks : bool
        False: the parameters' slots with their gradients.  True: the parameters' without
        their gradients and then, in the same order, for each chunk with gradients a chunk of
        them (Colossal-AI's grad chunk, which mirrors its parameter chunk).

    Returns
    -------
    list of tuple of str and list of Slot
        ``(GPU, slots)`` per chunk.
    """
    groups: list[tuple[str, list[Slot]]] = []
    twins: dict[int, list[Slot]] = {}
    for ((_, dev), slots), n in zip(tr.members.items(),
                                    chunk_numbers(tr.sizes(graph), chunk_size)):
        if n == len(groups):
            groups.append((dev, []))
        for slot in slots:
            if grad_chunks and slot[0] in tr.grads:
                twins.setdefault(n, []).append(slot)
            else:
                groups[n][1].append(slot)
    return groups + [(groups[n][0], twins[n]) for n in sorted(twins)]


def program(graph: TaskGraph, chunk_size: int, traced: Trace | None = None,
            grad_chunks: bool = False) -> Program:
    """Pack each GPU's parameters into chunks in the order the program first touches them.

    Parameters
    ----------
    graph : TaskGraph
        A training step.
    chunk_size : int
        The chunks' bytes of parameters.
    traced : Trace or None
        The graph's trace, if already made.
    grad_chunks : bool
        Gradients in chunks of their own (see :func:`grouped`).

    Returns
    -------
    Program
    """
    tr = traced or trace(graph)
    chunks = [Chunk(n, dev, slots)
              for n, (dev, slots) in enumerate(grouped(graph, tr, chunk_size, grad_chunks))]
    ops, reads, touched, readers = tr.ops, tr.reads, tr.touched, tr.readers
    chunk_of = {slot: chunk for chunk in chunks for slot in chunk.slots}
    compute = [list(dict.fromkeys(chunk_of[s] for s in slots)) for slots in touched]
    for i, used in enumerate(compute):
        for chunk in used:
            chunk.uses.append(i)
    return Program(ops, reads, compute, chunks, chunk_of, readers)


def next_use(chunk: Chunk, i: int) -> int:
    """The first operator after ``i`` that the chunk is COMPUTE for.

    Parameters
    ----------
    chunk : Chunk
        The chunk.
    i : int
        An operator's index in the program.

    Returns
    -------
    int
        The operator's index; NEVER if none.
    """
    return next_read(chunk.uses, i)


def next_read(uses: list[int], i: int) -> int:
    """The first of ``uses`` after ``i``.

    Parameters
    ----------
    uses : list of int
        Operators' indices, ascending.
    i : int
        An operator's index.

    Returns
    -------
    int
        The operator's index; NEVER if none.
    """
    k = bisect.bisect_right(uses, i)
    return uses[k] if k < len(uses) else NEVER

