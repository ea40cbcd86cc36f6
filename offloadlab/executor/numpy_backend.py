"""The ``numpy`` backend: a real executor on the CPU (docs/design.md, Executor).

Each GPU is an arena, one preallocated byte buffer whose tensors are ``np.ndarray`` views at
their planned offsets; a GPU's compute engine is one CPU core, a worker thread (a
:class:`~.device.Lane`) that runs the kernels launched on its streams one at a time, in launch
order (``serial_streams``); each link direction is a copy engine thread, paced to the machine's
bandwidth with ``rate_limit``.  NumPy releases the GIL in copies, ufunc loops and BLAS, so
kernels and copies really overlap.  Pacing, buses and duplex: docs/execution.md ("Executor").
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..core.machine import Machine
from .device import Array, Backend, Cancelled, backend
from .hostblock import fill

CHUNK_SECONDS = 0.5e-3    # a paced copy moves about this much time's worth of bytes at once
MIN_CHUNK = 64 * 1024
SLEEP_SLACK = 150e-6      # how late time.sleep may wake (timer slack, a VM's wake-up): a paced
                          # copy's last wait sleeps that much less, then yields until its deadline
SLEEP_SLICE = 0.1         # the longest single sleep of a paced copy (seconds)
_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))   # sleep(0) also oversleeps


def _touched(nbytes: int) -> np.ndarray:
    """A buffer whose pages are all mapped, as a GPU's memory is: the first write to a fresh
    page would otherwise cost a page fault inside the first kernel or copy that touches it."""
    buffer = np.empty(nbytes, np.uint8)
    fill(buffer, 0)
    return buffer


@dataclass(eq=False)
class CopyEngine:
    """A link direction's copy engine: its rate (bytes/s, None = as fast as memcpy), and for
    the two directions of a host link, the other one and the duplex factor."""

    name: str
    rate: float | None
    duplex: float = 1.0
    partner: CopyEngine | None = None
    busy: bool = False


@backend("numpy", doc="threads on the CPU (any machine): arenas in host RAM, copies paced to "
         "the machine's links", tolerance=(1e-5, 1e-6))
def make(machine: Machine, rate_limit: bool = True) -> Backend:
    """A fresh numpy backend, its copies paced to ``machine``'s bandwidths if ``rate_limit``.

    Parameters
    ----------
    machine : Machine
        Its links' bandwidths and duplex factor.
    rate_limit : bool
        Pace the copies; else they run at memcpy speed.

    Returns
    -------
    Backend
        A :class:`NumpyBackend`.
    """
    return NumpyBackend(machine, rate_limit)


class NumpyBackend:
    """Arenas, host block and copy engines on the CPU."""

    name = "numpy"
    xp: Any = np
    aligned = False             # NumPy handles unaligned views (more slowly)
    arenas_in_ram = True
    serial_streams = True       # a GPU's engine is one core: its streams share one thread
    warm_up = False             # nothing to compile, no per-thread handles
    lane_reserve = 0

    def __init__(self, machine: Machine, rate_limit: bool = True):
        self.machine = machine
        self.rate_limit = rate_limit
        self.stop = threading.Event()
        self.engines: dict[str, CopyEngine] = {}
        self.origin = time.perf_counter()
        self._blas: threadpool_limits | None = None

    # -- memory ---------------------------------------------------------------------------
    def arena(self, gpu: str, nbytes: int) -> np.ndarray:
        """A GPU's arena: a byte array in RAM, its pages touched.

        Parameters
        ----------
        gpu : str
            The GPU it stands for.
        nbytes : int
            Its size.

        Returns
        -------
        numpy.ndarray
        """
        return _touched(nbytes)

    def host_block(self, nbytes: int) -> np.ndarray:
        """The host block: a byte array in RAM, its pages touched.

        Parameters
        ----------
        nbytes : int
            Its size.

        Returns
        -------
        numpy.ndarray
        """
        return _touched(nbytes)

    def fill(self, buffer: Array, byte: int) -> None:
        """Set every byte of ``buffer`` to ``byte`` (:func:`.hostblock.fill`).

        Parameters
        ----------
        buffer : Array
            An arena or a workspace.
        byte : int
            The value.
        """
        fill(buffer, byte)

    def upload(self, dst: Array, value: np.ndarray) -> None:
        """Copy ``value`` into the arena's tensor ``dst``.

        Parameters
        ----------
        dst : Array
            A view of an arena.
        value : numpy.ndarray
            The input's value.
        """
        np.copyto(dst, value)

    def free_memory(self, gpu: str) -> None:
        """No GPU memory: the arenas are in RAM, which the event loop checks.

        Parameters
        ----------
        gpu : str
            The GPU.
        """
        return None

    def host_array(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """An empty array an output is copied into.

        Parameters
        ----------
        shape : tuple of int
            The output's shape, as its vertex gives it.
        dtype : str
            The output's dtype.

        Returns
        -------
        numpy.ndarray
        """
        return np.empty(shape, dtype)

    def download(self, stream: Any, src: Array, dst: np.ndarray) -> None:
        """Copy the arena's tensor ``src`` into ``dst``, at once (no stream to wait for).

        Parameters
        ----------
        stream : Any
            Unused.
        src : Array
            A view of an arena.
        dst : numpy.ndarray
            What :meth:`host_array` made.
        """
        np.copyto(dst, src)

    def untimed(self, stream: Any, work: Callable[[], None]) -> None:
        """Run ``work`` in the calling thread.

        Parameters
        ----------
        stream : Any
            Unused.
        work : callable
            The work.
        """
        work()

    # -- streams --------------------------------------------------------------------------
    def stream(self, resource: str, slot: int) -> CopyEngine | None:
        """A copy engine carries its pacing; kernels need no stream (their lane is the GPU's core).

        Parameters
        ----------
        resource : str
            A GPU, a link direction (``h2d:gpu0``, ``gpu0->gpu1``) or the CPU.
        slot : int
            The slot (a link direction's slots share its engine).

        Returns
        -------
        CopyEngine or None
            The link direction's engine, or None.
        """
        if resource.startswith(("h2d:", "d2h:")) or "->" in resource:
            if resource not in self.engines:
                self.engines[resource] = self._engine(resource)
            return self.engines[resource]
        return None

    def _engine(self, resource: str) -> CopyEngine:
        m = self.machine
        if not self.rate_limit:
            return CopyEngine(resource, None)
        direction, _, gpu = resource.partition(":")
        rate = m.gpu_gpu_bandwidth if "->" in resource else m.host_rate(direction)
        engine = CopyEngine(resource, rate if math.isfinite(rate) else None)
        partner = self.engines.get(("d2h:" if direction == "h2d" else "h2d:") + gpu)
        if partner is not None and m.duplex < 1:
            engine.partner, partner.partner = partner, engine
            engine.duplex = partner.duplex = m.duplex
        return engine

    # -- running --------------------------------------------------------------------------
    def begin(self) -> None:
        self._blas = threadpool_limits(1, user_api="blas")
        self.origin = time.perf_counter()

    def timed(self, stream: CopyEngine | None,
              work: Callable[[], None]) -> tuple[float, float]:
        """Run ``work`` in the calling thread and time it.

        Parameters
        ----------
        stream : CopyEngine or None
            Unused: the thread is the lane.
        work : callable
            The work.

        Returns
        -------
        tuple of float
            Its start and end, in seconds since :meth:`begin`.
        """
        start = time.perf_counter()
        work()
        return start - self.origin, time.perf_counter() - self.origin

    def copy(self, stream: CopyEngine | None, dst: Array, src: Array) -> None:
        """Copy ``src``'s bytes into ``dst``, paced to ``stream``'s rate when it has one.

        Parameters
        ----------
        stream : CopyEngine or None
            The link direction's engine.
        dst, src : Array
            Views of the same size in arenas or the host block.

        Raises
        ------
        Cancelled
            The run stopped during a paced copy.
        """
        d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
        if stream is None or stream.rate is None:
            np.copyto(d, s)
            return
        stream.busy = True
        try:
            self._paced_copy(stream, d, s)
        finally:
            stream.busy = False

    def _paced_copy(self, engine: CopyEngine, d: np.ndarray, s: np.ndarray) -> None:
        """Copy chunk by chunk, sleeping so that the bytes moved never run ahead of the rate
        (the deadline is absolute, so a late wake-up is made up by the next chunk)."""
        assert engine.rate is not None
        chunks = max(1, -(-d.size // max(MIN_CHUNK, int(engine.rate * CHUNK_SECONDS))))
        chunk = max(1, -(-d.size // chunks))    # equal: the last one's wait makes up a late
                                                # wake-up after the one before
        deadline = time.perf_counter()
        stop = self.stop
        for i in range(0, d.size, chunk):
            if stop.is_set():
                raise Cancelled()
            np.copyto(d[i:i + chunk], s[i:i + chunk])
            partner = engine.partner
            rate = engine.rate * (engine.duplex if partner is not None and partner.busy else 1.0)
            deadline += min(chunk, d.size - i) / rate
            delay = deadline - time.perf_counter()
            if i + chunk < d.size:              # a late wake-up is made up by the next chunk
                if delay > 0:
                    self._sleep(delay)
                continue
            if delay > SLEEP_SLACK:             # the last chunk: end on time, never early
                self._sleep(delay - SLEEP_SLACK)
            while time.perf_counter() < deadline:
                _yield()

    def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` in slices of at most :data:`SLEEP_SLICE`, so that a stopped run
        (Ctrl-C, the watchdog) ends a copy paced to an absurdly slow link, whose one wait could
        overflow ``time.sleep``."""
        end = time.perf_counter() + seconds
        while (left := end - time.perf_counter()) > 0:
            if self.stop.is_set():
                raise Cancelled()
            time.sleep(min(left, SLEEP_SLICE))

    def close(self) -> None:
        self.engines.clear()
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None
