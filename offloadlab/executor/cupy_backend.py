"""The ``cupy`` backend: the executor on NVIDIA GPUs (TURNIP Sec. 5; docs/gpu.md).

One arena per GPU (a single ``cudaMalloc`` made before the run, tensors at their planned
offsets) and one pinned host block; every stream slot is a non-blocking CUDA stream whose lane
sleeps on blocking-sync events until its job is done, as in TURNIP.  Nothing is allocated on a
GPU once the clock starts, and every lane runs each of its kernels once before it
(:attr:`warm_up`).  Streams, timing and allocation rules: docs/gpu.md.

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
from .device import Array, Backend, backend

NEEDS = "the cupy backend needs CuPy and an NVIDIA GPU: pip install 'offloadlab[gpu]'"


CUDA_ERROR_MEMORY_ALLOCATION = 2               # cudaError_t values (CuPy 14.2 names neither)
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
ANCHOR_SECONDS = 1.0     # a slot measures from a new anchor event once this much has passed
LANE_RESERVE = 64 << 20  # bytes of GPU memory each compute lane takes beyond its scratch: its
                         # cuBLAS handle's workspace and CuPy's per-thread state (docs/gpu.md)


@dataclass(eq=False)
class Slot:
    """A stream slot: its GPU, its CUDA stream, the start event each job reuses, two end
    events used in turn (the previous job's may be the anchor), and the anchor: an event and
    its time in seconds since :meth:`CupyBackend.begin`."""

    device: int
    stream: Any                  # cupy.cuda.Stream
    start: Any                   # cupy.cuda.Event
    ends: tuple[Any, Any]
    turn: int = 0
    anchor: Any = None
    anchor_time: float = 0.0


class DeviceAllocation(RuntimeError):
    """CuPy asked for device memory while the clock ran (the executor allows none)."""


def _no_allocation(nbytes: int) -> NoReturn:
    """The CuPy allocator installed by :meth:`CupyBackend.begin`."""
    raise DeviceAllocation(f"CuPy allocated {nbytes} bytes of GPU memory during the run (the "
                           f"executor allows none: a kernel that does is a bug, docs/gpu.md)")


@backend("cupy", doc="NVIDIA GPUs through CuPy: one arena per GPU, a pinned host block, CUDA "
         "streams and events", tolerance=(1e-3, 1e-4))
def make(machine: Machine, rate_limit: bool = True) -> Backend:
    """A fresh cupy backend (needs an NVIDIA GPU and the ``gpu`` extra); copies run at the
    hardware's speed whatever ``rate_limit`` says.

    Parameters
    ----------
    machine : Machine
        The machine, whose GPUs must be visible.
    rate_limit : bool
        Ignored.

    Returns
    -------
    Backend
        A :class:`CupyBackend`.

    Raises
    ------
    SpecError
        CuPy is not installed, or no CUDA device is visible.
    """
    return CupyBackend(machine)


class CupyBackend:
    """Arenas, a pinned host block, CUDA streams and events on the visible GPUs.

    ``forbid_alloc`` (the default) makes :meth:`begin` install a CuPy allocator that raises
    :class:`DeviceAllocation`, so any device allocation through CuPy during the run fails its
    vertex; :meth:`close` restores the previous allocator.
    """

    name = "cupy"
    aligned = True              # a kernel faults on a misaligned address
    arenas_in_ram = False
    serial_streams = False      # each stream its own lane: kernels on streams overlap
    warm_up = True              # compile kernels and make cuBLAS handles before the clock
    lane_reserve = LANE_RESERVE

    def __init__(self, machine: Machine, forbid_alloc: bool = True):
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
        cupy._core.set_reduction_accelerators([])
        cupy._core.set_routine_accelerators([])
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
        ``"gpu0:scratch3"``), as a 1-D ``uint8`` array.

        Parameters
        ----------
        gpu : str
            The GPU, or a workspace on it.
        nbytes : int
            The size.

        Returns
        -------
        Array
            The CuPy array.

        Raises
        ------
        SpecError
            The GPU is not visible.
        MemoryError
            ``cudaMalloc`` failed.
        """
        cuda = self.cuda
        with cuda.Device(self._device(gpu.partition(":")[0])):
            try:
                memory = cuda.Memory(nbytes)
            except cuda.runtime.CUDARuntimeError as exc:
                if exc.status != CUDA_ERROR_MEMORY_ALLOCATION:
                    raise
                raise MemoryError(str(exc)) from None
            return self.xp.ndarray((nbytes,), self.xp.uint8, cuda.MemoryPointer(memory, 0))

    def free_memory(self, gpu: str) -> int:
        """Bytes ``cudaMalloc`` may still take on ``gpu`` (its free memory, the CUDA context
        already made).

        Parameters
        ----------
        gpu : str
            The GPU, e.g. ``gpu0``.

        Returns
        -------
        int
            The bytes.
        """
        with self.cuda.Device(self._device(gpu)):
            return int(self.cuda.runtime.memGetInfo()[0])

    def host_array(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A pinned host array (an output's copy, which :meth:`download` fills asynchronously).

        Parameters
        ----------
        shape : tuple of int
            The output's shape.
        dtype : str
            Its dtype.

        Returns
        -------
        numpy.ndarray
            A view of freshly pinned memory.
        """
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self._pinned(nbytes).view(dtype).reshape(shape)

    def host_block(self, nbytes: int) -> np.ndarray:
        """One pinned, portable (pinned for every GPU) block of ``nbytes``, as NumPy bytes.

        Parameters
        ----------
        nbytes : int
            The bytes to pin.

        Returns
        -------
        numpy.ndarray
        """
        block = self._pinned(nbytes)
        if nbytes:
            self.pinned = (block.ctypes.data, block.ctypes.data + nbytes)
        return block

    def _pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of pinned, portable host memory as NumPy bytes (none for 0)."""
        if not nbytes:
            return np.empty(0, np.uint8)
        cuda = self.cuda
        try:
            memory = cuda.PinnedMemory(nbytes, cuda.runtime.hostAllocPortable)
        except cuda.runtime.CUDARuntimeError as exc:
            raise MemoryError(str(exc)) from None
        return np.frombuffer(cuda.PinnedMemoryPointer(memory, 0), np.uint8, nbytes)

    def fill(self, buffer: Array, byte: int) -> None:
        """Set every byte of ``buffer``, on its own device, and wait (outside the run, or
        inside a job for a tensor on another GPU than the job's stream: a peer copy's
        destination, which a kernel launched on the source device could not reach without
        peer access).

        Parameters
        ----------
        buffer : Array
            A CuPy array.
        byte : int
            The value.
        """
        cuda = self.cuda
        with cuda.Device(buffer.device.id), cuda.Stream.null:
            buffer.reshape(-1).view(self.xp.uint8).fill(byte)
            cuda.Stream.null.synchronize()

    def upload(self, dst: Array, value: np.ndarray) -> None:
        """Set the GPU tensor ``dst`` to ``value`` and wait.

        Parameters
        ----------
        dst : Array
            A view of an arena on its GPU.
        value : numpy.ndarray
            The input's value, in host memory.
        """
        with self.cuda.Device(dst.device.id):
            dst.set(value)
            self.cuda.get_current_stream().synchronize()

    def download(self, stream: Slot | None, src: Array, dst: np.ndarray) -> None:
        """Copy ``src`` into the host array ``dst`` on ``stream`` (after the job that wrote
        it) and wait for it.

        Parameters
        ----------
        stream : Slot or None
            The slot of the lane that downloads; None copies on the device's current stream.
        src : Array
            A view of an arena.
        dst : numpy.ndarray
            What :meth:`host_array` made.
        """
        if src.nbytes != dst.nbytes:
            raise ValueError(f"download of {src.nbytes} bytes into {dst.nbytes}")
        if stream is None:
            with self.cuda.Device(src.device.id):
                src.get(out=dst)
            return
        runtime = self.cuda.runtime
        runtime.memcpyAsync(dst.ctypes.data, src.data.ptr, src.nbytes, runtime.memcpyDefault,
                            stream.stream.ptr)
        stream.stream.synchronize()

    # -- streams --------------------------------------------------------------------------
    def stream(self, resource: str, slot: int) -> Slot | None:
        """A new non-blocking stream for a GPU's compute slot or a copy engine; None for the
        ``cpu``, whose jobs run NumPy on their lane.

        Parameters
        ----------
        resource : str
            ``gpu0``, ``h2d:gpu0``, ``gpu0->gpu1``, ``cpu``...
        slot : int
            The slot's index (each slot its own stream).

        Returns
        -------
        Slot or None
            The stream, with its device and timing events.
        """
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
            return Slot(device, cuda.Stream(non_blocking=True), cuda.Event(block=True),
                        (cuda.Event(block=True), cuda.Event(block=True)))

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
                if exc.status != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
                    raise
                runtime.getLastError()    # clear the error, or the next launch reports it

    # -- running --------------------------------------------------------------------------
    def untimed(self, stream: Slot | None, work: Callable[[], None]) -> None:
        """Run ``work`` with ``stream`` current and wait for it (the warm-up).

        Parameters
        ----------
        stream : Slot or None
            The slot; None runs ``work`` on the host.
        work : callable
            The work (kernel launches).
        """
        if stream is None:
            work()
            return
        with self.cuda.Device(stream.device), stream.stream:
            work()
        stream.stream.synchronize()

    def begin(self) -> None:
        """Wait for the uploads and fills, forbid device allocations, then record each GPU's
        origin event and note when it completed on the ``perf_counter`` clock, time zero of
        the ``cpu`` lane."""
        cuda = self.cuda
        for device in sorted(self.devices):
            cuda.Device(device).synchronize()
        if self.forbid_alloc:
            self.previous_allocator = cuda.get_allocator()
            cuda.set_allocator(_no_allocation)   # process-wide: the lanes' threads see it too
        self.origin = time.perf_counter()
        for device in sorted(self.devices):
            with cuda.Device(device):
                event = cuda.Event(block=True)
                event.record(cuda.Stream.null)
                event.synchronize()
            self.origins[device] = (event, time.perf_counter() - self.origin)

    def timed(self, stream: Slot | None, work: Callable[[], None]) -> tuple[float, float]:
        """Run ``work`` with ``stream`` current, between two events, and sleep until it is
        done; its start and end in seconds since :meth:`begin`, measured from the slot's
        anchor (the module's docstring).

        Parameters
        ----------
        stream : Slot or None
            The slot; None times ``work`` on the host's clock.
        work : callable
            The work (kernel launches or a copy).

        Returns
        -------
        tuple of float
            ``(start, end)``.
        """
        if stream is None:
            start = time.perf_counter()
            work()
            return start - self.origin, time.perf_counter() - self.origin
        cuda = self.cuda
        end_event = stream.ends[stream.turn]
        with cuda.Device(stream.device), stream.stream:
            stream.start.record(stream.stream)
            work()
            end_event.record(stream.stream)
        end_event.synchronize()
        if stream.anchor is None:
            stream.anchor, stream.anchor_time = self.origins[stream.device]
        anchor, at = stream.anchor, stream.anchor_time
        start = at + cuda.get_elapsed_time(anchor, stream.start) / 1e3
        end = at + cuda.get_elapsed_time(anchor, end_event) / 1e3
        if end - at > ANCHOR_SECONDS:
            stream.anchor, stream.anchor_time = end_event, end
            stream.turn ^= 1          # the next job records into the other end event
        return start, end

    def copy(self, stream: Slot, dst: Array, src: Array) -> None:
        """``cudaMemcpyAsync`` on ``stream``: pinned host <-> arena, or arena -> arena.

        Parameters
        ----------
        stream : Slot
            The copy engine's slot.
        dst, src : Array
            Tensors of the same size: views of arenas, or of the pinned host block.
        """
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
