"""A blocked sorted list of ``(size, key)`` items with distinct keys that answers "the least key
among the items of at least this size" (the allocator's free-space search,
:meth:`GpuMemory.find_free`).

The items are sorted by key in blocks of at most twice ``block`` items (as ``sortedcontainers``
keeps its lists); each block knows its last key, its largest size and how many items have it.
Adding or removing an item costs a binary search over the blocks, one within a block and a move
within it (and, when the last item of the block's largest size leaves, a pass over the block);
a query passes over the blocks' largest sizes up to the first block holding an item that large,
and over that block.
"""

from __future__ import annotations

BLOCK = 64
"""Half the most items a block holds by default (a full block is split in two)."""


class Blocked:
    """``(size, key)`` pairs of non-negative ints, each key once; :meth:`least` is the query."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.keys: list[list[int]] = []     # per block, ascending
        self.sizes: list[list[int]] = []    # per block, the sizes beside those keys
        self.last: list[int] = []           # each block's last key
        self.largest: list[int] = []        # each block's largest size
        self.at_largest: list[int] = []     # how many of its items have that size

    def __len__(self) -> int:
        return sum([len(keys) for keys in self.keys])

    def items(self) -> list[tuple[int, int]]:
        """Every item ``(size, key)``, by key.

        Returns
        -------
        list of (int, int)
            The items.
        """
        return [(s, k) for sizes, keys in zip(self.sizes, self.keys) for s, k in zip(sizes, keys)]

    def clear(self) -> None:
        for kept in (self.keys, self.sizes, self.last, self.largest, self.at_largest):
            kept.clear()

    def add(self, size: int, key: int) -> None:
        """Add the item ``(size, key)``, whose key must not be there.

        Parameters
        ----------
        size : int
            The item's size.
        key : int
            Its key.
        """
        if not self.keys:
            self.keys.append([key])
            self.sizes.append([size])
            self.last.append(key)
            self.largest.append(size)
            self.at_largest.append(1)
            return
        k = min(_first_at_least(self.last, key), len(self.last) - 1)
        keys, sizes = self.keys[k], self.sizes[k]
        pos = _first_at_least(keys, key)
        keys.insert(pos, key)
        sizes.insert(pos, size)
        if pos == len(keys) - 1:
            self.last[k] = key
        if size > self.largest[k]:
            self.largest[k], self.at_largest[k] = size, 1
        elif size == self.largest[k]:
            self.at_largest[k] += 1
        half = self.block
        if len(keys) > 2 * half:               # split in two
            self.keys.insert(k + 1, keys[half:])
            self.sizes.insert(k + 1, sizes[half:])
            del keys[half:]
            del sizes[half:]
            self.last.insert(k, keys[-1])
            self.largest.insert(k, 0)
            self.at_largest.insert(k, 0)
            self._measure(k)
            self._measure(k + 1)

    def remove(self, size: int, key: int) -> None:
        """Remove the item ``(size, key)``, which must be there.

        Parameters
        ----------
        size : int
            Its size, as added.
        key : int
            Its key.
        """
        k = _first_at_least(self.last, key)
        assert k < len(self.last), "no such item"
        keys, sizes = self.keys[k], self.sizes[k]
        pos = _first_at_least(keys, key)
        assert keys[pos] == key and sizes[pos] == size, "no such item"
        del keys[pos]
        del sizes[pos]
        if not keys:
            for kept in (self.keys, self.sizes, self.last, self.largest, self.at_largest):
                del kept[k]
            return
        if pos == len(keys):
            self.last[k] = keys[-1]
        if size == self.largest[k]:
            self.at_largest[k] -= 1
            if not self.at_largest[k]:
                self._measure(k)

    def _measure(self, k: int) -> None:
        """Find block ``k``'s largest size and how many of its items have it."""
        sizes = self.sizes[k]
        largest = max(sizes)
        self.largest[k], self.at_largest[k] = largest, sizes.count(largest)

    def least(self, size: int) -> int:
        """The least key among the items of at least ``size``, or -1 if there is none.

        Parameters
        ----------
        size : int
            The size wanted.

        Returns
        -------
        int
            The key, or -1.
        """
        largest = self.largest
        for k in range(len(largest)):
            if largest[k] >= size:
                sizes = self.sizes[k]
                for i in range(len(sizes)):
                    if sizes[i] >= size:
                        return self.keys[k][i]
        return -1


def _first_at_least(values: list[int], x: int) -> int:
    """The first position in the ascending ``values`` whose value is at least ``x``
    (:func:`bisect.bisect_left`, compiled with its comparisons on ints)."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo
