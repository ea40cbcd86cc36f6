"""Small helpers shared by the layers."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

PROMOTE_AT = 100_000
"""A :func:`no_gc` block that leaves this many new objects or more promotes them."""

_promoted = 0       # objects promoted since the last full collection that no_gc ran
_largest = 0        # the most one block has promoted


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector around allocation-heavy loops (planning or simulating
    100k-vertex graphs creates millions of acyclic objects that it would rescan repeatedly).

    On exit from a block that left :data:`PROMOTE_AT` new objects or more, every object in the
    young generations, the block's above all, moves straight to the oldest (``freeze`` then
    ``unfreeze``), where a collection would have moved the survivors anyway, instead of being
    scanned by the young collections first (0.2 s of planning 100k vertices, 0.1 s of reading
    their MemGraph).  Cyclic garbage moved with them (a simulation's model, an executor's
    event loop) would then wait for a full collection, which the collector's own rule never
    starts for objects moved this way: simulating in a loop grew by every model, and the test
    suite to 12 GB.  So a smaller block just resumes the collector, and once the blocks have
    promoted four times the most that one has, a full collection runs.  Promoting is skipped
    if the caller has frozen objects (``unfreeze`` would thaw them).

    Yields
    ------
    None
        The ``with`` block runs with the collector paused.
    """
    global _promoted, _largest
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        young = gc.get_count()[0]       # objects allocated, less those freed, since gen 0 ran
        if young >= PROMOTE_AT and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
            _promoted += young
            _largest = max(_largest, young)
            if _promoted > 4 * _largest:
                gc.collect()
                _promoted = 0
        if enabled:
            gc.enable()


def let_signals_in(done: int = 0) -> None:
    """Do nothing, in interpreted Python: a progress hook that reports nothing.

    Python runs a signal's handler (Ctrl-C's ``KeyboardInterrupt``, a SIGTERM's
    :class:`~offloadlab.lab.signals.Terminated`) only between the interpreter's instructions,
    and code compiled by mypyc runs none: a long compiled loop (planning a 1M-vertex graph
    takes a minute) calls this now and then, so that a pending signal stops it there
    (BuildMemGraph's, in place of a missing progress hook; the verifier's passes).  This
    module stays out of the compiled build for it (``tests/test_signals.py``).

    Parameters
    ----------
    done : int
        How much is done (ignored).
    """


def fmt_bytes(n: float) -> str:
    """``67108864`` -> ``"64 MiB"``.

    Parameters
    ----------
    n : float
        A number of bytes.

    Returns
    -------
    str
        It in B, KiB, MiB, GiB or TiB, with 4 significant digits.
    """
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{int(n)} B"
