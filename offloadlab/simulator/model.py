"""The discrete-event model: a MemGraph compiled to integer arrays, run on SimPy resources.

docs/design.md, Execution semantics: a vertex may start when all its predecessors (data and memory
edges alike) have finished and its resource is free.  Vertices are numbered by planner order.
When a vertex finishes, its successors' predecessor counts drop; a vertex whose count reaches
zero joins its engine's ready queue.  Dispatch is deferred to one pass per simulated instant,
after every event of that instant (:meth:`Model.run` steps the environment itself and runs the
pass when the next event lies later), so that simultaneous vertices are ordered by the policy
rather than by event order.  ``input`` vertices need no resource: they finish the
moment they are ready, without a trace row.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy
from simpy.core import EmptySchedule

from ..core.bound import durations as cost_durations
from ..core.contract import Contract, contract, slots
from ..core.devices import is_bus
from ..core.dispatch import Queues
from ..core.errors import GraphError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from .resources import Bus, Engine, Resource


class DeadlockError(GraphError):
    """The run ended with vertices that could never start (a cycle, or a ``fixed`` order that
    contradicts the edges)."""


class Model:
    """One simulation run of a MemGraph on a Machine."""

    def __init__(self, memgraph: MemGraph, machine: Machine, policy: str, noise: float,
                 seed: int, streams: int, progress: Callable[[int], None] | None = None):
        structure = contract(memgraph, machine)
        self.env = simpy.Environment()
        self.vertices, self.succ, self.waiting = (structure.vertices, structure.succ,
                                                  structure.waiting)
        self.data = structure.data     # the data edges, for the memory accounting
        n = len(self.vertices)
        self.duration = self._durations(memgraph, machine, noise, seed)
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.stream = [0] * n
        self.finished = 0
        self.progress = progress    # hears now and then how many vertices have finished
        self._dirty: list[Resource] = []
        self._build_resources(structure, machine, policy, streams, seed)

    def _durations(self, memgraph: MemGraph, machine: Machine, noise: float,
                   seed: int) -> list[float]:
        durations = cost_durations(memgraph, machine, self.vertices)
        if noise > 0:
            z = np.random.default_rng(seed).standard_normal(len(durations))
            durations = (np.array(durations) * np.exp(noise * z - noise ** 2 / 2)).tolist()
        return durations

    def _build_resources(self, structure: Contract, machine: Machine, policy: str,
                         streams: int, seed: int) -> None:
        sequences = structure.sequences
        queues = Queues(policy, self.vertices, self.succ, seed)

        def queue(name):
            return queues.new(sequences[name], lambda: self._mark(self.resources[name]))

        engines: dict[str, Engine] = {}
        buses: dict[str, Bus] = {}
        for name in sequences:
            if is_bus(name):
                buses[name] = Bus(self.env, name, queue(name), granted=self._begin,
                                  changed=self._mark)
            else:
                n = slots(name, streams)
                engines[name] = Engine(self.env, name, n, queue(name), taken=self._taken,
                                       began=self._began, released=self._released,
                                       finished=self._finish, changed=self._mark,
                                       fifo=n > 1 and machine.engine == "fifo")
        self.resources: dict[str, Resource] = {**engines, **buses}
        self.engine = [engines[held[0]] if held else None for held in structure.holds]
        self.bus = [buses[held[1]] if len(held) > 1 else None for held in structure.holds]
        if machine.duplex < 1:
            for name, engine in engines.items():
                if name.startswith("h2d:"):
                    partner = engines.get("d2h:" + name[4:])
                    if partner is not None:
                        engine.partner, partner.partner = partner, engine
                        engine.duplex = partner.duplex = machine.duplex

    @property
    def makespan(self) -> float:
        """When the last vertex finished (after :meth:`run`)."""
        return max(self.end, default=0.0)

    # -- running ------------------------------------------------------------------------
    def run(self) -> None:
        """Run every vertex: step the environment, one dispatch pass per instant."""
        for i in [i for i, count in enumerate(self.waiting) if count == 0]:
            self._ready(i, 0.0)
        env, dirty = self.env, self._dirty
        step, peek = env.step, env.peek
        now = 0.0
        while True:
            at = peek()                             # the next event's time
            if dirty and at > now:                  # every event of this instant has run
                self._dispatch(now)
                continue
            try:
                step()
            except EmptySchedule:
                if not dirty:
                    break
                self._dispatch(now)
                continue
            now = at
        if self.finished < len(self.vertices):
            raise DeadlockError(self._stuck())

    def _ready(self, vertex: int, now: float) -> None:
        engine = self.engine[vertex]
        if engine is None:
            self.start[vertex] = now
            self._finish(vertex, now)
        else:
            engine.queue.push(now, vertex)
            self._mark(engine)

    def _finish(self, vertex: int, now: float) -> None:
        self.end[vertex] = now
        self.finished += 1
        if self.progress is not None and not self.finished & 4095:
            self.progress(self.finished)
        waiting = self.waiting
        for w in self.succ[vertex]:
            waiting[w] -= 1
            if not waiting[w]:
                self._ready(w, now)

    def _taken(self, vertex: int, slot: int, now: float) -> None:
        """``vertex`` holds a slot of its engine: start it, or first wait for its bus."""
        self.stream[vertex] = slot
        bus = self.bus[vertex]
        if bus is None:
            self._begin(vertex, now)
        else:
            bus.request(vertex, now)

    def _begin(self, vertex: int, now: float) -> None:
        self.engine[vertex].start(vertex, self.duration[vertex], now)  # type: ignore[union-attr]

    def _began(self, vertex: int, now: float) -> None:
        self.start[vertex] = now

    def _released(self, vertex: int, now: float) -> None:
        bus = self.bus[vertex]
        if bus is not None:
            bus.release(now)

    def _mark(self, resource: Resource) -> None:
        """Have ``resource`` dispatch in this instant's dispatch pass."""
        if not resource.dirty:
            resource.dirty = True
            self._dirty.append(resource)

    def _dispatch(self, now: float) -> None:
        """The dispatch pass at ``now``: every marked resource takes what it can from its
        queue."""
        for resource in self._dirty:  # a dispatch may mark a bus: it joins this same pass
            resource.dirty = False
            resource.dispatch(now)
        self._dirty.clear()

    def _stuck(self) -> str:
        stuck = [i for i, t in enumerate(self.end) if math.isnan(t)]
        described = []
        for i in stuck[:5]:
            v, engine = self.vertices[i], self.engine[i]
            state = (f"waiting for {self.waiting[i]} predecessor(s)" if self.waiting[i]
                     or engine is None else f"ready, queued on {engine.name}")
            described.append(f"{v.id!r} ({v.kind} on {v.device}, {state})")
        return (f"simulation stalled with {len(stuck)} of {len(self.vertices)} vertices unfinished "
                f"(a cycle, or a 'fixed' order that contradicts the edges): "
                + "; ".join(described) + ("; ..." if len(stuck) > 5 else ""))
