"""Dispatch policies (docs/design.md, Execution semantics), shared by the simulator and the
executor.

Each resource (a GPU's compute engine, a link direction, a bus, the CPU) dispatches from a
ready queue.  A vertex is pushed when it becomes ready; ``pop`` returns the vertex the resource
runs next, or None if it must wait.  Vertices are integers: positions in the planner's order.
Each policy (``dynamic``, the TURNIP runtime, Sec. 5; ``fixed``; ``random``; ``adversarial``)
is a factory in :data:`POLICIES` (a :class:`~offloadlab.core.registry.Registry`), registered
with :func:`policy` where it is defined.  What each does: docs/execution.md, Simulator, and
docs/races.md for ``adversarial``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Protocol

from .errors import SpecError
from .intervals import LastWriter
from .registry import Registry

if TYPE_CHECKING:
    from .memgraph import MemVertex


class PolicyError(SpecError, ValueError):
    """An unknown dispatch policy."""


class ReadyQueue(Protocol):
    """A resource's ready queue, as a policy's factory makes it."""

    def push(self, now: float, vertex: int) -> None:
        """``vertex`` became ready at ``now``.

        Parameters
        ----------
        now : float
            The time, in seconds of the run.
        vertex : int
            Its position in the planner's order.
        """

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait.

        Returns
        -------
        int or None
            A position in the planner's order.
        """


Factory = Callable[["Queues", Sequence[int], Callable[[], None]], ReadyQueue]
"""A policy: the ready queue of one resource, given the run's :class:`Queues`, the resource's
vertices in planner order and a callable that has the resource dispatch again (a queue that
made its resource wait calls it when a vertex may go)."""



@dataclass(frozen=True)
class Policy:
    """A dispatch policy: its queue factory and what it does, in one line."""

    factory: Factory
    doc: str


POLICIES: Registry[Policy] = Registry("policy", error=PolicyError, listed="valid policies",
                                      doc=lambda p: p.doc)
"""The dispatch policies by name, in the order they are listed."""


def policy(name: str, doc: str) -> Callable[[Factory], Factory]:
    """Register a policy's queue factory under ``name`` with its one-line description.

    The description is given here, not read from a docstring: this module is compiled, and
    compiled functions keep none.

    Parameters
    ----------
    name : str
        The policy's name (``--policy NAME``).
    doc : str
        What it does, in one line (``offloadlab list policies``).

    Returns
    -------
    callable
        The decorator; it returns the factory unchanged.
    """
    def deco(factory: Factory) -> Factory:
        POLICIES[name] = Policy(factory, doc)
        return factory
    return deco


def check_policy(name: str) -> None:
    """Refuse an unknown dispatch policy.

    Parameters
    ----------
    name : str
        A policy's name.

    Raises
    ------
    PolicyError
        Listing the policies, unless ``name`` is one.
    """
    POLICIES.check(name)


class Queues:
    """The ready queues of one run of ``vertices`` (in planner order; ``succ`` lists each one's
    successors by position): ``queues.new(sequence, wake)`` for each resource, where
    ``sequence`` lists the resource's vertices in planner order and ``wake()`` has the
    resource dispatch again."""

    def __init__(self, name: str, vertices: Sequence[MemVertex],
                 succ: Sequence[Sequence[int]], seed: int = 0):
        check_policy(name)
        self.policy = name
        self.vertices, self.succ = vertices, succ
        self.ready = bytearray(len(vertices))
        self.rng = random.Random(seed)
        self._hazards: Hazards | None = None

    def new(self, sequence: Sequence[int], wake: Callable[[], None]) -> ReadyQueue:
        """The ready queue of one resource, of the run's policy.

        Parameters
        ----------
        sequence : sequence of int
            The resource's vertices, in planner order.
        wake : callable
            ``wake()`` has the resource dispatch again.

        Returns
        -------
        ReadyQueue
        """
        return POLICIES[self.policy].factory(self, sequence, wake)

    @property
    def hazards(self) -> Hazards:
        """The run's :class:`Hazards`, made on first use (by ``adversarial`` queues only)."""
        if self._hazards is None:
            self._hazards = Hazards(self.vertices, self.succ)
        return self._hazards


class EarliestReady:
    """``dynamic``: the earliest-ready vertex first, ties broken by planner order."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int]] = []

    def push(self, now: float, vertex: int) -> None:
        """``vertex`` became ready at ``now``.

        Parameters
        ----------
        now : float
            The time, in seconds of the run.
        vertex : int
            Its position in the planner's order.
        """
        heappush(self.heap, (now, vertex))

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait.

        Returns
        -------
        int or None
            A position in the planner's order.
        """
        return heappop(self.heap)[1] if self.heap else None


class InOrder:
    """``fixed``: the resource's vertices strictly in planner order; a later one waits.

    ``ready`` is a flag per vertex, shared by all the resources of one run."""

    def __init__(self, sequence: Sequence[int], ready: bytearray):
        self.sequence = sequence
        self.ready = ready
        self.next = 0

    def push(self, now: float, vertex: int) -> None:
        """``vertex`` became ready at ``now``.

        Parameters
        ----------
        now : float
            The time, in seconds of the run.
        vertex : int
            Its position in the planner's order.
        """
        self.ready[vertex] = 1

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait.

        Returns
        -------
        int or None
            A position in the planner's order.
        """
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
        """``vertex`` became ready at ``now``.

        Parameters
        ----------
        now : float
            The time, in seconds of the run.
        vertex : int
            Its position in the planner's order.
        """
        self.items.append(vertex)

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait.

        Returns
        -------
        int or None
            A position in the planner's order.
        """
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
    (docs/design.md rule 3).  A vertex y that writes bytes last written, in planner order, by x
    *threatens* x and every reader of x but y itself (an ``input`` exists before the run and is
    never threatened).  ``threats[y]`` counts the vertices y threatens that have not started.
    In a correct plan each of them is an ancestor of y, so by the time y is ready the count is
    zero; a threatened vertex r that is *not* an ancestor of y is a race the plan allows, and
    r is *held* until y has started, unless that could deadlock (y, or an ancestor of y, may
    be held itself).  ``holds[r]`` counts the vertices holding r that have not started.
    Finding the races searches backwards from each overwriter, as far back as the planner's
    order of its oldest victim: meant for test-sized plans."""

    def __init__(self, vertices: Sequence[MemVertex], succ: Sequence[Sequence[int]]):
        n = len(vertices)
        index = {v.id: i for i, v in enumerate(vertices)}
        readers: list[list[int]] = [[] for _ in range(n)]
        for i, v in enumerate(vertices):
            for u in dict.fromkeys(v.inputs):
                if u in index:
                    readers[index[u]].append(i)
        self.pred: list[list[int]] = [[] for _ in range(n)]
        for k, targets in enumerate(succ):
            for w in targets:
                self.pred[w].append(k)
        self.order = [v.order for v in vertices]
        self.victims: list[list[int]] = [[] for _ in range(n)]      # y -> those y threatens
        self.threateners: list[list[int]] = [[] for _ in range(n)]  # r -> those threatening r
        maps: dict[str, LastWriter[int]] = {}
        for y in sorted(range(n), key=self.order.__getitem__):
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
        self.holders: list[list[int]] = [[] for _ in range(n)]      # y -> those y holds
        self.holds = [0] * n
        self._races()
        self.begun = bytearray(n)
        self.queue: list[Adversarial | None] = [None] * n           # where a held one waits

    def _races(self) -> None:
        """The holds: each overwriter y's victims that are not its ancestors, where neither y
        nor any ancestor of y is such a victim itself."""
        races = {}
        for y, victims in enumerate(self.victims):
            if victims:
                ancestors = self._ancestors(y, min(self.order[r] for r in victims))
                unordered = [r for r in victims if r not in ancestors]
                if unordered:
                    races[y] = unordered
        held = {r for rs in races.values() for r in rs}
        if not held:
            return
        lowest = min(self.order[r] for r in held)
        for y, rs in races.items():
            if y not in held and held.isdisjoint(self._ancestors(y, lowest)):
                for r in rs:
                    self.holders[y].append(r)
                    self.holds[r] += 1

    def _ancestors(self, y: int, lowest: int) -> set[int]:
        """The ancestors of ``y`` no earlier than ``lowest`` in the planner's order (which
        increases along every edge)."""
        pred, order = self.pred, self.order
        seen: set[int] = set()
        stack = [y]
        while stack:
            for p in pred[stack.pop()]:
                if p not in seen and order[p] >= lowest:
                    seen.add(p)
                    stack.append(p)
        return seen

    def started(self, vertex: int) -> None:
        """``vertex`` has started: the vertices it threatens and those it held are told.

        Counted once: a vertex that takes a bus is popped twice.

        Parameters
        ----------
        vertex : int
            Its position in the planner's order.
        """
        if self.begun[vertex]:
            return
        self.begun[vertex] = 1
        for y in self.threateners[vertex]:
            self.threats[y] -= 1
        for r in self.holders[vertex]:
            self.holds[r] -= 1
            queue = self.queue[r]
            if not self.holds[r] and queue is not None:
                queue.wake()


class Adversarial(RandomChoice):
    """``adversarial``: a seeded choice among the ready vertices that are not held, those
    threatening a vertex that has not started first (:class:`Hazards`); the resource waits
    while every ready vertex is held, and ``wake`` (the dispatcher's) is called when one of
    them may go."""

    def __init__(self, rng: random.Random, hazards: Hazards, wake: Callable[[], None]):
        super().__init__(rng)
        self.hazards = hazards
        self.wake = wake

    def push(self, now: float, vertex: int) -> None:
        """``vertex`` became ready at ``now``.

        Parameters
        ----------
        now : float
            The time, in seconds of the run.
        vertex : int
            Its position in the planner's order.
        """
        self.items.append(vertex)
        self.hazards.queue[vertex] = self

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait.

        Returns
        -------
        int or None
            A position in the planner's order.
        """
        items = self.items
        threats, holds = self.hazards.threats, self.hazards.holds
        free = [i for i, v in enumerate(items) if not holds[v]]
        if not free:
            return None
        first = [i for i in free if threats[items[i]]] or free
        vertex = self._take(first[self.rng.randrange(len(first))])
        self.hazards.started(vertex)
        return vertex


@policy("dynamic", "Work-conserving, the earliest-ready vertex first, ties by planner order "
        "(TURNIP Sec. 5)")
def _dynamic(queues: Queues, sequence: Sequence[int], wake: Callable[[], None]) -> ReadyQueue:
    return EarliestReady()


@policy("fixed", "Each resource runs its vertices strictly in planner order (the ablation)")
def _fixed(queues: Queues, sequence: Sequence[int], wake: Callable[[], None]) -> ReadyQueue:
    return InOrder(sequence, queues.ready)


@policy("random", "Work-conserving, a seeded uniform choice among the ready vertices (a test "
        "policy)")
def _random(queues: Queues, sequence: Sequence[int], wake: Callable[[], None]) -> ReadyQueue:
    return RandomChoice(queues.rng)


@policy("adversarial", "Seeded as random, a write over bytes others still need first, and a "
        "vertex such a write may overtake held until it starts (a test policy for small plans)")
def _adversarial(queues: Queues, sequence: Sequence[int],
                 wake: Callable[[], None]) -> ReadyQueue:
    return Adversarial(queues.rng, queues.hazards, wake)
