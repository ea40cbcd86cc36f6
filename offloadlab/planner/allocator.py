"""A simulated offset allocator for one GPU (the generalised slot map of TURNIP Sec. 6).

Memory is a list of segments linked in address order; an occupied segment names its occupant,
a free one keeps the *guard* of its bytes (the vertices that must finish before a new writer
may overwrite them), which an allocation hands to the caller as memory edges.  With many
segments the free runs are indexed by the latest freeing their windows cover (a
:class:`Blocked` list of steps, found lazily by :class:`_Run`), so that
:meth:`GpuMemory.find_free` is one query; with few, the allocator scans.  See docs/design.md
(``buildmemgraph``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from .blocked import Blocked

Owner = Any   # what the caller names an occupant by (BuildMemGraph: its Resident)


@dataclass(slots=True, eq=False, init=False)
class Segment:
    start: int
    end: int
    owner: Owner                     # None: free
    guard: tuple[str, ...]
    freed_at: int
    prev: Segment | None             # the neighbours in address order
    next: Segment | None

    # written out: compiled, it is native code, where dataclass's generated one is interpreted
    def __init__(self, start: int, end: int, owner: Owner = None, guard: tuple[str, ...] = (),
                 freed_at: int = -1):
        self.start, self.end, self.owner, self.guard, self.freed_at = \
            start, end, owner, guard, freed_at
        self.prev = self.next = None


@dataclass(slots=True, eq=False, init=False)
class _Run:
    """A free run ``[start, end)`` of the index, its steps found up to segment ``reached``
    (:meth:`GpuMemory._reach`): ``steps`` holds the closed ones, ``[size, key, ...]``; the
    step of value ``newest`` that ``reached`` is in is the item ``(end - start, key)``, exact
    for the windows up to ``reached.end`` and a lower bound for the longer ones."""

    start: int
    end: int
    steps: list[int]
    newest: int
    key: int
    reached: Segment

    def __init__(self, start: int, end: int, first: Segment, shift: int):
        self.start, self.end, self.steps = start, end, []
        self.newest = first.freed_at
        self.key = (first.freed_at + 1) << shift | start
        self.reached = first


INDEX_AT = 64
"""Segments from which :meth:`GpuMemory.find_free` indexes the free runs (it drops the index
below a quarter of that)."""

VICTIM_SCAN = 128
"""Window starts that :meth:`GpuMemory.find_victims` judges per eviction (its clock hand's
reach); 64 to 512 were measured (docs/results/quality.md, the victim search)."""

PINNED = 2**61
"""The badness of an occupant that must stay (:class:`Victims`)."""

LEAST = -PINNED
"""The badness of evicting nothing; no occupant's is lower."""


class Victims(Protocol):
    """What :meth:`GpuMemory.find_victims` asks about each occupant it judges."""

    def badness(self, owner: Owner) -> int:
        """How bad evicting ``owner`` is, from :data:`LEAST` up; :data:`PINNED` if it must
        stay.

        Parameters
        ----------
        owner : Owner
            An occupant.

        Returns
        -------
        int
            Its badness.
        """

    def moved(self, owner: Owner) -> int:
        """The bytes evicting ``owner`` moves (asked only when it is not pinned).

        Parameters
        ----------
        owner : Owner
            An occupant that is not pinned.

        Returns
        -------
        int
            The bytes.
        """


class GpuMemory:
    """The simulated address space ``[0, capacity)`` of one GPU."""

    def __init__(self, device: str, capacity: int):
        self.device = device
        self.capacity = capacity
        self.first = Segment(0, capacity)     # the segments, linked from the lowest address
        self._at: dict[int, Segment] = {0: self.first}   # segment start -> segment
        self.free = capacity          # free bytes
        self._no_fit = capacity + 1   # no free run holds this many bytes
        self._hand = 0                # find_victims' clock hand: an offset,
        self._hand_at = self.first    # and the segment containing it
        self._indexed = False         # whether the free runs below are kept
        self._runs: dict[int, _Run] = {}         # free run start -> its steps found so far
        self._run_start: dict[int, int] = {}     # free run end -> its start
        self._steps = Blocked()                  # every run's steps (_add_run)
        self._shift = capacity.bit_length()     # a step key's bits for a start

    @property
    def segments(self) -> list[Segment]:
        """The segments in address order."""
        out: list[Segment] = []
        s: Segment | None = self.first
        while s is not None:
            out.append(s)
            s = s.next
        return out

    # -- simMalloc's search ---------------------------------------------------------------
    def find_free(self, size: int) -> int | None:
        """Offset of the free run that fits ``size`` and whose bytes were freed longest ago
        (TURNIP: "the available slot whose last use was furthest in the past"): the window
        ``[start, start + size)`` at the start of each run is judged by the latest freeing
        among its bytes, ties going to the lowest offset.  ``None`` if no run is large enough.

        With the index, it is the least key among the steps serving ``size`` (:meth:`_add_run`):
        a run's steps serving it are the one its window falls in and the later, higher ones.
        Where that key is a run's open step and the window reaches past the segments its
        value is known for, the run's steps are found up to the window's end
        (:meth:`_reach`) and the query asked again: every other item's key is at most that
        of the step it stands for, so the least key that is exact is the answer.

        Parameters
        ----------
        size : int
            The bytes wanted.

        Returns
        -------
        int or None
            The offset.
        """
        if size >= self._no_fit:
            return None
        if self._indexed != (len(self._at) >= (INDEX_AT // 4 if self._indexed else INDEX_AT)):
            self._index_runs(not self._indexed)
        if not self._indexed:
            return self._scan_free(size)
        mask = (1 << self._shift) - 1
        while True:
            key = self._steps.least(size)
            if key < 0:
                self._no_fit = size
                return None
            run = self._runs[key & mask]
            if key != run.key or run.reached.end - run.start >= size:
                return run.start
            self._reach(run, run.start + size)

    def _scan_free(self, size: int) -> int | None:
        """:meth:`find_free` by one pass over the segments."""
        best, best_key = None, None
        start = end = newest = -1                   # the window at the start of this free run
        s: Segment | None = self.first
        while s is not None:
            if s.owner is not None:
                start = -1
                s = s.next
                continue
            if start < 0:
                start, end, newest = s.start, s.start + size, -1
            if end >= 0:                            # else this run's window is judged
                if s.freed_at > newest:
                    newest = s.freed_at
                if s.end >= end:
                    if newest < 0:
                        return start                # never used: nothing can beat it
                    if best_key is None or newest < best_key:
                        best, best_key = start, newest
                    end = -1
            s = s.next
        if best is None:
            self._no_fit = size
        return best

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
        occupant's memory edges reach back to old frees rather than to the latest.

        Parameters
        ----------
        size : int
            The bytes wanted.
        cost : Victims
            How bad evicting each occupant is, and what it moves.

        Returns
        -------
        tuple or None
            ``(offset, occupants)``, or None if every window holds a pinned occupant.
        """
        n = len(self._at)
        k = min(n, VICTIM_SCAN)
        best, walked = self._slide(self._hand_at, k, size, cost, None)
        if walked < k:
            best, _ = self._slide(self.first, k - walked, size, cost, best)
        if best is None and k < n:
            best, _ = self._slide(self.first, n, size, cost, None)
        if best is None:
            return None
        _, first, last = best
        offset, end = first.start, first.start + size
        victims: list[Owner] = []
        s: Segment | None = first
        while s is not last and s is not None:
            if s.owner is not None:
                victims.append(s.owner)
            s = s.next
        if end < self.capacity:
            self._hand, self._hand_at = end, self._containing(end, first)
        else:
            self._hand, self._hand_at = 0, self.first
        return offset, victims

    def _slide(self, i0: Segment, count: int, size: int, cost: Victims,
               best: tuple[tuple[int, int, int], Segment, Segment | None] | None
               ) -> tuple[tuple[tuple[int, int, int], Segment, Segment | None] | None, int]:
        """:meth:`find_victims` over the windows starting at ``count`` segments from ``i0``
        on (fewer at the end of memory), beating ``best``: ``((worst badness, bytes, distance
        after the hand), first, last)``, the window being the segments from ``first`` up to
        ``last`` (excluded).  Returns that and how many segments it walked.  One sliding pass
        keeps the window's pinned count, its evictable occupants and bytes moved, and (in a
        monotonic deque) its worst badness."""
        hand, capacity = self._hand, self.capacity
        evictable: deque[tuple[Segment, int]] = deque()  # (segment, bytes moved), in the window
        worst: deque[tuple[int, Segment]] = deque()      # (badness, segment), badness decreasing
        i: Segment | None = i0
        j: Segment | None = i0
        pinned = moved = walked = 0         # the window is segments i up to j (excluded)
        top, top_moved, top_distance = best[0] if best is not None else (PINNED, 0, 0)
        judging = True
        while i is not None and walked < count:
            walked += 1
            if judging:
                start = i.start
                end = start + size
                if end > capacity:
                    judging = False             # walk on: the caller counts every start
                    i = i.next
                    continue
                while j is not None and j.start < end:
                    owner = j.owner
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
                    j = j.next
                if not pinned:
                    bad = worst[0][0] if worst else LEAST
                    if best is None or bad < top or bad == top and (moved < top_moved or (
                            moved == top_moved and (start - hand) % capacity < top_distance)):
                        top, top_moved, top_distance = bad, moved, (start - hand) % capacity
                        best = (top, top_moved, top_distance), i, j
                        if bad == LEAST and moved == 0:   # nothing to lose: no window beats it
                            return best, count  # (nor any after a wrap: they are further)
                if i.owner is not None:             # segment i leaves the window
                    if evictable and evictable[0][0] is i:
                        moved -= evictable.popleft()[1]
                        if worst and worst[0][1] is i:
                            worst.popleft()
                    else:
                        pinned -= 1
            i = i.next
        return best, walked

    def owners(self) -> list[Owner]:
        """Every occupant, by offset.

        Returns
        -------
        list of Owner
            The occupants.
        """
        return [s.owner for s in self.segments if s.owner is not None]

    # -- updates --------------------------------------------------------------------------
    def place(self, offset: int, size: int, owner: Owner) -> list[Segment]:
        """Occupy ``[offset, offset + size)``, which must be free; return the free segments it
        covered (their guards become memory edges; :meth:`restore` puts them back).

        Parameters
        ----------
        offset : int
            Where.
        size : int
            How many bytes.
        owner : Owner
            What occupies them.

        Returns
        -------
        list of Segment
            The free segments covered.
        """
        end = offset + size
        first = self._at.get(offset)
        if first is None:                       # not a segment boundary: split there
            first = self._containing(offset, self.first)
            self._split(first, offset)
            first = first.next
            assert first is not None
        indexed = self._indexed
        if indexed:
            r = first                           # the free run's first segment
            while r.prev is not None and r.prev.owner is None:
                r = r.prev
            run = r.start
            run_end = self._runs[run].end
            assert end <= run_end, "place: the bytes are not free"
            self._drop_run(run)
        last = first
        while last.end < end:
            nxt = last.next
            assert nxt is not None
            last = nxt
        if last.end > end:
            self._split(last, end)
        covered: list[Segment] = []
        s: Segment | None = first
        while True:
            assert s is not None and s.owner is None, "place: the bytes are not free"
            covered.append(s)
            if s is last:
                break
            if s is not first:
                del self._at[s.start]
            s = s.next
        if last is not first:
            del self._at[last.start]
        new = Segment(offset, end, owner)
        self._link(first.prev, new, last.next)
        for c in covered:       # unlinked: linked segments are reference cycles, which only
            c.prev = c.next = None      # the collector frees, and it is paused when planning
        self._at[offset] = new
        if self._hand_at in covered:
            self._hand_at = new
        self.free -= size
        if indexed:
            if run < offset:
                self._add_run(run, offset)
            if end < run_end:
                self._add_run(end, run_end)
        return covered

    def release(self, owner: Owner, offset: int, guard: tuple[str, ...], now: int) -> None:
        """Free ``owner``'s segment; new writers there must wait for ``guard``.

        Parameters
        ----------
        owner : Owner
            The occupant leaving.
        offset : int
            Its segment's offset.
        guard : tuple of str
            The vertices the next writers there wait for.
        now : int
            When it is freed (the planner's clock), for :meth:`find_free`.
        """
        s = self._at[offset]
        assert s.owner == owner
        s.owner, s.guard, s.freed_at = None, guard, now
        self.free += s.end - s.start
        self._freed(s, s)

    def restore(self, owner: Owner, offset: int, covered: list[Segment]) -> None:
        """Undo ``place``: the bytes get back the guards they had (retraction).

        Parameters
        ----------
        owner : Owner
            The occupant :meth:`place` placed.
        offset : int
            Where it was placed.
        covered : list of Segment
            What :meth:`place` returned.
        """
        s = self._at[offset]
        assert s.owner == owner
        self.free += s.end - s.start
        prev = s.prev
        for c in covered:                       # relinked where s was
            self._link(prev, c, s.next)
            self._at[c.start] = c
            prev = c
        first, last = covered[0], covered[-1]
        if self._hand_at is s:
            self._hand_at = self._containing(self._hand, first)
        s.prev = s.next = None                  # unlinked (see place)
        self._freed(first, last)

    # -- the index of free runs -------------------------------------------------------------
    def _freed(self, i: Segment, j: Segment) -> None:
        """Segments ``i`` to ``j`` became free: only the free run containing them grew, so if
        it is the largest, ``find_free``'s fail threshold becomes its size plus one; with the
        index, merge them with the free runs on either side."""
        start, end = i.start, j.end
        if not self._indexed:
            while i.prev is not None and i.prev.owner is None:
                i = i.prev
            while j.next is not None and j.next.owner is None:
                j = j.next
            run = j.end - i.start
            if run >= self._no_fit:
                self._no_fit = run + 1
            return
        runs = self._runs
        left = self._run_start.get(start, start)
        right = runs[end].end if end in runs else end
        if right > end:
            self._drop_run(end)
        if left == start:
            self._add_run(start, right)
            return
        # the run on the left keeps the steps it found; its open step's item grows with it
        grown = runs[left]
        del self._run_start[start]
        self._steps.remove(grown.end - left, grown.key)
        grown.end = right
        self._run_start[right] = left
        self._steps.add(right - left, grown.key)
        if right - left >= self._no_fit:
            self._no_fit = right - left + 1

    def _index_runs(self, on: bool) -> None:
        """Start keeping the index of free runs (``on``), or stop."""
        self._runs.clear()
        self._run_start.clear()
        self._steps.clear()
        self._indexed = on
        if on:
            start = -1
            s: Segment | None = self.first
            while s is not None:
                if s.owner is None and start < 0:
                    start = s.start
                if s.owner is not None and start >= 0:
                    self._add_run(start, s.start)
                    start = -1
                s = s.next
            if start >= 0:
                self._add_run(start, self.capacity)

    def _add_run(self, start: int, end: int) -> None:
        """Index the free run ``[start, end)`` by its steps: the window at its start is judged
        by the latest freeing among the segments it covers, which rises at each prefix maximum
        of the segments' freeings; each value ``v`` serves the windows up to the start of the
        segment where the next one begins (the last, up to the run's end), and is the item
        ``(the largest size it serves, (v + 1) << shift | start)`` of :attr:`_steps`.  Only
        the first step is found here, its item standing for the rest (:class:`_Run`)."""
        run = _Run(start, end, self._at[start], self._shift)
        self._runs[start] = run
        self._run_start[end] = start
        self._steps.add(end - start, run.key)
        if end - start >= self._no_fit:
            self._no_fit = end - start + 1

    def _reach(self, run: _Run, end: int) -> None:
        """Find ``run``'s steps up to the segment holding byte ``end - 1``: each segment
        freed later than those before it closes the open step and opens the next."""
        shift, start, s, newest = self._shift, run.start, run.reached, run.newest
        closed = len(run.steps)
        while s.end < end:
            nxt = s.next
            assert nxt is not None and nxt.owner is None, "_reach: past the run's end"
            s = nxt
            if s.freed_at > newest:
                run.steps.append(s.start - start)
                run.steps.append((newest + 1) << shift | start)
                newest = s.freed_at
        run.reached = s
        if len(run.steps) > closed:
            steps, add = run.steps, self._steps.add
            self._steps.remove(run.end - start, run.key)
            for k in range(closed, len(steps), 2):
                add(steps[k], steps[k + 1])
            run.newest, run.key = newest, (newest + 1) << shift | start
            add(run.end - start, run.key)

    def _drop_run(self, start: int) -> None:
        run = self._runs.pop(start)
        del self._run_start[run.end]
        remove, steps = self._steps.remove, run.steps
        for k in range(0, len(steps), 2):
            remove(steps[k], steps[k + 1])
        remove(run.end - start, run.key)

    # -- the linked segments ----------------------------------------------------------------
    def _link(self, prev: Segment | None, s: Segment, next: Segment | None) -> None:
        """Put ``s`` between ``prev`` and ``next`` (``prev`` None: ``s`` comes first)."""
        s.prev, s.next = prev, next
        if prev is None:
            self.first = s
        else:
            prev.next = s
        if next is not None:
            next.prev = s

    def _containing(self, offset: int, s: Segment) -> Segment:
        """The segment containing ``offset``, walking from ``s`` (at or before it)."""
        while s.end <= offset:
            nxt = s.next
            assert nxt is not None, "offset beyond capacity"
            s = nxt
        return s

    def _split(self, s: Segment, at: int) -> None:
        """Cut ``s`` in two at ``at`` (inside it); both halves keep its occupant and guard."""
        if s.start < at < s.end:
            right = Segment(at, s.end, s.owner, s.guard, s.freed_at)
            self._link(s, right, s.next)
            s.end = at
            self._at[at] = right
            if self._hand_at is s and self._hand >= at:
                self._hand_at = right
