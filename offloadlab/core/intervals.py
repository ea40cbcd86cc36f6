"""A sorted interval map of the bytes of one GPU to the vertex that last wrote them."""

from __future__ import annotations

import bisect


class LastWriter:
    """Byte ranges of one GPU mapped to the vertex that last wrote them (a sorted interval map)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.items: list[tuple[int, int, str]] = []

    def overwrite(self, start: int, end: int, writer: str) -> set[str]:
        """Record ``writer`` on ``[start, end)``; return the previous writers there."""
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        j = i
        previous, keep = set(), []
        while j < len(self.items) and self.items[j][0] < end:
            s, e, w = self.items[j]
            if e > start:
                previous.add(w)
                if s < start:
                    keep.append((s, start, w))
                if e > end:
                    keep.append((end, e, w))
            else:
                keep.append((s, e, w))
            j += 1
        new = sorted(keep + [(start, end, writer)])
        self.items[i:j] = new
        self.starts[i:j] = [s for s, _, _ in new]
        return previous
