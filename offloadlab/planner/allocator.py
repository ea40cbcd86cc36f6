"""A simulated offset allocator for one GPU (the generalised slot map of TURNIP Sec. 6).

Memory is a sorted list of segments.  An occupied segment names its occupant; a free segment
keeps the *guard* of the bytes it covers: the MemGraph vertices that must finish before a new
writer may overwrite them (the readers of the last occupant, or the offload that copied it
out).  Allocating over free segments hands their guards to the caller, which turns them into
memory-dependency edges.

With many segments, free *runs* (maximal stretches of free segments) are indexed by size
class, as in a two-level segregated-fit allocator, so that :meth:`GpuMemory.find_free` looks at
a handful of candidate runs instead of every segment; with few, a scan is cheaper than keeping
the index, and the allocator scans.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

Owner = Any   # what the caller names an occupant by (BuildMemGraph: its Resident)


@dataclass(slots=True, eq=False, init=False)
class Segment:
    start: int
    end: int
    owner: Owner                     # None: free
    guard: tuple[str, ...]
    freed_at: int

    # written out: compiled, it is native code, where dataclass's generated one is interpreted
    def __init__(self, start: int, end: int, owner: Owner = None, guard: tuple[str, ...] = (),
                 freed_at: int = -1):
        self.start, self.end, self.owner, self.guard, self.freed_at = \
            start, end, owner, guard, freed_at


def size_class(n: int) -> int:
    """A monotone size class: eight classes per power of two (two-level segregated fit)."""
    b = n.bit_length()
    return n if b <= 4 else (b << 3) | ((n >> (b - 4)) & 7)


INDEX_AT = 64
"""Segments from which :meth:`GpuMemory.find_free` indexes the free runs (it drops the index
below a quarter of that)."""

VICTIM_SCAN = 128
"""Window starts that :meth:`GpuMemory.find_victims` judges per eviction (its clock hand's
reach); 64 to 512 were measured (README, Scaling)."""

PINNED = 2**61
"""The badness of an occupant that must stay (:class:`Victims`)."""

LEAST = -PINNED
"""The badness of evicting nothing; no occupant's is lower."""


class Victims:
    """What :meth:`GpuMemory.find_victims` asks about each occupant; the caller subclasses
    it (compiled, these are native calls: the search makes one per occupant it judges)."""

    def badness(self, owner: Owner) -> int:
        """How bad evicting ``owner`` is, from :data:`LEAST` up; :data:`PINNED` if it must
        stay."""
        raise NotImplementedError

    def moved(self, owner: Owner) -> int:
        """The bytes evicting ``owner`` moves (asked only when it is not pinned)."""
        raise NotImplementedError


class GpuMemory:
    """The simulated address space ``[0, capacity)`` of one GPU."""

    def __init__(self, device: str, capacity: int):
        self.device = device
        self.capacity = capacity
        self.segments: list[Segment] = [Segment(0, capacity)]
        self.free = capacity          # free bytes
        self._no_fit = capacity + 1   # no free run holds this many bytes
        self._hand = 0                # find_victims' clock hand: an offset
        self._indexed = False         # whether the free runs below are kept
        self._runs: dict[int, tuple[int, int]] = {}   # free run start -> (end, first freed_at)
        self._run_starts: list[int] = []         # the free runs' starts, ascending
        self._run_start: dict[int, int] = {}     # free run end -> its start
        self._class_runs: dict[int, list[int]] = {}  # size class -> _run_key()s, ascending
        self._shift = capacity.bit_length()     # _run_key's bits for a start
        self._classes: list[int] = []            # size classes holding a free run, ascending
        self._prefix: dict[int, tuple[list[int], list[int]]] = {}   # run start -> _window's

    # -- simMalloc's search ---------------------------------------------------------------
    def find_free(self, size: int) -> int | None:
        """Offset of the free run that fits ``size`` and whose bytes were freed longest ago
        (TURNIP: "the available slot whose last use was furthest in the past"): the window
        ``[start, start + size)`` at the start of each run is judged by the latest freeing
        among its bytes, ties going to the lowest offset.  ``None`` if no run is large enough.

        Runs of a size class are sorted by their first segment's freeing, a lower bound of
        their window's, so each class is read only while it can still beat the best."""
        if size >= self._no_fit:
            return None
        if self._indexed != (len(self.segments) >= (INDEX_AT // 4 if self._indexed else INDEX_AT)):
            self._index_runs(not self._indexed)
        if not self._indexed:
            return self._scan_free(size)
        lowest = size_class(size)
        runs, class_runs, classes = self._runs, self._class_runs, self._classes
        best, best_key = -1, math.inf
        shift, mask = self._shift, (1 << self._shift) - 1
        for c in classes[bisect.bisect_left(classes, lowest):]:
            for key in class_runs[c]:
                if (key >> shift) - 1 > best_key:
                    break                               # its first segment's freeing
                start = key & mask
                if c == lowest and runs[start][0] - start < size:
                    continue
                newest = self._window(start, size)
                if newest < best_key or (newest == best_key and start < best):
                    best, best_key = start, float(newest)  # mypyc: best_key is a float
        if best < 0:
            self._no_fit = size
            return None
        return best

    def _scan_free(self, size: int) -> int | None:
        """:meth:`find_free` by one pass over the segments."""
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

    def _window(self, start: int, size: int) -> int:
        """The latest freeing among the first ``size`` bytes of the free run at ``start``,
        from the run's prefix maxima (its segments' ends and the latest freeing up to each),
        computed when the run is first judged and kept until the run changes."""
        prefix = self._prefix.get(start)
        if prefix is None:
            segs, run_end = self.segments, self._runs[start][0]
            i, newest = self._index(start), -1
            ends: list[int] = []
            latest: list[int] = []
            while True:
                s = segs[i]
                if s.freed_at > newest:
                    newest = s.freed_at
                ends.append(s.end)
                latest.append(newest)
                if s.end >= run_end:
                    break
                i += 1
            prefix = self._prefix[start] = (ends, latest)
        ends, latest = prefix
        return latest[bisect.bisect_left(ends, start + size)]

    def find_victims(self, size: int, cost: Victims) -> tuple[int, list[Owner]] | None:
        """simMallocOffld's search: a window of ``size`` bytes whose occupants may all be
        evicted (none is :data:`PINNED`) and whose worst occupant is least bad
        (``cost.badness``); ties go to the window that moves fewer bytes (``cost.moved``).
        Returns its offset and its occupants.

        The search is bounded as the CLOCK page-replacement algorithm bounds LRU: a hand
        sweeps the address space, the windows starting at the :data:`VICTIM_SCAN` segments
        from the hand on are judged (wrapping at the end; all of them only if none of those
        can be emptied), the last ties go to the window nearest after the hand, and the hand
        stops after the chosen window.  An eviction so costs a constant instead of the
        number of residents, and successive evictions cycle through memory, so that a new
        occupant's memory edges reach back to old frees rather than to the latest."""
        n = len(self.segments)
        h, k = self._index(self._hand), min(n, VICTIM_SCAN)
        best = self._slide(h, min(n, h + k), size, cost, None)
        if h + k > n:
            best = self._slide(0, h + k - n, size, cost, best)
        if best is None and k < n:
            best = self._slide(0, n, size, cost, None)
        if best is None:
            return None
        _, first, last = best
        offset = self.segments[first].start
        self._hand = offset + size if offset + size < self.capacity else 0
        return offset, [s.owner for s in self.segments[first:last] if s.owner is not None]

    def _slide(self, i0: int, i1: int, size: int, cost: Victims,
               best: tuple[tuple[int, int, int], int, int] | None
               ) -> tuple[tuple[int, int, int], int, int] | None:
        """:meth:`find_victims` over the windows starting at segments ``i0..i1-1``, beating
        ``best``: ``((worst badness, bytes, distance after the hand), first, last)``, the
        window being segments ``first..last-1``.  One sliding pass keeps the window's pinned
        count, its evictable occupants and offload bytes, and (in a monotonic deque) its worst
        badness."""
        segs, n = self.segments, len(self.segments)
        hand, capacity = self._hand, self.capacity
        evictable: deque[tuple[int, int]] = deque()  # (index, bytes to offload), in the window
        worst: deque[tuple[int, int]] = deque()      # (badness, index), badness decreasing
        j = i0
        pinned = moved = 0                 # the window is segments i..j-1
        top, top_moved, top_distance = best[0] if best is not None else (PINNED, 0, 0)
        for i in range(i0, i1):
            start = segs[i].start
            end = start + size
            if end > capacity:
                break
            while j < n and segs[j].start < end:
                owner = segs[j].owner
                if owner is not None:
                    bad = cost.badness(owner)
                    if bad == PINNED:
                        pinned += 1
                    else:
                        nbytes = cost.moved(owner)
                        evictable.append((j, nbytes))
                        moved += nbytes
                        while worst and worst[-1][0] <= bad:
                            worst.pop()
                        worst.append((bad, j))
                j += 1
            if not pinned:
                bad = worst[0][0] if worst else LEAST
                if best is None or bad < top or bad == top and (moved < top_moved or (
                        moved == top_moved and (start - hand) % capacity < top_distance)):
                    top, top_moved, top_distance = bad, moved, (start - hand) % capacity
                    best = (top, top_moved, top_distance), i, j
                    if bad == LEAST and moved == 0:
                        break                   # nothing to lose here: no window beats it
            if segs[i].owner is not None:       # segment i leaves the window
                if evictable and evictable[0][0] == i:
                    moved -= evictable.popleft()[1]
                    if worst and worst[0][1] == i:
                        worst.popleft()
                else:
                    pinned -= 1
        return best

    def owners(self) -> list[Owner]:
        return [s.owner for s in self.segments if s.owner is not None]

    # -- updates --------------------------------------------------------------------------
    def place(self, offset: int, size: int, owner: Owner) -> list[Segment]:
        """Occupy ``[offset, offset + size)``, which must be free; return the free segments it
        covered (their guards become memory edges; :meth:`restore` puts them back)."""
        segs, end = self.segments, offset + size
        indexed = self._indexed
        if indexed:
            run = offset if offset in self._runs else \
                self._run_starts[bisect.bisect_right(self._run_starts, offset) - 1]
            run_end, first = self._runs[run]
            assert run <= offset and end <= run_end, "place: the bytes are not free"
            self._drop_run(run)
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
        self.free -= size
        if indexed:
            if run < offset:
                self._add_run(run, offset, first)
            if end < run_end:
                self._add_run(end, run_end, segs[i + 1].freed_at)
        return covered

    def release(self, owner: Owner, offset: int, guard: tuple[str, ...], now: int) -> None:
        """Free ``owner``'s segment; new writers there must wait for ``guard``."""
        i = self._index(offset)
        s = self.segments[i]
        assert s.owner == owner
        s.owner, s.guard, s.freed_at = None, guard, now
        self.free += s.end - s.start
        self._freed(i, i, now)

    def restore(self, owner: Owner, offset: int, covered: list[Segment]) -> None:
        """Undo ``place``: the bytes get back the guards they had (retraction)."""
        i = self._index(offset)
        s = self.segments[i]
        assert s.owner == owner
        self.free += s.end - s.start
        self.segments[i:i + 1] = covered
        self._freed(i, i + len(covered) - 1, covered[0].freed_at)

    # -- the index of free runs -------------------------------------------------------------
    def _freed(self, i: int, j: int, first: int) -> None:
        """Segments ``i..j``, the first freed at ``first``, became free: only the free run
        containing them grew, so if it is the largest, ``find_free``'s fail threshold becomes
        its size plus one; with the index, merge them with the free runs on either side."""
        segs = self.segments
        start, end = segs[i].start, segs[j].end
        if not self._indexed:
            while i > 0 and segs[i - 1].owner is None:
                i -= 1
            while j + 1 < len(segs) and segs[j + 1].owner is None:
                j += 1
            run = segs[j].end - segs[i].start
            if run >= self._no_fit:
                self._no_fit = run + 1
            return
        runs = self._runs
        left = self._run_start.get(start, start)
        right = runs[end][0] if end in runs else end
        if left < start:
            first = runs[left][1]
            self._drop_run(left)
        if right > end:
            self._drop_run(end)
        self._add_run(left, right, first)

    def _index_runs(self, on: bool) -> None:
        """Start keeping the index of free runs (``on``), or stop."""
        for kept in (self._runs, self._run_start, self._class_runs, self._prefix):
            kept.clear()
        self._run_starts.clear()
        self._classes.clear()
        self._indexed = on
        if on:
            start = -1
            for s in self.segments:
                if s.owner is None and start < 0:
                    start, first = s.start, s.freed_at
                if s.owner is not None and start >= 0:
                    self._add_run(start, s.start, first)
                    start = -1
            if start >= 0:
                self._add_run(start, self.capacity, first)

    def _add_run(self, start: int, end: int, first: int) -> None:
        """Index the free run ``[start, end)`` whose first segment was freed at ``first``."""
        self._runs[start] = (end, first)
        self._run_start[end] = start
        bisect.insort(self._run_starts, start)
        c = size_class(end - start)
        same = self._class_runs.get(c)
        if same is None:
            same = self._class_runs[c] = []
            bisect.insort(self._classes, c)
        bisect.insort(same, self._run_key(first, start))
        if end - start >= self._no_fit:
            self._no_fit = end - start + 1

    def _run_key(self, first: int, start: int) -> int:
        """A free run's place in its size class, ``(first, start)`` packed in one int so
        that the class's sorted list compares ints instead of tuples."""
        return (first + 1) << self._shift | start

    def _drop_run(self, start: int) -> None:
        end, first = self._runs.pop(start)
        self._prefix.pop(start, None)
        del self._run_start[end]
        starts = self._run_starts
        del starts[bisect.bisect_left(starts, start)]
        c = size_class(end - start)
        same = self._class_runs[c]
        del same[bisect.bisect_left(same, self._run_key(first, start))]
        if not same:
            del self._class_runs[c]
            del self._classes[bisect.bisect_left(self._classes, c)]

    def _index(self, offset: int) -> int:
        """Index of the segment containing ``offset`` (binary search on starts; by hand, as
        compiled it reads each start directly where ``bisect``'s key would be called)."""
        segs = self.segments
        lo, hi = 0, len(segs)
        while lo < hi:
            mid = (lo + hi) >> 1
            if segs[mid].start <= offset:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def _split(self, i: int, at: int) -> None:
        s = self.segments[i]
        if s.start < at < s.end:
            self.segments.insert(i + 1, Segment(at, s.end, s.owner, s.guard, s.freed_at))
            s.end = at
