"""Trace: one row per executed vertex, from the simulator or the executor (docs/design.md, Trace).

A trace is a pandas DataFrame with the columns :data:`TRACE_COLUMNS`; times are seconds from
the start of the run.  ``input`` vertices are not executed and have no row; their tensors exist
from time 0.  Memory in use over time, per GPU and in host (pinned) RAM, is derived from a trace
and the MemGraph it ran (:func:`offloadlab.core.memory.memory_over_time`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .devices import lane_key

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from .memgraph import MemVertex

TRACE_COLUMNS = ["vertex", "kind", "device", "resource", "stream", "start", "end", "bytes",
                 "flops", "source", "run"]
SOURCES = ("sim", "measured")
_DTYPES = {"vertex": object, "kind": object, "device": object, "resource": object,
           "stream": "int64", "start": "float64", "end": "float64", "bytes": "int64",
           "flops": "float64", "source": object, "run": "int64"}


def make_trace(rows: Sequence[Mapping] | Mapping[str, Sequence | np.ndarray]) -> pd.DataFrame:
    """A trace from a list of row dicts, or from a dict of equal-length columns.

    Parameters
    ----------
    rows : sequence of mapping, or mapping of str to sequence or array
        The rows, or the columns (lists or arrays).

    Returns
    -------
    pandas.DataFrame
        The trace's columns, in order.

    Raises
    ------
    ValueError
        A column is missing or unknown, columns differ in length, or a ``source`` is not
        "sim" or "measured".
    """
    import pandas as pd

    if isinstance(rows, Mapping):   # typed columns: pandas would infer strings, then convert
        if len({len(v) for v in rows.values()}) > 1:
            raise ValueError(f"trace columns: lengths differ: "
                             f"{ {c: len(v) for c, v in rows.items()} }")
        frame = pd.DataFrame({c: pd.Series(v, dtype=_DTYPES.get(c)) for c, v in rows.items()})
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
    """The trace of one run of a MemGraph, from per-vertex lists.

    Parameters
    ----------
    vertices : sequence of MemVertex
        The MemGraph's vertices, in planner order.
    resource : sequence of str or None
        The resource each ran on; a vertex whose resource is None (an input) gets no row.
    stream : sequence of int
        The stream slot each ran in.
    start, end : sequence of float
        When each started and ended, in seconds.
    source : str
        ``"sim"`` or ``"measured"``.
    run : int
        The run's number.

    Returns
    -------
    pandas.DataFrame
        One row per vertex that ran, in planner order.
    """
    import numpy as np

    rows = [i for i, name in enumerate(resource) if name is not None]
    ran = [vertices[i] for i in rows]
    taken = np.array(rows, dtype=np.int64)
    return make_trace({
        "vertex": [v.id for v in ran],
        "kind": [v.kind for v in ran],
        "device": [v.device for v in ran],
        "resource": [resource[i] for i in rows],
        "stream": np.asarray(stream, dtype=np.int64)[taken],
        "start": np.asarray(start, dtype=float)[taken],
        "end": np.asarray(end, dtype=float)[taken],
        "bytes": [v.bytes for v in ran],
        "flops": [v.flops for v in ran],
        "source": [source] * len(rows),
        "run": [run] * len(rows),
    })


# -- Chrome trace-event JSON ----------------------------------------------------------------
def to_chrome_trace(trace: pd.DataFrame, memory: pd.DataFrame | None = None,
                    edges: Iterable[tuple[str, str]] = ()) -> dict:
    """Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

    One process per resource (prefixed with the run when the trace holds several), named and
    sorted as the Gantt chart sorts its lanes (:func:`~offloadlab.core.devices.lane_key`);
    one thread per stream of a GPU's engine (a link direction or a CPU has one), named
    ``stream k``, so that the slices of a thread never overlap; one complete (``"X"``) event
    per row, ``ts``/``dur`` in microseconds.  Every number is finite (strict JSON).

    Parameters
    ----------
    trace : pandas.DataFrame
        The trace.
    memory : pandas.DataFrame, optional
        Memory in use over time (as :func:`memory_over_time` gives it): adds a counter track
        ``memory in use`` to each GPU's process and a ``host`` process for pinned host memory.
    edges : iterable of (str, str)
        ``(source, target)`` vertex ids (e.g. a MemGraph's data edges): a flow arrow from each
        source's slice to its target's where they lie on different threads.

    Returns
    -------
    dict
        The trace-event document.
    """
    several_runs = trace["run"].nunique() > 1
    lanes = sorted({(int(r), str(s)) for r, s in zip(trace["run"], trace["resource"])},
                   key=lambda lane: (lane[0], lane_key(lane[1])))
    pids = {lane: i + 1 for i, lane in enumerate(lanes)}
    events: list[dict] = []

    def process(pid: int, name: str) -> None:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})

    for (run, resource), pid in pids.items():
        process(pid, f"run {run} {resource}" if several_runs else resource)
        rows = trace[(trace["run"] == run) & (trace["resource"] == resource)]
        for stream in sorted(set(rows["stream"].astype(int))):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": stream,
                           "args": {"name": f"stream {stream}"}})
    where: dict[str, tuple[int, int, float, float]] = {}   # vertex -> pid, tid, start, end
    for row in trace.itertuples(index=False):
        pid, tid = pids[int(row.run), str(row.resource)], int(row.stream)
        start, end = float(row.start) * 1e6, float(row.end) * 1e6
        where[str(row.vertex)] = (pid, tid, start, end)
        events.append({
            "name": str(row.vertex), "cat": str(row.kind), "ph": "X", "pid": pid, "tid": tid,
            "ts": start, "dur": end - start,
            "args": {"device": str(row.device), "bytes": int(row.bytes), "flops": float(row.flops),
                     "source": str(row.source), "run": int(row.run)}})
    if memory is not None and len(memory):
        run = int(trace["run"].iloc[0]) if len(trace) else 0
        for device, rows in memory.groupby("device", sort=False):
            pid = pids.get((run, str(device)), 0)
            if not pid:                          # host RAM, or a GPU that ran nothing
                pid = pids[run, str(device)] = len(pids) + 1
                process(pid, str(device))
            for t, nbytes in zip(rows["time"], rows["bytes"]):
                events.append({"ph": "C", "name": "memory in use", "pid": pid, "tid": 0,
                               "ts": float(t) * 1e6, "args": {"bytes": int(nbytes)}})
    for n, (u, v) in enumerate(edges):
        if u in where and v in where and where[u][:2] != where[v][:2]:
            (pu, tu, _, end), (pv, tv, start, _) = where[u], where[v]
            events.append({"ph": "s", "id": n, "name": "data", "cat": "data", "pid": pu,
                           "tid": tu, "ts": end})
            events.append({"ph": "f", "bp": "e", "id": n, "name": "data", "cat": "data",
                           "pid": pv, "tid": tv, "ts": start})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(trace: pd.DataFrame, path: str | Path,
                       memory: pd.DataFrame | None = None,
                       edges: Iterable[tuple[str, str]] = ()) -> None:
    """Write :func:`to_chrome_trace` to ``path``.

    Parameters
    ----------
    trace : pandas.DataFrame
        The trace.
    path : str or Path
        The JSON file to write.
    memory : pandas.DataFrame, optional
        Memory in use over time, as for :func:`to_chrome_trace`.
    edges : iterable of (str, str)
        Flow arrows, as for :func:`to_chrome_trace`.
    """
    from .checks import dumps
    Path(path).write_text(dumps(to_chrome_trace(trace, memory, edges), "the Chrome trace"))


def busy_time(trace: pd.DataFrame) -> dict[str, float]:
    """Seconds each resource had at least one vertex running.

    The length of the union of its rows' ``[start, end)`` intervals (streams of one engine
    overlap).

    Parameters
    ----------
    trace : pandas.DataFrame
        The trace of one run.

    Returns
    -------
    dict of str to float
        Seconds per resource.

    Raises
    ------
    ValueError
        The trace holds several runs.
    """
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
