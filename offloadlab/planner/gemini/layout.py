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
    """Lay out the copies offline, knowing their lifetimes, and return the bytes each GPU then
    needs: on each GPU the better of two first-fit layouts, largest copies first (greedy by
    size) and largest size times lifetime first."""
    need: dict[str, int] = {}
    by_gpu: dict[str, list[Copy]] = {}
    for c in copies:
        by_gpu.setdefault(c.slot[1], []).append(c)
    for dev, mine in by_gpu.items():
        # lifetimes counted in this GPU's events, so that a GPU's layout does not depend on
        # what the others do
        rank = {e: k for k, e in enumerate(sorted({e for c in mine for e in (c.born, c.freed)}))}
        layouts = [_first_fit(mine, lambda c: (-c.size, c.born)),
                   _first_fit(mine, lambda c: (-c.size * (rank[c.freed] - rank[c.born]),
                                               c.born))]
        offsets, need[dev] = min(layouts, key=lambda layout: layout[1])
        for c, offset in zip(mine, offsets):
            c.offset = offset
    return need


def _first_fit(copies: list[Copy], key: Callable[[Copy], tuple[int, int]]
               ) -> tuple[list[int], int]:
    """Each copy's offset when they are placed in the order of ``key``, each at the lowest
    offset that no copy living at the same time holds; and the bytes they take."""
    offsets = [0] * len(copies)
    placed: list[tuple[int, int, int, int]] = []     # (born, freed, offset, end)
    for k in sorted(range(len(copies)), key=lambda k: key(copies[k])):
        c = copies[k]
        offset = 0
        for start, end in sorted((o, e) for b, f, o, e in placed if b < c.freed and c.born < f):
            if start - offset >= c.size:
                break
            offset = max(offset, end)
        offsets[k] = offset
        placed.append((c.born, c.freed, offset, offset + c.size))
    return offsets, max(end for *_, end in placed)


def locate(manager: Manager, capacity: int) -> None:
    """Give each copy's writer its location, replaying the placements and frees on each GPU's
    allocator: a writer waits for the readers of whatever it overwrites (memory edges)."""
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

