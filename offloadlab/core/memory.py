"""Memory in use over time, per GPU and in host (pinned) RAM, derived from a trace and the
MemGraph it ran (docs/design.md, Trace), and its peaks: what the simulator and the executor
report, what the simulator checks against the machine's GPU memory and reports against its
``host_memory`` (docs/host-memory.md).  Compiled (docs/install.md, The compiled build): its
loops run once per vertex and data edge of every simulated run."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .devices import HOST, is_gpu, split_transfer
from .host import in_host_ram

if TYPE_CHECKING:
    from .memgraph import Loc, MemGraph, MemVertex


def _memgraph_gpus(memgraph: MemGraph) -> list[str]:
    """The GPUs a MemGraph uses (devices, transfer ends, locations), sorted by index."""
    found: set[str] = set()
    for v in memgraph:
        devices = split_transfer(v.device) if "->" in v.device else (v.device,)
        found.update(d for d in devices if is_gpu(d))
        if v.loc is not None:
            found.add(v.loc.device)
    return sorted(found, key=lambda d: int(d[3:]))


def memory_over_time(trace: pd.DataFrame, memgraph: MemGraph) -> pd.DataFrame:
    """Bytes in use per device over time: a step function with columns ``time, device, bytes``.

    A vertex with a location occupies ``loc.size`` bytes on ``loc.device`` from its start until
    the end of the last of its data successors (its readers, an offload among them); one with
    none stays until the first vertex to start after it writing any of its bytes starts (a copy
    dropped unread), or to the end of the run (a graph output).  Host RAM (``"host"``) holds
    what :func:`host_lifetimes` says.  Inputs start at time 0.
    Vertices missing from the trace (other than inputs) occupy nothing, and missing readers
    are ignored.

    Parameters
    ----------
    trace : pandas.DataFrame
        A single run's trace (a simulation's or an execution's).
    memgraph : MemGraph
        The plan it ran.

    Returns
    -------
    pandas.DataFrame
        One row per device and time where its use changes, giving the use from then on; sorted
        by time, then device.
    """
    vertices, index, begin, end, run_end = _run_times(trace, memgraph)
    return _memory(vertices, _data_edges(memgraph, vertices, index), begin, end, run_end)


def run_memory_and_peaks(vertices: Sequence[MemVertex], data: tuple[np.ndarray, np.ndarray],
                         start: Sequence[float], end: Sequence[float], gpus: Sequence[str]
                         ) -> tuple[pd.DataFrame, dict[str, int]]:
    """:func:`memory_and_peaks` of a run in which every vertex ran, from per-vertex lists: what
    the simulator reports, without going through its trace.

    Parameters
    ----------
    vertices : sequence of MemVertex
        The plan's vertices, in any order.
    data : tuple of (numpy.ndarray, numpy.ndarray)
        Its data edges as ``(sources, targets)`` positions in ``vertices``, as
        :class:`~offloadlab.core.contract.Contract` gives them.
    start, end : sequence of float
        When each vertex started and ended, by position.
    gpus : sequence of str
        Every GPU of the machine, each of which gets a peak.

    Returns
    -------
    tuple of (pandas.DataFrame, dict of str to int)
        The use over time and the peaks, as :func:`memory_and_peaks`.
    """
    inputs = _inputs(vertices)
    begin = np.where(inputs, 0.0, np.asarray(start, dtype=float))
    ended = np.where(inputs, np.nan, np.asarray(end, dtype=float))
    run_end = float(ended[~inputs].max()) if not inputs.all() else 0.0
    memory = _memory(vertices, data, begin, ended, run_end)
    return memory, _peaks(memory, (*gpus, HOST))


def _memory(vertices: Sequence[MemVertex], data: tuple[np.ndarray, np.ndarray],
            begin: np.ndarray, end: np.ndarray, run_end: float) -> pd.DataFrame:
    """:func:`memory_over_time` from when each vertex began and ended (NaN: it did not run;
    inputs began at 0 and have no end) and the run's end."""
    last = _last_reads(len(vertices), data, end)
    located, since, until = _gpu_lifetimes(vertices, begin, last, run_end)
    locs: list[Loc] = [v.loc for v in located]                # type: ignore[misc]
    size = np.array([loc.size for loc in locs], dtype=np.int64)
    held_from, held_until, held = _host_lifetimes(vertices, begin, end, last, run_end)
    return _steps([loc.device for loc in locs] * 2 + [HOST] * (2 * len(held)),
                  np.concatenate([since, until, held_from, held_until]),
                  np.concatenate([size, -size, held, -held]))


def _steps(devices: list[str], times: np.ndarray, change: np.ndarray) -> pd.DataFrame:
    """The use per device over time from its changes (``change`` bytes on ``devices[k]`` at
    ``times[k]``; a NaN time is left out): one row per device and time where the use changes,
    sorted by time, then device."""
    names = sorted(set(devices))
    lookup = {name: k for k, name in enumerate(names)}
    code = np.fromiter(map(lookup.__getitem__, devices), np.int64, len(devices))
    keep = ~np.isnan(times)
    code, times, change = code[keep], times[keep], change[keep]
    order = np.lexsort((times, code))                 # by device, then time
    code, times, change = code[order], times[order], change[order]
    first = np.ones(len(code), dtype=bool)
    first[1:] = (code[1:] != code[:-1]) | (times[1:] != times[:-1])
    starts = np.flatnonzero(first)
    code, times = code[starts], times[starts]
    total = np.add.reduceat(change, starts) if len(starts) else change[:0]
    kept = total != 0
    code, times, total = code[kept], times[kept], total[kept]
    used = np.cumsum(total)
    begins = np.ones(len(code), dtype=bool)
    begins[1:] = code[1:] != code[:-1]
    before = (used - total)[begins]                   # the sum before each device's first row
    used = used - before[np.cumsum(begins) - 1]
    rows = np.lexsort((code, times))                  # by time, then device
    return pd.DataFrame({"time": times[rows],
                         "device": [names[k] for k in code[rows].tolist()],
                         "bytes": used[rows]})


def gpu_lifetimes(trace: pd.DataFrame, memgraph: MemGraph
                  ) -> tuple[list[MemVertex], np.ndarray, np.ndarray]:
    """The vertices with a location that ran, and from when until when each holds its
    ``loc.size`` bytes (:func:`memory_over_time`'s rule).

    Parameters
    ----------
    trace, memgraph
        As :func:`memory_over_time` takes them.

    Returns
    -------
    tuple of (list of MemVertex, numpy.ndarray, numpy.ndarray)
        The vertices, their starts, their ends.
    """
    vertices, index, begin, end, run_end = _run_times(trace, memgraph)
    last = _last_reads(len(vertices), _data_edges(memgraph, vertices, index), end)
    return _gpu_lifetimes(vertices, begin, last, run_end)


def _data_edges(memgraph: MemGraph, vertices: Sequence[MemVertex],
               index: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The MemGraph's data edges as ``(sources, targets)`` arrays of positions in
    ``vertices`` (``index``: id -> position)."""
    sources: list[int] = []
    targets: list[int] = []
    succ = memgraph.succ
    for i, v in enumerate(vertices):
        for w, kind in succ[v.id].items():
            if kind == "data":
                sources.append(i)
                targets.append(index[w])
    return np.array(sources, dtype=np.int64), np.array(targets, dtype=np.int64)


def _inputs(vertices: Sequence[MemVertex]) -> np.ndarray:
    return np.array([v.kind == "input" for v in vertices], dtype=bool)


def _run_times(trace: pd.DataFrame, memgraph: MemGraph
               ) -> tuple[list[MemVertex], dict[str, int], np.ndarray, np.ndarray, float]:
    """The MemGraph's vertices, their positions, when each began (inputs: 0) and ended (NaN
    where it did not run) and the run's end."""
    if trace["run"].nunique() > 1:
        raise ValueError("memory_over_time: the trace holds several runs; select one first")
    vertices = list(memgraph)
    index: dict[str, int] = {v.id: i for i, v in enumerate(vertices)}
    n = len(vertices)
    rows = np.array([index.get(v, -1) for v in trace["vertex"].tolist()], dtype=np.int64)
    known = rows >= 0
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    start[rows[known]] = trace["start"].to_numpy(dtype=float)[known]
    end[rows[known]] = trace["end"].to_numpy(dtype=float)[known]
    run_end = float(trace["end"].max()) if len(trace) else 0.0
    begin = np.where(np.isnan(start) & _inputs(vertices), 0.0, start)
    return vertices, index, begin, end, run_end


def _last_reads(n: int, data: tuple[np.ndarray, np.ndarray], end: np.ndarray) -> np.ndarray:
    """When each of ``n`` vertices' last data reader that ran ended (-inf: none ran)."""
    sources, targets = data
    last = np.full(n, -np.inf)
    read_end = end[targets]
    traced = ~np.isnan(read_end)
    np.maximum.at(last, sources[traced], read_end[traced])
    return last


def _gpu_lifetimes(vertices: Sequence[MemVertex], begin: np.ndarray, last: np.ndarray,
                   run_end: float) -> tuple[list[MemVertex], np.ndarray, np.ndarray]:
    ran = (~np.isnan(begin)).tolist()
    located = [i for i, v in enumerate(vertices) if v.loc is not None and ran[i]]
    where = np.array(located, dtype=np.int64)
    until = last[where]
    locs: list[Loc] = [vertices[i].loc for i in located]   # type: ignore[misc]
    unread = until == -np.inf
    if unread.any():
        order = np.array([vertices[i].order for i in located], dtype=np.int64)
        until[unread] = _overwritten(locs, begin[where], order, unread, run_end)
    return [vertices[i] for i in located], begin[where], until


def host_lifetimes(vertices: Sequence[MemVertex], succ: Mapping[str, Mapping[str, str]],
                   index: Mapping[str, int], start: Sequence[float], end: Sequence[float],
                   run_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """When a run holds each tensor in host RAM: one entry per host input (from 0 to
    ``run_end``) and per offload or CPU op that ran (from its start until the end of its last
    data reader that ran, else its own end).

    Parameters
    ----------
    vertices : sequence of MemVertex
        The plan's vertices.
    succ : mapping
        The MemGraph's successors (``id -> {successor: kind}``).
    index : mapping of str to int
        Each vertex's position in ``vertices``.
    start, end : sequence of float
        When each vertex started and ended, by position; NaN where it did not run.
    run_end : float
        When the run ended.

    Returns
    -------
    tuple of numpy.ndarray
        ``(since, until, bytes)``, an entry each.
    """
    sources: list[int] = []
    targets: list[int] = []
    for i, v in enumerate(vertices):
        if in_host_ram(v):
            for w, kind in succ[v.id].items():
                if kind == "data":
                    sources.append(i)
                    targets.append(index[w])
    return run_host_lifetimes(vertices, (np.array(sources, dtype=np.int64),
                                         np.array(targets, dtype=np.int64)),
                              start, end, run_end)


def run_host_lifetimes(vertices: Sequence[MemVertex], data: tuple[np.ndarray, np.ndarray],
                       start: Sequence[float], end: Sequence[float], run_end: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`host_lifetimes` with the data edges as arrays of positions.

    Parameters
    ----------
    vertices : sequence of MemVertex
        The plan's vertices.
    data : tuple of (numpy.ndarray, numpy.ndarray)
        Its data edges, as :func:`run_memory_and_peaks` takes them.
    start, end, run_end
        As :func:`host_lifetimes` takes them.

    Returns
    -------
    tuple of numpy.ndarray
        ``(since, until, bytes)``, as :func:`host_lifetimes`.
    """
    ended = np.asarray(end, dtype=float)
    return _host_lifetimes(vertices, np.asarray(start, dtype=float), ended,
                           _last_reads(len(vertices), data, ended), run_end)


def _host_lifetimes(vertices: Sequence[MemVertex], start: np.ndarray, end: np.ndarray,
                    last: np.ndarray, run_end: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    held = np.array([in_host_ram(v) for v in vertices], dtype=bool)
    inputs = _inputs(vertices)
    size = np.array([v.bytes for v in vertices], dtype=np.int64)
    ran = held & ~inputs & ~np.isnan(start)
    held_in = held & inputs
    # the entries in vertex order, as the rule lists them
    keep = np.flatnonzero(held_in | ran)
    since = np.where(held_in, 0.0, start)[keep]
    until = np.where(held_in, run_end, np.maximum(end, last))[keep]
    return since.astype(float), until.astype(float), size[keep]


def run_host_peak(since: np.ndarray, until: np.ndarray, size: np.ndarray) -> int:
    """The most bytes :func:`host_lifetimes`' tensors hold at once; one freed at the instant
    another is allocated makes room for it (the executor frees before it launches).

    Parameters
    ----------
    since, until, size : numpy.ndarray
        :func:`host_lifetimes`' entries.

    Returns
    -------
    int
        The peak, in bytes.
    """
    if not len(size):
        return 0
    times = np.concatenate([since, until])
    change = np.concatenate([size, -size])
    order = np.lexsort((change, times))          # at one instant, frees first
    return max(int(np.cumsum(change[order]).max()), 0)


def _overwritten(locs: list[Loc], begin: np.ndarray, order: np.ndarray, unread: np.ndarray,
                 run_end: float) -> np.ndarray:
    """When the bytes of each ``unread`` writer (a mask over the writers ``locs``, which start
    at ``begin``) are first written again, else ``run_end``: one sweep over the writers in
    order of their start (ties in planner ``order``), from the first unread one on, keeping per
    GPU the unread copies not yet overwritten (disjoint intervals, sorted by offset)."""
    sweep = np.lexsort((np.arange(len(locs)), order, begin))
    first = int(np.argmax(unread[sweep]))
    pending: dict[str, list[tuple[int, int, int]]] = {}
    until = np.full(len(locs), run_end)
    for k in sweep[first:].tolist():
        loc = locs[k]
        alive = pending.setdefault(loc.device, [])
        i = max(bisect.bisect_right(alive, (loc.offset,)) - 1, 0)
        while i < len(alive) and alive[i][0] < loc.end:
            if alive[i][1] > loc.offset:
                until[alive.pop(i)[2]] = begin[k]
            else:
                i += 1
        if unread[k]:
            bisect.insort(alive, (loc.offset, loc.end, k))
    return until[unread]


def memory_and_peaks(trace: pd.DataFrame, memgraph: MemGraph,
                     gpus: Sequence[str]) -> tuple[pd.DataFrame, dict[str, int]]:
    """:func:`memory_over_time` and :func:`peak_memory`, with a peak for each of ``gpus``.

    Parameters
    ----------
    trace, memgraph
        As :func:`memory_over_time` takes them.
    gpus : sequence of str
        Every GPU of the machine, which includes those the MemGraph uses (0 where unused).

    Returns
    -------
    tuple of (pandas.DataFrame, dict of str to int)
        The use over time and the peak of each GPU and of ``"host"``.
    """
    memory = memory_over_time(trace, memgraph)
    return memory, _peaks(memory, (*gpus, HOST))


def peak_memory(trace: pd.DataFrame, memgraph: MemGraph,
                memory: pd.DataFrame | None = None) -> dict[str, int]:
    """Peak bytes in use per GPU of the MemGraph (0 if unused) and in ``"host"`` RAM.

    Parameters
    ----------
    trace, memgraph
        As :func:`memory_over_time` takes them.
    memory : pandas.DataFrame, optional
        :func:`memory_over_time`'s result, if already computed.

    Returns
    -------
    dict of str to int
        The peak of each device.
    """
    if memory is None:
        memory = memory_over_time(trace, memgraph)
    return _peaks(memory, (*_memgraph_gpus(memgraph), HOST))


def _peaks(memory: pd.DataFrame, devices: Iterable[str]) -> dict[str, int]:
    """The most bytes in use on each of ``devices`` (0 if none) and any other in ``memory``."""
    peaks = {d: 0 for d in devices}
    for device, peak in memory.groupby("device")["bytes"].max().items():
        peaks[str(device)] = max(int(peak), 0)
    return peaks
