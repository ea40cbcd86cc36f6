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


def memgraph_gpus(memgraph: MemGraph) -> list[str]:
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
    are ignored.  One row per device and time where its use changes, giving the use from then
    on; sorted by time, then device.  The trace must hold a single run.
    """
    vertices, index, begin, end, run_end = _run_times(trace, memgraph)
    located, since, until = _gpu_lifetimes(memgraph, vertices, index, begin, end, run_end)
    locs: list[Loc] = [v.loc for v in located]                # type: ignore[misc]
    devices = [loc.device for loc in locs]
    size = np.array([loc.size for loc in locs], dtype=np.int64)
    held_from, held_until, held = host_lifetimes(vertices, memgraph.succ, index, begin.tolist(),
                                                 end.tolist(), run_end)
    changes = (pd.DataFrame({
        "device": devices * 2 + [HOST] * (2 * len(held)),
        "time": np.concatenate([since, until, held_from, held_until]),
        "bytes": np.concatenate([size, -size, held, -held])})
        .groupby(["device", "time"], sort=True)["bytes"].sum())
    changes = changes[changes != 0]
    used = changes.groupby(level="device").cumsum().reset_index()
    return used.sort_values(["time", "device"], kind="stable")[["time", "device", "bytes"]] \
               .reset_index(drop=True)


def gpu_lifetimes(trace: pd.DataFrame, memgraph: MemGraph
                  ) -> tuple[list[MemVertex], np.ndarray, np.ndarray]:
    """The vertices with a location that ran, and from when until when each holds its
    ``loc.size`` bytes (:func:`memory_over_time`'s rule): the vertices, their starts, their
    ends."""
    vertices, index, begin, end, run_end = _run_times(trace, memgraph)
    return _gpu_lifetimes(memgraph, vertices, index, begin, end, run_end)


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
    begin = np.where(np.isnan(start) & np.array([v.kind == "input" for v in vertices], bool),
                     0.0, start)
    return vertices, index, begin, end, run_end


def _gpu_lifetimes(memgraph: MemGraph, vertices: list[MemVertex], index: dict[str, int],
                   begin: np.ndarray, end: np.ndarray, run_end: float
                   ) -> tuple[list[MemVertex], np.ndarray, np.ndarray]:
    ran = (~np.isnan(begin)).tolist()
    located = [i for i, v in enumerate(vertices) if v.loc is not None and ran[i]]
    # the end of each located vertex's last data reader (-inf: none in the trace)
    succ = memgraph.succ
    sources: list[int] = []
    readers: list[int] = []
    for k, i in enumerate(located):
        for w, kind in succ[vertices[i].id].items():
            if kind == "data":
                sources.append(k)
                readers.append(index[w])
    until = np.full(len(located), -np.inf)
    read_end = end[np.array(readers, dtype=np.int64)]
    traced = ~np.isnan(read_end)
    np.maximum.at(until, np.array(sources, dtype=np.int64)[traced], read_end[traced])
    where = np.array(located, dtype=np.int64)
    locs: list[Loc] = [vertices[i].loc for i in located]   # type: ignore[misc]
    unread = until == -np.inf
    if unread.any():
        order = np.array([vertices[i].order for i in where.tolist()], dtype=np.int64)
        until[unread] = _overwritten(locs, begin[where], order, unread, run_end)
    return [vertices[i] for i in located], begin[where], until


def host_lifetimes(vertices: Sequence[MemVertex], succ: Mapping[str, Mapping[str, str]],
                   index: Mapping[str, int], start: Sequence[float], end: Sequence[float],
                   run_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """When a run holds each tensor in host RAM: ``(since, until, bytes)`` arrays, one entry
    per host input (from 0 to ``run_end``) and per offload or CPU op that ran (from its start
    until the end of its last data reader that ran, else its own end).  ``start``/``end``
    are by position in ``vertices`` (``index``: id -> position), NaN where a vertex did not
    run; ``succ`` is the MemGraph's."""
    since: list[float] = []
    until: list[float] = []
    size: list[int] = []
    for i, v in enumerate(vertices):
        if not in_host_ram(v):
            continue
        if v.kind == "input":
            since.append(0.0)
            until.append(run_end)
            size.append(v.bytes)
            continue
        began = start[i]
        if began != began:                      # NaN: it did not run
            continue
        last = end[i]
        for w, kind in succ[v.id].items():
            if kind == "data":
                t = end[index[w]]
                if t > last:                    # False for NaN: a reader that did not run
                    last = t
        since.append(began)
        until.append(last)
        size.append(v.bytes)
    return (np.array(since, dtype=float), np.array(until, dtype=float),
            np.array(size, dtype=np.int64))


def run_host_peak(since: np.ndarray, until: np.ndarray, size: np.ndarray) -> int:
    """The most bytes :func:`host_lifetimes`' tensors hold at once; one freed at the instant
    another is allocated makes room for it (the executor frees before it launches)."""
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
    """:func:`memory_over_time` and :func:`peak_memory`, with a peak for each of ``gpus``
    (every GPU of the machine, which includes those the MemGraph uses; 0 where unused)."""
    memory = memory_over_time(trace, memgraph)
    return memory, _peaks(memory, (*gpus, HOST))


def peak_memory(trace: pd.DataFrame, memgraph: MemGraph,
                memory: pd.DataFrame | None = None) -> dict[str, int]:
    """Peak bytes in use per GPU of the MemGraph (0 if unused) and in ``"host"`` RAM.

    ``memory`` is :func:`memory_over_time`'s result if already computed.
    """
    if memory is None:
        memory = memory_over_time(trace, memgraph)
    return _peaks(memory, (*memgraph_gpus(memgraph), HOST))


def _peaks(memory: pd.DataFrame, devices: Iterable[str]) -> dict[str, int]:
    """The most bytes in use on each of ``devices`` (0 if none) and any other in ``memory``."""
    peaks = {d: 0 for d in devices}
    for device, peak in memory.groupby("device")["bytes"].max().items():
        peaks[str(device)] = max(int(peak), 0)
    return peaks
