"""The ``offloadlab`` command line: demo, plan, simulate, run, calibrate, validate, reproduce,
list.

Every user error ends with one line ``offloadlab: error: ...`` and exit status 2 (Ctrl-C 130,
SIGTERM 143), never a traceback; outputs are checked before any work and renamed into place
together only on success (:class:`Outputs`).  Each command is a module of this package that
owns its parser (``add_parser``) and its handler (``cmd_NAME``); :mod:`.common`,
:mod:`.outputs` and :mod:`.options` hold what several share and :mod:`.parser` puts them
together.  This module runs a command and ends the process.
The conventions: docs/commands/index.md.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn, TextIO

from ...core.errors import OffloadlabError
from .outputs import Outputs
from .parser import build_parser

__all__ = ["build_parser", "main", "run"]

_left: list[object] | None = None
"""What the running command leaves for the process's end to reclaim (:func:`run`), or None
(:func:`main` called in a process that goes on)."""


def leave(*objects: object) -> None:
    """Keep a command's large objects (its graphs) alive until :func:`run` ends the process,
    which returns their memory at once instead of freeing them one object at a time as the
    command returns; nothing when :func:`main` runs in a process that goes on.

    Parameters
    ----------
    *objects : object
        The objects to keep.
    """
    if _left is not None:
        _left.extend(objects)


_leave = leave      # the private name it had while the commands lived in this module


def run() -> NoReturn:
    """The ``offloadlab`` command and ``python -m offloadlab``: :func:`main`, then the process
    ends at once (:func:`os._exit`) with its status once the standard streams are flushed and
    the exit handlers have run (temporary files' finalizers among them).  The interpreter's
    own teardown would free every object a command made, one by one (0.15-0.25 s of ``plan``
    of the 100k-vertex benchmark DAG, for its TaskGraph and MemGraph, which the command
    hands to :func:`leave`), and collect those in reference cycles (0.7 s of ``simulate``
    of a 165k-vertex MemGraph), only to return memory the process is about to return anyway.
    Its output is written all the same, or the status says it was not (:func:`_end`)."""
    global _left
    _left = []
    if sys.stdout is not None:
        sys.stdout = _NamedStdout(sys.stdout)  # type: ignore[assignment]
    _end(main())


class _NamedStdout:
    """``sys.stdout`` whose write errors name it (``stdout: No space left on device``): a
    failed write names no file, and stdout may be a file on a full disk (``> FILE``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with _naming_stdout():
            return self._stream.write(text)

    def flush(self) -> None:
        with _naming_stdout():
            self._stream.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextmanager
def _naming_stdout() -> Iterator[None]:
    """An OSError naming no file, raised again naming stdout."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None or exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, "stdout") from None


def _end(code: int) -> NoReturn:
    """End the process with status ``code`` now (:func:`run`): flush the standard streams
    (stdout closed early: status 141, quietly; stdout failing otherwise, a full disk: one
    error line and status 2; Ctrl-C: one line and 130), run the exit handlers, then
    :func:`os._exit`."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is None:                  # started with the stream closed
                continue
            try:
                stream.flush()
            except BrokenPipeError:
                if stream is sys.stdout:
                    code = 141
            except (OSError, ValueError) as exc:
                if stream is sys.stdout:
                    code = code or 2
                    _say(f"offloadlab: error: stdout: {getattr(exc, 'strerror', None) or exc}")
    except KeyboardInterrupt:
        _say("offloadlab: interrupted")
        code = 130
    _exit_handlers()
    _exit(code)


def _say(line: str) -> None:
    """``line`` on file descriptor 2, bypassing ``sys.stderr`` (:func:`_end` has flushed it
    or found it failing); nothing if that fails too."""
    try:
        os.write(2, line.encode(errors="replace") + b"\n")
    except OSError:
        pass


_exit_handlers = atexit._run_exitfuncs     # what runs the exit handlers,


_exit = os._exit                           # and what ends the process (tests replace both)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit status, never raising for a user error.

    Parameters
    ----------
    argv : list of str, optional
        The arguments; ``sys.argv[1:]`` when None.

    Returns
    -------
    int
        0; 2 for any user error (one line ``offloadlab: error: ...`` on stderr, running out of
        memory too); 130 on Ctrl-C (``offloadlab: interrupted``); 143 on SIGTERM
        (``offloadlab: terminated``); or what a command returns (1 for a failed ``--check``).
    """
    from ..signals import Terminated, sigterm_stops
    try:
        with sigterm_stops():
            return _main(argv)
    except Terminated:
        print("offloadlab: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("offloadlab: interrupted", file=sys.stderr)
        return 130
    except OutOfMemory:
        progress = sys.modules.get("offloadlab.lab.progress")   # imported by any phase
        what = progress.ran_out_while() if progress else None
        _error(f"out of memory while {what or 'running the command'}: the RAM available (or "
               f"the process's memory limit) is too small for it")
    except BrokenPipeError:             # stdout closed early (offloadlab ... | head): stop quietly
        _silence_stdout()
        return 141
    except OffloadlabError as exc:
        _error(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _error(f"{where}{exc.strerror or exc}")
    return 2


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    args.outputs = Outputs()
    try:
        return args.func(args)
    except MemoryError:
        # the exception's frames hold what was being built: they go at the end of this block,
        # before the files staged are removed and the error is reported
        pass
    finally:
        args.outputs.discard()          # what a failed command staged; nothing after commit()
    raise OutOfMemory()


class OutOfMemory(Exception):
    """A command ran out of memory (:func:`_main`; its MemoryError and frames are gone)."""


def _silence_stdout() -> None:
    """Point stdout at the null device, so that flushing it at exit raises no second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no real file descriptor (captured)
        pass


def _error(message: str) -> None:
    """``offloadlab: error: MESSAGE`` on stderr, on one line whatever the message holds."""
    line = " ".join(part.strip() for part in message.splitlines()).strip() or "unknown error"
    print(f"offloadlab: error: {line}", file=sys.stderr)
