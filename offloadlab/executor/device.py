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
from typing import Any, Protocol

import numpy as np

Array = Any


class Cancelled(Exception):
    """Raised inside a job when the run is being stopped."""


class Backend(Protocol):
    """What the event loop needs from a device backend."""

    name: str
    xp: Any                     # the array module kernels run with on the GPUs
    aligned: bool               # GPU tensors must start at a multiple of their item size
    arenas_in_ram: bool         # the arenas take host RAM (the numpy backend)
    serial_streams: bool        # an engine's streams run one job at a time, in launch order,
                                # on one lane (the numpy backend: a GPU's engine is one core)
    stop: threading.Event       # set when the run stops; long jobs check it and raise Cancelled

    def arena(self, gpu: str, nbytes: int) -> Array:
        """A GPU's arena: one 1-D byte array, allocated once."""

    def host_block(self, nbytes: int) -> np.ndarray:
        """The host block (pinned where that matters): one 1-D byte array, allocated once."""

    def stream(self, resource: str, slot: int) -> Any:
        """The stream slot ``slot`` of ``resource`` runs on (a compute stream, a link
        direction's copy engine, the CPU)."""

    def fill(self, buffer: Array, byte: int) -> None:
        """Set every byte of an arena or workspace, on its own device (before the run)."""

    def upload(self, dst: Array, value: np.ndarray) -> None:
        """Write a host array into a GPU tensor before the run (synchronous)."""

    def download(self, src: Array, dst: np.ndarray) -> None:
        """Copy a GPU tensor into a host array of its shape and dtype (synchronous; called on
        the lane that wrote it, once its work is complete)."""

    def begin(self) -> None:
        """Time zero of the run."""

    def timed(self, stream: Any, work: Callable[[], None]) -> tuple[float, float]:
        """Run ``work`` on ``stream``; its start and end in seconds since :meth:`begin`."""

    def copy(self, stream: Any, dst: Array, src: Array) -> None:
        """Copy ``src`` into ``dst`` (same byte size) on ``stream``; called inside ``work``."""

    def close(self) -> None:
        """Release every buffer and stream."""


Job = tuple[int, Any, Callable[[], None], Callable[[], None] | None]
"""(vertex, stream, work, after): ``after`` runs once ``work`` is complete, untimed."""
Done = tuple[int, float, float, BaseException | None]
"""(vertex, start, end, exception or None): what a lane reports of a job."""


class Lane(threading.Thread):
    """One slot of a resource: runs jobs one at a time and hands each result to ``report``,
    on this thread (which may submit this lane's next job before it returns)."""

    def __init__(self, name: str, backend: Backend, report: Callable[[Done], None]):
        super().__init__(name=f"offloadlab-{name}", daemon=True)
        self.backend = backend
        self.report = report
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.vertex: int | None = None     # the vertex running, for the watchdog

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def close(self) -> None:
        self.jobs.put(None)

    def run(self) -> None:
        backend, report = self.backend, self.report
        while True:
            job = self.jobs.get()
            if job is None:
                return
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
