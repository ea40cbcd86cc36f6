"""BuildMemGraph (TURNIP Figs. 8-9), generalised to variable-sized tensors.

The TaskGraph is "executed" in a serial order V while two horizons advance, ``alloc_hzn``
(allocated) and ``exec_hzn`` (run); allocation is pushed ahead of execution, here only while the
GPU keeps ``reserve`` room.  Memory comes from :class:`GpuMemory`, a real offset allocator.  The
run works on the TaskGraph's vertex numbers (:class:`Numbered`): a slot is one integer, and what
it keeps per vertex, slot or item is a list indexed by it.  Items, horizons and evictions:
docs/design.md (``buildmemgraph``).
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
from ..core.taskgraph import Task, TaskGraph
from ..core.util import let_signals_in, no_gc
from .allocator import GpuMemory
from .residents import Eviction, Resident, Slot, check_victim

NO_USES: list[int] = []  # the uses of a tensor not read on its GPU (shared, never changed)


@dataclass(slots=True, eq=False)
class Numbered:
    """A TaskGraph as the planner reads it: vertices numbered in insertion order, devices
    numbered in ``gpus`` order with ``len(gpus)`` for host RAM and the CPU (and any GPU not
    in ``gpus``), and each field a list by vertex number (:func:`_number`)."""

    ids: list[str]
    index: dict[str, int]
    tasks: list[Task]
    gpus: list[str]
    is_input: list[bool]
    bytes: list[int]
    out: list[int]                  # where the output lives (:attr:`Task.out_device`)
    read: list[int]                 # where it reads its inputs (:attr:`Task.read_device`)
    inputs: list[tuple[int, ...]]   # in argument order


def _number(graph: TaskGraph, gpus: list[str]) -> Numbered:
    """``graph`` numbered for planning on ``gpus`` (:class:`Numbered`)."""
    ids, tasks = list(graph.tasks), list(graph.tasks.values())
    index = {t: i for i, t in enumerate(ids)}
    host = len(gpus)
    gpu = {d: k for k, d in enumerate(gpus)}
    where: dict[str, tuple[int, int]] = {}   # device -> (out, read), once per device
    is_input, nbytes, out, read = [], [], [], []
    inputs: list[tuple[int, ...]] = []
    for task in tasks:
        pair = where.get(task.device)
        if pair is None:
            pair = where[task.device] = (gpu.get(task.out_device, host),
                                         gpu.get(task.read_device, host))
        is_input.append(task.kind == "input")
        nbytes.append(task.bytes)
        out.append(pair[0])
        read.append(pair[1])
        inputs.append(tuple([index[u] for u in task.inputs]))
    return Numbered(ids, index, tasks, gpus, is_input, nbytes, out, read, inputs)


class OverBudget(Exception):
    """A run given a ``budget`` has moved that many bytes to or from host RAM: a plan that
    would only be kept if it moved fewer is abandoned there."""


class BuildMemGraph:
    """One run of the algorithm; :func:`buildmemgraph` is the registered entry point.

    It works on the TaskGraph's numbers (:class:`Numbered`): a tensor on a device is the
    :data:`Slot` ``t * stride + d`` (vertex ``t``, device ``d``; ``d == host`` for host RAM
    and the CPU), and what it keeps per vertex, slot or item is a list indexed by it."""

    def __init__(self, graph: TaskGraph, machine: Machine, order: Sequence[str],
                 victim: str, ahead: bool, progress: Callable[[int], None] | None = None,
                 reserve: float = 0.0, budget: int | None = None):
        check_victim(victim)
        self.g, self.machine, self.victim, self.ahead = graph, machine, victim, ahead
        self.reserve = reserve
        self.gpus = machine.gpu_names()
        with no_gc():                            # a tuple per vertex
            self.n = n = _number(graph, self.gpus)
        self.host = len(self.gpus)              # the device number of host RAM and the CPU
        self.stride = self.host + 1             # slot = vertex * stride + device
        slots = len(n.ids) * self.stride
        self.room = [0] * self.host             # GPU -> free bytes allocating ahead leaves
        self.mg = MemGraph()
        self.memory = [GpuMemory(d, machine.gpu_memory) for d in self.gpus]
        self.resident: list[Resident | None] = [None] * slots
        self.uses: list[list[int]] = [NO_USES] * slots   # slot -> items reading it, ascending
        self.host_copy = [""] * len(n.ids)      # vertex -> MemGraph vertex holding it on host
        self.vertex: list[MemVertex | None] = [None] * len(n.ids)   # its MemGraph vertex
        self.items: list[Slot] = []
        self.allocated: list[bool] = []         # item -> whether it has memory
        self.item_writer: list[str] = []        # item -> the MemGraph vertex that wrote it
        self.item_load: list[bool] = []         # item -> whether it is a load (from host RAM)
        self.item_bytes: list[int] = []         # item -> the bytes it allocates
        self.item_reads: list[tuple[Slot, ...]] = []  # item -> the GPU slots it reads
        read_at = [False] * len(n.ids)          # read by some vertex
        host_read = [False] * len(n.ids)        # read by a CPU vertex (in host RAM)
        for t, inputs in enumerate(n.inputs):
            on_host = n.read[t] == self.host and not n.is_input[t]
            for u in inputs:
                read_at[u] = True
                if on_host:
                    host_read[u] = True
        self.outputs = [not r for r in read_at]
        self.host_read = host_read
        self.kept = [o or h for o, h in zip(self.outputs, host_read)]   # needed later anyway
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
        self.order = [n.index[t] for t in order]
        self.progress = progress    # hears how many TaskGraph vertices are planned

    def names(self, slot: Slot) -> tuple[str, str]:
        """The TaskGraph vertex and the device (a GPU, or ``"host"``) of ``slot``.

        Parameters
        ----------
        slot : Slot

        Returns
        -------
        tuple of str
        """
        d = slot % self.stride
        return self.n.ids[slot // self.stride], HOST if d == self.host else self.gpus[d]

    # -- V: the serial list of items -----------------------------------------------------
    def _build_items(self) -> None:
        """Host-resident tensors listed in the serial order are loaded there, onto every GPU
        that reads them; the others just before their first reader on each GPU."""
        n, stride, host = self.n, self.stride, self.host
        is_input, out, read, nbytes, index = n.is_input, n.out, n.read, n.bytes, n.index
        items, item_reads, item_bytes = self.items, self.item_reads, self.item_bytes
        item_load = self.item_load
        loaded = [False] * len(self.resident)
        for t in self.order:
            if is_input[t]:
                if out[t] == host:
                    for w in self.g.succ[n.ids[t]]:     # its readers, in order
                        dev = read[index[w]]
                        slot = t * stride + dev
                        if dev != host and not loaded[slot]:
                            loaded[slot] = True
                            items.append(slot)
                            item_reads.append(())
                            item_bytes.append(nbytes[t])
                            item_load.append(True)
                continue
            dev = read[t]
            reads: list[Slot] = []
            if dev != host:
                for u in n.inputs[t]:
                    slot = u * stride + dev
                    if slot in reads:
                        continue
                    reads.append(slot)
                    if out[u] == host and not loaded[slot]:
                        loaded[slot] = True            # a load, before its first reader
                        items.append(slot)
                        item_reads.append(())
                        item_bytes.append(nbytes[u])
                        item_load.append(True)
            items.append(t * stride + out[t])
            item_reads.append(tuple(reads))
            item_bytes.append(nbytes[t])
            item_load.append(False)
        uses = self.uses
        for i, slots in enumerate(item_reads):
            for slot in slots:
                used = uses[slot]
                if used is NO_USES:
                    uses[slot] = [i]
                else:
                    used.append(i)
        self.allocated = [False] * len(items)
        self.item_writer = [""] * len(items)

    # -- Figure 8 -------------------------------------------------------------------------
    def run(self) -> MemGraph:
        """Plan: TURNIP's Fig. 8, allocating ahead and executing each vertex in the serial order.

        Returns
        -------
        MemGraph
            The plan, not yet stamped (:func:`~offloadlab.planner.plan` does).

        Raises
        ------
        PlanError
            A vertex with its inputs, or a GPU's resident inputs, do not fit its memory.
        """
        with no_gc():
            return self._run()

    def _run(self) -> MemGraph:
        self._build_items()
        self._check_fits()
        self._place_gpu_inputs()
        n, allocated, ahead = len(self.items), self.allocated, self.ahead
        sim_malloc_item, execute = self.sim_malloc_item, self._execute
        has_room, total = self._has_room, len(self.g)
        progress = self.progress or let_signals_in   # interpreted: a Ctrl-C can stop it there
        while self.exec_hzn < n:
            a, e = self.alloc_hzn, self.exec_hzn
            if a < n and (allocated[a] or ((a == e or ahead and has_room(a))
                                           and sim_malloc_item(a))):
                self.alloc_hzn = a + 1       # allocated space for a future result
            elif a == e:
                self._sim_malloc_offload_item(a)   # cannot allocate for the next execution
                self.alloc_hzn = a + 1
            else:
                execute(e)                   # simulate execution of the next item
                self.exec_hzn = e + 1
                if not e & 4095:
                    progress(e * total // n)
        return self.mg

    def _check_fits(self) -> None:
        """Refuse a vertex that cannot fit its GPU; size each GPU's room (``reserve`` times
        the most a vertex holds there at once)."""
        cap, room = self.machine.gpu_memory, self.room
        for t, dev, nbytes in _needs(self.n):
            if nbytes > cap:
                gpu = self.gpus[dev]
                what = (f"vertex {self.n.ids[t]!r} (its output and inputs)" if t >= 0
                        else f"the inputs living on {gpu}")
                raise PlanError(f"{what} need(s) {nbytes} bytes on {gpu} but {gpu} has a "
                                f"capacity of {cap} bytes")
            if t >= 0:
                room[dev] = max(room[dev], int(self.reserve * nbytes))

    def _has_room(self, i: int) -> bool:
        """Whether item ``i`` may be allocated ahead of execution: its GPU keeps at least its
        room free after it (the bound on looking ahead; room 0 is the paper's "as far as
        memory allows")."""
        dev = self.items[i] % self.stride
        return dev == self.host or \
            self.memory[dev].free - self.item_bytes[i] >= self.room[dev]

    def _place_gpu_inputs(self) -> None:
        n = self.n
        for t, task in enumerate(n.tasks):
            if n.is_input[t]:
                self.vertex[t] = self.mg.add_vertex(MemVertex(
                    task.id, "input", task.device, task.bytes, task=task.id,
                    order=next(self.sequence)))
                dev = n.out[t]
                if dev == self.host:
                    self.host_copy[t] = task.id
                else:
                    offset = self.memory[dev].find_free(task.bytes)
                    assert offset is not None     # _check_fits: a GPU's inputs fit together
                    self._occupy(t * self.stride + dev, task.bytes, offset, task.id, -1,
                                 materialized=True)

    # -- Figure 9: the malloc variants -----------------------------------------------------
    def _sim_malloc(self, slot: Slot, nbytes: int, writer_for, item: int) -> Resident | None:
        """Find free memory for ``slot``; add memory edges from the guards it overwrites."""
        offset = self.memory[slot % self.stride].find_free(nbytes)
        if offset is None:
            return None
        return self._occupy(slot, nbytes, offset, writer_for, item)

    def _sim_malloc_offload(self, slot: Slot, nbytes: int, writer_for, item: int,
                            pinned: set[Slot]) -> Resident:
        """Evict the victims whose earliest next use is latest (``belady``) or least recently
        used (``lru``), offloading those with no copy in host RAM; cannot fail."""
        memory = self.memory[slot % self.stride]
        found = memory.find_victims(nbytes, self._costs(pinned))
        # If the pinned tensors fragment memory, clear the GPU and repack from offset 0
        # (_execute() then brings back whatever pinned tensor this evicted).
        offset, victims = found or (0, memory.owners())
        if found is None:
            self.repacks += 1
            self.repacked += sum(res.size for res in victims)
        for res in victims:
            self._sim_free(res, evict=True)
        return self._occupy(slot, nbytes, offset, writer_for, item)

    def _sim_malloc_force_reload(self, slot: Slot, pinned: set[Slot]) -> Resident:
        """Bring an evicted tensor back for the vertex about to run (a reload or a load)."""
        t = slot // self.stride
        source = self.host_copy[t]
        kind = "reload" if self.mg[source].kind == "offload" else "load"
        nbytes = self.n.bytes[t]
        self.refetched += nbytes
        res = self._sim_malloc(slot, nbytes, (kind, source), -1)
        if res is None:
            res = self._sim_malloc_offload(slot, nbytes, (kind, source), -1, pinned)
        return res

    def _sim_free(self, res: Resident, evict: bool = False) -> None:
        """Free (or, with ``evict``, evict) a resident copy.  A materialized copy that is not
        yet in host RAM and is needed later is offloaded first; a copy whose writer has not
        run yet is retracted and its item re-allocated later."""
        memory = self.memory[res.slot % self.stride]
        self.resident[res.slot] = None
        if not res.materialized:
            memory.restore(res, res.loc.offset, res.covered)
            self.allocated[res.item] = False
            self.alloc_hzn = min(self.alloc_hzn, res.item)
            return
        if evict and not res.clean and (self.kept[res.task] or self._next_use(
                res, self.exec_hzn - 1) is not None):
            self._offload(res)
        guard = tuple(res.readers) if res.readers else (res.writer,)
        memory.release(res, res.loc.offset, guard, self.exec_hzn)

    # -- items ------------------------------------------------------------------------------
    def sim_malloc_item(self, i: int) -> bool:
        """Allocate item ``i`` without evicting (Fig. 8's simMalloc of an output or a load).

        Parameters
        ----------
        i : int

        Returns
        -------
        bool
            Whether it found room.
        """
        slot = self.items[i]
        t = slot // self.stride
        if slot % self.stride == self.host:
            self._add_task_vertex(t, None)         # a CPU vertex: its output lives on host
            self.allocated[i] = True
            return True
        if self.item_load[i] and not self.host_copy[t]:
            return False                           # a CPU result cannot load before it exists
        return self._sim_malloc(slot, self.item_bytes[i], self._writer_for(i), i) is not None

    def _sim_malloc_offload_item(self, i: int) -> None:
        slot = self.items[i]
        if slot % self.stride != self.host:
            self._sim_malloc_offload(slot, self.item_bytes[i], self._writer_for(i), i,
                                     self._pinned(i))
        else:
            self.sim_malloc_item(i)

    def _writer_for(self, i: int):
        """The MemGraph writer of item ``i``: its TaskGraph vertex, or a load from host RAM."""
        t = self.items[i] // self.stride
        return ("load", self.host_copy[t]) if self.item_load[i] else self.n.ids[t]

    def _pinned(self, i: int) -> set[Slot]:
        """What evictions for item ``i`` must spare: its output and its inputs."""
        return {self.items[i], *self.item_reads[i]}

    def _execute(self, i: int) -> None:
        """Simulate item ``i``: reload evicted inputs, add data edges, free dead tensors."""
        if self.item_load[i]:         # a load: it ran when its memory was allocated
            return
        n, output, allocated = self.n, self.items[i], self.allocated
        t = output // self.stride
        reads, resident = self.item_reads[i], self.resident
        if not allocated[i] or not all([resident[slot] is not None for slot in reads]):
            pinned = self._pinned(i)
            while True:               # reloads evict each other only through the repack path
                if not allocated[i]:
                    self._sim_malloc_offload_item(i)
                for slot in reads:
                    if resident[slot] is None:
                        self._sim_malloc_force_reload(slot, pinned)
                if allocated[i] and all([resident[slot] is not None for slot in reads]):
                    break
        tid = n.ids[t]
        if reads:
            for slot in reads:
                res = resident[slot]
                assert res is not None
                res.readers.append(tid)
                res.last_use = i
            dev, stride = n.read[t], self.stride
            inputs = tuple([_writer(resident[u * stride + dev]) for u in n.inputs[t]])
        else:
            inputs = tuple([self._ensure_host_copy(u) for u in n.inputs[t]])
        self.mg.add_edges(inputs, tid, "data")
        v = self.vertex[t]
        assert v is not None
        v.inputs, v.order = inputs, next(self.sequence)
        written = resident[output]
        host_copy = self.host_copy
        if written is not None:
            written.materialized = True
        else:
            host_copy[t] = tid
        outputs, host_read = self.outputs, self.host_read
        for slot in reads:
            res = resident[slot]
            assert res is not None
            u = res.task
            if res.uses[-1] == i and not outputs[u] and (host_copy[u] or not host_read[u]):
                self._sim_free(res)                 # its last reader has run

    # -- helpers ----------------------------------------------------------------------------
    def _occupy(self, slot: Slot, nbytes: int, offset: int, writer_for, item: int,
                materialized: bool = False) -> Resident:
        """Place ``slot`` (``nbytes``) at ``offset``; its writer waits for the guards of the
        bytes it covers."""
        t, dev = slot // self.stride, slot % self.stride
        gpu = self.gpus[dev]
        loc = Loc(gpu, offset, nbytes)
        exec_hzn = self.exec_hzn
        res = Resident(slot, t, loc, "", item, materialized, self.host_copy[t] != "",
                       item if item > exec_hzn else exec_hzn, self.uses[slot])
        covered = res.covered = self.memory[dev].place(offset, nbytes, res)
        mg = self.mg
        if isinstance(writer_for, tuple):          # a load or reload, created now
            kind, source = writer_for
            tid = self.n.ids[t]
            writer = f"{kind}:{tid}@{gpu}#{self.moves}"
            self.moves += 1
            self._count_moved(nbytes)
            mg.add_vertex(MemVertex(writer, kind, gpu, nbytes, loc=loc, of=tid,
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
            self.allocated[item] = True
            self.item_writer[item] = writer
        return res

    def _add_task_vertex(self, t: int, loc: Loc | None) -> None:
        v = self.vertex[t]
        if v is None:
            task = self.n.tasks[t]
            v = self.vertex[t] = self.mg.add_vertex(MemVertex(
                task.id, task.kind, task.device, task.bytes, task=task.id, op=task.op,
                flops=task.flops, time=task.time))
        v.loc = loc

    def _offload(self, res: Resident) -> None:
        t, gpu = res.task, res.loc.device
        tid = self.n.ids[t]
        off = f"offload:{tid}@{gpu}#{self.moves}"
        self.moves += 1
        self._count_moved(res.size)
        self.mg.add_vertex(MemVertex(off, "offload", gpu, res.size, of=tid,
                                     inputs=(res.writer,), order=next(self.sequence)))
        self.mg.add_edge(res.writer, off, "data")
        res.readers.append(off)
        res.clean = True
        self.host_copy[t] = off

    def _count_moved(self, nbytes: int) -> None:
        self.moved += nbytes
        if self.budget is not None and self.moved >= self.budget:
            raise OverBudget(f"moved {self.moved} bytes, the budget is {self.budget}")

    def _ensure_host_copy(self, t: int) -> str:
        """A CPU vertex reads vertex ``t``'s tensor from host RAM: offload a GPU copy if
        needed (only the GPU it was written on has one)."""
        if not self.host_copy[t]:
            copies = [self.resident[t * self.stride + dev] for dev in range(self.host)]
            self._offload(next(res for res in copies if res is not None and res.materialized))
        return self.host_copy[t]

    def _next_use(self, res: Resident, after: int) -> int | None:
        """The first item after ``after`` that reads ``res``."""
        uses = res.uses
        k = bisect.bisect_right(uses, after)
        return uses[k] if k < len(uses) else None

    def _costs(self, pinned: set[Slot]) -> Eviction:
        """The costs of evicting each resident now (:class:`Eviction`), sparing the
        ``pinned``, whom it finds by a stamp (the victim search asks about every resident)."""
        self.searches += 1
        stamp = self.searches
        for slot in pinned:
            pin = self.resident[slot]
            if pin is not None:
                pin.pin = stamp
        return Eviction(self.victim, self.exec_hzn, stamp, self.kept, len(self.items))


def _writer(res: Resident | None) -> str:
    """The MemGraph vertex that writes a resident copy (one that _execute() made sure of)."""
    assert res is not None
    return res.writer


def _needs(n: Numbered) -> Iterator[tuple[int, int, int]]:
    """What :func:`memory_needs` yields, by number (:class:`Numbered`), ``-1`` for the
    inputs."""
    host, size = len(n.gpus), n.bytes
    inputs: dict[int, int] = {}
    for t, dst in enumerate(n.out):
        if n.is_input[t]:
            if dst != host:
                inputs[dst] = inputs.get(dst, 0) + size[t]
            continue
        src = n.read[t]
        if src != host:
            reads = sum([size[u] for u in set(n.inputs[t])])
            if dst == src:
                yield t, dst, reads + size[t]
                continue
            yield t, src, reads
        if dst != host:
            yield t, dst, size[t]
    for dev, nbytes in inputs.items():
        yield -1, dev, nbytes


def memory_needs(graph: TaskGraph) -> Iterator[tuple[str | None, str, int]]:
    """What must fit on one GPU at once.

    Parameters
    ----------
    graph : TaskGraph

    Yields
    ------
    tuple
        ``(vertex, gpu, bytes)`` for each vertex with its inputs, and ``(None, gpu, bytes)``
        for each GPU's resident inputs together (they exist before the run).
    """
    n = _number(graph, graph.gpus())
    for t, dev, nbytes in _needs(n):
        yield (n.ids[t] if t >= 0 else None), n.gpus[dev], nbytes


def min_capacity(graph: TaskGraph) -> int:
    """The smallest GPU memory in which BuildMemGraph can plan ``graph``.

    Parameters
    ----------
    graph : TaskGraph

    Returns
    -------
    int
    """
    return max((nbytes for _, _, nbytes in memory_needs(graph)), default=0)


def serial_order(graph: TaskGraph, order: str | Sequence[str]) -> list[str]:
    """The serial order V: ``given`` (insertion order, which must be topological),
    ``topological`` (any valid order, networkx), or an explicit list of vertex ids.

    Parameters
    ----------
    graph : TaskGraph
    order : str or sequence of str
        ``"given"``, ``"topological"`` or the vertex ids.

    Returns
    -------
    list of str
        The vertex ids in order.

    Raises
    ------
    PlanError
        An unknown order, or not every vertex once in a topological order.
    """
    if isinstance(order, str) and order == "given":
        ids, bad = list(graph.tasks), graph.checked_order()    # validates it too
    else:
        graph.validate()
        if isinstance(order, str) and order == "topological":
            import networkx as nx

            from ..core.formats import to_networkx
            return list(nx.topological_sort(to_networkx(graph)))
        if isinstance(order, str):
            raise PlanError(f"unknown order {order!r}: use 'given', 'topological' or a list "
                            f"of ids")
        ids = list(order)
        if len(ids) != len(graph.tasks) or set(ids) != set(graph.tasks):
            raise PlanError("the serial order must list every TaskGraph vertex exactly once")
        pos = {t: i for i, t in enumerate(ids)}
        bad = next(((t, u) for t in ids for u in graph[t].inputs if pos[u] > pos[t]), None)
    if bad is not None:
        raise PlanError(f"serial order is not topological: {bad[0]!r} comes before its "
                        f"input {bad[1]!r} (use order=topological)")
    return ids
