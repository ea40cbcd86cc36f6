"""Small helpers shared by the layers."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector around allocation-heavy loops (planning or simulating
    100k-vertex graphs creates millions of acyclic objects that it would rescan repeatedly)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
