"""Verifying a MemGraph beside the work that follows it, on a second core.

The ``plan`` and ``simulate`` commands verify every MemGraph before they keep anything of it,
but what they do next (writing the file, simulating) does not depend on the verdict, only
whether they keep the result does.  :func:`verifying` runs the verifier in a forked child
process while the command goes on, and raises the child's :class:`VerificationError` before
the command can commit anything (at 1M vertices, verifying and writing took 13.4 s beside
each other, 19-20 s one after the other).

The child shares the parent's memory copy-on-write, and copies the pages whose reference
counts it touches: it forks only on Linux, for graphs of :data:`BESIDE_AT` vertices or more
(below, forking costs more than it saves), and only while the machine has twice this
process's resident memory available; else it verifies first, in this process, as before.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from ..core.errors import VerificationError
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph
from ..core.verify import verify, verify_against

BESIDE_AT = 20_000
"""The smallest MemGraph (vertices) verified in a child process."""

_OK, _FAILED = b"ok", b"failed:"


@contextmanager
def verifying(mg: MemGraph, graph: TaskGraph | None = None, machine: Machine | None = None,
              beside: bool = True,
              shown: Callable[[], AbstractContextManager[object]] = nullcontext
              ) -> Iterator[None]:
    """``verify(mg, graph, machine)`` while the ``with`` block runs, in a child process where it
    can and ``beside`` (module docstring), else before the block, inside ``shown()``.

    The child checks the rules of the MemGraph alone; rule 2, against ``graph``, is checked
    here after the block (:func:`verify_against`), so that the two processes share the work;
    the child's verdict is reported first, as :func:`verify` orders them.  Ctrl-C stops the
    child.  The block must not change ``mg`` or ``graph``: the child verifies them as they were
    when it forked, this process checks rule 2 as they are after the block.

    Parameters
    ----------
    mg : MemGraph
        The plan.
    graph : TaskGraph, optional
        What it was planned from (rule 2).
    machine : Machine, optional
        What it runs on.
    beside : bool
        Whether it may verify in a child process.
    shown : callable
        Makes the context (a progress bar) verifying runs in.

    Yields
    ------
    None
        While the block runs, beside the child.

    Raises
    ------
    VerificationError
        When the block ends, or instead of the block's own exception (a simulation of an
        incorrect plan may fail first, with a less telling message).
    """
    child = _Child.start(mg, machine) if beside and _room_to_fork(len(mg)) else None
    if child is None:
        with shown():
            verify(mg, graph, machine)
        yield
        return
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        child.stop()
        raise
    except BaseException:
        _verdict(child, mg, graph, machine)
        raise
    _verdict(child, mg, graph, machine)


def _verdict(child: _Child, mg: MemGraph, graph: TaskGraph | None, machine: Machine | None
             ) -> None:
    """Rule 2 here, then the child's verdict: raise the child's VerificationError, else rule
    2's."""
    against: VerificationError | None = None
    try:
        if graph is not None:
            verify_against(mg, graph)
    except VerificationError as exc:
        against = exc
    except (KeyboardInterrupt, SystemExit):
        child.stop()
        raise
    except BaseException:                       # a failure of its own: the verdict first
        child.verdict(mg, machine)
        raise
    child.verdict(mg, machine)
    if against is not None:
        raise against


class _Child:
    """A forked process verifying a MemGraph; it writes its verdict to a pipe and exits."""

    def __init__(self, pid: int, verdict_fd: int):
        self.pid, self.fd = pid, verdict_fd

    @classmethod
    def start(cls, mg: MemGraph, machine: Machine | None) -> _Child:
        """Fork a child that verifies the rules of ``mg`` alone (all but rule 2)."""
        read_fd, write_fd = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12 warns on forking a process with threads (numpy's BLAS pool, a
            # progress bar's monitor): the child runs only the verifier, which takes no
            # lock those threads may hold
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:                                        # the child
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)    # Ctrl-C: just stop
                os.close(read_fd)
                try:
                    verify(mg, None, machine)
                    verdict = _OK
                except VerificationError as exc:
                    verdict = _FAILED + str(exc).encode()
                with open(write_fd, "wb") as out:
                    out.write(verdict)
                code = 0
            finally:
                os._exit(code)      # no exit handlers, no flushing the parent's buffers
        os.close(write_fd)
        return cls(pid, read_fd)

    def verdict(self, mg: MemGraph, machine: Machine | None) -> None:
        """Wait for the child; raise its VerificationError.  A child that ended without a
        verdict (killed, out of memory, or an error other than a verification's) is replaced
        by verifying here, which raises what it raised."""
        try:
            with open(self.fd, "rb") as verdict_in:
                verdict = verdict_in.read()
        except BaseException:                   # Ctrl-C while waiting
            self._reap(signal.SIGKILL)
            raise
        self._reap()
        if verdict == _OK:
            return
        if verdict.startswith(_FAILED):
            raise VerificationError(verdict[len(_FAILED):].decode())
        verify(mg, None, machine)

    def stop(self) -> None:
        """Kill the child and reap it."""
        os.close(self.fd)
        self._reap(signal.SIGKILL)

    def _reap(self, kill: int | None = None) -> None:
        if kill is not None:
            try:
                os.kill(self.pid, kill)
            except ProcessLookupError:
                pass
        os.waitpid(self.pid, 0)


def _room_to_fork(vertices: int) -> bool:
    """Whether to verify ``vertices`` in a child process (module docstring)."""
    if vertices < BESIDE_AT or not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open("/proc/meminfo") as meminfo:
            available = next(int(line.split()[1]) * 1024 for line in meminfo
                             if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    return available >= 2 * resident
