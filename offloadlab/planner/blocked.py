"""A blocked sorted list of ``(size, key)`` items with distinct keys that answers "the least key
among the items of at least this size" (the allocator's free-space search,
:meth:`GpuMemory.find_free`).

The items are sorted by key in blocks of at most twice ``block`` items (as ``sortedcontainers``
keeps its lists); each block knows its last key, its largest size and how many items have it,
and a max tree over the blocks' largest sizes finds the first block holding an item of at least
a size.  Adding or removing an item costs a binary search over the blocks, one within a block, a
move within it and a walk up the tree (and, when the last item of the block's largest size
leaves, a pass over the block; when a block splits or empties, the tree is built again); a query
descends the tree to the first block holding an item that large and passes over that block.
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
        self.leaves = 1                     # the tree's leaves: a power of two, >= the blocks
        self.tree: list[int] = [-1, -1]     # [1]: the root; [leaves + k]: block k's largest

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
        self._build_tree()

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
            self._build_tree()
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
            self._grew(k)
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
            self._build_tree()

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
            self._build_tree()
            return
        if pos == len(keys):
            self.last[k] = keys[-1]
        if size == self.largest[k]:
            self.at_largest[k] -= 1
            if not self.at_largest[k]:
                self._measure(k)
                self._shrank(k)

    def _measure(self, k: int) -> None:
        """Find block ``k``'s largest size and how many of its items have it."""
        sizes = self.sizes[k]
        largest = max(sizes)
        self.largest[k], self.at_largest[k] = largest, sizes.count(largest)

    # -- the max tree over the blocks' largest sizes ------------------------------------------
    def _build_tree(self) -> None:
        """Build the tree again for the blocks as they are (after a split or a removal)."""
        leaves = 1
        while leaves < len(self.largest):
            leaves *= 2
        tree = [-1] * leaves + self.largest + [-1] * (leaves - len(self.largest))
        for i in range(leaves - 1, 0, -1):
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
        self.leaves, self.tree = leaves, tree

    def _grew(self, k: int) -> None:
        """Block ``k``'s largest size rose: raise its ancestors up to one already as large."""
        tree, size = self.tree, self.largest[k]
        i = self.leaves + k
        while i and tree[i] < size:
            tree[i] = size
            i >>= 1

    def _shrank(self, k: int) -> None:
        """Block ``k``'s largest size fell: its ancestors take their children's maxima."""
        tree = self.tree
        i = self.leaves + k
        tree[i] = self.largest[k]
        i >>= 1
        while i:
            top = max(tree[2 * i], tree[2 * i + 1])
            if tree[i] == top:
                break
            tree[i] = top
            i >>= 1

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
        tree = self.tree
        if tree[1] < size:
            return -1
        i, leaves = 1, self.leaves
        while i < leaves:                   # to the leftmost child holding that size
            i = 2 * i if tree[2 * i] >= size else 2 * i + 1
        k = i - leaves
        sizes, j = self.sizes[k], 0
        while sizes[j] < size:              # the tree says block k holds one
            j += 1
        return self.keys[k][j]


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
