"""A sorted interval map of the bytes of one GPU to the vertex that last wrote them."""

from __future__ import annotations

import bisect
from typing import Generic, TypeVar

W = TypeVar("W")

BLOCK = 256
"""Intervals per block of :class:`LastWriter` (a block is split at twice this many)."""

SCAN_PREVIOUS = 8
"""Previous writers an overwrite keeps in a list alone, scanned for repeats; past this many, a
set beside it (a plan's overwrite finds 2 on average and 18 at most; an overwrite across
thousands of writers would otherwise be quadratic)."""


class Interval(Generic[W]):
    """The bytes ``[start, end)``, last written by ``writer``.  Compiled, its bounds are
    machine integers inside the object, so that a search reads one object per step (a tuple
    of Python integers costs two, the tuple and the integer)."""

    __slots__ = ("start", "end", "writer")

    def __init__(self, start: int, end: int, writer: W) -> None:
        self.start, self.end, self.writer = start, end, writer

    def __repr__(self) -> str:
        return f"Interval({self.start}, {self.end}, {self.writer!r})"


class LastWriter(Generic[W]):
    """Byte ranges of one GPU mapped to the vertex (any value: an id, an index) that last
    wrote them: disjoint :class:`Interval`\\ s, sorted, in blocks of at most twice ``block``,
    with the first start of each block beside them for the binary search, so that an update
    moves at most a block's worth of entries however many intervals the GPU holds (one
    sorted list moved its whole tail on every insertion, which made verifying a
    million-vertex plan at generous memory quadratic)."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.blocks: list[list[Interval[W]]] = []
        self.firsts: list[int] = []      # the start of each block's first interval

    def overwrite(self, start: int, end: int, writer: W) -> list[W]:
        """Record ``writer`` on ``[start, end)``; return the previous writers there.

        Parameters
        ----------
        start, end : int
            The byte range (an empty one writes no bytes).
        writer : object
            Its new writer.

        Returns
        -------
        list
            The previous writers of the range, each once, in address order.
        """
        if end <= start:
            return []
        blocks, firsts = self.blocks, self.firsts
        new = Interval(start, end, writer)
        if not blocks:
            blocks.append([new])
            firsts.append(start)
            return []
        b = max(bisect.bisect_right(firsts, start) - 1, 0)
        block = blocks[b]
        i = max(_starts_after(block, start) - 1, 0)
        previous: list[W] = []
        seen: set[W] | None = None      # previous as a set, once it is too long to scan
        keep: list[Interval[W]] = []    # what stays of the intervals from i on, then new
        tail: Interval[W] | None = None     # what stays after new: the last one's end
        c, j = b, i                     # the intervals from block b, item i to block c, item j
        while True:
            items = blocks[c]
            while j < len(items) and items[j].start < end:
                x = items[j]
                if x.end <= start:      # item i, when it ends before start
                    keep.append(x)
                else:
                    w = x.writer
                    if seen is not None:
                        if w not in seen:
                            seen.add(w)
                            previous.append(w)
                    elif w not in previous:
                        previous.append(w)
                        if len(previous) > SCAN_PREVIOUS:
                            seen = set(previous)
                    if x.start < start:
                        keep.append(Interval(x.start, start, w))
                    if x.end > end:
                        tail = Interval(end, x.end, w)
                j += 1
            if j < len(items) or c + 1 == len(blocks) or firsts[c + 1] >= end:
                break
            c, j = c + 1, 0
        keep.append(new)
        if tail is not None:
            keep.append(tail)
        if c == b:
            block[i:j] = keep
        else:                           # the overwrite spans blocks b..c: merge them into b
            block[i:] = keep
            block.extend(blocks[c][j:])
            del blocks[b + 1:c + 1], firsts[b + 1:c + 1]
        firsts[b] = block[0].start
        half = self.block
        while len(block) > 2 * half:
            blocks.insert(b + 1, block[-half:])
            firsts.insert(b + 1, block[-half].start)
            del block[-half:]
        return previous


    def writers(self, start: int, end: int) -> list[W]:
        """The writers of the bytes ``[start, end)`` now; nothing changes.

        Parameters
        ----------
        start, end : int
            The byte range.

        Returns
        -------
        list
            Its writers, each once, in address order (bytes never written have none).
        """
        blocks, firsts = self.blocks, self.firsts
        found: list[W] = []
        if end <= start or not blocks:
            return found
        b = max(bisect.bisect_right(firsts, start) - 1, 0)
        j = max(_starts_after(blocks[b], start) - 1, 0)
        for items in blocks[b:]:
            for x in items[j:]:
                if x.start >= end:
                    return found
                if x.end > start and x.writer not in found:
                    found.append(x.writer)
            j = 0
        return found


def _starts_after(items: list[Interval[W]], start: int) -> int:
    """The place of the first of ``items`` (sorted) to start after ``start``: a binary
    search written out, which compiled reads each step's bound in place (``bisect`` with a
    key calls it per step, 1.6x slower here)."""
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if start < items[mid].start:
            hi = mid
        else:
            lo = mid + 1
    return lo
