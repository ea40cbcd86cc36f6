"""The host block's allocator: TURNIP Sec. 5 allocates CPU storage for a tensor when it is
offloaded and frees it when it is reloaded, inside one block allocated at start-up; and the
filling of host buffers at start-up."""

from __future__ import annotations

import bisect

import numpy as np

FILL_CHUNK = 64 * 2**20   # bytes written at once: Python sees Ctrl-C between two chunks


def fill(buffer: np.ndarray, byte: int) -> None:
    """Set every byte of a host buffer to ``byte``, a chunk at a time (a gigabyte arena takes
    seconds to fault in on first touch; a single ``fill`` would not let Ctrl-C through).

    Parameters
    ----------
    buffer : numpy.ndarray
        A host array.
    byte : int
        The value.
    """
    flat = buffer.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, FILL_CHUNK):
        flat[start:start + FILL_CHUNK].fill(byte)


class HostAllocator:
    """First fit over the free ranges of a block of ``size`` bytes, merging on free."""

    def __init__(self, size: int):
        self.size = size
        self.starts: list[int] = [0] if size else []   # free ranges, sorted by start
        self.ends: list[int] = [size] if size else []
        self.used = 0

    def alloc(self, nbytes: int) -> int | None:
        """The offset of ``nbytes`` free bytes, or None if no free range is long enough.

        Parameters
        ----------
        nbytes : int
            The size.

        Returns
        -------
        int or None
            The offset.
        """
        if nbytes == 0:
            return 0
        for i, (start, end) in enumerate(zip(self.starts, self.ends)):
            if end - start >= nbytes:
                if end - start == nbytes:
                    del self.starts[i], self.ends[i]
                else:
                    self.starts[i] = start + nbytes
                self.used += nbytes
                return start
        return None

    def free(self, offset: int, nbytes: int) -> None:
        """Return ``[offset, offset + nbytes)``, merging it with free neighbours.

        Parameters
        ----------
        offset : int
            Where the range starts.
        nbytes : int
            Its size.

        Raises
        ------
        ValueError
            Part of the range is free already.
        """
        if nbytes == 0:
            return
        i = bisect.bisect(self.starts, offset)
        end = offset + nbytes
        if i and self.ends[i - 1] > offset or i < len(self.starts) and self.starts[i] < end:
            raise ValueError(f"host block: freeing [{offset}, {end}) which is partly free")
        self.used -= nbytes
        if i < len(self.starts) and self.starts[i] == end:        # merge with the next
            end = self.ends[i]
            del self.starts[i], self.ends[i]
        if i and self.ends[i - 1] == offset:                       # merge with the previous
            self.ends[i - 1] = end
        else:
            self.starts.insert(i, offset)
            self.ends.insert(i, end)
