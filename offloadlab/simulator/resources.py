"""The simulated resources: engines that run vertices, and shared buses (docs/design.md,
Execution semantics).

An :class:`Engine` is a GPU's compute engine (``streams`` slots), the CPU, a link direction or a
GPU->GPU link (one slot); its jobs share its speed (processor sharing), or run one at a time on
a ``fifo`` engine.  A :class:`Bus` is a shared host bus: one transfer at a time.  As SimPy's own
resources, neither knows who uses it: both take from a ready queue of
:mod:`offloadlab.core.dispatch` when told to and report through callbacks.  The protocol:
docs/execution.md ("Simulator").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Protocol

import simpy
from simpy.events import Timeout

from ..core.dispatch import ReadyQueue


class Resource(Protocol):
    """What the model asks of an engine or a bus."""

    name: str
    queue: ReadyQueue
    busy: float
    dirty: bool

    def dispatch(self, now: float) -> None:
        """Take what it can from its queue.

        Parameters
        ----------
        now : float
            The simulated time.
        """


class Engine:
    """A resource holding up to ``slots`` vertices at once, running them all and sharing its
    speed among them, or (``fifo``) running them one at a time in the order they started."""

    def __init__(self, env: simpy.Environment, name: str, slots: int, queue: ReadyQueue, *,
                 taken: Callable[[int, int, float], None],
                 began: Callable[[int, float], None],
                 released: Callable[[int, float], None],
                 finished: Callable[[int, float], None],
                 changed: Callable[[Engine], None], fifo: bool = False):
        self.env = env
        self.name = name
        self.queue = queue
        self.taken, self.began, self.released = taken, began, released
        self.finished, self.changed = finished, changed
        self.fifo = fifo
        self.launched: deque[tuple[int, float]] = deque()   # fifo: started, waiting to run
        self.free = list(range(slots))  # a heap of free slot (stream) numbers
        self.held: dict[int, int] = {}  # vertex taken -> its slot
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
        self._timed = self._complete   # the timeouts' callback, bound once

    def dispatch(self, now: float) -> None:
        """Take ready vertices while a slot is free; each then holds the slot.

        Parameters
        ----------
        now : float
            The simulated time.
        """
        while self.free:
            vertex = self.queue.pop()
            if vertex is None:
                return
            self.held[vertex] = slot = heappop(self.free)
            self.taken(vertex, slot, now)

    def start(self, vertex: int, seconds: float, now: float) -> None:
        """Run ``vertex``, which holds a slot, for ``seconds`` at full speed (on a ``fifo``
        engine once the jobs started before it are done).

        Parameters
        ----------
        vertex : int
            The vertex, by position.
        seconds : float
            Its duration at full speed.
        now : float
            The simulated time.
        """
        if self.fifo and (self.jobs or self.launched):
            self.launched.append((vertex, seconds))
            return
        self.began(vertex, now)
        if self.jobs:
            self._progress(now)
        else:
            self.updated = self.busy_since = now
        self.jobs[vertex] = seconds
        if len(self.jobs) == 1 and self.partner is not None:
            self.partner._set_speed(now, self.duplex)
        self._schedule()

    def _set_speed(self, now: float, speed: float) -> None:
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
        timer.callbacks.append(self._timed)

    def _complete(self, timer: Timeout) -> None:
        if timer is not self.timer:
            return  # superseded
        now = self.env.now
        self._progress(now)
        finishing = self.finishing
        for vertex in finishing:
            del self.jobs[vertex]
            heappush(self.free, self.held.pop(vertex))
            self.released(vertex, now)
        if self.launched and not self.jobs:         # fifo: the next job in launch order
            vertex, seconds = self.launched.popleft()
            self.began(vertex, now)
            self.jobs[vertex] = seconds
        if self.jobs:
            self._schedule()
        else:
            self.timer = None
            self.busy += now - self.busy_since
            if self.partner is not None:
                self.partner._set_speed(now, 1.0)
        self.changed(self)
        for vertex in finishing:
            self.finished(vertex, now)


class Bus:
    """A host bus shared by its GPUs' transfers in one direction: one transfer at a time."""

    def __init__(self, env: simpy.Environment, name: str, queue: ReadyQueue, *,
                 granted: Callable[[int, float], None], changed: Callable[[Bus], None]):
        self.env = env
        self.name = name
        self.queue = queue
        self.granted, self.changed = granted, changed
        self.holder: int | None = None
        self.busy = 0.0
        self.busy_since = 0.0
        self.dirty = False

    def request(self, vertex: int, now: float) -> None:
        """Queue ``vertex``'s transfer for the bus.

        Parameters
        ----------
        vertex : int
            The vertex, by position.
        now : float
            The simulated time.
        """
        self.queue.push(now, vertex)
        self.changed(self)

    def dispatch(self, now: float) -> None:
        """Grant the bus to the next transfer in its queue if it is free.

        Parameters
        ----------
        now : float
            The simulated time.
        """
        if self.holder is None:
            vertex = self.queue.pop()
            if vertex is not None:
                self.holder = vertex
                self.busy_since = now
                self.granted(vertex, now)

    def release(self, now: float) -> None:
        """The transfer holding the bus has ended.

        Parameters
        ----------
        now : float
            When.
        """
        self.holder = None
        self.busy += now - self.busy_since
        self.changed(self)
