"""The race detector: a run that reports an overwrite of bytes a vertex still needed
(docs/races.md; docs/design.md rule 3).

Under ``execute(..., check_races=True)`` every tensor gets a checksum when its writer
completes, and every vertex that reads a GPU tensor checksums it again just before and after
its own work; beside them the loop keeps, per GPU, the vertex last launched over each byte.  In
a plan missing a memory edge the first test to see the race stops the run with a
:class:`RaceError` naming the reader, the writer and the overwriter.  The checksum, its costs
and its limits: docs/races.md.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import VerificationError
from ..core.intervals import LastWriter
from ..core.machine import Machine
from ..core.memgraph import MOVE_KINDS, MemGraph
from ..core.verify import verify
from .device import Array, ExecutionError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .loop import EventLoop

HOST = "host"
"""Where the slots of CPU kernels and host inputs live."""

CUDA_SOURCE = r"""
extern "C" __global__ void offloadlab_checksum(const unsigned char* data,
                                               unsigned long long n,
                                               unsigned long long* out) {
    unsigned long long sum = 0;
    unsigned long long words = (n + 3) / 4;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < words; i += step) {
        unsigned long long at = 4 * i;
        unsigned int word = 0;
        if (at + 4 <= n && ((unsigned long long)(data + at) & 3) == 0) {
            word = *(const unsigned int*)(data + at);
        } else {
            for (int k = 0; k < 4 && at + k < n; ++k)
                word |= (unsigned int)data[at + k] << (8 * k);
        }
        sum += word;
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if ((threadIdx.x & 31) == 0)
        atomicAdd(out, sum);
}
"""
THREADS = 256
MAX_BLOCKS = 1024


class RaceError(ExecutionError):
    """A vertex read a tensor whose bytes another vertex overwrote (or had started to)."""


def checksum(xp: Any, data: Array, out: Array) -> None:
    """Set the 0-d ``uint64`` array ``out`` to the checksum of the 1-D byte array ``data``
    (both on one device, ``xp``'s: NumPy or CuPy), allocating nothing on a GPU.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    data : Array
        The bytes.
    out : Array
        The 0-d ``uint64`` result, set in place.
    """
    if xp is np:
        whole = data.size & ~3
        np.add.reduce(data[:whole].view("<u4"), dtype=np.uint64, out=out)
        if whole < data.size:
            out += np.uint64(int.from_bytes(data[whole:].tobytes(), "little"))
        return
    out.fill(0)
    blocks = min(MAX_BLOCKS, max(1, (data.size + 4 * THREADS - 1) // (4 * THREADS)))
    _cuda_kernel(xp)((blocks,), (THREADS,), (data, np.uint64(data.size), out))


@functools.cache
def _cuda_kernel(xp: Any) -> Any:
    return xp.RawKernel(CUDA_SOURCE, "offloadlab_checksum")


def _on(xp: Any, array: Array) -> Any:
    """The context in which work on ``array`` runs on its own GPU (nothing for NumPy)."""
    return nullcontext() if xp is np else xp.cuda.Device(array.device.id)


class RaceDetector:
    """The checksums and the last writers of one :class:`~.loop.EventLoop`'s run; the loop
    calls :meth:`launched` as it launches a vertex and :meth:`completed` as it completes
    one, both holding its lock."""

    def __init__(self, loop: EventLoop):
        self.loop = loop
        backend, vertices = loop.backend, loop.vertices
        self.xp = backend.xp
        n = len(vertices)
        self.expected = np.zeros(n, np.uint64)
        self.source = [-1] * n          # a move's: the vertex whose value it carries
        self.bytes: list[tuple[str, int, int] | None] = [None] * n   # a GPU tensor's bytes
        self.data: list[Array] = [None] * n      # ... as a byte array in its arena
        self.reads: list[list[int]] = [[] for _ in range(n)]    # the GPU tensors probed
        self.after: list[list[int]] = [[] for _ in range(n)]    # ... and after the work
        self.device = [HOST] * n        # where a vertex's probes run
        self.base = [-1] * n            # its first slot: output, then probes before, after
        self.measured = [False] * n     # whether its output's checksum is measured
        count: dict[str, int] = {}
        for i, v in enumerate(vertices):
            if v.loc is not None:
                start = v.loc.offset
                end = start + int(np.prod(loop.shape[i])) * np.dtype(v.dtype).itemsize
                self.bytes[i] = (v.loc.device, start, end)
                self.data[i] = loop.arenas[v.loc.device][start:end]
            if v.kind in MOVE_KINDS or v.kind == "transfer":
                self.source[i] = loop.inputs[i][0]
            else:
                self.measured[i] = True
        for i in range(n):
            self.reads[i] = [u for u in loop.distinct_inputs[i] if self.bytes[u] is not None]
            mine = self.bytes[i]
            self.after[i] = [u for u in self.reads[i] if not _overlap(mine, self.bytes[u])]
            if self.reads[i]:
                self.device[i] = self.bytes[self.reads[i][0]][0]  # type: ignore[index]
            elif mine is not None:
                self.device[i] = mine[0]
            size = self.measured[i] + len(self.reads[i]) + len(self.after[i])
            if size:
                self.base[i] = count.get(self.device[i], 0)
                count[self.device[i]] = self.base[i] + size
        self.slots: dict[str, Array] = {}
        self.host_slots: dict[str, np.ndarray] = {}
        for where, size in count.items():
            if where == HOST:
                slots = np.zeros(size, np.uint64)
            else:
                slots = backend.arena(f"{where}:races", 8 * size).view(self.xp.uint64)
            self.slots[where] = slots
            self.host_slots[where] = slots if where == HOST else np.zeros(size, np.uint64)
        self._compile()
        self.last: dict[str, LastWriter[int]] = {}
        self.finished = bytearray(n)

    def loaded(self) -> None:
        """The inputs' checksums and last writers, once their values are loaded and before
        the clock starts (which also compiles the GPU's checksum kernel there)."""
        for i, v in enumerate(self.loop.vertices):
            if v.kind != "input":
                continue
            self.finished[i] = 1
            if self.bytes[i] is None:
                self.expected[i] = self._host_checksum(self.loop.tensor[i])
                continue
            gpu, start, end = self.bytes[i]  # type: ignore[misc]
            self.last.setdefault(gpu, LastWriter()).overwrite(start, end, i)
            slots = self.slots[gpu]
            with _on(self.xp, slots):
                checksum(self.xp, self.data[i], self._slot(i, 0))
            self.expected[i] = self._read(i, 1)[0]

    def _compile(self) -> None:
        """Compile the checksum kernel on every GPU with slots, before the run (an input's
        checksum compiles it only on a GPU that holds an input)."""
        for where, slots in self.slots.items():
            if where != HOST:
                with _on(self.xp, slots):
                    checksum(self.xp, slots.view(self.xp.uint8)[:0], slots[:1].reshape(()))

    def _host_checksum(self, tensor: np.ndarray) -> int:
        out = np.zeros((), np.uint64)
        checksum(np, tensor.reshape(-1).view(np.uint8), out)
        return int(out)

    def _slot(self, i: int, k: int) -> Array:
        """The ``k``-th slot of vertex ``i``, as a 0-d array."""
        at = self.base[i] + k
        return self.slots[self.device[i]][at:at + 1].reshape(())

    def _read(self, i: int, size: int) -> np.ndarray:
        """The values of the first ``size`` slots of vertex ``i``, on the host."""
        where, at = self.device[i], self.base[i]
        host = self.host_slots[where][at:at + size]
        if where != HOST:
            self.loop.backend.download(None, self.slots[where][at:at + size], host)
        return host

    # -- the loop's hooks --------------------------------------------------------------------
    def launched(self, i: int, work: Callable[[], None]) -> Callable[[], None]:
        """Vertex ``i`` is being launched: check it, record it as the last writer of its bytes, and
        wrap ``work`` with the checksums of the run around it.

        Parameters
        ----------
        i : int
            The vertex, by position.
        work : callable
            Its work.

        Returns
        -------
        callable
            ``work`` between the checksums.

        Raises
        ------
        RaceError
            A vertex was launched over one of ``i``'s inputs after the input's writer, or ``i``
            overwrites bytes that a vertex still running writes.
        """
        for u in self.reads[i]:
            self._check_writers(i, u, "before it started")
        mine = self.bytes[i]
        if mine is not None:
            for p in self.last.setdefault(mine[0], LastWriter()).overwrite(mine[1], mine[2], i):
                if not self.finished[p]:
                    self._raise(self._reader_of(p), p, f"overwritten ({self._name(i)} was "
                                f"launched over them while {self._name(p)} wrote them)", i)
        reads, after = self.reads[i], self.after[i]
        output = self.measured[i] and self.loop.vertices[i].kind != "input"
        if not (reads or output):
            return work
        xp = np if self.device[i] == HOST else self.xp
        data = self.data
        first = [(data[u], self._slot(i, output + k)) for k, u in enumerate(reads)]
        then = [(data[u], self._slot(i, output + len(reads) + k)) for k, u in enumerate(after)]
        if output:
            then.append((data[i] if mine is not None else
                         self.loop.tensor[i].reshape(-1).view(np.uint8), self._slot(i, 0)))

        def checked() -> None:
            for tensor, slot in first:
                checksum(xp, tensor, slot)
            work()
            for tensor, slot in then:
                checksum(xp, tensor, slot)
        return checked

    def completed(self, i: int) -> None:
        """Vertex ``i`` completed: its output's checksum is known.

        Parameters
        ----------
        i : int
            The vertex, by position.

        Raises
        ------
        RaceError
            An input it read changed before or during its work, or a vertex was launched over one
            while it ran.
        """
        reads, after = self.reads[i], self.after[i]
        measured = self.measured[i]
        self.finished[i] = 1
        if self.base[i] < 0:            # a copy from the host: it carries its source's value
            self.expected[i] = self.expected[self.source[i]]
            return
        values = self._read(i, measured + len(reads) + len(after))
        self.expected[i] = values[0] if measured else self.expected[self.source[i]]
        expected = self.expected
        for k, u in enumerate(reads):
            if values[measured + k] != expected[u]:
                self._raise(i, u, "changed before it started")
        for k, u in enumerate(after):
            if values[measured + len(reads) + k] != expected[u]:
                self._raise(i, u, "changed while it ran")
        for u in reads:
            self._check_writers(i, u, "while it ran")

    # -- reports -----------------------------------------------------------------------------
    def _check_writers(self, i: int, u: int, when: str) -> None:
        """Raise if the bytes of ``u`` (which ``i`` reads) were last launched over by a vertex
        other than ``u`` and ``i``."""
        gpu, start, end = self.bytes[u]  # type: ignore[misc]
        others = [w for w in self.last[gpu].writers(start, end) if w not in (u, i)]
        if others:
            self._raise(i, u, f"overwritten ({self._name(others[-1])} was launched over "
                              f"them {when})", others[-1])

    def _raise(self, i: int, u: int, what: str, overwriter: int | None = None) -> None:
        gpu, start, end = self.bytes[u]  # type: ignore[misc]
        if overwriter is None:
            others = [w for w in self.last[gpu].writers(start, end) if w not in (u, i)]
            overwriter = others[-1] if others else None
            what += (f" by {self._name(overwriter)}, the last vertex launched over them"
                     if overwriter is not None else ", by no vertex the plan launched there")
        v = self.loop.vertices[i]
        role = "offloads" if v.kind == "offload" else "copies" if v.kind == "transfer" \
            else "reads"
        raise RaceError(f"race on {gpu} [{start}, {end}): {v.id!r} {role} the tensor "
                        f"{self._name(u)} wrote, whose bytes were {what}")

    def _reader_of(self, p: int) -> int:
        """The first reader of ``p`` in the planner's order, or ``p`` if it has none."""
        inputs = self.loop.distinct_inputs
        return next((k for k in range(len(inputs)) if p in inputs[k]), p)

    def _name(self, i: int) -> str:
        return repr(self.loop.vertices[i].id)


def _overlap(a: tuple[str, int, int] | None, b: tuple[str, int, int] | None) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def racy_edges(mg: MemGraph, machine: Machine | None = None) -> list[tuple[str, str]]:
    """The memory edges ``(u, v)`` of ``mg`` whose removal alone breaks rule 3: each is a plan with
    a race a runtime must catch.

    Without the edge, v may overwrite bytes that u, or a vertex only u orders before v, still
    reads or writes.  ``mg`` is left as it was.

    Parameters
    ----------
    mg : MemGraph
        A correct plan.
    machine : Machine, optional
        What it runs on, for the rules that depend on it.

    Returns
    -------
    list of (str, str)
        The edges.
    """
    found = []
    for u, v, kind in list(mg.edges()):
        if kind != "memory":
            continue
        del mg.succ[u][v], mg.pred[v][u]
        try:
            verify(mg, None, machine)
        except VerificationError as exc:
            if str(exc).startswith("rule 3"):
                found.append((u, v))
        finally:
            mg.succ[u][v] = mg.pred[v][u] = kind
    return found
