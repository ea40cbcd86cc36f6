"""Dispatch policies (docs/design.md, Execution semantics), shared by the simulator and the
executor.

Each resource (a GPU's compute engine, a link direction, a bus, the CPU) dispatches from a
ready queue.  A vertex is pushed when it becomes ready; ``pop`` returns the vertex the resource
runs next, or None if it must wait.  Vertices are integers: positions in the planner's order.

- ``dynamic`` — work-conserving, the earliest-ready vertex first, ties by planner order (the
  TURNIP runtime, Sec. 5);
- ``fixed`` — each resource runs its vertices strictly in planner order (the ablation);
- ``random`` — work-conserving, a seeded uniform choice among the ready vertices: a test
  policy that explores many legal orders.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from heapq import heappop, heappush
from typing import Protocol

from .errors import SpecError

POLICIES = ("dynamic", "fixed", "random")


class PolicyError(SpecError, ValueError):
    """An unknown dispatch policy."""


class ReadyQueue(Protocol):
    def push(self, now: float, vertex: int) -> None: ...

    def pop(self) -> int | None:
        """The next vertex to dispatch, or None if the resource must wait."""


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
        i = self.rng.randrange(len(items))
        items[i], items[-1] = items[-1], items[i]
        return items.pop()


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise PolicyError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")


class Queues:
    """The ready queues of one run: ``queues.new(sequence)`` for each resource, where
    ``sequence`` lists the resource's vertices in planner order."""

    def __init__(self, policy: str, vertices: int, seed: int = 0):
        check_policy(policy)
        self.policy = policy
        self.ready = bytearray(vertices)
        self.rng = random.Random(seed)

    def new(self, sequence: Sequence[int]) -> ReadyQueue:
        if self.policy == "dynamic":
            return EarliestReady()
        if self.policy == "fixed":
            return InOrder(sequence, self.ready)
        return RandomChoice(self.rng)
