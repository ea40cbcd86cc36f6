"""BuildMemGraph (TURNIP Figs. 8-9), generalised to variable-sized tensors.

The TaskGraph is "executed" in a serial order V while two horizons advance: ``alloc_hzn``
(every item before it has GPU memory) and ``exec_hzn`` (every item before it has run).
Allocation is pushed ahead of execution, so that the runtime may later run vertices out of
the serial order: as far as memory allows in the paper, and here (``reserve`` > 0) only while
the GPU keeps room for what executing needs, so that allocating ahead never forces out what
the next vertices read.  Memory comes from :class:`GpuMemory`, a real
offset allocator: an allocation may overlap several former occupants (memory edges from all
of their readers) and an eviction may need several victims.

Items of V are ``(tensor, gpu)`` pairs: the output of a compute/transfer vertex on its GPU,
or the copy of a host-resident tensor that a ``load`` vertex brings to a GPU (placed just
before its first reader there).  GPU-resident inputs are placed before the run.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..core.devices import HOST
from ..core.errors import PlanError
from ..core.machine import Machine
from ..core.memgraph import Loc, MemGraph, MemVertex
from ..core.taskgraph import TaskGraph
from ..core.util import no_gc
from .allocator import LEAST, PINNED, GpuMemory, Segment

Slot = tuple[str, str]  # (TaskGraph vertex whose tensor it is, GPU)
NEVER = 2**60           # the next use of a tensor not read again (a short int, compiled)
VICTIMS = ("belady", "cost", "lru")   # victim policies, the default first
SCALE = 20              # fixed-point bits of the ``cost`` victim policy's bytes per item
NO_USES: list[int] = []  # the uses of a tensor not read on its GPU (shared, never changed)


@dataclass(slots=True, eq=False, init=False)
class Resident:
    """A tensor's copy on a GPU: where it is, which MemGraph vertex writes it, who read it.
    It is its memory's occupant in the allocator."""

    slot: Slot
    loc: Loc
    size: int                 # loc.size, kept in the object (the victim search reads it)
    writer: str
    item: int                 # the V item that allocated it (-1: placed before the run)
    materialized: bool
    clean: bool               # host RAM has a copy (only a tensor with one can be on two GPUs)
    last_use: int
    uses: list[int]           # the items that read it, ascending (BuildMemGraph.uses)
    covered: list[Segment]    # the free segments it replaced
    readers: list[str]
    next_use: int             # cache of the first item after execution that reads it
    pin: int                  # the victim search that must spare it (_costs)

    # written out: compiled, it is native code, where dataclass's generated one is interpreted
    def __init__(self, slot: Slot, loc: Loc, writer: str, item: int, materialized: bool,
                 clean: bool, last_use: int, uses: list[int]):
        self.slot, self.loc, self.size, self.writer, self.item = slot, loc, loc.size, writer, item
        self.materialized, self.clean, self.last_use, self.uses = \
            materialized, clean, last_use, uses
        self.covered, self.readers, self.next_use, self.pin = [], [], -1, -1


class OverBudget(Exception):
    """A run given a ``budget`` has moved that many bytes to or from host RAM: a plan that
    would only be kept if it moved fewer is abandoned there."""


def check_victim(victim: str) -> None:
    """Raise :class:`PlanError` unless ``victim`` is one of :data:`VICTIMS`."""
    if victim not in VICTIMS:
        raise PlanError(f"unknown victim policy {victim!r}; use {', '.join(VICTIMS)}")


class BuildMemGraph:
    """One run of the algorithm; :func:`buildmemgraph` is the registered entry point."""

    def __init__(self, graph: TaskGraph, machine: Machine, order: Sequence[str],
                 victim: str, ahead: bool, progress: Callable[[int], None] | None = None,
                 reserve: float = 0.0, budget: int | None = None):
        check_victim(victim)
        self.g, self.machine, self.victim, self.ahead = graph, machine, victim, ahead
        self.reserve = reserve
        self.room: dict[str, int] = {}          # GPU -> free bytes allocating ahead leaves
        self.task = graph.tasks
        self.mg = MemGraph()
        self.memory = {d: GpuMemory(d, machine.gpu_memory) for d in machine.gpu_names()}
        self.resident: dict[Slot, Resident] = {}
        self.host_copy: dict[str, str] = {}     # tensor -> MemGraph vertex holding it on host
        self.items: list[Slot] = []
        self.allocated: set[int] = set()
        self.uses: dict[Slot, list[int]] = {}   # slot -> items that read it there, ascending
        self.out, self.read = placement(graph)
        self.outputs = set(graph.outputs())
        self.host_read = {u for t, task in graph.tasks.items() if self.read[t] == HOST
                          for u in task.inputs}
        self.kept = self.outputs | self.host_read   # needed later even with no GPU reader
        self.item_writer: dict[int, str] = {}   # item -> the MemGraph vertex that wrote it
        self.item_load: list[bool] = []         # item -> whether it is a load (from host RAM)
        self.item_bytes: list[int] = []         # item -> the bytes it allocates
        self.item_reads: list[tuple[Slot, ...]] = []  # item -> the GPU slots it reads
        self.moves = 0
        self.repacks = 0                        # times a GPU was cleared and repacked
        self.repacked = 0                       # bytes those repacks evicted
        self.refetched = 0                      # bytes brought back after an eviction
        self.moved = 0                          # bytes moved to or from host RAM so far
        self.budget = budget                    # raise OverBudget when moved reaches it
        self.sequence = itertools.count()   # the MemGraph order of each vertex
        self.searches = 0                   # victim searches so far (Resident.pin)
        self.exec_hzn = 0
        self.alloc_hzn = 0
        self.order = order
        self.progress = progress    # hears how many TaskGraph vertices are planned

    # -- V: the serial list of items -----------------------------------------------------
    def _build_items(self) -> None:
        """Host-resident tensors listed in the serial order are loaded there, onto every GPU
        that reads them; the others just before their first reader on each GPU."""
        tasks, succ, out, read, gpus = self.g.tasks, self.g.succ, self.out, self.read, self.memory
        items, item_reads, item_bytes = self.items, self.item_reads, self.item_bytes
        item_load, loaded = self.item_load, set()
        for t in self.order:
            task = tasks[t]
            if task.kind == "input":
                if task.device == HOST:
                    for dev in dict.fromkeys(read[w] for w in succ[t]):
                        if dev in gpus and (t, dev) not in loaded:
                            loaded.add((t, dev))
                            items.append((t, dev))
                            item_reads.append(())
                            item_bytes.append(task.bytes)
                            item_load.append(True)
                continue
            dev = read[t]
            reads = tuple([(u, dev) for u in dict.fromkeys(task.inputs)]) if dev in gpus else ()
            for slot in reads:
                if out[slot[0]] == HOST and slot not in loaded:
                    loaded.add(slot)               # a load, before its first reader
                    items.append(slot)
                    item_reads.append(())
                    item_bytes.append(tasks[slot[0]].bytes)
                    item_load.append(True)
            items.append((t, out[t]))
            item_reads.append(reads)
            item_bytes.append(task.bytes)
            item_load.append(False)
        uses = self.uses
        for i, reads in enumerate(item_reads):
            for slot in reads:
                if slot in uses:
                    uses[slot].append(i)
                else:
                    uses[slot] = [i]

    # -- Figure 8 -------------------------------------------------------------------------
    def run(self) -> MemGraph:
        with no_gc():
            return self._run()

    def _run(self) -> MemGraph:
        self._build_items()
        self._check_fits()
        self._place_gpu_inputs()
        n, allocated, ahead = len(self.items), self.allocated, self.ahead
        sim_malloc_item, execute, progress = self.sim_malloc_item, self.execute, self.progress
        has_room = self.has_room
        total = len(self.g)
        while self.exec_hzn < n:
            a, e = self.alloc_hzn, self.exec_hzn
            if a < n and (a in allocated or ((a == e or ahead and has_room(a))
                                             and sim_malloc_item(a))):
                self.alloc_hzn = a + 1       # allocated space for a future result
            elif a == e:
                self.sim_malloc_offload_item(a)   # cannot allocate for the next execution
                self.alloc_hzn = a + 1
            else:
                execute(e)                   # simulate execution of the next item
                self.exec_hzn = e + 1
                if progress is not None and not e & 4095:
                    progress(e * total // n)
        return self.mg

    def _check_fits(self) -> None:
        """Refuse a vertex that cannot fit its GPU; size each GPU's room (``reserve`` times
        the most a vertex holds there at once)."""
        cap, room = self.machine.gpu_memory, self.room
        for vertex, dev, nbytes in memory_needs(self.g, self.out, self.read):
            if nbytes > cap:
                what = (f"vertex {vertex!r} (its output and inputs)" if vertex is not None
                        else f"the inputs living on {dev}")
                raise PlanError(f"{what} need(s) {nbytes} bytes on {dev} but {dev} has a "
                                f"capacity of {cap} bytes")
            if vertex is not None:
                room[dev] = max(room.get(dev, 0), int(self.reserve * nbytes))

    def has_room(self, i: int) -> bool:
        """Whether item ``i`` may be allocated ahead of execution: its GPU keeps at least its
        room free after it (the bound on looking ahead; room 0 is the paper's "as far as
        memory allows")."""
        dev = self.items[i][1]
        memory = self.memory.get(dev)
        return memory is None or memory.free - self.item_bytes[i] >= self.room.get(dev, 0)

    def _place_gpu_inputs(self) -> None:
        for task in self.g:
            if task.kind == "input":
                self.mg.add_vertex(MemVertex(task.id, "input", task.device, task.bytes,
                                             task=task.id, order=next(self.sequence)))
                if task.device == HOST:
                    self.host_copy[task.id] = task.id
                else:
                    offset = self.memory[task.device].find_free(task.bytes)
                    assert offset is not None     # _check_fits: a GPU's inputs fit together
                    self._occupy((task.id, task.device), task.bytes, offset, task.id, -1,
                                 materialized=True)

    # -- Figure 9: the malloc variants -----------------------------------------------------
    def sim_malloc(self, slot: Slot, nbytes: int, writer_for, item: int) -> Resident | None:
        """Find free memory for ``slot``; add memory edges from the guards it overwrites."""
        offset = self.memory[slot[1]].find_free(nbytes)
        if offset is None:
            return None
        return self._occupy(slot, nbytes, offset, writer_for, item)

    def sim_malloc_offload(self, slot: Slot, nbytes: int, writer_for, item: int,
                           pinned: set[Slot]) -> Resident:
        """Evict the victims whose earliest next use is latest (``belady``) or least recently
        used (``lru``), offloading those with no copy in host RAM; cannot fail."""
        memory = self.memory[slot[1]]
        found = memory.find_victims(nbytes, self._costs(pinned))
        # If the pinned tensors fragment memory, clear the GPU and repack from offset 0
        # (execute() then brings back whatever pinned tensor this evicted).
        offset, victims = found or (0, memory.owners())
        if found is None:
            self.repacks += 1
            self.repacked += sum(res.size for res in victims)
        for res in victims:
            self.sim_free(res, evict=True)
        return self._occupy(slot, nbytes, offset, writer_for, item)

    def sim_malloc_force_reload(self, slot: Slot, pinned: set[Slot]) -> Resident:
        """Bring an evicted tensor back for the vertex about to run (a reload or a load)."""
        t, dev = slot
        source = self.host_copy[t]
        kind = "reload" if self.mg[source].kind == "offload" else "load"
        nbytes = self.task[t].bytes
        self.refetched += nbytes
        res = self.sim_malloc(slot, nbytes, (kind, source), -1)
        if res is None:
            res = self.sim_malloc_offload(slot, nbytes, (kind, source), -1, pinned)
        return res

    def sim_free(self, res: Resident, evict: bool = False) -> None:
        """Free (or, with ``evict``, evict) a resident copy.  A materialized copy that is not
        yet in host RAM and is needed later is offloaded first; a copy whose writer has not
        run yet is retracted and its item re-allocated later."""
        t, dev = res.slot
        memory = self.memory[dev]
        del self.resident[res.slot]
        if not res.materialized:
            memory.restore(res, res.loc.offset, res.covered)
            self.allocated.discard(res.item)
            self.alloc_hzn = min(self.alloc_hzn, res.item)
            return
        if evict and not res.clean and (t in self.kept or self._next_use(
                res.slot, self.exec_hzn - 1) is not None):
            self._offload(res)
        guard = tuple(res.readers) if res.readers else (res.writer,)
        memory.release(res, res.loc.offset, guard, self.exec_hzn)

    # -- items ------------------------------------------------------------------------------
    def sim_malloc_item(self, i: int) -> bool:
        slot = t, dev = self.items[i]
        if dev not in self.memory:
            self._add_task_vertex(t, None)         # a CPU vertex: its output lives on host
            self.allocated.add(i)
            return True
        if self.item_load[i] and t not in self.host_copy:
            return False                           # a CPU result cannot load before it exists
        return self.sim_malloc(slot, self.item_bytes[i], self._writer_for(i), i) is not None

    def sim_malloc_offload_item(self, i: int) -> None:
        slot = self.items[i]
        if slot[1] in self.memory:
            self.sim_malloc_offload(slot, self.item_bytes[i], self._writer_for(i), i,
                                    self._pinned(i))
        else:
            self.sim_malloc_item(i)

    def _writer_for(self, i: int):
        """The MemGraph writer of item ``i``: its TaskGraph vertex, or a load from host RAM."""
        t = self.items[i][0]
        return ("load", self.host_copy[t]) if self.item_load[i] else t

    def _pinned(self, i: int) -> set[Slot]:
        """What evictions for item ``i`` must spare: its output and its inputs."""
        return {self.items[i], *self.item_reads[i]}

    def execute(self, i: int) -> None:
        """Simulate item ``i``: reload evicted inputs, add data edges, free dead tensors."""
        if self.item_load[i]:         # a load: it ran when its memory was allocated
            return
        output = self.items[i]
        t = output[0]
        reads, resident = self.item_reads[i], self.resident
        if i not in self.allocated or not all(map(resident.__contains__, reads)):
            pinned = self._pinned(i)
            while True:               # reloads evict each other only through the repack path
                if i not in self.allocated:
                    self.sim_malloc_offload_item(i)
                for slot in reads:
                    if slot not in resident:
                        self.sim_malloc_force_reload(slot, pinned)
                if i in self.allocated and all(slot in resident for slot in reads):
                    break
        if reads:
            source = {}
            for slot in reads:
                res = resident[slot]
                res.readers.append(t)
                res.last_use = i
                source[slot[0]] = res.writer
            inputs = tuple([source[u] for u in self.task[t].inputs])
        else:
            inputs = tuple([self._ensure_host_copy(u) for u in self.task[t].inputs])
        self.mg.add_edges(inputs, t, "data")
        v = self.mg.vertices[t]
        v.inputs, v.order = inputs, next(self.sequence)
        written = resident.get(output)
        if written is not None:
            written.materialized = True
        else:
            self.host_copy[t] = t
        uses, host_copy = self.uses, self.host_copy
        for slot in reads:
            u = slot[0]
            if uses[slot][-1] == i and u not in self.outputs \
                    and (u in host_copy or u not in self.host_read):
                self.sim_free(resident[slot])     # its last reader has run

    # -- helpers ----------------------------------------------------------------------------
    def _occupy(self, slot: Slot, nbytes: int, offset: int, writer_for, item: int,
                materialized: bool = False) -> Resident:
        """Place ``slot`` (``nbytes``) at ``offset``; its writer waits for the guards of the
        bytes it covers."""
        t, dev = slot
        loc = Loc(dev, offset, nbytes)
        exec_hzn = self.exec_hzn
        res = Resident(slot, loc, "", item, materialized, t in self.host_copy,
                       item if item > exec_hzn else exec_hzn, self.uses.get(slot, NO_USES))
        covered = res.covered = self.memory[dev].place(offset, nbytes, res)
        mg = self.mg
        if isinstance(writer_for, tuple):          # a load or reload, created now
            kind, source = writer_for
            writer = f"{kind}:{t}@{dev}#{self.moves}"
            self.moves += 1
            self._count_moved(nbytes)
            mg.add_vertex(MemVertex(writer, kind, dev, nbytes, loc=loc, of=t,
                                    inputs=(source,), order=next(self.sequence)))
            mg.add_edge(source, writer, "data")
            res.materialized = True
        else:
            writer = writer_for
            self._add_task_vertex(t, loc)
        mg.add_edges([guard for segment in covered for guard in segment.guard], writer, "memory")
        res.writer = writer
        self.resident[slot] = res
        if item >= 0:
            self.allocated.add(item)
            self.item_writer[item] = writer
        return res

    def _add_task_vertex(self, t: str, loc: Loc | None) -> None:
        v = self.mg.vertices.get(t)
        if v is None:
            task = self.task[t]
            v = self.mg.add_vertex(MemVertex(t, task.kind, task.device, task.bytes, task=t,
                                             op=task.op, flops=task.flops, time=task.time))
        v.loc = loc

    def _offload(self, res: Resident) -> None:
        t, dev = res.slot
        off = f"offload:{t}@{dev}#{self.moves}"
        self.moves += 1
        self._count_moved(res.size)
        self.mg.add_vertex(MemVertex(off, "offload", dev, res.size, of=t,
                                     inputs=(res.writer,), order=next(self.sequence)))
        self.mg.add_edge(res.writer, off, "data")
        res.readers.append(off)
        res.clean = True
        self.host_copy[t] = off

    def _count_moved(self, nbytes: int) -> None:
        self.moved += nbytes
        if self.budget is not None and self.moved >= self.budget:
            raise OverBudget(f"moved {self.moved} bytes, the budget is {self.budget}")

    def _ensure_host_copy(self, t: str) -> str:
        """A CPU vertex reads ``t`` from host RAM: offload a GPU copy if needed."""
        if t not in self.host_copy:
            res = next(r for r in self.resident.values() if r.slot[0] == t and r.materialized)
            self._offload(res)
        return self.host_copy[t]

    def _next_use(self, slot: Slot, after: int | None = None) -> int | None:
        """The first item after ``after`` (default: the one executing) that reads ``slot``."""
        uses = self.uses.get(slot, ())
        k = bisect.bisect_right(uses, self.exec_hzn if after is None else after)
        return uses[k] if k < len(uses) else None

    def _costs(self, pinned: set[Slot]) -> Eviction:
        """The costs of evicting each resident now (:class:`Eviction`), sparing the
        ``pinned``, whom it finds by a stamp (the victim search asks about every resident)."""
        self.searches += 1
        stamp = self.searches
        for slot in pinned:
            pin = self.resident.get(slot)
            if pin is not None:
                pin.pin = stamp
        return Eviction(self.victim, self.exec_hzn, stamp, self.kept, len(self.items))


class Eviction:
    """The cost of evicting a resident at item ``now`` (the allocator's :class:`Victims`):
    the victim search minimises a window's worst badness, then the bytes it moves.

    ``belady`` (the paper's rule): badness is minus the next use (the furthest is evicted
    first), bytes are those to offload.  ``lru``: badness is the last use.  ``cost``: no
    badness; "bytes" are the bytes the eviction makes move (an offload unless host RAM has a
    copy, and a reload if the tensor is read again) divided by how many items away its next
    use is, summed over the window: with equal sizes and every victim dirty this is Belady's
    rule, but a clean tensor (a weight, or a reload not written since) costs half a dirty
    one, a big tensor more than a small one, and a copy not needed again only its offload.
    Retracting an allocation made ahead moves nothing (``cost``: free); its "use" is when
    its item comes.  Residents stamped ``stamp`` are pinned."""

    def __init__(self, victim: str, now: int, stamp: int, kept: set[str], horizon: int):
        self.by_cost, self.lru = victim == "cost", victim == "lru"
        self.now, self.stamp, self.kept, self.horizon = now, stamp, kept, horizon

    def badness(self, owner: Resident) -> int:
        if owner.pin == self.stamp:
            return PINNED
        if self.by_cost:
            return 0
        if self.lru:
            return owner.last_use
        if not owner.materialized:
            return -owner.item
        nxt = self.next_use(owner)
        return LEAST if nxt == NEVER else -nxt

    def moved(self, owner: Resident) -> int:
        if not owner.materialized:
            return 0
        offload = 0 if owner.clean else owner.size
        if not self.by_cost:
            return offload
        now, nxt = self.now, self.next_use(owner)
        if nxt == NEVER:
            if owner.slot[0] not in self.kept:
                return 0
            return (offload << SCALE) // max(1, self.horizon - now)
        return ((offload + owner.size) << SCALE) // (nxt - now)

    def next_use(self, res: Resident) -> int:
        """The first item after ``now`` that reads ``res`` (:data:`NEVER` if none), cached
        on it until that item has passed."""
        nxt = res.next_use
        if nxt <= self.now:
            used = res.uses
            k = bisect.bisect_right(used, self.now)
            nxt = res.next_use = used[k] if k < len(used) else NEVER
        return nxt


def placement(graph: TaskGraph) -> tuple[dict[str, str], dict[str, str]]:
    """Where each vertex's output lives and where it reads its inputs
    (:attr:`Task.out_device`, :attr:`Task.read_device`), by vertex: a GPU, or ``"host"`` for
    host inputs and CPU vertices."""
    tasks = graph.tasks
    return ({t: task.out_device for t, task in tasks.items()},
            {t: task.read_device for t, task in tasks.items()})


def memory_needs(graph: TaskGraph, out: dict[str, str] | None = None,
                 read: dict[str, str] | None = None) -> Iterator[tuple[str | None, str, int]]:
    """What must fit on one GPU at once: ``(vertex, gpu, bytes)`` for each vertex with its
    inputs, and ``(None, gpu, bytes)`` for each GPU's resident inputs together (they exist
    before the run).  ``out`` and ``read`` are :func:`placement`'s, if known."""
    if out is None or read is None:
        out, read = placement(graph)
    inputs: dict[str, int] = {}
    size = {t: task.bytes for t, task in graph.tasks.items()}
    for t, task in graph.tasks.items():
        if task.kind == "input":
            if task.device != HOST:
                inputs[task.device] = inputs.get(task.device, 0) + task.bytes
            continue
        dst, src = out[t], read[t]
        if src != HOST:
            reads = sum([size[u] for u in set(task.inputs)])
            if dst == src:
                yield t, dst, reads + task.bytes
                continue
            yield t, src, reads
        if dst != HOST:
            yield t, dst, task.bytes
    for dev, nbytes in inputs.items():
        yield None, dev, nbytes


def min_capacity(graph: TaskGraph) -> int:
    """The smallest GPU memory in which BuildMemGraph can plan ``graph``."""
    return max((nbytes for _, _, nbytes in memory_needs(graph)), default=0)


def serial_order(graph: TaskGraph, order: str | Sequence[str]) -> list[str]:
    """The serial order V: ``given`` (insertion order, which must be topological),
    ``topological`` (any valid order, networkx), or an explicit list of vertex ids."""
    graph.validate()
    if isinstance(order, str) and order == "topological":
        import networkx as nx
        return list(nx.topological_sort(graph.to_networkx()))
    if isinstance(order, str):
        if order != "given":
            raise PlanError(f"unknown order {order!r}: use 'given', 'topological' or a list of ids")
        ids = list(graph.tasks)
        bad = graph.out_of_order()
    else:
        ids = list(order)
        if len(ids) != len(graph.tasks) or set(ids) != set(graph.tasks):
            raise PlanError("the serial order must list every TaskGraph vertex exactly once")
        pos = {t: i for i, t in enumerate(ids)}
        bad = next(((t, u) for t in ids for u in graph[t].inputs if pos[u] > pos[t]), None)
    if bad is not None:
        raise PlanError(f"serial order is not topological: {bad[0]!r} comes before its "
                        f"input {bad[1]!r} (use order=topological)")
    return ids
