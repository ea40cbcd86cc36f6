"""Colossal-AI Gemini's heterogeneous memory manager, registered as ``gemini``.

The source is the page "Meet Gemini: The Heterogeneous Memory Manager of Colossal-AI"
(``shared/papers/colossalai-gemini-memory-manager.txt``); sections are the page's.

*Model and non-model data* ("Concepts"): Gemini's model data are the parameters, their
gradients and optimizer states.  Here a parameter is a host-resident input with what the
optimizer updates make of it: each update (``adam_update``/``sgd_update``) joins its output,
the new version, to the version it reads (its first input) and to its other inputs, the
gradients.  Every host-resident input is model data, also one no update reads (a traced step's
batch and targets, which the toolkit keeps in host RAM beside the weights); the toolkit's
updates keep no optimizer state (fresh moments).  Everything else is non-model data
(activations, temporaries, tensors living on a GPU before the run such as a training chain's
batches) and stays on its GPU from its writer to its last reader (to the end for the graph's
outputs), unless an operator cannot run even with every HOLD chunk in host RAM: then non-model
tensors it does not use go there too, the one read again latest first (Belady's rule), and
come back before their next reader.  Gemini itself has no such fallback (it runs out of
memory); the toolkit's other planners move activations, and this lets ``gemini`` plan where
they do, at the cost of the moves.

*Scope*: training steps, TaskGraphs with an optimizer update on a GPU (``training-chain``,
``gpt2-train``, ``bert-train``, the traced ``model:...,mode=train``, ``import-torch --train``):
Gemini's warm-up and later iterations are training iterations, and its model data what
training updates.  Without an update every host tensor is a read-only weight paged in on
demand, which ``levelwise`` and ``buildmemgraph`` cover.  A TaskGraph with an operator on the
CPU is refused: Gemini runs every operator on its GPU.

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

*States* ("StatefulTensorMgr"): before an operator runs, the chunks whose tensors it reads or
writes are COMPUTE and brought to its GPU on demand; the others are HOLD, on the GPU or in host
RAM; a chunk with no live tensor is FREE.  Operators run in the TaskGraph's order (the program
order), each GPU's one after the other, and the chunk movements made for an operator run after
the GPU's previous operator and before it (memory edges): no reordering, and every on-demand
load is waited for.

*Prefetch* (Colossal-AI's GeminiDDP ``max_prefetch``, its ``AutoPlacementPolicy``'s
``get_prefetch_chunks``): with ``max_prefetch`` > 0, once an operator's COMPUTE chunks are in,
the chunks of its GPU that the next operators need and that are in host RAM are loaded ahead,
in order of next use, while fewer than ``max_prefetch`` chunks loaded ahead are still unused
and the next one fits in the memory the warm-up's statistics leave to model data until its
use; the first that does not fit ends the prefetch (Colossal-AI stops there too, and checks
only the current period: here the non-model peaks up to the use count, so that a prefetch
never forces an eviction).  A prefetch waits for the GPU's previous operator, like the
operator's own loads, but the operator does not wait for it: it overlaps the operators before
its use, which waits for it through its data edge.  The warm-up does not prefetch (Colossal-AI
needs the warm-up's order of chunks for it).  Prefetch is best effort: where the plan with it
does not fit (its layout), the plan loads on demand (``graph["prefetched"]`` says which).

*Warm-up* ("Design Details", "MemStatsCollector", "Tensor Eviction Strategy"): a first pass
runs the same manager with model data capped at ``warmup_share`` of GPU memory (the page's
30%; Colossal-AI's ``AutoPlacementPolicy`` leaves it 20%), evicting HOLD chunks in the order
they were registered (nothing is known of their next uses yet), and samples for each operator
and GPU the memory in use while it runs less the model data: the non-model peak of its period.
Where an operator's own chunks exceed the cap, the cap rises to them for that operator
(Gemini's warm-up fails there, "Adjust layout failed"), and where they do not fit beside the
non-model data at all the warm-up samples the operator all the same: the non-model data, and
so the statistics, do not depend on where the model data are, and the planned iteration
decides what fits.  The plan is the non-warm-up iteration, placed by those statistics (Colossal-AI's
auto placement): before each operator, HOLD chunks are moved to host RAM until the operator's
non-model peak and its COMPUTE chunks fit (the page's S2), choosing by ``eviction``: ``opt``,
the page's OPT policy, moves the chunk needed latest (first those never needed again), ``lru``
the least recently used; so the non-model peak of each step decides how many chunks stay on
the GPU.  An evicted tensor is offloaded unless host RAM holds it already (a weight as loaded,
or a version offloaded before: tensors are never written twice).  If an operator cannot run
even with every HOLD chunk and every non-model tensor it does not use in host RAM, planning
fails naming it.

*Layout*: Gemini decides in bytes and leaves addresses to PyTorch's caching allocator.  Here
the planned pass records when each copy of a tensor is placed and freed; :func:`pack` lays the
copies out offline (first fit by size, or by size times lifetime, whichever needs less), and
:func:`locate` replays them on BuildMemGraph's allocator
(:class:`~offloadlab.planner.allocator.GpuMemory`) for the memory edges.  If the layout needs
more than the GPU has, the pass is redone within less, the most (to 1/64 of the memory) whose
layout fits (:func:`fitted`): the counterpart of the headroom Colossal-AI keeps for
fragmentation (it plans within 90% of the memory, ``steady_cuda_cap_ratio``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NoReturn

from ..core.devices import CPU, HOST
from ..core.errors import PlanError
from ..core.machine import Machine, MiB
from ..core.memgraph import Loc, MemGraph, MemVertex
from ..core.ops import UPDATE_OPS
from ..core.taskgraph import TaskGraph
from .allocator import GpuMemory
from .buildmemgraph import serial_order
from .registry import Hooks, Options, option, register

Slot = tuple[str, str]   # (TaskGraph vertex whose tensor it is, GPU)
EVICTIONS = ("opt", "lru")
NEVER = 2**62            # after every operator and event: no next use, never freed


@dataclass(frozen=True)
class GeminiOptions(Options):
    chunk_size: int = option(32 * MiB, "bytes of parameters a chunk holds (a larger parameter "
                                       "is a chunk of its own)")
    warmup_share: float = option(0.3, "share of GPU memory model data may use in the warm-up "
                                      "iteration, in (0, 1] (Gemini's 30%)")
    eviction: str = option("opt", "which HOLD chunk moves to host RAM: opt (needed latest, "
                                  "Gemini's) or lru (least recently used)")
    max_prefetch: int = option(0, "chunks per GPU whose loads may be in flight ahead of the "
                                  "operators that need them (GeminiDDP's max_prefetch; 0: "
                                  "every load on demand, Colossal-AI's default)")

    def __post_init__(self) -> None:
        if type(self.chunk_size) is not int or self.chunk_size <= 0:
            raise PlanError(f"gemini: chunk_size must be a positive number of bytes, got "
                            f"{self.chunk_size!r}")
        share = self.warmup_share
        if type(share) not in (int, float) or not 0 < share <= 1:
            raise PlanError(f"gemini: warmup_share must be in (0, 1], got {share!r}")
        if self.eviction not in EVICTIONS:
            raise PlanError(f"gemini: unknown eviction {self.eviction!r}; use "
                            f"{' or '.join(EVICTIONS)}")
        if type(self.max_prefetch) is not int or self.max_prefetch < 0:
            raise PlanError(f"gemini: max_prefetch must be a number of chunks >= 0, got "
                            f"{self.max_prefetch!r}")


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


def applies(graph: TaskGraph) -> None:
    if not any(t.kind == "compute" and t.op in UPDATE_OPS and t.device != CPU for t in graph):
        raise PlanError(f"gemini plans training steps: TaskGraph {graph.name!r} has no "
                        f"optimizer update ({', '.join(UPDATE_OPS)}) on a GPU")
    on_cpu = next((t.id for t in graph if t.kind == "compute" and t.device == CPU), None)
    if on_cpu is not None:
        raise PlanError(f"gemini runs every operator on its GPU: vertex {on_cpu!r} of "
                        f"{graph.name!r} runs on the CPU")


def parameters(graph: TaskGraph) -> dict[str, str]:
    """The model tensors, each mapped to its parameter (one of its tensors, the same for all):
    host-resident inputs, and the tensors that optimizer updates read and write, grouped
    with the version each update reads; tensors living on a GPU before the run excluded."""
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


def program(graph: TaskGraph, chunk_size: int) -> Program:
    """Pack each GPU's parameters into chunks in the order the program first touches them."""
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
    chunks: list[Chunk] = []
    filling: dict[str, tuple[Chunk, int]] = {}     # GPU -> its open chunk and its bytes
    for (_, dev), slots in members.items():
        size = max(graph[t].bytes for t, _ in slots)
        chunk, held = filling.get(dev, (None, 0))
        if chunk is None or held + size > chunk_size:
            chunk, held = Chunk(len(chunks), dev), 0
            chunks.append(chunk)
        chunk.slots += slots
        filling[dev] = chunk, held + size
    chunk_of = {slot: chunk for chunk in chunks for slot in chunk.slots}
    compute = [list(dict.fromkeys(chunk_of[s] for s in slots)) for slots in touched]
    for i, used in enumerate(compute):
        for chunk in used:
            chunk.uses.append(i)
    return Program(ops, reads, compute, chunks, chunk_of, readers)


@dataclass(eq=False)
class Copy:
    """A tensor's copy on a GPU: its writer and readers (MemGraph vertices), and its lifetime
    from the event that places it to the one that frees it; :func:`pack` gives its offset."""

    slot: Slot
    size: int
    writer: str
    born: int
    freed: int = NEVER
    readers: list[str] = field(default_factory=list)
    offset: int = 0


class Manager:
    """One iteration of Gemini's manager over the program, in bytes: the warm-up (``peaks``
    None), which samples the non-model peaks into :attr:`peaks`, or the planned iteration,
    which reserves them within ``budget`` bytes per GPU.  Either builds a MemGraph without
    locations and lists the copies it places and frees (:attr:`events`)."""

    def __init__(self, graph: TaskGraph, machine: Machine, options: GeminiOptions,
                 prog: Program, peaks: dict[tuple[int, str], int] | None = None,
                 budget: dict[str, int] | None = None):
        self.g, self.prog, self.options = graph, prog, options
        self.capacity = machine.gpu_memory
        self.warmup = peaks is None
        self.peaks: dict[tuple[int, str], int] = {} if peaks is None else peaks
        gpus = machine.gpu_names()
        self.budget = budget or dict.fromkeys(gpus, self.capacity)
        self.model = dict.fromkeys(gpus, 0)     # model bytes on each GPU
        self.used = dict.fromkeys(gpus, 0)      # all bytes on each GPU
        self.resident: dict[Slot, Copy] = {}
        self.events: list[Copy] = []            # placements and frees, in order
        self.host_copy: dict[str, str] = {}     # tensor -> the MemGraph vertex holding it on host
        self.dead: set[Slot] = set()
        self.kept = set(graph.outputs())
        self.last_op: dict[str, str] = {}       # device -> its operator run last
        self.last_use = [-1] * len(prog.chunks)     # chunk -> the operator that used it last
        self.on_gpu: dict[str, list[Chunk]] = {dev: [] for dev in gpus}
        for chunk in prog.chunks:
            self.on_gpu[chunk.device].append(chunk)
        self.inflight: dict[str, set[Chunk]] = {dev: set() for dev in gpus}  # prefetched, unused
        self.spilled = dict.fromkeys(gpus, 0)   # non-model bytes of each GPU in host RAM
        self.spills = 0                         # non-model tensors moved to host RAM
        self.mg = MemGraph()
        self.sequence = itertools.count()
        self.moves = itertools.count()

    def run(self, hooks: Hooks | None = None) -> MemGraph:
        for task in self.g:
            if task.kind == "input":
                self._add(MemVertex(task.id, "input", task.device, task.bytes, task=task.id))
                if task.device == HOST:
                    self.host_copy[task.id] = task.id
                else:
                    self._place((task.id, task.device), task.id)
        for i in range(len(self.prog.ops)):
            self.step(i)
            if hooks is not None and hooks.progress is not None and not i & 4095:
                hooks.progress(i)
        return self.mg

    def step(self, i: int) -> None:
        """Operator ``i``: make room, bring its COMPUTE chunks in, run it, free what died."""
        t = self.prog.ops[i]
        task = self.g[t]
        devices = list(dict.fromkeys((task.read_device, task.out_device)))
        moves: list[str] = []
        for dev in devices:
            self._make_room(i, dev, moves)
        for chunk in self.prog.compute[i]:
            for slot in self._missing(chunk):
                moves.append(self._load(slot))
            self.inflight[chunk.device].discard(chunk)
        for slot in self.prog.reads[i]:
            if slot not in self.resident:                   # non-model data spilled before
                moves.append(self._load(slot))
                self.spilled[slot[1]] -= self.g[slot[0]].bytes
        ahead: list[str] = []
        if not self.warmup:
            for dev in devices:
                self._prefetch(i, dev, ahead)
        self._add(MemVertex(t, task.kind, task.device, task.bytes, task=t, op=task.op,
                            flops=task.flops, time=task.time))
        self._place((t, task.out_device), t)
        op = self.mg[t]
        op.inputs = tuple([self.resident[(u, task.read_device)].writer for u in task.inputs])
        self.mg.add_edges(op.inputs, t, "data")
        previous = self.last_op.get(task.device)
        if previous is not None:
            self.mg.add_edges([previous], t, "memory")
            for m in moves + ahead:
                self.mg.add_edge(previous, m, "memory")
        self.mg.add_edges(moves, t, "memory")
        self.last_op[task.device] = t
        if self.warmup:
            for dev in devices:
                self.peaks[i, dev] = self.used[dev] - self.model[dev]
        for chunk in self.prog.compute[i]:
            self.last_use[chunk.index] = i
        for slot in self.prog.reads[i]:
            self.resident[slot].readers.append(t)
            if self.prog.readers[slot][-1] == i and slot[0] not in self.kept:
                self._free(slot)
                self.dead.add(slot)

    def _make_room(self, i: int, dev: str, moves: list[str]) -> None:
        """Evict HOLD chunks from ``dev`` until operator ``i``'s COMPUTE chunks fit beside its
        non-model peak; in the warm-up, until they fit within the model data's share of
        memory, or within the operator's own chunks where those exceed it (the cap adapts
        rather than fail), and, with the operator's output, in memory."""
        t = self.prog.ops[i]
        task = self.g[t]
        mine = [c for c in self.prog.compute[i] if c.device == dev]
        incoming = sum(self.g[s[0]].bytes for c in mine for s in c.slots
                       if s not in self.resident and (s[0] == t or self._live(s)))
        if self.warmup:
            output = task.bytes if task.out_device == dev and (t, dev) not in self.prog.chunk_of \
                else 0
            nonmodel = self.used[dev] - self.model[dev] + output
            own = incoming + sum(self.resident[s].size for c in mine for s in c.slots
                                 if s in self.resident)
            cap = max(int(self.options.warmup_share * self.capacity), own)
            room = min(cap, self.capacity - nonmodel) - self.model[dev]
        else:
            back = sum(self.g[u].bytes for u, d in self.prog.reads[i]
                       if d == dev and (u, d) not in self.resident
                       and (u, d) not in self.prog.chunk_of)
            nonmodel = self.peaks[i, dev] - self.spilled[dev] + back
            room = self.budget[dev] - nonmodel - self.model[dev]
        while incoming > room:
            victim = self._victim(i, dev)
            if victim is not None:
                room += self._evict(victim, moves)
                continue
            if self.warmup:             # only statistics: they do not need the operator to fit
                return
            spill = self._spill_victim(i, dev)
            if spill is None:
                self._refuse(i, dev, incoming, nonmodel)
            room += self._to_host(spill, moves)
            self.spilled[dev] += spill.size
            self.spills += 1
            nonmodel -= spill.size

    def _prefetch(self, i: int, dev: str, ahead: list[str]) -> None:
        """GeminiDDP's prefetch: after operator ``i``'s chunks are in, load the chunks of
        ``dev`` needed next (in order of next use) that are in host RAM, while fewer than
        ``max_prefetch`` prefetched chunks are unused and the next one fits beside the
        warm-up's non-model peaks until its use; the first that does not fit ends it.  Its
        loads wait for the GPU's previous operator, not for operator ``i``."""
        slots = self.options.max_prefetch - len(self.inflight[dev])
        if slots <= 0:
            return
        compute = self.prog.compute[i]
        wanted = sorted((_next_use(c, i), c.index, c) for c in self.on_gpu[dev]
                        if c not in compute and c not in self.inflight[dev] and self._missing(c))
        t = self.prog.ops[i]
        output = self.g[t].bytes if (t, dev) in self.prog.chunk_of else 0   # placed after this
        free = self.budget[dev] - self.model[dev] - output
        peak, scanned = 0, i
        for use, _, chunk in wanted[:slots]:
            if use == NEVER:
                return
            for k in range(scanned, use):
                peak = max(peak, self.peaks.get((k, dev), 0))
            scanned = max(scanned, use)
            missing = self._missing(chunk)
            size = sum(self.g[u].bytes for u, _ in missing)
            if size > free - peak:
                return
            ahead.extend(self._load(slot) for slot in missing)
            free -= size
            self.inflight[dev].add(chunk)

    def _missing(self, chunk: Chunk) -> list[Slot]:
        """The chunk's tensors that live, in host RAM only."""
        return [s for s in chunk.slots if s not in self.resident and self._live(s)]

    def _refuse(self, i: int, dev: str, incoming: int, nonmodel: int) -> NoReturn:
        t = self.prog.ops[i]
        chunks = incoming + sum(self.resident[s].size for c in self.prog.compute[i]
                                for s in c.slots if s in self.resident and s[1] == dev)
        lost = self.capacity - self.budget[dev]
        raise PlanError(
            f"operator {t!r} needs {nonmodel} bytes of non-model data and {chunks} bytes of "
            f"chunks on {dev}: more than its {self.capacity} bytes"
            + (f" less {lost} lost to fragmentation" if lost else "")
            + " even with every HOLD chunk and every tensor it does not use in host RAM")

    def _spill_victim(self, i: int, dev: str) -> Copy | None:
        """The non-model tensor of ``dev`` to move to host RAM when moving every HOLD chunk
        there is not enough, or None: of those operator ``i`` does not read, the one read
        again latest (first those never read again, the graph's outputs)."""
        t = self.prog.ops[i]
        reads = set(self.prog.reads[i])
        held = [c for slot, c in self.resident.items()
                if slot[1] == dev and slot not in self.prog.chunk_of and slot not in reads
                and slot[0] != t]
        if not held:
            return None
        return max(held, key=lambda c: (_next_read(self.prog.readers.get(c.slot, []), i),
                                        -c.born))

    def _victim(self, i: int, dev: str) -> Chunk | None:
        """The HOLD chunk of ``dev`` to move to host RAM, or None: in the warm-up the first
        registered (nothing is known of their uses yet); then ``opt``, the one needed latest,
        or ``lru``, the least recently used."""
        compute = self.prog.compute[i]
        held = [c for c in self.prog.chunks if c.device == dev and c not in compute
                and any(s in self.resident for s in c.slots)]
        if not held:
            return None
        if self.warmup:
            return held[0]
        if self.options.eviction == "lru":
            return min(held, key=lambda c: self.last_use[c.index])
        return max(held, key=lambda c: (_next_use(c, i), c.index))

    def _evict(self, chunk: Chunk, moves: list[str]) -> int:
        """Move a chunk's tensors to host RAM, offloading those host RAM lacks; its bytes."""
        self.inflight[chunk.device].discard(chunk)
        return sum(self._to_host(self.resident[slot], moves) for slot in chunk.slots
                   if slot in self.resident)

    def _to_host(self, copy: Copy, moves: list[str]) -> int:
        """Free a tensor's GPU copy, offloading it first unless host RAM holds it; its
        bytes."""
        t, dev = copy.slot
        if t not in self.host_copy:
            off = self._add(MemVertex(f"offload:{t}@{dev}#{next(self.moves)}", "offload",
                                      dev, copy.size, of=t, inputs=(copy.writer,)))
            self.mg.add_edge(copy.writer, off, "data")
            copy.readers.append(off)
            self.host_copy[t] = off
            moves.append(off)
        self._free(copy.slot)
        return copy.size

    def _load(self, slot: Slot) -> str:
        """Bring a chunk's tensor from host RAM: a ``load`` of a host input, else a
        ``reload`` of its offload."""
        t, dev = slot
        source = self.host_copy[t]
        kind = "reload" if self.mg[source].kind == "offload" else "load"
        move = self._add(MemVertex(f"{kind}:{t}@{dev}#{next(self.moves)}", kind, dev,
                                   self.g[t].bytes, of=t, inputs=(source,)))
        self.mg.add_edge(source, move, "data")
        self._place(slot, move)
        return move

    def _place(self, slot: Slot, writer: str) -> None:
        copy = Copy(slot, self.g[slot[0]].bytes, writer, len(self.events))
        self.events.append(copy)
        self.resident[slot] = copy
        self.used[slot[1]] += copy.size
        if slot in self.prog.chunk_of:
            self.model[slot[1]] += copy.size

    def _free(self, slot: Slot) -> None:
        copy = self.resident.pop(slot)
        copy.freed = len(self.events)
        self.events.append(copy)
        self.used[slot[1]] -= copy.size
        if slot in self.prog.chunk_of:
            self.model[slot[1]] -= copy.size

    def _live(self, slot: Slot) -> bool:
        """Whether a chunk's slot holds a tensor now: written (or in host RAM), not yet dead."""
        return slot not in self.dead and (slot in self.resident or slot[0] in self.host_copy)

    def _add(self, v: MemVertex) -> str:
        v.order = next(self.sequence)
        self.mg.add_vertex(v)
        return v.id


def _next_use(chunk: Chunk, i: int) -> int:
    """The first operator after ``i`` that the chunk is COMPUTE for."""
    return _next_read(chunk.uses, i)


def _next_read(uses: list[int], i: int) -> int:
    """The first of ``uses`` (operators, ascending) after ``i``; NEVER if none."""
    k = bisect.bisect_right(uses, i)
    return uses[k] if k < len(uses) else NEVER


def pack(copies: list[Copy]) -> dict[str, int]:
    """Lay out the copies offline, knowing their lifetimes, and return the bytes each GPU then
    needs: on each GPU the better of two first-fit layouts, largest copies first (greedy by
    size) and largest size times lifetime first."""
    need: dict[str, int] = {}
    by_gpu: dict[str, list[Copy]] = {}
    for c in copies:
        by_gpu.setdefault(c.slot[1], []).append(c)
    for dev, mine in by_gpu.items():
        # lifetimes counted in this GPU's events, so that a GPU's layout does not depend on
        # what the others do
        rank = {e: k for k, e in enumerate(sorted({e for c in mine for e in (c.born, c.freed)}))}
        layouts = [_first_fit(mine, lambda c: (-c.size, c.born)),
                   _first_fit(mine, lambda c: (-c.size * (rank[c.freed] - rank[c.born]),
                                               c.born))]
        offsets, need[dev] = min(layouts, key=lambda layout: layout[1])
        for c, offset in zip(mine, offsets):
            c.offset = offset
    return need


def _first_fit(copies: list[Copy], key: Callable[[Copy], tuple[int, int]]
               ) -> tuple[list[int], int]:
    """Each copy's offset when they are placed in the order of ``key``, each at the lowest
    offset that no copy living at the same time holds; and the bytes they take."""
    offsets = [0] * len(copies)
    placed: list[tuple[int, int, int, int]] = []     # (born, freed, offset, end)
    for k in sorted(range(len(copies)), key=lambda k: key(copies[k])):
        c = copies[k]
        offset = 0
        for start, end in sorted((o, e) for b, f, o, e in placed if b < c.freed and c.born < f):
            if start - offset >= c.size:
                break
            offset = max(offset, end)
        offsets[k] = offset
        placed.append((c.born, c.freed, offset, offset + c.size))
    return offsets, max(end for *_, end in placed)


def locate(manager: Manager, capacity: int) -> None:
    """Give each copy's writer its location, replaying the placements and frees on each GPU's
    allocator: a writer waits for the readers of whatever it overwrites (memory edges)."""
    mg = manager.mg
    memory = {dev: GpuMemory(dev, capacity) for dev in manager.used}
    for k, copy in enumerate(manager.events):
        dev = copy.slot[1]
        if k == copy.freed:
            memory[dev].release(copy, copy.offset, tuple(copy.readers) or (copy.writer,), k)
            continue
        covered = memory[dev].place(copy.offset, copy.size, copy)
        mg.add_edges([g for segment in covered for g in segment.guard], copy.writer, "memory")
        mg[copy.writer].loc = Loc(dev, copy.offset, copy.size)


def fitted(graph: TaskGraph, machine: Machine, options: GeminiOptions, prog: Program,
           peaks: dict[tuple[int, str], int], hooks: Hooks) -> Manager:
    """The planned iteration within the largest budget per GPU (to 1/64 of its memory) whose
    layout fits: the whole memory, or, stepping down by the layout's excess and then
    bisecting, less.  GPUs are independent: each one's plan depends on its budget alone."""
    cap = machine.gpu_memory
    budget = dict.fromkeys(machine.gpu_names(), cap)
    fits: dict[str, int] = {}        # per GPU: the largest budget tried whose layout fits
    fails: dict[str, int] = {}       # per GPU: the smallest budget tried whose layout does not
    while True:
        planned = Manager(graph, machine, options, prog, peaks, dict(budget))
        planned.run(hooks)
        need = pack([c for k, c in enumerate(planned.events) if k == c.born])
        settled = True
        for dev, n in need.items():
            (fits if n <= cap else fails)[dev] = budget[dev]
            if n > cap and fits.get(dev, -1) >= budget[dev]:
                del fits[dev]       # no longer fits where it did: step down again
            if dev not in fails:
                continue
            if dev not in fits:
                budget[dev] -= max(n - cap, cap // 64)
            elif fails[dev] - fits[dev] > cap // 64:
                budget[dev] = (fits[dev] + fails[dev]) // 2
            else:
                budget[dev] = fits[dev]
            settled = settled and n <= cap and budget[dev] == fits[dev]
        if settled:
            return planned


@register("gemini", GeminiOptions, applies=applies)
def gemini(graph: TaskGraph, machine: Machine, options: GeminiOptions, hooks: Hooks) -> MemGraph:
    """Colossal-AI Gemini: chunks of model data paged in on demand in program order, room made
    for each operator's warm-up-sampled non-model peak by evicting the chunk needed latest."""
    prog = program(graph, options.chunk_size)
    warmup = Manager(graph, machine, options, prog)
    warmup.run()
    try:
        planned = fitted(graph, machine, options, prog, warmup.peaks, hooks)
    except PlanError:
        if not options.max_prefetch:
            raise
        # prefetch is best effort: where its layout does not fit, load on demand
        planned = fitted(graph, machine, replace(options, max_prefetch=0), prog, warmup.peaks,
                         hooks)
    planned.mg.graph["prefetched"] = planned.options.max_prefetch > 0
    locate(planned, machine.gpu_memory)
    planned.mg.graph["chunks"] = len(prog.chunks)
    planned.mg.graph["spills"] = planned.spills
    return planned.mg
