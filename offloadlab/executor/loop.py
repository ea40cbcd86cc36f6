"""The central event loop of the executor (TURNIP Sec. 5, docs/design.md Execution semantics).

A vertex is launched when every MemGraph predecessor has completed and its resources (a stream
slot of its engine, a host bus) are free, dispatched by the simulator's policies
(:mod:`offloadlab.core.dispatch`).  The loop has no thread of its own: the lane that reports a
completion takes its turn.  GPU tensors live at their planned offsets in each GPU's arena, host
tensors in one host block; ``poison`` fills locations with ``0xFF`` so a race shows.  Turns,
lanes, memory and poisoning: docs/execution.md.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..core.budget import ram_available
from ..core.contract import Contract, contract, slots
from ..core.devices import HOST, is_bus
from ..core.dispatch import Queues, ReadyQueue
from ..core.machine import Machine
from ..core.memgraph import MemGraph, MemVertex
from ..core.ops.arrays import aligned
from .device import Array, Backend, Cancelled, Done, ExecutionError, Lane, StallError, WarmUp
from .hostblock import HostAllocator, fill
from .kernels import initial_value, tensor_shape, view
from .workspace import needs

if TYPE_CHECKING:
    from .races import RaceDetector

T = TypeVar("T")
POISON = 0xFF
JOIN_SECONDS = 5.0


@dataclass(eq=False)
class Resource:
    """Slots of an engine (or a bus), each with its lane, and the ready queue they take from."""

    name: str
    queue: ReadyQueue
    lanes: list[Lane]
    free: list[int] = field(default_factory=list)   # a stack of free slots, next on top
    streams: list = field(default_factory=list)     # the backend's stream of each slot
    dirty: bool = False


class EventLoop:
    """One run of a MemGraph on a backend; :meth:`run` returns when every vertex is done."""

    def __init__(self, memgraph: MemGraph, machine: Machine, backend: Backend, policy: str,
                 seed: int, streams: int, poison: bool, outputs: set[str],
                 host_memory: int | None, watchdog: float,
                 progress: Callable[[int], None] | None = None, check_races: bool = False):
        structure = contract(memgraph, machine)
        self.backend, self.poison, self.watchdog = backend, poison, watchdog
        self.progress = progress
        self.vertices: list[MemVertex] = structure.vertices
        n = len(self.vertices)
        index = {v.id: i for i, v in enumerate(self.vertices)}
        self.succ, self.waiting = structure.succ, structure.waiting
        self.inputs = [[index[u] for u in v.inputs] for v in self.vertices]
        self.distinct_inputs = [list(dict.fromkeys(us)) for us in self.inputs]
        self.readers = [sum(1 for k in memgraph.succ[v.id].values() if k == "data")
                        for v in self.vertices]
        self.shape = [tensor_shape(v.shape, v.dtype, v.bytes) for v in self.vertices]
        self.capture = [v.kind in ("compute", "transfer", "input") and (v.task or v.id) in outputs
                        for v in self.vertices]
        self.to_host = [v.kind in ("offload", "compute") and v.out_device == HOST
                        for v in self.vertices]
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.slot = [0] * n
        self.finished = 0
        self.running = 0
        self.outputs: dict[str, np.ndarray] = {}
        self.done: queue.SimpleQueue[Done] = queue.SimpleQueue()
        self.lock = threading.Lock()         # held by the thread taking the loop's turn
        self.over = threading.Event()        # set when every vertex is done or the run fails
        self.error: BaseException | None = None
        self._build_resources(structure, policy, seed, streams)
        self._allocate(machine, host_memory)
        self.races: RaceDetector | None = None     # the race detector, if asked for
        if check_races:
            from .races import RaceDetector
            self.races = RaceDetector(self)

    # -- set-up -----------------------------------------------------------------------------
    def _build_resources(self, structure: Contract, policy: str, seed: int,
                         streams: int) -> None:
        queues = Queues(policy, self.vertices, self.succ, seed)
        self.resources: dict[str, Resource] = {}
        self.lanes: list[Lane] = []
        for name, sequence in structure.sequences.items():
            n = slots(name, streams)
            if is_bus(name):
                lanes = []
            elif self.backend.serial_streams:   # the engine's streams share one thread
                lanes = [Lane(name, self.backend, self._report)] * n
            else:
                lanes = [Lane(f"{name}#{s}", self.backend, self._report) for s in range(n)]
            self.lanes += dict.fromkeys(lanes)
            wake = lambda name=name: self._mark(self.resources[name])   # noqa: E731
            self.resources[name] = Resource(name, queues.new(sequence, wake), lanes,
                                           list(range(n))[::-1])
        self.engine = [self.resources[h[0]] if h else None for h in structure.holds]
        self.bus = [self.resources[h[1]] if len(h) > 1 else None for h in structure.holds]
        for name, r in self.resources.items():
            r.streams = [self.backend.stream(name, s) for s in range(len(r.lanes))]
        self._dirty: list[Resource] = []

    def _allocate(self, machine: Machine, host_memory: int | None) -> None:
        """The arenas (each as long as its last planned byte), the host block, every GPU
        tensor's view, the inputs' values, and each lane's scratch."""
        backend, vertices, shape = self.backend, self.vertices, self.shape
        extent: dict[str, int] = {}
        for v, s in zip(vertices, shape):
            if v.loc is not None:
                if v.loc.end > machine.gpu_memory:
                    raise ExecutionError(f"vertex {v.id!r}: location [{v.loc.offset}, "
                                         f"{v.loc.end}) on {v.loc.device} lies outside its "
                                         f"{machine.gpu_memory}-byte memory")
                itemsize = np.dtype(v.dtype).itemsize
                if backend.aligned and v.loc.offset % itemsize:
                    raise ExecutionError(
                        f"vertex {v.id!r}: its {v.dtype} tensor at offset {v.loc.offset} on "
                        f"{v.loc.device} is not {itemsize}-byte aligned, which the "
                        f"{backend.name} backend needs (a GPU kernel faults on a misaligned "
                        f"address); plan tensors whose sizes are whole elements")
                if math.prod(s) * itemsize > v.loc.size:
                    raise ExecutionError(f"vertex {v.id!r}: a {v.dtype} tensor of shape {s} "
                                         f"does not fit its {v.loc.size}-byte location")
                extent[v.loc.device] = max(extent.get(v.loc.device, 0), v.loc.end)
        host_inputs = [i for i, v in enumerate(vertices) if v.kind == "input" and v.loc is None]
        dynamic = sum(v.bytes for v, to_host in zip(vertices, self.to_host) if to_host)
        static = sum(vertices[i].bytes for i in host_inputs)
        size = static + dynamic if host_memory is None else host_memory
        _check_ram(size + sum(v.bytes for v, c in zip(vertices, self.capture)
                              if v.kind == "input" or c)
                   + (sum(extent.values()) if backend.arenas_in_ram else 0), extent, size)
        self._scratch_needs()
        self._check_gpu_memory(machine, extent)
        self.arenas = {gpu: _alloc(f"the arena of {gpu}", end,
                                   lambda: backend.arena(gpu, end))
                       for gpu, end in sorted(extent.items())}
        self.host = _alloc("the host block", size, lambda: backend.host_block(size))
        self.host_alloc = HostAllocator(size)
        self.host_offset: dict[int, int] = {}
        self.tensor: list[Array] = [None] * len(vertices)   # None until placed
        for i, v in enumerate(vertices):
            if v.loc is not None:
                self.tensor[i] = view(self.arenas[v.loc.device], v.loc.offset, shape[i], v.dtype)
        for i in host_inputs:
            self.tensor[i] = self._host_tensor(i)
        for i, v in enumerate(vertices):      # each output's host copy, made before the run
            if v.kind == "input" and self.capture[i]:
                self.outputs[v.task or v.id] = initial_value(v.task or v.id, shape[i], v.dtype)
            elif self.capture[i]:
                self.outputs[v.task or v.id] = _alloc(
                    f"the host copy of output {v.id!r}", v.bytes,
                    lambda: backend.host_array(shape[i], v.dtype))
        self._scratch_buffers()

    def _load(self) -> None:
        """Poison every location (with ``poison``) and write the inputs' values: after the
        warm-up, whose kernels write where the run will."""
        backend = self.backend
        vertices, capture, outputs = self.vertices, self.capture, self.outputs
        if self.poison:
            for arena in self.arenas.values():
                backend.fill(arena, POISON)
            fill(self.host, POISON)
            for i, v in enumerate(vertices):
                if capture[i] and v.kind != "input":
                    fill(outputs[v.task or v.id], POISON)
        for i, v in enumerate(vertices):
            if v.kind == "input":
                value = outputs[v.task or v.id] if capture[i] else \
                    initial_value(v.task or v.id, self.shape[i], v.dtype)
                if v.loc is None:
                    np.copyto(self.tensor[i], value)
                else:
                    backend.upload(self.tensor[i], value)

    def _scratch_needs(self) -> None:
        """Each compute vertex's kernel and the workspace it needs (:func:`workspace.needs`)."""
        found = needs(self.vertices, self.shape, self.inputs,
                      [None if e is None else e.name for e in self.engine])
        self.kernel, self.aliased, self.signature = found.kernel, found.aliased, found.signature
        self.need = found.need

    def _check_gpu_memory(self, machine: Machine, extent: dict[str, int]) -> None:
        """Refuse, naming the numbers, a run whose arena, lane workspaces and lanes' own
        memory (cuBLAS handles) would not fit in what the device has free."""
        backend = self.backend
        for gpu, end in sorted(extent.items()):
            free = backend.free_memory(gpu)
            if free is None:
                continue
            lanes = len(dict.fromkeys(self.resources[gpu].lanes)) if gpu in self.resources \
                else 0
            scratch = lanes * self.need.get(gpu, 0)
            reserve = lanes * backend.lane_reserve
            if end + scratch + reserve > free:
                raise ExecutionError(
                    f"{gpu}: the run needs {end + scratch + reserve} bytes of GPU memory (the "
                    f"plan's {end}, {lanes} lane workspace(s) of {self.need.get(gpu, 0)} and "
                    f"{lanes} x {backend.lane_reserve} for the lanes' cuBLAS handles) but "
                    f"{free} are free on the device; plan with gpu_memory at most "
                    f"{max(free - scratch - reserve, 0)} (the machine says "
                    f"{machine.gpu_memory})")

    def _scratch_buffers(self) -> None:
        """Each compute lane's workspace: the most any kernel on its engine needs; one per
        lane, which runs one job at a time, so serial streams share theirs."""
        self.scratch: dict[Lane, Array] = {}
        for name, nbytes in self.need.items():
            for s, lane in enumerate(dict.fromkeys(self.resources[name].lanes)):
                where = f"{name}:scratch{s}"     # the CPU's in RAM, a GPU's on the GPU
                make = (lambda: np.empty(nbytes, np.uint8)) if name == "cpu" \
                    else (lambda: self.backend.arena(where, nbytes))
                self.scratch[lane] = _alloc(f"the workspace of {lane.name}", nbytes, make)

    def _host_tensor(self, i: int):
        v = self.vertices[i]
        offset = self.host_alloc.alloc(v.bytes)
        if offset is None:
            raise ExecutionError(f"vertex {v.id!r}: the host block ({self.host_alloc.size} "
                                 f"bytes, {self.host_alloc.used} in use) has no free range of "
                                 f"{v.bytes} bytes")
        self.host_offset[i] = offset
        return view(self.host, offset, self.shape[i], v.dtype)

    # -- running ----------------------------------------------------------------------------
    def run(self) -> None:
        for lane in self.lanes:
            lane.start()
        try:
            self._warm_up()
            self._load()
            if self.races is not None:
                self.races.loaded()
            self._loop()
        finally:
            self._shutdown()

    def _warm_up(self) -> None:
        """Where the backend asks for it, every lane of a GPU runs each kernel signature of
        its engine once, untimed, on the planned locations (no values are loaded yet): CuPy
        compiles a kernel on first use and makes a cuBLAS handle per thread, which would
        otherwise happen inside the first timed jobs."""
        if not self.backend.warm_up:
            return
        first: dict[Resource, dict[tuple, int]] = {}     # engine -> signature -> vertex
        for i, signature in enumerate(self.signature):
            engine = self.engine[i]
            if signature is not None and engine is not None and not self.to_host[i]:
                first.setdefault(engine, {}).setdefault(signature, i)
        jobs: list[WarmUp] = []
        for resource, mine in first.items():
            warmed: set[Lane] = set()
            for slot, lane in enumerate(resource.lanes):
                if lane in warmed:                   # serial streams share one lane
                    continue
                warmed.add(lane)
                job = WarmUp(resource.streams[slot],
                             [(i, self._work(i, slot, poison=False)) for i in mine.values()])
                jobs.append(job)
                lane.submit(job)
        for job in jobs:
            while not job.done.wait(0.1):
                pass                          # Ctrl-C gets through between waits
            if job.failure is not None:
                i, exc = job.failure
                v = self.vertices[i]
                raise ExecutionError(f"vertex {v.id!r} ({v.kind} {v.op} on {v.device}) failed "
                                     f"in the warm-up: {type(exc).__name__}: {exc}") from exc

    def _loop(self) -> None:
        """Launch the sources, then wait: lanes take the loop's turns as they report."""
        self.backend.begin()
        self._last = time.perf_counter()
        with self.lock:
            for i in [i for i, count in enumerate(self.waiting) if count == 0]:
                self._ready(i, 0.0)
            self._turn()                  # nothing has completed yet: the first dispatch
        self._drain()
        n = len(self.vertices)
        report = self._last
        while not self.over.wait(min(0.1, self.watchdog)):
            now = time.perf_counter()
            if now - self._last > self.watchdog:
                with self.lock:
                    self._fail(StallError(self._stuck(
                        f"no vertex completed for {self.watchdog:g} s")))
            elif self.progress is not None and now >= report:
                self.progress(self.finished)      # at most four times a second
                report = now + 0.25
        if self.error is not None:
            raise self.error
        if self.progress is not None:
            self.progress(n)

    def _report(self, item: Done) -> None:
        """A lane's completion: queue it, and take the loop's turn unless a thread has it."""
        self.done.put(item)
        self._drain()

    def _drain(self) -> None:
        """Take turns while completions wait and the loop is free (an item queued during a
        turn whose thread could not get the lock is seen here by the turn's thread)."""
        done, lock = self.done, self.lock
        while not done.empty() and lock.acquire(blocking=False):
            try:
                self._turn()
            finally:
                lock.release()

    def _turn(self) -> None:
        """Every completion queued, then one dispatch pass (under the lock)."""
        done = self.done
        if self.over.is_set():            # stopped: completions of cancelled jobs
            while not done.empty():
                done.get_nowait()
            return
        try:
            while not done.empty():
                self._complete(done.get_nowait())
            self._dispatch()
            self._settle()
        except BaseException as exc:
            self._fail(exc)

    def _settle(self) -> None:
        """End the run when every vertex is done; stop it if nothing runs and nothing can."""
        if self.finished == len(self.vertices):
            self.over.set()
        elif not self.running:
            raise StallError(self._stuck("no vertex is running and none can start"))

    def _fail(self, exc: BaseException) -> None:
        """Stop the run with ``exc`` (the first failure is the one raised)."""
        if self.error is None:
            self.error = exc
        self.over.set()

    def _complete(self, item: Done) -> None:
        i, start, end, exc = item
        v = self.vertices[i]
        if exc is not None:
            what = f"{v.kind} {v.op}" if v.op else v.kind
            raise ExecutionError(f"vertex {v.id!r} ({what} on {v.device}) failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        self._last = time.perf_counter()
        self.running -= 1
        self.start[i], self.end[i] = start, end
        engine, bus = self.engine[i], self.bus[i]
        assert engine is not None
        engine.free.append(self.slot[i])   # on top: the reporting lane goes on
        self._mark(engine)
        if bus is not None:
            bus.free.append(0)
            self._mark(bus)
        to_host = self.to_host        # the tensors the host block holds only for a while
        for u in self.distinct_inputs[i]:      # readers counts one data edge per input
            if to_host[u]:
                self.readers[u] -= 1
                if not self.readers[u]:
                    self._free_host(u)
        if to_host[i] and not self.readers[i]:
            self._free_host(i)
        if self.races is not None:
            self.races.completed(i)
        self._finish(i, end)

    def _free_host(self, i: int) -> None:
        offset = self.host_offset.pop(i)
        nbytes = self.vertices[i].bytes
        if self.poison:
            self.host[offset:offset + nbytes].fill(POISON)
        self.host_alloc.free(offset, nbytes)

    def _finish(self, i: int, now: float) -> None:
        self.finished += 1
        waiting = self.waiting
        for w in self.succ[i]:
            waiting[w] -= 1
            if not waiting[w]:
                self._ready(w, now)

    def _ready(self, i: int, now: float) -> None:
        engine = self.engine[i]
        if engine is None:              # an input: it exists from the start
            self.start[i] = self.end[i] = 0.0
            self._finish(i, now)
        else:
            engine.queue.push(now, i)
            self._mark(engine)

    def _mark(self, resource: Resource) -> None:
        if not resource.dirty:
            resource.dirty = True
            self._dirty.append(resource)

    def _dispatch(self) -> None:
        """One pass over the resources whose queue or slots changed (a bus marked by an
        engine's dispatch joins the same pass)."""
        for resource in self._dirty:
            resource.dirty = False
            while resource.free:
                i = resource.queue.pop()
                if i is None:
                    break
                slot = resource.free.pop()
                if resource.lanes:              # an engine: then the bus, if any
                    self.slot[i] = slot
                    bus = self.bus[i]
                    if bus is None:
                        self._launch(i)
                    else:
                        bus.queue.push(time.perf_counter(), i)
                        self._mark(bus)
                else:                           # the bus
                    self._launch(i)
        self._dirty.clear()

    def _launch(self, i: int) -> None:
        v = self.vertices[i]
        engine = self.engine[i]
        assert engine is not None
        slot = self.slot[i]
        stream = engine.streams[slot]
        if self.to_host[i]:
            self.tensor[i] = self._host_tensor(i)
        work = self._work(i, slot, self.poison)
        after = None
        if self.capture[i]:
            out, backend = self.tensor[i], self.backend
            copy = self.outputs[v.task or v.id]

            def after() -> None:
                if v.loc is None:
                    np.copyto(copy, out)
                else:
                    backend.download(stream, out, copy)
        if self.races is not None:
            work = self.races.launched(i, work)
        self.running += 1
        engine.lanes[slot].submit((i, stream, work, after))

    def _work(self, i: int, slot: int, poison: bool) -> Callable[[], None]:
        """What vertex ``i``'s job does on ``slot`` of its engine: its kernel, or its copy
        (first filling its location with NaN bytes, with ``poison``)."""
        v = self.vertices[i]
        engine = self.engine[i]
        assert engine is not None
        stream = engine.streams[slot]
        backend, xp = self.backend, self.backend.xp
        out = self.tensor[i]
        args = [self.tensor[u] for u in self.inputs[i]]
        poison = poison and v.loc is not None and not self.aliased[i]
        if v.kind == "compute":
            k, scratch = self.kernel[i], self.scratch[engine.lanes[slot]]
            on = np if self.to_host[i] else xp
            if self.aliased[i]:      # computed aside at the start of scratch, then copied
                rest = aligned(out.nbytes)

                def work() -> None:
                    target = view(scratch, 0, out.shape, str(out.dtype))
                    k.fn(on, target, args, scratch[rest:])
                    on.copyto(out, target)
            else:
                def work() -> None:
                    if poison:
                        _fill(on, out)
                    k.fn(on, out, args, scratch)
            return work
        src = args[0]
        elsewhere = v.kind == "transfer"     # the destination is on another GPU than the stream

        def copy() -> None:
            if poison:
                if elsewhere:
                    backend.fill(out, POISON)
                else:
                    _fill(xp, out)
            backend.copy(stream, out, src)
        return copy

    # -- stopping ---------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop every lane (a paced copy stops within a chunk) and join them all."""
        self.over.set()
        self.backend.stop.set()
        for lane in self.lanes:
            lane.close()
        deadline = time.perf_counter() + JOIN_SECONDS
        for lane in self.lanes:
            if lane.is_alive():
                lane.join(max(0.0, deadline - time.perf_counter()))
        alive = [lane.name for lane in self.lanes if lane.is_alive()]
        self.arenas.clear()
        self.scratch.clear()
        self.tensor.clear()
        self.races = None
        self.backend.close()
        if alive:
            raise ExecutionError(f"lanes still running a job after {JOIN_SECONDS:g} s: "
                                 f"{', '.join(alive)}")

    def _stuck(self, why: str) -> str:
        running = [lane.vertex for lane in self.lanes if lane.vertex is not None]
        waiting = [i for i, t in enumerate(self.end) if math.isnan(t) and i not in running]
        parts = []
        for i in running[:5]:
            v = self.vertices[i]
            parts.append(f"{v.id!r} ({v.kind} on {v.device}, running)")
        for i in waiting[:5]:
            v = self.vertices[i]
            state = (f"waiting for {self.waiting[i]} predecessor(s)" if self.waiting[i]
                     else f"ready, queued on {self.engine[i].name}")  # type: ignore[union-attr]
            parts.append(f"{v.id!r} ({v.kind} on {v.device}, {state})")
        more = len(running) + len(waiting) - len(parts)
        cause = ("a vertex that runs longer: a large kernel, or a copy paced to a very slow "
                 "link" if running else "a cycle, or a 'fixed' order that contradicts the edges")
        return (f"execution stalled ({why}; {cause}), {len(self.vertices) - self.finished} of "
                f"{len(self.vertices)} vertices "
                f"unfinished: " + "; ".join(parts) + (f"; and {more} more" if more > 0 else ""))


def _check_ram(need: int, extent: dict[str, int], host: int) -> None:
    """Refuse a run whose buffers (and the inputs' and outputs' values, on the host) would
    not fit in the RAM available, before the OOM killer ends the process half-way through
    set-up."""
    available = ram_available()
    if available is not None and need > 0.9 * available:
        arenas = ", ".join(f"{gpu} {size}" for gpu, size in extent.items())
        raise ExecutionError(f"the run needs about {need} bytes of RAM (arenas: "
                             f"{arenas or 'none'}; "
                             f"host block {host}; input and output values) but {available} "
                             f"are available; plan with less GPU memory or a smaller workload")


def _alloc(what: str, nbytes: int, make: Callable[[], T]) -> T:
    try:
        return make()
    except MemoryError as exc:
        raise ExecutionError(f"cannot allocate {what} ({nbytes} bytes): {exc}") from None


def _fill(xp, tensor) -> None:
    tensor.reshape(-1).view(xp.uint8).fill(POISON)


__all__ = ["EventLoop", "ExecutionError", "StallError", "Cancelled"]
