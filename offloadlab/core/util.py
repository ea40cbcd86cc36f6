"""Small helpers shared by the layers."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector around allocation-heavy loops (planning or simulating
    100k-vertex graphs creates millions of acyclic objects that it would rescan repeatedly).

    On exit every object in the young generations, the ones made meanwhile above all, moves
    straight to the oldest (``freeze`` then ``unfreeze``), where a collection would have moved
    the survivors anyway, instead of being scanned once more by the first young collection;
    cyclic garbage made meanwhile then waits for a full collection.  This is skipped if the
    caller has frozen objects (``unfreeze`` would thaw them)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()
