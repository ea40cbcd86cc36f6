"""A sorted interval map of the bytes of one GPU to the vertex that last wrote them."""

from __future__ import annotations

import bisect
from operator import itemgetter
from typing import Generic, TypeVar

W = TypeVar("W")

BLOCK = 256
"""Intervals per block of :class:`LastWriter` (a block is split at twice this many)."""


_start = itemgetter(0)


class LastWriter(Generic[W]):
    """Byte ranges of one GPU mapped to the vertex (any value: an id, an index) that last
    wrote them: disjoint ``(start, end, writer)`` intervals, sorted, in blocks of at most
    twice ``block``, with the first start of each block beside them for the binary search, so
    that an update moves at most a block's worth of entries however many intervals the GPU
    holds (one sorted list moved its whole tail on every insertion, which made verifying a
    million-vertex plan at generous memory quadratic)."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.blocks: list[list[tuple[int, int, W]]] = []
        self.firsts: list[int] = []      # the start of each block's first interval

    def overwrite(self, start: int, end: int, writer: W) -> set[W]:
        """Record ``writer`` on ``[start, end)``; return the previous writers there (none for
        an empty range, which writes no bytes)."""
        if end <= start:
            return set()
        blocks, firsts = self.blocks, self.firsts
        new = (start, end, writer)
        if not blocks:
            blocks.append([new])
            firsts.append(start)
            return set()
        b = max(bisect.bisect_right(firsts, start) - 1, 0)
        block = blocks[b]
        i = max(bisect.bisect_right(block, start, key=_start) - 1, 0)
        previous: set[W] = set()
        keep: list[tuple[int, int, W]] = []
        c, j = b, i                     # the intervals from block b, item i to block c, item j
        while True:
            items = blocks[c]
            while j < len(items) and items[j][0] < end:
                s, e, w = items[j]
                if e > start:
                    previous.add(w)
                    if s < start:
                        keep.append((s, start, w))
                    if e > end:
                        keep.append((end, e, w))
                else:
                    keep.append((s, e, w))
                j += 1
            if j < len(items) or c + 1 == len(blocks) or firsts[c + 1] >= end:
                break
            c, j = c + 1, 0
        keep.append(new)
        keep.sort(key=_start)
        if c == b:
            block[i:j] = keep
        else:                           # the overwrite spans blocks b..c: merge them into b
            block[i:] = keep
            block.extend(blocks[c][j:])
            del blocks[b + 1:c + 1], firsts[b + 1:c + 1]
        firsts[b] = block[0][0]
        half = self.block
        while len(block) > 2 * half:
            blocks.insert(b + 1, block[-half:])
            firsts.insert(b + 1, block[-half][0])
            del block[-half:]
        return previous
