"""The ``cupy`` backend: the executor on NVIDIA GPUs (TURNIP Sec. 5; docs/design.md, Executor).

Each GPU gets one arena, a single ``cudaMalloc`` made before the run whose tensors are
``cupy.ndarray`` views at their planned offsets; the host gets one pinned (page-locked,
portable) block, whose tensors are NumPy views.  Every stream slot is a non-blocking CUDA
stream: a GPU's compute slots, each link direction's copy engine (``h2d:gpuN``, ``d2h:gpuN``),
and each GPU pair's peer copies (``gpuI->gpuJ``, on the source GPU, with peer access enabled
where the hardware allows it).  Copies are ``cudaMemcpyAsync`` between pinned host memory and
the arenas, or between arenas (unified addressing infers the direction).  A job is bracketed by
two CUDA events on its stream and its lane waits for the second, so a vertex holds its stream
until its work is done, as in TURNIP; its times are the events' offsets from an origin event
recorded on each GPU by :meth:`CupyBackend.begin`.  The ``cpu`` lane runs NumPy and is timed
with ``time.perf_counter``, aligned with the GPUs' clocks at :meth:`CupyBackend.begin`.

CuPy is imported when a backend is made: ``import offloadlab.executor.cupy_backend`` needs no GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from ..core.devices import gpu_index, split_transfer
from ..core.errors import SpecError
from ..core.machine import Machine
from .device import Array

NEEDS = "the cupy backend needs CuPy and an NVIDIA GPU: pip install 'offloadlab[gpu]'"


@dataclass(eq=False)
class Slot:
    """A stream slot: its GPU, its CUDA stream, and the two timing events each job reuses."""

    device: int
    stream: Any      # cupy.cuda.Stream
    start: Any       # cupy.cuda.Event
    end: Any


def _no_allocation(nbytes: int) -> NoReturn:
    """The CuPy allocator installed by ``forbid_alloc``."""
    raise RuntimeError("device allocation during the run")


class CupyBackend:
    """Arenas, a pinned host block, CUDA streams and events on the visible GPUs.

    With ``forbid_alloc``, :meth:`begin` installs a CuPy allocator that raises, so any device
    allocation through CuPy during the run (the design allows none) fails its vertex;
    :meth:`close` restores the previous allocator.
    """

    name = "cupy"
    aligned = True              # a kernel faults on a misaligned address
    arenas_in_ram = False
    serial_streams = False      # each stream its own lane: kernels on streams overlap

    def __init__(self, machine: Machine, forbid_alloc: bool = False):
        try:
            import cupy
        except ImportError as exc:
            raise SpecError(f"{NEEDS} ({str(exc).splitlines()[0]})") from None
        try:
            self.count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise SpecError(f"{NEEDS} ({exc})") from None
        if not self.count:
            raise SpecError(f"{NEEDS} (no CUDA device is visible)")
        self.xp = cupy
        self.cuda = cupy.cuda
        self.machine = machine
        self.forbid_alloc = forbid_alloc
        self.stop = threading.Event()
        self.devices: set[int] = set()
        self.pinned = (0, 0)                        # the host block's address range
        self.origin = time.perf_counter()
        self.origins: dict[int, tuple[Any, float]] = {}   # GPU -> (origin event, its offset)
        self.previous_allocator: Callable[[int], Any] | None = None

    def _device(self, gpu: str) -> int:
        """The CUDA device index of ``gpu`` (``"gpu3"`` -> 3), which must be visible."""
        index = gpu_index(gpu)
        if not 0 <= index < self.count:
            raise SpecError(f"{gpu} is not visible: the machine {self.machine.name!r} has "
                            f"{self.machine.gpus} GPU(s) and CuPy sees {self.count}")
        self.devices.add(index)
        return index

    # -- memory ---------------------------------------------------------------------------
    def arena(self, gpu: str, nbytes: int) -> Array:
        """One ``cudaMalloc`` of ``nbytes`` on ``gpu`` (or on the GPU of a workspace named
        ``"gpu0:scratch3"``), as a 1-D ``uint8`` array."""
        cuda = self.cuda
        with cuda.Device(self._device(gpu.partition(":")[0])):
            try:
                memory = cuda.Memory(nbytes)
            except cuda.runtime.CUDARuntimeError as exc:
                if exc.status != cuda.runtime.errorMemoryAllocation:
                    raise
                raise MemoryError(str(exc)) from None
            return self.xp.ndarray((nbytes,), self.xp.uint8, cuda.MemoryPointer(memory, 0))

    def host_block(self, nbytes: int) -> np.ndarray:
        """One pinned, portable (pinned for every GPU) block of ``nbytes``, as NumPy bytes."""
        if not nbytes:
            return np.empty(0, np.uint8)
        cuda = self.cuda
        try:
            memory = cuda.PinnedMemory(nbytes, cuda.runtime.hostAllocPortable)
        except cuda.runtime.CUDARuntimeError as exc:
            raise MemoryError(str(exc)) from None
        block = np.frombuffer(cuda.PinnedMemoryPointer(memory, 0), np.uint8, nbytes)
        self.pinned = (block.ctypes.data, block.ctypes.data + nbytes)
        return block

    def fill(self, buffer: Array, byte: int) -> None:
        with self.cuda.Device(buffer.device.id):
            buffer.fill(byte)

    def upload(self, dst: Array, value: np.ndarray) -> None:
        with self.cuda.Device(dst.device.id):
            dst.set(value)
            self.cuda.get_current_stream().synchronize()

    def download(self, src: Array, dst: np.ndarray) -> None:
        with self.cuda.Device(src.device.id):
            src.get(out=dst)          # blocking: on return ``dst`` holds the values

    # -- streams --------------------------------------------------------------------------
    def stream(self, resource: str, slot: int) -> Slot | None:
        """A new non-blocking stream for a GPU's compute slot or a copy engine; None for the
        ``cpu``, whose jobs run NumPy on their lane."""
        if resource == "cpu":
            return None
        if "->" in resource:
            src, dst = (self._device(gpu) for gpu in split_transfer(resource))
            self._enable_peer_access(src, dst)
            device = src
        else:
            device = self._device(resource.rpartition(":")[2])
        cuda = self.cuda
        with cuda.Device(device):
            return Slot(device, cuda.Stream(non_blocking=True), cuda.Event(), cuda.Event())

    def _enable_peer_access(self, src: int, dst: int) -> None:
        """Let ``src`` reach ``dst``'s memory directly, where the hardware allows it (a peer
        copy is staged through the host otherwise)."""
        runtime = self.cuda.runtime
        if src == dst or not runtime.deviceCanAccessPeer(src, dst):
            return
        with self.cuda.Device(src):
            try:
                runtime.deviceEnablePeerAccess(dst)
            except runtime.CUDARuntimeError as exc:
                if exc.status != runtime.errorPeerAccessAlreadyEnabled:
                    raise

    # -- running --------------------------------------------------------------------------
    def begin(self) -> None:
        """Wait for the uploads and fills, then record each GPU's origin event and note when
        it completed on the ``perf_counter`` clock, time zero of the ``cpu`` lane."""
        cuda = self.cuda
        for device in sorted(self.devices):
            cuda.Device(device).synchronize()
        if self.forbid_alloc:
            self.previous_allocator = cuda.get_allocator()
            cuda.set_allocator(_no_allocation)   # process-wide: the lanes' threads see it too
        self.origin = time.perf_counter()
        for device in sorted(self.devices):
            with cuda.Device(device):
                event = cuda.Event()
                event.record(cuda.Stream.null)
                event.synchronize()
            self.origins[device] = (event, time.perf_counter() - self.origin)

    def timed(self, stream: Slot | None, work: Callable[[], None]) -> tuple[float, float]:
        """Run ``work`` with ``stream`` current, between two events, and wait for it."""
        if stream is None:
            start = time.perf_counter()
            work()
            return start - self.origin, time.perf_counter() - self.origin
        cuda = self.cuda
        with cuda.Device(stream.device), stream.stream:
            stream.start.record(stream.stream)
            work()
            stream.end.record(stream.stream)
        stream.end.synchronize()
        origin, offset = self.origins[stream.device]
        return (offset + cuda.get_elapsed_time(origin, stream.start) / 1e3,
                offset + cuda.get_elapsed_time(origin, stream.end) / 1e3)

    def copy(self, stream: Slot, dst: Array, src: Array) -> None:
        """``cudaMemcpyAsync`` on ``stream``: pinned host <-> arena, or arena -> arena."""
        if dst.nbytes != src.nbytes:
            raise ValueError(f"copy of {src.nbytes} bytes into {dst.nbytes}")
        runtime = self.cuda.runtime
        runtime.memcpyAsync(self._pointer(dst), self._pointer(src), dst.nbytes,
                            runtime.memcpyDefault, stream.stream.ptr)

    def _pointer(self, tensor: Array) -> int:
        """A tensor's address; a host tensor must lie in the pinned block (a pageable copy
        would be synchronous)."""
        if isinstance(tensor, self.xp.ndarray):
            return tensor.data.ptr
        address = tensor.ctypes.data
        low, high = self.pinned
        if not (low <= address and address + tensor.nbytes <= high):
            raise ValueError("a host tensor outside the pinned host block")
        return address

    def close(self) -> None:
        """Wait for every GPU, restore the allocator, drop the origin events."""
        cuda = self.cuda
        try:
            for device in sorted(self.devices):
                cuda.Device(device).synchronize()
        except cuda.runtime.CUDARuntimeError:
            pass      # the run failed on the GPU: the lane that saw it has reported it
        finally:
            if self.previous_allocator is not None:
                cuda.set_allocator(self.previous_allocator)
                self.previous_allocator = None
            self.origins.clear()
            self.pinned = (0, 0)
