"""Gemini's manager: one iteration over the program, in bytes.

The chunk states ("StatefulTensorMgr"), prefetch (GeminiDDP's ``max_prefetch``), the warm-up
("Design Details", "MemStatsCollector", "Tensor Eviction Strategy") and the planned iteration
placed by its statistics (the page's S2): docs/gemini.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NoReturn

from ...core.devices import HOST
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import Loc, MemGraph, MemVertex
from ...core.taskgraph import TaskGraph
from ..allocator import PINNED, GpuMemory
from ..registry import Hooks
from .chunks import NEVER, Chunk, Program, Slot, next_read, next_use
from .held import Held, Key
from .options import GeminiOptions


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


BIG = 2**59     # beyond any operator's position; below PINNED


class Fragmented(PlanError):
    """No range of a GPU's memory can hold a tensor operator ``i`` needs, even evicting all
    that :class:`Victims` lets go: the operator's own tensors split the free memory."""

    def __init__(self, message: str, device: str):
        super().__init__(message)
        self.device = device


@dataclass(frozen=True)
class Victims:
    """Which copies the planned pass that lays out as it decides may evict to find a place
    for a tensor operator ``i`` needs (the allocator's
    :class:`~offloadlab.planner.allocator.Victims`): HOLD chunks (a chunk moves whole), worst
    those needed soonest (``opt``) or used last (``lru``); then non-model tensors the operator
    does not use, worst those read again soonest; nothing else."""

    manager: Manager
    i: int

    def badness(self, owner: Copy) -> int:
        """How bad evicting ``owner`` is; PINNED if operator ``i`` uses it.

        Parameters
        ----------
        owner : Copy
            A copy in the way.

        Returns
        -------
        int
            Its badness, from the allocator's LEAST up.
        """
        m, i = self.manager, self.i
        chunk = m.prog.chunk_of.get(owner.slot)
        if chunk is not None:
            if chunk in m.prog.compute[i]:
                return PINNED
            if m.options.eviction == "lru":
                return m.last_use[chunk.index] - BIG
            return -min(next_use(chunk, i), BIG)
        if owner.slot in m.prog.reads[i] or owner.slot[0] == m.prog.ops[i]:
            return PINNED
        return BIG - min(next_read(m.prog.readers.get(owner.slot, []), i), BIG // 2)

    def moved(self, owner: Copy) -> int:
        """The bytes evicting ``owner`` moves: none where host RAM holds it already.

        Parameters
        ----------
        owner : Copy
            A copy in the way.

        Returns
        -------
        int
            Bytes.
        """
        return 0 if owner.slot[0] in self.manager.host_copy else owner.size


class Manager:
    """One iteration of Gemini's manager over the program, in bytes: the warm-up (``peaks``
    None), which samples the non-model peaks into :attr:`peaks`, or the planned iteration,
    which reserves them within ``budget`` bytes per GPU.  Either builds a MemGraph and lists
    the copies it places and frees (:attr:`events`); without ``located`` its vertices have no
    locations (:mod:`.layout` gives them), with it the planned pass lays each copy out as it
    places it, evicting what lies in the way where no free range holds it."""

    def __init__(self, graph: TaskGraph, machine: Machine, options: GeminiOptions,
                 prog: Program, peaks: dict[tuple[int, str], int] | None = None,
                 budget: dict[str, int] | None = None, located: bool = False):
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
        self.held = Held(prog.chunks, self._order)  # HOLD candidates, in order of eviction
        self.on_gpu: dict[str, list[Chunk]] = {dev: [] for dev in gpus}
        for chunk in prog.chunks:
            self.on_gpu[chunk.device].append(chunk)
        self.inflight: dict[str, set[Chunk]] = {dev: set() for dev in gpus}  # prefetched, unused
        self.spilled = dict.fromkeys(gpus, 0)   # non-model bytes of each GPU in host RAM
        self.spills = 0                         # non-model tensors moved to host RAM
        self.mg = MemGraph()
        self.sequence = itertools.count()
        self.moves = itertools.count()
        self.memory = {dev: GpuMemory(dev, self.capacity) for dev in gpus} if located else None
        self.now = -1                   # the operator being planned
        self.moving: list[str] = []     # its moves so far (evictions to lay a copy out join)

    def run(self, hooks: Hooks | None = None) -> MemGraph:
        """Run the iteration: the inputs placed, then every operator in program order.

        Parameters
        ----------
        hooks : Hooks or None
            Its ``progress`` is called every 4096 operators.

        Returns
        -------
        MemGraph
            The iteration's MemGraph (also :attr:`mg`).

        Raises
        ------
        PlanError
            Naming an operator that cannot run even with every HOLD chunk and every
            non-model tensor it does not use in host RAM.
        """
        for task in self.g:
            if task.kind == "input":
                vertex = MemVertex(task.id, "input", task.device, task.bytes, task=task.id)
                if task.device == HOST:
                    self.host_copy[task.id] = self._add(vertex)
                else:
                    self._place((task.id, task.device), vertex)
        for i in range(len(self.prog.ops)):
            self.step(i)
            if hooks is not None and hooks.progress is not None and not i & 4095:
                hooks.progress(i)
        return self.mg

    def step(self, i: int) -> None:
        """Operator ``i``: make room, bring its COMPUTE chunks in, run it, free what died.

        Parameters
        ----------
        i : int
            The operator's index in the program.

        Raises
        ------
        PlanError
            Naming the operator where it cannot run even with every HOLD chunk and every
            non-model tensor it does not use in host RAM.
        """
        t = self.prog.ops[i]
        task = self.g[t]
        devices = list(dict.fromkeys((task.read_device, task.out_device)))
        moves: list[str] = []
        self.now, self.moving = i, moves
        for dev in devices:
            self._make_room(i, dev, moves)
        ahead: list[str] = []
        try:
            self._bring_and_run(i, devices, ahead)
        except Fragmented as e:
            self._flush(e.device)
            self._bring_and_run(i, devices, ahead)
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
            self.held.rekey(chunk)
        for slot in self.prog.reads[i]:
            self.resident[slot].readers.append(t)
            if self.prog.readers[slot][-1] == i and slot[0] not in self.kept:
                self._free(slot)
                self.dead.add(slot)

    def _bring_and_run(self, i: int, devices: list[str], ahead: list[str]) -> None:
        """Bring operator ``i``'s COMPUTE chunks and the non-model tensors it reads that are
        in host RAM, prefetch (into ``ahead``), and place its output."""
        t = self.prog.ops[i]
        task = self.g[t]
        for chunk in self.prog.compute[i]:
            for slot in self._missing(chunk):
                self.moving.append(self._load(slot))
            self.inflight[chunk.device].discard(chunk)
        for slot in self.prog.reads[i]:
            if slot not in self.resident:                   # non-model data spilled before
                self.moving.append(self._load(slot))
                self.spilled[slot[1]] -= self.g[slot[0]].bytes
        if not self.warmup:
            for dev in devices:
                self._prefetch(i, dev, ahead)
        self._place((t, task.out_device), MemVertex(t, task.kind, task.device, task.bytes,
                                                    task=t, op=task.op, flops=task.flops,
                                                    time=task.time))

    def _flush(self, dev: str) -> None:
        """Move everything on ``dev`` to host RAM (the operator's own tensors come back
        after, laid out in the emptied memory): the way out where they split it."""
        for copy in [c for slot, c in self.resident.items() if slot[1] == dev]:
            if self.resident.get(copy.slot) is not copy:
                continue                    # gone with its chunk
            chunk = self.prog.chunk_of.get(copy.slot)
            if chunk is not None:
                self._evict(chunk, self.moving)
            else:
                self._spill(copy)

    def _spill(self, copy: Copy) -> None:
        """Move a non-model tensor to host RAM until its next reader."""
        self._to_host(copy, self.moving)
        self.spilled[copy.slot[1]] += copy.size
        self.spills += 1

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
            self._spill(spill)
            room += spill.size
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
        wanted = sorted((next_use(c, i), c.index, c) for c in self.on_gpu[dev]
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
            if size > free - peak or not self._free_ranges_hold(dev, missing):
                return
            ahead.extend(self._load(slot) for slot in missing)
            free -= size
            self.inflight[dev].add(chunk)

    def _free_ranges_hold(self, dev: str, slots: list[Slot]) -> bool:
        """Whether free memory of ``dev`` holds these tensors, placed one after the other
        (always, laying out offline): a prefetch evicts nothing."""
        if self.memory is None:
            return True
        memory = self.memory[dev]
        trial: list[tuple[object, int, list]] = []
        for u, _ in slots:
            offset = memory.find_free(self.g[u].bytes)
            if offset is None:
                break
            marker = object()
            trial.append((marker, offset, memory.place(offset, self.g[u].bytes, marker)))
        for marker, offset, covered in reversed(trial):
            memory.restore(marker, offset, covered)
        return len(trial) == len(slots)

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
        return max(held, key=lambda c: (next_read(self.prog.readers.get(c.slot, []), i),
                                        -c.born))

    def _victim(self, i: int, dev: str) -> Chunk | None:
        """The HOLD chunk of ``dev`` to move to host RAM, or None: in the warm-up the first
        registered (nothing is known of their uses yet); then ``opt``, the one needed latest,
        or ``lru``, the least recently used (ties: the first registered)."""
        return self.held.first(dev, self.prog.compute[i])

    def _order(self, chunk: Chunk) -> Key:
        """The chunk's rank among :meth:`_victim`'s candidates, least evicted first: up to its
        next use, ``opt``'s next use is the one after the operator that used it last."""
        if self.warmup:
            return (chunk.index,)
        if self.options.eviction == "lru":
            return (self.last_use[chunk.index], chunk.index)
        return (-next_use(chunk, self.last_use[chunk.index]), -chunk.index)

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
        move = self._place(slot, MemVertex(f"{kind}:{t}@{dev}#{next(self.moves)}", kind, dev,
                                           self.g[t].bytes, of=t, inputs=(source,)))
        self.mg.add_edge(source, move, "data")
        return move

    def _place(self, slot: Slot, vertex: MemVertex) -> str:
        """Place a tensor's copy on its GPU, written by ``vertex`` (added here, after any
        eviction its place needs); its id."""
        size = self.g[slot[0]].bytes
        offset = 0 if self.memory is None else self._lay_out(slot, size)
        writer = self._add(vertex)
        copy = Copy(slot, size, writer, len(self.events), offset=offset)
        self.events.append(copy)
        self.resident[slot] = copy
        self.used[slot[1]] += copy.size
        chunk = self.prog.chunk_of.get(slot)
        if chunk is not None:
            self.model[slot[1]] += copy.size
            self.held.arrive(chunk)
        if self.memory is not None:
            covered = self.memory[slot[1]].place(offset, size, copy)
            self.mg.add_edges([g for segment in covered for g in segment.guard], writer,
                              "memory")
            vertex.loc = Loc(slot[1], offset, size)
        return writer

    def _lay_out(self, slot: Slot, size: int) -> int:
        """The offset of a new copy of ``slot``: a free range, or else the range whose
        occupants :class:`Victims` lets go least reluctantly, which move to host RAM first."""
        assert self.memory is not None
        dev, i = slot[1], self.now
        memory = self.memory[dev]
        offset = memory.find_free(size)
        if offset is not None:
            return offset
        if i < 0:
            raise PlanError(f"no place for input {slot[0]!r} ({size} bytes) on {dev}: the "
                            f"inputs living on it exceed its {self.capacity} bytes")
        found = memory.find_victims(size, Victims(self, i))
        if found is None:
            raise Fragmented(f"no place for {slot[0]!r} ({size} bytes) on {dev}: the tensors "
                             f"operator {self.prog.ops[i]!r} uses split its free memory", dev)
        offset, victims = found
        for victim in victims:
            if victim.slot not in self.resident or self.resident[victim.slot] is not victim:
                continue            # gone with a chunk evicted before it
            held = self.prog.chunk_of.get(victim.slot)
            if held is not None:
                self._evict(held, self.moving)
            else:
                self._spill(victim)
        return offset

    def _free(self, slot: Slot) -> None:
        copy = self.resident.pop(slot)
        copy.freed = len(self.events)
        if self.memory is not None:
            self.memory[slot[1]].release(copy, copy.offset, tuple(copy.readers) or
                                         (copy.writer,), copy.freed)
        self.events.append(copy)
        self.used[slot[1]] -= copy.size
        chunk = self.prog.chunk_of.get(slot)
        if chunk is not None:
            self.model[slot[1]] -= copy.size
            self.held.leave(chunk)

    def _live(self, slot: Slot) -> bool:
        """Whether a chunk's slot holds a tensor now: written (or in host RAM), not yet dead."""
        return slot not in self.dead and (slot in self.resident or slot[0] in self.host_copy)

    def _add(self, v: MemVertex) -> str:
        v.order = next(self.sequence)
        self.mg.add_vertex(v)
        return v.id

