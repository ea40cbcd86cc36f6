"""Dispatch policies (docs/design.md, Execution semantics), shared by the simulator and the
executor.

Each resource (a GPU's compute engine, a link direction, a bus, the CPU) dispatches from a
ready queue.  A vertex is pushed when it becomes ready; ``pop`` returns the vertex the resource
runs next, or None if it must wait.  Vertices are integers: positions in the planner's order.

- ``dynamic`` — work-conserving, the earliest-ready vertex first, ties by planner order (the
  TURNIP runtime, Sec. 5);
- ``fixed`` — each resource runs its vertices strictly in planner order (the ablation);
- ``random`` — work-conserving, a seeded uniform choice among the ready vertices: a test
  policy that explores many legal orders;
- ``adversarial`` — work-conserving and seeded like ``random``, but a ready vertex whose write
  covers bytes that another vertex has yet to read (or write) goes first, and a ready reader
  of bytes that a vertex not yet started will overwrite goes last: the order most likely to
  expose a missing memory edge (a test policy; on a correct plan no ready vertex
  threatens one that has not started, so only the last rule applies).

Each policy is a factory in :data:`POLICIES`, registered with :func:`policy`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Protocol

from .errors import SpecError
from .intervals import LastWriter

if TYPE_CHECKING:
    from .memgraph import MemVertex


class PolicyError(SpecError, ValueError):
    """An unknown dispatch policy."""


class ReadyQueue(Protocol):
    def push(self, now: float, vertex: int) -> None: ...

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait."""


Factory = Callable[["Queues", Sequence[int]], ReadyQueue]
"""A policy: the ready queue of one resource, given the run's :class:`Queues` and the
resource's vertices in planner order."""

POLICIES: dict[str, Factory] = {}
"""The dispatch policies by name, in the order they are listed."""


def policy(name: str) -> Callable[[Factory], Factory]:
    """Register a policy's queue factory under ``name``."""
    def deco(factory: Factory) -> Factory:
        POLICIES[name] = factory
        return factory
    return deco


def check_policy(name: str) -> None:
    if name not in POLICIES:
        raise PolicyError(f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}")


class Queues:
    """The ready queues of one run of ``vertices`` (in planner order): ``queues.new(sequence)``
    for each resource, where ``sequence`` lists the resource's vertices in planner order."""

    def __init__(self, name: str, vertices: Sequence[MemVertex], seed: int = 0):
        check_policy(name)
        self.policy = name
        self.vertices = vertices
        self.ready = bytearray(len(vertices))
        self.rng = random.Random(seed)
        self._hazards: Hazards | None = None

    def new(self, sequence: Sequence[int]) -> ReadyQueue:
        return POLICIES[self.policy](self, sequence)

    @property
    def hazards(self) -> Hazards:
        """The run's :class:`Hazards`, made on first use (by ``adversarial`` queues only)."""
        if self._hazards is None:
            self._hazards = Hazards(self.vertices)
        return self._hazards


class EarliestReady:
    """``dynamic``: the earliest-ready vertex first, ties broken by planner order."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int]] = []

    def push(self, now: float, vertex: int) -> None:
        heappush(self.heap, (now, vertex))

    def pop(self) -> int | None:
        return heappop(self.heap)[1] if self.heap else None


class InOrder:
    """``fixed``: the resource's vertices strictly in planner order; a later one waits.

    ``ready`` is a flag per vertex, shared by all the resources of one run."""

    def __init__(self, sequence: Sequence[int], ready: bytearray):
        self.sequence = sequence
        self.ready = ready
        self.next = 0

    def push(self, now: float, vertex: int) -> None:
        self.ready[vertex] = 1

    def pop(self) -> int | None:
        if self.next < len(self.sequence) and self.ready[self.sequence[self.next]]:
            self.next += 1
            return self.sequence[self.next - 1]
        return None


class RandomChoice:
    """``random``: a uniform choice among the ready vertices, from a seeded generator."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.items: list[int] = []

    def push(self, now: float, vertex: int) -> None:
        self.items.append(vertex)

    def pop(self) -> int | None:
        items = self.items
        if not items:
            return None
        return self._take(self.rng.randrange(len(items)))

    def _take(self, i: int) -> int:
        items = self.items
        items[i], items[-1] = items[-1], items[i]
        return items.pop()


class Hazards:
    """Which vertices' writes may destroy bytes that others still need, from the plan alone
    (docs/design.md rule 3): a vertex y that writes bytes last written, in planner order, by x
    *threatens* x and every reader of x but y itself; an ``input`` exists before the run and is
    never threatened.  ``threats[y]`` counts the vertices y threatens that have not started,
    ``threatened[r]`` the vertices threatening r that have not started; :meth:`started` keeps
    both as vertices start.  In a correct plan every vertex y threatens is an ancestor of y, so
    by the time y is ready ``threats[y]`` is zero."""

    def __init__(self, vertices: Sequence[MemVertex]):
        n = len(vertices)
        index = {v.id: i for i, v in enumerate(vertices)}
        readers: list[list[int]] = [[] for _ in range(n)]
        for i, v in enumerate(vertices):
            for u in dict.fromkeys(v.inputs):
                if u in index:
                    readers[index[u]].append(i)
        self.victims: list[list[int]] = [[] for _ in range(n)]     # y -> those y threatens
        self.threateners: list[list[int]] = [[] for _ in range(n)]  # r -> those threatening r
        maps: dict[str, LastWriter[int]] = {}
        for y in sorted(range(n), key=lambda i: vertices[i].order):
            loc = vertices[y].loc
            if loc is None:
                continue
            bytes_of = maps.setdefault(loc.device, LastWriter())
            for x in bytes_of.overwrite(loc.offset, loc.end, y):
                for r in dict.fromkeys([x, *readers[x]]):
                    if r != y and vertices[r].kind != "input":
                        self.victims[y].append(r)
                        self.threateners[r].append(y)
        self.threats = [len(v) for v in self.victims]
        self.threatened = [len(t) for t in self.threateners]
        self.begun = bytearray(n)

    def started(self, vertex: int) -> None:
        """``vertex`` has started (once: a vertex that takes a bus is popped twice)."""
        if self.begun[vertex]:
            return
        self.begun[vertex] = 1
        for y in self.threateners[vertex]:
            self.threats[y] -= 1
        for r in self.victims[vertex]:
            self.threatened[r] -= 1


class Adversarial(RandomChoice):
    """``adversarial``: a seeded choice among the ready vertices, those threatening a vertex
    that has not started first, then those neither threatening nor threatened, and last those
    threatened by a vertex that has not started (:class:`Hazards`)."""

    def __init__(self, rng: random.Random, hazards: Hazards):
        super().__init__(rng)
        self.hazards = hazards

    def pop(self) -> int | None:
        items = self.items
        if not items:
            return None
        threats, threatened = self.hazards.threats, self.hazards.threatened
        first = [i for i, v in enumerate(items) if threats[v]] \
            or [i for i, v in enumerate(items) if not threatened[v]] or list(range(len(items)))
        vertex = self._take(first[self.rng.randrange(len(first))])
        self.hazards.started(vertex)
        return vertex


@policy("dynamic")
def _dynamic(queues: Queues, sequence: Sequence[int]) -> ReadyQueue:
    return EarliestReady()


@policy("fixed")
def _fixed(queues: Queues, sequence: Sequence[int]) -> ReadyQueue:
    return InOrder(sequence, queues.ready)


@policy("random")
def _random(queues: Queues, sequence: Sequence[int]) -> ReadyQueue:
    return RandomChoice(queues.rng)


@policy("adversarial")
def _adversarial(queues: Queues, sequence: Sequence[int]) -> ReadyQueue:
    return Adversarial(queues.rng, queues.hazards)
