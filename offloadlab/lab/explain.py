"""Why a plan is fast or slow: each GPU's overlap of copies with compute, and its idle time
attributed to a cause, from any trace, simulated or measured (issue 45).

Per GPU: ``busy`` (a kernel runs), ``transfer`` and its ``hidden`` part (a host copy runs,
beside a kernel), and ``idle`` split into ``load``, ``memory``, ``dependency``, ``launch`` and
``done``; by construction ``busy`` + the five idle parts = the makespan.  Also GPU memory over
time split by tensor category (:data:`~offloadlab.core.taskgraph.CATEGORIES`).  What each
column and cause means: docs/explain.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.devices import is_gpu

if TYPE_CHECKING:
    import pandas as pd

    from ..core.memgraph import MemGraph
    from ..core.taskgraph import TaskGraph

CAUSES = ("load", "memory", "dependency", "launch", "done")
COPIES = ("load", "reload", "offload")
COLUMNS = ["gpu", "makespan", "busy", "transfer", "hidden", "overlap",
           *(f"idle_{c}" for c in CAUSES)]

Intervals = list[tuple[float, float]]
UNKNOWN = "unknown"
"""The category of bytes whose tensor's category is not known (no TaskGraph, or none set)."""


def union(intervals: Sequence[tuple[float, float]]) -> Intervals:
    """The disjoint, sorted intervals covering ``intervals`` (empty ones dropped).

    Parameters
    ----------
    intervals : sequence of (float, float)
        ``(start, end)`` pairs, in any order, overlapping or not.

    Returns
    -------
    Intervals
        The union.
    """
    merged: Intervals = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


def overlap(a: Intervals, b: Intervals) -> float:
    """The length of the intersection of two disjoint sorted interval lists.

    Parameters
    ----------
    a, b : Intervals
        The lists.

    Returns
    -------
    float
        The length.
    """
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if high > low:
            total += high - low
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def explain(trace: pd.DataFrame, memgraph: MemGraph) -> pd.DataFrame:
    """One row per GPU of ``trace`` (a run of ``memgraph``): :data:`COLUMNS`, in seconds
    (``overlap`` a share, NaN where the GPU copies nothing).

    Parameters
    ----------
    trace : pandas.DataFrame
        A simulated or measured trace (:data:`offloadlab.core.trace.TRACE_COLUMNS`).
    memgraph : MemGraph
        The MemGraph that ran: its edges name what each kernel waited for.

    Returns
    -------
    pandas.DataFrame
        A row per GPU that ran a kernel or a copy, sorted by GPU.

    Raises
    ------
    KeyError
        A trace vertex that is not in ``memgraph``.

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> from offloadlab.planner import plan
    >>> from offloadlab.simulator import simulate
    >>> machine = machine_from_spec("v100:gpu_memory=1.5GB")
    >>> memgraph = plan(build_workload("training-chain"), machine)
    >>> row = explain(simulate(memgraph, machine).trace, memgraph).iloc[0]
    >>> print(f"busy {row.busy:.4g} s, copies {row.transfer:.4g} s, {row.overlap:.0%} hidden, "
    ...       f"idle on loads {row.idle_load:.4g} s")
    busy 3.6 s, copies 0.8336 s, 92% hidden, idle on loads 0.06669 s
    """
    import pandas as pd

    end = dict(zip(trace["vertex"], trace["end"]))
    makespan = float(trace["end"].max()) if len(trace) else 0.0
    kernels: dict[str, list[tuple[float, float, str]]] = {}
    copies: dict[str, list[tuple[float, float]]] = {}
    for v, kind, device, s, e in zip(trace["vertex"], trace["kind"], trace["device"],
                                     trace["start"], trace["end"]):
        if not is_gpu(device):
            continue
        if kind == "compute":
            kernels.setdefault(device, []).append((s, e, v))
        elif kind in COPIES:
            copies.setdefault(device, []).append((s, e))
    rows = []
    for gpu in sorted(set(kernels) | set(copies), key=lambda g: int(g[3:])):
        runs = sorted(kernels.get(gpu, []))
        busy = union([(s, e) for s, e, _ in runs])
        moved = union(copies.get(gpu, []))
        idle = dict.fromkeys(CAUSES, 0.0)
        at = 0.0                                  # the end of the compute seen so far
        for s, e, v in runs:
            if s > at:
                _attribute(idle, at, s, v, memgraph, end)
            at = max(at, e)
        idle["done"] += max(makespan - at, 0.0)
        transfer, hidden = _length(moved), overlap(busy, moved)
        rows.append({"gpu": gpu, "makespan": makespan, "busy": _length(busy),
                     "transfer": transfer, "hidden": hidden,
                     "overlap": hidden / transfer if transfer > 0 else float("nan"),
                     **{f"idle_{c}": t for c, t in idle.items()}})
    return pd.DataFrame(rows, columns=COLUMNS)


def _attribute(idle: dict[str, float], gap_start: float, gap_end: float, vertex: str,
               memgraph: MemGraph, end: dict[str, float]) -> None:
    """Split the gap [gap_start, gap_end) before ``vertex`` started between what it waited
    for last and ``launch``."""
    last, cause = gap_start, "launch"
    for u, kind in memgraph.pred[vertex].items():
        finished = end.get(u, 0.0)               # an input exists from the start
        if finished > last:
            last, cause = finished, _cause(memgraph, u, kind)
    last = min(last, gap_end)
    idle[cause] += last - gap_start
    idle["launch"] += gap_end - last


def _cause(memgraph: MemGraph, u: str, edge: str) -> str:
    """What waiting for predecessor ``u`` (over an edge of kind ``edge``) is called."""
    if edge == "memory":
        return "memory"
    if memgraph[u].kind in ("load", "reload"):
        return "load"
    return "dependency"


def records(table: pd.DataFrame) -> list[dict]:
    """The rows of :func:`explain` as JSON-ready dicts (an undefined overlap is None).

    Parameters
    ----------
    table : DataFrame
        What :func:`explain` returned.

    Returns
    -------
    list of dict
        A dict per row.
    """
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
            for row in table.to_dict("records")]


def text(table: pd.DataFrame) -> str:
    """The rows of :func:`explain` as a printed table: seconds, and shares of the makespan.

    Parameters
    ----------
    table : DataFrame
        A table :func:`explain` made.

    Returns
    -------
    str
        Its lines, aligned.
    """
    lines = ["why, per GPU: busy, idle by cause, host copies and the share of them hidden "
             "under compute (seconds)"]
    shown = table.copy()
    shown["overlap"] = [f"{100 * x:.0f}%" if x == x else "-" for x in table["overlap"]]
    shown = shown.drop(columns="makespan").rename(
        columns={f"idle_{c}": c for c in CAUSES} | {"transfer": "copies"})
    lines.append(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return "\n".join(lines)


def memory_by_category(trace: pd.DataFrame, memgraph: MemGraph,
                       graph: TaskGraph | None = None) -> pd.DataFrame:
    """GPU memory in use over time per category: a step function, sorted by time.

    Parameters
    ----------
    trace : DataFrame
        The run's Trace.
    memgraph : MemGraph
        The plan it ran.
    graph : TaskGraph, optional
        What ``memgraph`` was planned from; without it every byte is :data:`UNKNOWN`.

    Returns
    -------
    DataFrame
        Columns ``time, device, category, bytes`` (the use from then on), one row per device,
        category and time where it changes.
    """
    import pandas as pd

    from ..core.memory import gpu_lifetimes
    located, since, until = gpu_lifetimes(trace, memgraph)
    tasks = graph.tasks if graph is not None else {}
    kinds = []
    for v in located:
        task = tasks.get(v.task or v.of or "")
        category = task.category if task is not None else None
        kinds.append(category if isinstance(category, str) else UNKNOWN)
    sizes = [v.loc.size for v in located if v.loc is not None]
    changes = (pd.DataFrame({
        "device": [v.loc.device for v in located if v.loc is not None] * 2,
        "category": kinds * 2, "time": [*since, *until], "bytes": [*sizes, *(-b for b in sizes)]})
        .groupby(["device", "category", "time"], sort=True)["bytes"].sum())
    changes = changes[changes != 0]
    used = changes.groupby(level=["device", "category"]).cumsum().reset_index()
    return used.sort_values(["time", "device", "category"], kind="stable")[
        ["time", "device", "category", "bytes"]].reset_index(drop=True)


def category_table(series: pd.DataFrame) -> pd.DataFrame:
    """Per GPU and category of :func:`memory_by_category`'s ``series``: its peak, and what it
    holds at the GPU's peak.

    Parameters
    ----------
    series : DataFrame
        What :func:`memory_by_category` returned.

    Returns
    -------
    DataFrame
        Per GPU and category, its ``peak``, the bytes it holds at the GPU's peak
        (``at_gpu_peak``, the first instant of the highest total) and their ``share`` of it.
    """
    import pandas as pd

    rows = []
    for device, one in series.groupby("device", sort=False):
        wide = one.pivot_table(index="time", columns="category", values="bytes",
                               aggfunc="last").sort_index().ffill().fillna(0)
        total = wide.sum(axis=1)
        at = total.idxmax()
        peak = float(total.loc[at])
        for category in wide.columns:
            held = float(wide.loc[at, category])
            rows.append({"gpu": device, "category": category,
                         "peak": int(wide[category].max()), "at_gpu_peak": int(held),
                         "share": held / peak if peak > 0 else float("nan")})
    table = pd.DataFrame(rows, columns=["gpu", "category", "peak", "at_gpu_peak", "share"])
    return table.sort_values(["gpu", "category"], key=_category_order, kind="stable") \
        .reset_index(drop=True)


def _category_order(column: pd.Series) -> pd.Series:
    """Sort key: GPUs by index, categories in :data:`CATEGORIES` order (unknown last)."""
    from ..core.taskgraph import CATEGORIES
    if column.name == "gpu":
        return column.map(lambda g: int(g[3:]))
    order = {c: i for i, c in enumerate((*CATEGORIES, UNKNOWN))}
    return column.map(order)


def category_text(table: pd.DataFrame) -> str:
    """:func:`category_table` printed: bytes, and the share of the GPU's peak.

    Parameters
    ----------
    table : DataFrame
        What :func:`category_table` returned.

    Returns
    -------
    str
        The table's lines.
    """
    from ..core.util import fmt_bytes
    lines = ["memory by category, per GPU: each category's peak, and what it holds at the "
             "GPU's peak (its share of it)"]
    shown = table.copy()
    for column in ("peak", "at_gpu_peak"):
        shown[column] = [fmt_bytes(int(x)) for x in table[column]]
    shown["share"] = [f"{100 * x:.0f}%" if x == x else "-" for x in table["share"]]
    lines.append(shown.to_string(index=False))
    return "\n".join(lines)
