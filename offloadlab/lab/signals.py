"""SIGTERM stops a command as Ctrl-C does: :class:`Terminated` (a ``KeyboardInterrupt``) is
raised where the command is, so that the same clean-up runs (temporary output files removed,
a forked verifier or a cluster's worker processes stopped) and the command line ends with
one line and status 143.  A section that must not be cut half-way (starting a cluster, which
cannot be closed half-started) runs :func:`deferred`: a SIGTERM there stops the command as
the section ends."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread."""


_deferring = 0          # sections running that defer a SIGTERM
_pending = False        # a SIGTERM arrived in one


def _stop() -> None:
    """Raise :class:`Terminated`; a later SIGTERM, while the command stops, is ignored, so
    that the clean-up finishes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def _on_sigterm(signum: int, frame: object) -> None:
    global _pending
    if _deferring:
        _pending = True
        return
    _stop()


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` while the block runs; the previous handler is back
    after it.

    Only where Python runs signal handlers, in the main thread; elsewhere signals are left alone.

    Yields
    ------
    None
        While the block runs.
    """
    global _pending
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:                          # not the main thread
        yield
        return
    _pending = False
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def deferred() -> Iterator[None]:
    """A SIGTERM while the block runs stops the command (:class:`Terminated`) only once the
    block has ended.

    Yields
    ------
    None
        While the block runs.
    """
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending:
            _pending = False
            _stop()
