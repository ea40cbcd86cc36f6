"""SIGTERM stops a command as Ctrl-C does: :class:`Terminated` (a ``KeyboardInterrupt``) is
raised where the command is, so that the same clean-up runs (temporary output files removed,
a forked verifier or a cluster's worker processes stopped) and the command line ends with
one line and status 143.  A section that must not be cut half-way (starting a cluster, which
cannot be closed half-started, or closing one) runs :func:`deferred`: a SIGTERM or a Ctrl-C
there stops the command as the section ends.  Worker processes started in
:func:`sigint_blocked` never see a Ctrl-C: the command, not the terminal, stops them."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


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
    block has ended, and so does a SIGINT: its handler (Python's raises
    ``KeyboardInterrupt``) runs then, once.  A SIGINT ignored, or left to its default
    action, stays so.

    Yields
    ------
    None
        While the block runs.
    """
    global _deferring, _pending
    interrupted: list[FrameType | None] = []
    handler = _hold_sigint(interrupted)
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        if not _deferring and _pending:
            _pending = False
            _stop()
        if handler is not None and interrupted:
            handler(signal.SIGINT, interrupted[0])


def _hold_sigint(interrupted: list[FrameType | None]
                 ) -> Callable[[int, FrameType | None], Any] | None:
    """Replace SIGINT's Python handler by one that appends the frame to ``interrupted``;
    the handler replaced, or None where there is none to replace (ignored, the default
    action, or not the main thread)."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        return None
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(frame))
    except ValueError:                          # not the main thread
        return None
    return handler


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the block runs, and for good in the threads
    started meanwhile and in the processes those start: a signal mask, unlike a handler, is
    inherited by a thread and kept through fork and exec, and Python leaves it as it is.  A
    terminal's Ctrl-C, sent to the whole process group, so never reaches worker processes
    started here; this process sees it once the block ends (run in :func:`deferred`, where
    another thread may take it meanwhile).

    Yields
    ------
    None
        While the block runs.
    """
    from multiprocessing import resource_tracker

    # started here first: the thread that starts multiprocessing's resource tracker has
    # SIGINT unblocked after (CPython's bpo-33613 fix blocks it for the start, then
    # unblocks it), and so would the workers that thread's threads start
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
