"""Gemini's layout: the copies a pass places, laid out offline and replayed on an allocator.

*Layout*: Gemini decides in bytes and leaves addresses to PyTorch's caching allocator.  Here
the planned pass records when each copy of a tensor is placed and freed; :func:`pack` lays the
copies out offline (first fit by size, or by size times lifetime, whichever needs less), and
:func:`locate` replays them on BuildMemGraph's allocator
(:class:`~offloadlab.planner.allocator.GpuMemory`) for the memory edges.  If the layout needs
more than the GPU has, the pass is redone within less, the most (to 1/64 of the memory) whose
layout fits (:func:`~offloadlab.planner.gemini.fitted`): the counterpart of the headroom
Colossal-AI keeps for fragmentation (it plans within 90% of the memory,
``steady_cuda_cap_ratio``).  Where no budget plans, the pass is redone within the whole memory
laying each copy out as it places it (:class:`~offloadlab.planner.gemini.manager.Victims`).
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.memgraph import Loc
from ..allocator import GpuMemory
from .manager import Copy, Manager


def pack(copies: list[Copy]) -> dict[str, int]:
    """Lay out the copies offline, knowing their lifetimes, and return the bytes each GPU needs.

    On each GPU the better of two first-fit layouts, largest copies first (greedy by size)
    and largest size times lifetime first.

    Parameters
    ----------
    copies : list of Copy
        The copies a pass placed; each gets its ``offset``.

    Returns
    -------
    dict of str to int
        Each GPU's bytes.
    """
    need: dict[str, int] = {}
    by_gpu: dict[str, list[Copy]] = {}
    for c in copies:
        by_gpu.setdefault(c.slot[1], []).append(c)
    for dev, mine in by_gpu.items():
        # lifetimes counted in this GPU's events, so that a GPU's layout does not depend on
        # what the others do
        rank = {e: k for k, e in enumerate(sorted({e for c in mine for e in (c.born, c.freed)}))}
        layouts = [_first_fit(mine, rank, lambda c: (-c.size, c.born)),
                   _first_fit(mine, rank, lambda c: (-c.size * (rank[c.freed] - rank[c.born]),
                                                     c.born))]
        offsets, need[dev] = min(layouts, key=lambda layout: layout[1])
        for c, offset in zip(mine, offsets):
            c.offset = offset
    return need


def _first_fit(copies: list[Copy], rank: dict[int, int],
               key: Callable[[Copy], tuple[int, int]]) -> tuple[list[int], int]:
    """Each copy's offset when they are placed in the order of ``key``, each at the lowest
    offset that no copy living at the same time holds; and the bytes they take.  ``rank``
    numbers the copies' events in order; the copies living at the same time as one are found
    by :class:`_Lives`, not by a pass over all."""
    offsets = [0] * len(copies)
    lives = _Lives(len(rank))
    top = 0
    for k in sorted(range(len(copies)), key=lambda k: key(copies[k])):
        c = copies[k]
        born, freed = rank[c.born], rank[c.freed]
        offset = 0
        # by start alone: of ranges starting at the same offset, the first fits iff any does
        for start, end in sorted(lives.meeting(born, freed), key=_start):
            if start - offset >= c.size:
                break
            if end > offset:
                offset = end
        offsets[k] = offset
        lives.add(born, freed, (offset, offset + c.size))
        top = max(top, offset + c.size)
    return offsets, top


def _start(block: tuple[int, int]) -> int:
    return block[0]


Lists = list[list[tuple[int, int]] | None]


class _Lives:
    """Ranges of memory, each held over an interval ``[born, freed)`` of times ``0 .. n-1``,
    found by the intervals they meet: two segment trees over the times, one listing each range
    at the nodes that its interval covers (those held at a time are on the path from its leaf
    up), one at every node above its birth (those born in an interval are at the nodes that
    cover it)."""

    def __init__(self, n: int):
        self.leaves = 1 << max(n - 1, 1).bit_length()
        self.held: Lists = [None] * (2 * self.leaves)
        self.born: Lists = [None] * (2 * self.leaves)

    def add(self, born: int, freed: int, block: tuple[int, int]) -> None:
        node = born + self.leaves
        while node:
            _put(self.born, node, block)
            node >>= 1
        lo, hi = born + self.leaves, freed + self.leaves
        while lo < hi:
            if lo & 1:
                _put(self.held, lo, block)
                lo += 1
            if hi & 1:
                hi -= 1
                _put(self.held, hi, block)
            lo, hi = lo >> 1, hi >> 1

    def meeting(self, born: int, freed: int) -> list[tuple[int, int]]:
        """The ranges whose interval meets ``[born, freed)``: those held at ``born`` and those
        born after it and before ``freed``, each once."""
        out: list[tuple[int, int]] = []
        node = born + self.leaves
        while node:
            out += self.held[node] or ()
            node >>= 1
        lo, hi = born + 1 + self.leaves, freed + self.leaves
        while lo < hi:
            if lo & 1:
                out += self.born[lo] or ()
                lo += 1
            if hi & 1:
                hi -= 1
                out += self.born[hi] or ()
            lo, hi = lo >> 1, hi >> 1
        return out


def _put(lists: Lists, node: int, block: tuple[int, int]) -> None:
    held = lists[node]
    if held is None:
        lists[node] = [block]
    else:
        held.append(block)


def locate(manager: Manager, capacity: int) -> None:
    """Give each copy's writer its location, replaying the placements and frees.

    On each GPU's allocator: a writer waits for the readers of whatever it overwrites (memory
    edges).

    Parameters
    ----------
    manager : Manager
        The planned pass, its copies laid out by :func:`pack`.
    capacity : int
        The GPU's bytes.
    """
    mg = manager.mg
    memory = {dev: GpuMemory(dev, capacity) for dev in manager.used}
    for k, copy in enumerate(manager.events):
        dev = copy.slot[1]
        if k == copy.freed:
            memory[dev].release(copy, copy.offset, tuple(copy.readers) or (copy.writer,), k)
            continue
        covered = memory[dev].place(copy.offset, copy.size, copy)
        mg.add_edges([g for segment in covered for g in segment.guard], copy.writer, "memory")
        mg[copy.writer].loc = Loc(dev, copy.offset, copy.size)

