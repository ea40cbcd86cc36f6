"""The simulated resources: engines that run vertices, and shared buses (DESIGN.md, Execution
semantics).

An :class:`Engine` is a GPU's compute engine (``streams`` slots), the CPU, a link direction or a
GPU->GPU link (one slot).  The jobs running on it share its speed equally (processor sharing:
``k`` running jobs each progress at ``speed / k``), and a host link direction runs at the
machine's duplex factor while its partner direction is busy.  Instead of interrupting
processes, an engine schedules one SimPy timeout for its next completion and, whenever its
jobs or speed change, a new one; a superseded timeout fires to no effect.

A :class:`Bus` is a shared host bus: one transfer at a time, taken after the link.  Each
resource dispatches from a ready queue of :mod:`offloadlab.core.dispatch`, the policies the
executor uses too.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING

from simpy.events import Timeout

from ..core.dispatch import ReadyQueue

if TYPE_CHECKING:
    from .model import Model


class Engine:
    """A resource running up to ``slots`` vertices at once, sharing its speed among them."""

    def __init__(self, model: "Model", name: str, slots: int, queue: ReadyQueue):
        self.model = model
        self.env = model.env
        self.name = name
        self.queue = queue
        self.free = list(range(slots))  # a heap of free slot (stream) numbers
        self.jobs: dict[int, float] = {}  # running vertex -> remaining seconds at full speed
        self.speed = 1.0
        self.updated = 0.0
        self.timer: Timeout | None = None
        self.finishing: list[int] = []
        self.partner: Engine | None = None  # the other direction of a host link (duplex < 1)
        self.duplex = 1.0
        self.busy = 0.0
        self.busy_since = 0.0
        self.dirty = False

    def dispatch(self) -> None:
        """Take ready vertices while a slot is free; each then holds the slot."""
        model = self.model
        while self.free:
            vertex = self.queue.pop()
            if vertex is None:
                return
            model.stream[vertex] = heappop(self.free)
            bus = model.bus[vertex]
            if bus is None:
                self.start(vertex)
            else:
                bus.request(vertex)

    def start(self, vertex: int) -> None:
        now = self.env.now
        self.model.start[vertex] = now
        if self.jobs:
            self._progress(now)
        else:
            self.updated = self.busy_since = now
        self.jobs[vertex] = self.model.duration[vertex]
        if len(self.jobs) == 1 and self.partner is not None:
            self.partner.set_speed(now, self.duplex)
        self._schedule()

    def set_speed(self, now: float, speed: float) -> None:
        """The partner direction started or stopped: change speed from ``now`` on."""
        if self.jobs:
            self._progress(now)
            self.speed = speed
            self._schedule()
        else:
            self.speed = speed

    def _progress(self, now: float) -> None:
        if now > self.updated:
            step = (now - self.updated) * self.speed / len(self.jobs)
            for vertex in self.jobs:
                self.jobs[vertex] -= step
            self.updated = now

    def _schedule(self) -> None:
        jobs = self.jobs
        if len(jobs) == 1:
            (vertex, remaining), = jobs.items()
            self.finishing = [vertex]
        else:
            remaining = min(jobs.values())
            self.finishing = [v for v, left in jobs.items() if left == remaining]
        delay = max(remaining, 0.0) * len(jobs) / self.speed
        self.timer = timer = Timeout(self.env, delay)
        timer.callbacks.append(self._complete)

    def _complete(self, timer: Timeout) -> None:
        if timer is not self.timer:
            return  # superseded
        now = self.env.now
        model = self.model
        self._progress(now)
        finishing = self.finishing
        for vertex in finishing:
            del self.jobs[vertex]
            heappush(self.free, model.stream[vertex])
            bus = model.bus[vertex]
            if bus is not None:
                bus.release(now)
        if self.jobs:
            self._schedule()
        else:
            self.timer = None
            self.busy += now - self.busy_since
            if self.partner is not None:
                self.partner.set_speed(now, 1.0)
        model.mark(self)
        for vertex in finishing:
            model.finish(vertex, now)


class Bus:
    """A host bus shared by all GPUs' transfers in one direction: one transfer at a time."""

    def __init__(self, model: "Model", name: str, queue: ReadyQueue):
        self.model = model
        self.name = name
        self.queue = queue
        self.holder: int | None = None
        self.busy = 0.0
        self.busy_since = 0.0
        self.dirty = False

    def request(self, vertex: int) -> None:
        self.queue.push(self.model.env.now, vertex)
        self.model.mark(self)

    def dispatch(self) -> None:
        if self.holder is None:
            vertex = self.queue.pop()
            if vertex is not None:
                self.holder = vertex
                self.busy_since = self.model.env.now
                self.model.engine[vertex].start(vertex)

    def release(self, now: float) -> None:
        self.holder = None
        self.busy += now - self.busy_since
        self.model.mark(self)
