"""The device protocol the event loop runs on, and the lanes (threads) that drive it.

A backend owns the memory (one arena per GPU, one host block) and knows how to run work on a
*stream* and time it; it does not know the MemGraph.  The event loop (:mod:`.loop`) gives
every slot of every resource a :class:`Lane` (the slots of an engine share one where the
backend's streams are serial): a thread that takes one job at a time, runs it
on its stream through the backend, and reports the job's start and end (seconds since
:meth:`Backend.begin`) or its exception through a callback.  A launched vertex holds its
lane until it completes, as a TURNIP vertex holds its CUDA stream (TURNIP Sec. 5).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..core.errors import OffloadlabError
from ..core.registry import Registry

Array = Any


class Cancelled(Exception):
    """Raised inside a job when the run is being stopped."""


class ExecutionError(OffloadlabError):
    """A run failed: a kernel raised, memory does not suffice, or the loop stalled."""


class StallError(ExecutionError):
    """No vertex can make progress: a cycle, a ``fixed`` order that contradicts the edges, or
    a job that has not completed within the watchdog's time."""


class Backend(Protocol):
    """What the event loop needs from a device backend."""

    name: str
    xp: Any                     # the array module kernels run with on the GPUs
    aligned: bool               # GPU tensors must start at a multiple of their item size
    arenas_in_ram: bool         # the arenas take host RAM (the numpy backend)
    serial_streams: bool        # an engine's streams run one job at a time, in launch order,
                                # on one lane (the numpy backend: a GPU's engine is one core)
    warm_up: bool               # run each kernel once on every lane before the clock starts
    lane_reserve: int           # GPU bytes each compute lane takes beyond its scratch
    stop: threading.Event       # set when the run stops; long jobs check it and raise Cancelled

    def arena(self, gpu: str, nbytes: int) -> Array:
        """A GPU's arena: one 1-D byte array, allocated once.

        Parameters
        ----------
        gpu : str
            The GPU (``gpu0``, ...).
        nbytes : int
            Its size in bytes.

        Returns
        -------
        Array
            On the GPU's device.
        """

    def host_block(self, nbytes: int) -> np.ndarray:
        """The host block (pinned where that matters): one 1-D byte array, allocated once.

        Parameters
        ----------
        nbytes : int
            Its size in bytes.

        Returns
        -------
        numpy.ndarray
        """

    def host_array(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A host array an output is downloaded into (pinned where that matters).

        Parameters
        ----------
        shape : tuple of int
            The output's shape.
        dtype : str
            The output's dtype.

        Returns
        -------
        numpy.ndarray
        """

    def free_memory(self, gpu: str) -> int | None:
        """Bytes that may still be allocated on ``gpu``.

        Parameters
        ----------
        gpu : str
            The GPU.

        Returns
        -------
        int or None
            None where a GPU's memory is RAM.
        """

    def stream(self, resource: str, slot: int) -> Any:
        """The stream slot ``slot`` of ``resource`` runs on.

        Parameters
        ----------
        resource : str
            A GPU, a link direction or the CPU.
        slot : int
            The slot's index.

        Returns
        -------
        Any
            A compute stream, a link direction's copy engine, the CPU.
        """

    def fill(self, buffer: Array, byte: int) -> None:
        """Set every byte of an arena or workspace, on its own device (before the run).

        Parameters
        ----------
        buffer : Array
            The arena or workspace.
        byte : int
            The value of every byte.
        """

    def upload(self, dst: Array, value: np.ndarray) -> None:
        """Write a host array into a GPU tensor before the run (synchronous).

        Parameters
        ----------
        dst : Array
            The GPU tensor.
        value : numpy.ndarray
            Its value, of its shape and dtype.
        """

    def download(self, stream: Any, src: Array, dst: np.ndarray) -> None:
        """Copy a GPU tensor into a host array of its shape and dtype, on ``stream``, and wait.

        Parameters
        ----------
        stream : Any
            The stream of the lane that wrote it, once its work is complete.
        src : Array
            The GPU tensor.
        dst : numpy.ndarray
            The host array (:meth:`host_array`).
        """

    def begin(self) -> None:
        """Time zero of the run."""

    def timed(self, stream: Any, work: Callable[[], None]) -> tuple[float, float]:
        """Run ``work`` on ``stream`` and time it.

        Parameters
        ----------
        stream : Any
            The stream.
        work : callable
            The job, called with no arguments.

        Returns
        -------
        tuple of float
            Its start and end in seconds since :meth:`begin`.
        """

    def untimed(self, stream: Any, work: Callable[[], None]) -> None:
        """Run ``work`` on ``stream`` and wait for it, before :meth:`begin` (the warm-up).

        Parameters
        ----------
        stream : Any
            The stream.
        work : callable
            The job, called with no arguments.
        """

    def copy(self, stream: Any, dst: Array, src: Array) -> None:
        """Copy ``src`` into ``dst`` (same byte size) on ``stream``; called inside ``work``.

        Parameters
        ----------
        stream : Any
            The stream.
        dst : Array
            The destination.
        src : Array
            The source.
        """

    def close(self) -> None:
        """Release every buffer and stream."""


Factory = Callable[[Any, bool], Backend]
"""A backend's factory: ``make(machine, rate_limit)``."""


@dataclass(frozen=True)
class BackendKind:
    """A backend: its description, its factory and the ``(rtol, atol)`` its outputs must meet
    against the NumPy reference (:func:`offloadlab.executor.check_outputs`)."""

    doc: str
    make: Factory
    tolerance: tuple[float, float] = (1e-3, 1e-4)


BACKENDS: Registry[BackendKind] = Registry("backend", listed="valid backends",
                                           doc=lambda b: b.doc)
"""The backends by name, each declared by the module that implements it
(``executor/NAME_backend.py``), in the order of
:func:`~offloadlab.core.backends.backend_names`."""


def backend(name: str, *, doc: str,
            tolerance: tuple[float, float] = (1e-3, 1e-4)) -> Callable[[Factory], Factory]:
    """Declare backend ``name`` with the decorated function as its factory.

    Parameters
    ----------
    name : str
        The backend's name.
    doc : str
        Its description, as ``offloadlab list backends`` shows it.
    tolerance : tuple of float, default (1e-3, 1e-4)
        ``(rtol, atol)``: how closely its outputs must match the reference.

    Returns
    -------
    callable
        The decorator, which registers the factory and returns it.
    """
    def deco(make: Factory) -> Factory:
        BACKENDS[name] = BackendKind(doc, make, tolerance)
        return make
    return deco


Job = tuple[int, Any, Callable[[], None], Callable[[], None] | None]
"""(vertex, stream, work, after): ``after`` runs once ``work`` is complete, untimed."""
Done = tuple[int, float, float, BaseException | None]
"""(vertex, start, end, exception or None): what a lane reports of a job."""


@dataclass(eq=False)
class WarmUp:
    """Work a lane runs on its own thread before the clock starts, untimed: ``works`` are
    (vertex, work) pairs; ``failure`` is the first vertex whose work raised, and the error."""

    stream: Any
    works: list[tuple[int, Callable[[], None]]]
    done: threading.Event = field(default_factory=threading.Event)
    failure: tuple[int, BaseException] | None = None

    def run(self, backend: Backend) -> None:
        """Run every work untimed on ``backend``, stopping at the first that raises.

        Parameters
        ----------
        backend : Backend
            The backend the lane drives.
        """
        try:
            for vertex, work in self.works:
                try:
                    backend.untimed(self.stream, work)
                except BaseException as exc:
                    self.failure = (vertex, exc)
                    return
        finally:
            self.done.set()


class Lane(threading.Thread):
    """One slot of a resource: runs jobs one at a time and hands each result to ``report``,
    on this thread (which may submit this lane's next job before it returns)."""

    def __init__(self, name: str, backend: Backend, report: Callable[[Done], None]):
        super().__init__(name=f"offloadlab-{name}", daemon=True)
        self.backend = backend
        self.report = report
        self.jobs: queue.SimpleQueue[Job | WarmUp | None] = queue.SimpleQueue()
        self.vertex: int | None = None     # the vertex running, for the watchdog

    def submit(self, job: Job | WarmUp) -> None:
        """Queue a job (or a warm-up) for this lane.

        Parameters
        ----------
        job : Job or WarmUp
            What to run next.
        """
        self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(None)

    def run(self) -> None:
        backend, report = self.backend, self.report
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if isinstance(job, WarmUp):
                job.run(backend)
                continue
            vertex, stream, work, after = job
            self.vertex = vertex
            try:
                if backend.stop.is_set():
                    raise Cancelled()
                start, end = backend.timed(stream, work)
                if after is not None:
                    after()
            except BaseException as exc:   # reported to the loop, which raises it
                done: Done = (vertex, 0.0, 0.0, exc)
            else:
                done = (vertex, start, end, None)
            self.vertex = None
            report(done)
