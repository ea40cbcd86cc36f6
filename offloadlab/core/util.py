"""Small helpers shared by the layers."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector around allocation-heavy loops (planning or simulating
    100k-vertex graphs creates millions of acyclic objects that it would rescan repeatedly).

    On exit the objects made meanwhile go straight to the oldest generation (``freeze`` then
    ``unfreeze``), where a collection would have moved the survivors anyway, instead of being
    scanned once more by the first young collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()
