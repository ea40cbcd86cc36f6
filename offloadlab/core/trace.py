"""Trace: one row per executed vertex, from the simulator or the executor (DESIGN.md, Trace).

A trace is a pandas DataFrame with the columns :data:`TRACE_COLUMNS`; times are seconds from
the start of the run.  ``input`` vertices are not executed and have no row; their tensors exist
from time 0.  Memory in use over time, per GPU and in host (pinned) RAM, is derived from a trace
and the MemGraph it ran (:func:`memory_over_time`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .devices import HOST, is_gpu, split_transfer

if TYPE_CHECKING:
    import pandas as pd

    from .memgraph import MemGraph, MemVertex

TRACE_COLUMNS = ["vertex", "kind", "device", "resource", "stream", "start", "end", "bytes",
                 "flops", "source", "run"]
SOURCES = ("sim", "measured")
_DTYPES = {"vertex": object, "kind": object, "device": object, "resource": object,
           "stream": "int64", "start": "float64", "end": "float64", "bytes": "int64",
           "flops": "float64", "source": object, "run": "int64"}


def make_trace(rows: Sequence[Mapping] | Mapping[str, Sequence]) -> pd.DataFrame:
    """A trace from a list of row dicts, or from a dict of equal-length columns.

    Raises ValueError if a column is missing or unknown, or a ``source`` is not "sim" or
    "measured".
    """
    import pandas as pd

    if isinstance(rows, Mapping):
        frame = pd.DataFrame(dict(rows))
    else:
        rows = list(rows)
        frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=TRACE_COLUMNS)
    missing = [c for c in TRACE_COLUMNS if c not in frame.columns]
    unknown = [c for c in frame.columns if c not in TRACE_COLUMNS]
    if missing or unknown:
        raise ValueError(f"trace rows: missing column(s) {missing}, unknown column(s) {unknown}; "
                         f"expected {TRACE_COLUMNS}")
    bad = set(frame["source"]) - set(SOURCES)
    if bad:
        raise ValueError(f"trace rows: source must be one of {SOURCES}, "
                         f"got {sorted(map(str, bad))}")
    return frame[TRACE_COLUMNS].astype(_DTYPES).reset_index(drop=True)


def run_trace(vertices: Sequence[MemVertex], resource: Sequence[str | None],
              stream: Sequence[int], start: Sequence[float], end: Sequence[float], source: str,
              run: int) -> pd.DataFrame:
    """The trace of one run of a MemGraph, from per-vertex lists (``vertices`` in planner order;
    a vertex whose ``resource`` is None, an input, gets no row)."""
    rows = [i for i, name in enumerate(resource) if name is not None]
    return make_trace({
        "vertex": [vertices[i].id for i in rows],
        "kind": [vertices[i].kind for i in rows],
        "device": [vertices[i].device for i in rows],
        "resource": [resource[i] for i in rows],
        "stream": [stream[i] for i in rows],
        "start": [start[i] for i in rows],
        "end": [end[i] for i in rows],
        "bytes": [vertices[i].bytes for i in rows],
        "flops": [vertices[i].flops for i in rows],
        "source": [source] * len(rows),
        "run": [run] * len(rows),
    })


# -- Chrome trace-event JSON ----------------------------------------------------------------
def to_chrome_trace(trace: pd.DataFrame) -> dict:
    """Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

    One complete (``"X"``) event per row, ``ts``/``dur`` in microseconds; one process lane per
    resource (prefixed with the run when the trace holds several), one thread per stream.
    """
    several_runs = trace["run"].nunique() > 1
    pids: dict[tuple[int, str], int] = {}
    events: list[dict] = []
    for row in trace.itertuples(index=False):
        lane = (int(row.run), str(row.resource))
        pid = pids.get(lane)
        if pid is None:
            pid = pids[lane] = len(pids) + 1
            name = f"run {lane[0]} {lane[1]}" if several_runs else lane[1]
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
        events.append({
            "name": str(row.vertex), "cat": str(row.kind), "ph": "X", "pid": pid,
            "tid": int(row.stream), "ts": float(row.start) * 1e6,
            "dur": (float(row.end) - float(row.start)) * 1e6,
            "args": {"device": str(row.device), "bytes": int(row.bytes), "flops": float(row.flops),
                     "source": str(row.source), "run": int(row.run)}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(trace: pd.DataFrame, path: str | Path) -> None:
    """Write :func:`to_chrome_trace` to ``path``."""
    from .checks import dumps
    Path(path).write_text(dumps(to_chrome_trace(trace), "the Chrome trace"))


# -- memory -------------------------------------------------------------------------------
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
    dropped unread), or to the end of the run (a graph output).  An offload's output occupies
    ``bytes`` on ``"host"`` from the offload's start to the end of the run.  Inputs start at time 0.
    Vertices missing from the trace (other than inputs) occupy nothing, and missing readers
    are ignored.  One row per device and time where its use changes, giving the use from then
    on; sorted by time, then device.  The trace must hold a single run.
    """
    import numpy as np
    import pandas as pd

    if trace["run"].nunique() > 1:
        raise ValueError("memory_over_time: the trace holds several runs; select one first")
    start = dict(zip(trace["vertex"], trace["start"].tolist()))
    end = dict(zip(trace["vertex"], trace["end"].tolist()))
    run_end = max(end.values(), default=0.0)
    succ = memgraph.succ
    times: list[float] = []
    devices: list[str] = []
    deltas: list[int] = []
    unread: dict[str, tuple[float, str, int]] = {}   # vertex -> (start, GPU, bytes)
    for v in memgraph:
        begin = start.get(v.id, 0.0 if v.kind == "input" else None)
        if begin is None:
            continue
        loc = v.loc
        if loc is not None:
            last = max([end[w] for w, kind in succ[v.id].items() if kind == "data" and w in end],
                       default=None)
            if last is None:      # unread: live until a later writer reuses its bytes
                unread[v.id] = (begin, loc.device, loc.size)
            else:
                times += (begin, last)
                devices += (loc.device, loc.device)
                deltas += (loc.size, -loc.size)
        if v.kind == "offload":
            times += (begin, run_end)
            devices += (HOST, HOST)
            deltas += (v.bytes, -v.bytes)
    overwritten = _overwritten(memgraph, start, set(unread)) if unread else {}
    for vid, (begin, device, size) in unread.items():
        times += (begin, overwritten.get(vid, run_end))
        devices += (device, device)
        deltas += (size, -size)
    changes = (pd.DataFrame({"device": devices, "time": np.asarray(times, dtype=float),
                             "bytes": np.asarray(deltas, dtype=np.int64)})
               .groupby(["device", "time"], sort=True)["bytes"].sum())
    changes = changes[changes != 0]
    used = changes.groupby(level="device").cumsum().reset_index()
    return used.sort_values(["time", "device"], kind="stable")[["time", "device", "bytes"]] \
               .reset_index(drop=True)


def _overwritten(memgraph: MemGraph, start: dict[str, float], unread: set[str]
                 ) -> dict[str, float]:
    """When the bytes of each ``unread`` vertex are first written again: one sweep over the
    writers in order of their start (ties in planner order), keeping per GPU the unread
    copies not yet overwritten (disjoint intervals, sorted by offset)."""
    import bisect

    writers = sorted((start.get(v.id, 0.0), v.order, v.id, v.loc) for v in memgraph
                     if v.loc is not None and (v.id in start or v.kind == "input"))
    pending: dict[str, list[tuple[int, int, str]]] = {}
    overwritten: dict[str, float] = {}
    for time, _, vid, loc in writers:
        alive = pending.setdefault(loc.device, [])
        i = max(bisect.bisect_right(alive, (loc.offset,)) - 1, 0)
        while i < len(alive) and alive[i][0] < loc.end:
            if alive[i][1] > loc.offset:
                overwritten[alive.pop(i)[2]] = time
            else:
                i += 1
        if vid in unread:
            bisect.insort(alive, (loc.offset, loc.end, vid))
    return overwritten


def memory_and_peaks(trace: pd.DataFrame, memgraph: MemGraph,
                     gpus: Sequence[str]) -> tuple[pd.DataFrame, dict[str, int]]:
    """:func:`memory_over_time` and :func:`peak_memory`, with a peak for each of ``gpus``
    (every GPU of the machine, 0 where unused)."""
    memory = memory_over_time(trace, memgraph)
    peaks = {gpu: 0 for gpu in gpus}
    peaks.update(peak_memory(trace, memgraph, memory))
    return memory, peaks


def peak_memory(trace: pd.DataFrame, memgraph: MemGraph,
                memory: pd.DataFrame | None = None) -> dict[str, int]:
    """Peak bytes in use per GPU of the MemGraph (0 if unused) and in ``"host"`` RAM.

    ``memory`` is :func:`memory_over_time`'s result if already computed.
    """
    if memory is None:
        memory = memory_over_time(trace, memgraph)
    peaks = {d: 0 for d in (*memgraph_gpus(memgraph), HOST)}
    for device, peak in memory.groupby("device")["bytes"].max().items():
        peaks[device] = max(int(peak), 0)
    return peaks


def busy_time(trace: pd.DataFrame) -> dict[str, float]:
    """Seconds each resource had at least one vertex running: the length of the union of its
    rows' ``[start, end)`` intervals (streams of one engine overlap).  One run only."""
    if trace["run"].nunique() > 1:
        raise ValueError("busy_time: the trace holds several runs; select one first")
    busy: dict[str, float] = {}
    for resource, rows in trace.groupby("resource", sort=True):
        total, reach = 0.0, -float("inf")
        for start, end in sorted(zip(rows["start"].tolist(), rows["end"].tolist())):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        busy[str(resource)] = total
    return busy
