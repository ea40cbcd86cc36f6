"""A simulated offset allocator for one GPU (the generalised slot map of TURNIP Sec. 6).

Memory is a sorted list of segments.  An occupied segment names its occupant; a free segment
keeps the *guard* of the bytes it covers: the MemGraph vertices that must finish before a new
writer may overwrite them (the readers of the last occupant, or the offload that copied it
out).  Allocating over free segments hands their guards to the caller, which turns them into
memory-dependency edges.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable

Owner = Any   # what the caller names an occupant by (BuildMemGraph: a Slot); hashable


@dataclass(slots=True, eq=False)
class Segment:
    start: int
    end: int
    owner: Owner = None              # None: free
    guard: tuple[str, ...] = ()
    freed_at: int = -1


_start = attrgetter("start")


class GpuMemory:
    """The simulated address space ``[0, capacity)`` of one GPU."""

    def __init__(self, device: str, capacity: int):
        self.device = device
        self.capacity = capacity
        self.segments: list[Segment] = [Segment(0, capacity)]
        self._no_fit = capacity + 1   # no free run holds this many bytes

    # -- simMalloc's search ---------------------------------------------------------------
    def find_free(self, size: int) -> int | None:
        """Offset of the free run that fits ``size`` and whose bytes were freed longest ago
        (TURNIP: "the available slot whose last use was furthest in the past"); ties go to the
        lowest offset.  ``None`` if no free run is large enough."""
        if size >= self._no_fit:
            return None
        best, best_key = None, None
        start = end = newest = -1                   # the window at the start of this free run
        for s in self.segments:
            if s.owner is not None:
                start = -1
                continue
            if start < 0:
                start, end, newest = s.start, s.start + size, -1
            if end < 0:
                continue                            # this run's window is already judged
            if s.freed_at > newest:
                newest = s.freed_at
            if s.end >= end:
                if newest < 0:
                    return start                    # never used: nothing can beat it
                if best_key is None or newest < best_key:
                    best, best_key = start, newest
                end = -1
        if best is None:
            self._no_fit = size
        return best

    def find_victims(self, size: int, cost: Callable[[Owner], tuple[float, int] | None]
                     ) -> tuple[int, list[Owner]] | None:
        """simMallocOffld's search: a window of ``size`` bytes whose occupants may all be
        evicted (``cost`` is not None) and whose worst occupant is least bad, where
        ``cost(owner) = (badness, bytes to offload)``; ties go to the window that offloads
        fewer bytes, then to the lowest offset.  Returns its offset and its occupants.

        Windows start at segment starts; one sliding pass keeps the window's pinned count,
        offload bytes and (in a monotonic deque) its worst badness."""
        segs, n = self.segments, len(self.segments)
        badness = [0.0] * n                # of each evictable occupant seen
        moves = [-1] * n                   # its bytes to offload; -1: free or pinned
        worst: deque[int] = deque()        # evictable indices in the window, badness decreasing
        best_key: tuple[float, int, int] | None = None
        first = last = 0                   # the best window is segments first..last-1
        j = pinned = moved = 0             # the window is segments i..j-1
        for i in range(n):
            start = segs[i].start
            end = start + size
            if end > self.capacity:
                break
            while j < n and segs[j].start < end:
                owner = segs[j].owner
                if owner is not None:
                    c = cost(owner)
                    if c is None:
                        pinned += 1
                    else:
                        badness[j], moves[j] = c
                        moved += c[1]
                        while worst and badness[worst[-1]] <= c[0]:
                            worst.pop()
                        worst.append(j)
                j += 1
            if not pinned:
                key = (badness[worst[0]] if worst else -math.inf, moved, start)
                if best_key is None or key < best_key:
                    best_key, first, last = key, i, j
                    if key[:2] == (-math.inf, 0):
                        break                   # nothing to lose here: no window beats it
            owner = segs[i].owner
            if owner is not None:               # segment i leaves the window
                if moves[i] < 0:
                    pinned -= 1
                else:
                    moved -= moves[i]
                    if worst and worst[0] == i:
                        worst.popleft()
        if best_key is None:
            return None
        return best_key[2], [s.owner for s in segs[first:last] if s.owner is not None]

    def owners(self) -> list[Owner]:
        return [s.owner for s in self.segments if s.owner is not None]

    # -- updates --------------------------------------------------------------------------
    def place(self, offset: int, size: int, owner: Owner) -> list[Segment]:
        """Occupy ``[offset, offset + size)``, which must be free; return the free segments it
        covered (their guards become memory edges; :meth:`restore` puts them back)."""
        segs, end = self.segments, offset + size
        i = self._index(offset)
        if segs[i].start < offset:
            self._split(i, offset)
            i += 1
        j = i
        while segs[j].end < end:
            j += 1
        if segs[j].end > end:
            self._split(j, end)
        covered = segs[i:j + 1]
        segs[i:j + 1] = [Segment(offset, end, owner)]
        return covered

    def release(self, owner: Owner, offset: int, guard: tuple[str, ...], now: int) -> None:
        """Free ``owner``'s segment; new writers there must wait for ``guard``."""
        i = self._index(offset)
        s = self.segments[i]
        assert s.owner == owner
        s.owner, s.guard, s.freed_at = None, guard, now
        self._freed(i, i)

    def restore(self, owner: Owner, offset: int, covered: list[Segment]) -> None:
        """Undo ``place``: the bytes get back the guards they had (retraction)."""
        i = self._index(offset)
        assert self.segments[i].owner == owner
        self.segments[i:i + 1] = covered
        self._freed(i, i + len(covered) - 1)

    def _freed(self, i: int, j: int) -> None:
        """Segments ``i..j`` became free: only the free run containing them grew, so if it is
        the largest run, ``find_free``'s fail threshold becomes its size plus one."""
        segs = self.segments
        while i > 0 and segs[i - 1].owner is None:
            i -= 1
        while j + 1 < len(segs) and segs[j + 1].owner is None:
            j += 1
        run = segs[j].end - segs[i].start
        if run >= self._no_fit:
            self._no_fit = run + 1

    def _index(self, offset: int) -> int:
        """Index of the segment containing ``offset`` (binary search on starts)."""
        return bisect.bisect_right(self.segments, offset, key=_start) - 1

    def _split(self, i: int, at: int) -> None:
        s = self.segments[i]
        if s.start < at < s.end:
            self.segments.insert(i + 1, Segment(at, s.end, s.owner, s.guard, s.freed_at))
            s.end = at
