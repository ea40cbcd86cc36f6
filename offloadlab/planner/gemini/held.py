"""The chunks each GPU holds, in the order the manager evicts them: a heap per GPU instead of a
pass over every chunk for each eviction."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from .chunks import Chunk

Key = tuple[int, ...]


class Held:
    """Each GPU's chunks with a tensor on it, least ``key`` first: a heap per GPU whose entries
    go stale when the chunk's key changes (:meth:`rekey` pushes the new one) or the chunk
    leaves its GPU, and are dropped when they reach the top.  Keys are unique per chunk (they
    end with its index), so that the order, ties included, is the key's."""

    def __init__(self, chunks: list[Chunk], key: Callable[[Chunk], Key]):
        self.chunks, self.key = chunks, key
        self.tensors = [0] * len(chunks)        # chunk -> its tensors on its GPU
        self.keys: list[Key] = [key(c) for c in chunks]
        self.stamp = [0] * len(chunks)          # chunk -> its entry that is not stale
        self.heaps: dict[str, list[tuple[Key, int, int]]] = {}

    def _push(self, chunk: Chunk) -> None:
        k = chunk.index
        self.stamp[k] += 1
        heapq.heappush(self.heaps.setdefault(chunk.device, []),
                       (self.keys[k], self.stamp[k], k))

    def arrive(self, chunk: Chunk) -> None:
        """One of the chunk's tensors is placed on its GPU.

        Parameters
        ----------
        chunk : Chunk
            The chunk.
        """
        self.tensors[chunk.index] += 1
        if self.tensors[chunk.index] == 1:
            self._push(chunk)

    def leave(self, chunk: Chunk) -> None:
        """One of the chunk's tensors leaves its GPU.

        Parameters
        ----------
        chunk : Chunk
            The chunk.
        """
        self.tensors[chunk.index] -= 1

    def rekey(self, chunk: Chunk) -> None:
        """The chunk's key may have changed.

        Parameters
        ----------
        chunk : Chunk
            The chunk.
        """
        key = self.key(chunk)
        if key != self.keys[chunk.index]:
            self.keys[chunk.index] = key
            if self.tensors[chunk.index]:
                self._push(chunk)

    def first(self, device: str, skip: list[Chunk]) -> Chunk | None:
        """The chunk of ``device`` with the least key among those with a tensor on it.

        Parameters
        ----------
        device : str
            The GPU.
        skip : list of Chunk
            Chunks not to choose.

        Returns
        -------
        Chunk or None
            None if there is none.
        """
        heap = self.heaps.get(device, [])
        aside = []
        found = None
        while heap:
            _, stamp, k = heap[0]
            if stamp != self.stamp[k] or not self.tensors[k]:
                heapq.heappop(heap)
            elif self.chunks[k] in skip:
                aside.append(heapq.heappop(heap))
            else:
                found = self.chunks[k]
                break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found
