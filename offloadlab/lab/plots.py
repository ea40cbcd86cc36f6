"""Plots of simulated or measured runs: Gantt charts of a Trace and memory in use over time.

Each function builds a :class:`matplotlib.figure.Figure` (no pyplot state, no backend chosen:
the same call works in a script, a server and a notebook, where the returned figure shows
inline), writes it to ``path`` if one is given, and returns it.  matplotlib is imported when a
plot is drawn, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.devices import lane_key

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: Bar colour per vertex kind; kinds not listed are drawn grey.
KIND_COLORS: dict[str, str] = {
    "compute": "#4c72b0",
    "transfer": "#8172b2",
    "load": "#55a868",
    "reload": "#dd8452",
    "offload": "#c44e52",
}
_OTHER = "#999999"


def figure(**options: Any) -> Figure:
    """A new Figure of its own, outside pyplot.

    Parameters
    ----------
    **options
        As for ``matplotlib.figure.Figure``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    from matplotlib.figure import Figure
    return Figure(**options)


def save(fig: Figure, path: str | Path | None) -> Figure:
    """Write ``fig`` to ``path`` unless ``path`` is None.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure.
    path : str or Path or None
        The file; its format from the suffix, PNG without one.

    Returns
    -------
    matplotlib.figure.Figure
        ``fig``.
    """
    if path is not None:
        path = Path(path)
        fig.savefig(path, dpi=120, bbox_inches="tight",
                    format=path.suffix.lstrip(".") or "png")
    return fig


def gantt(traces: Mapping[str, pd.DataFrame] | pd.DataFrame, path: str | Path | None = None,
          title: str = "Simulated schedule",
          memory: Mapping[str, pd.DataFrame] | None = None,
          capacity: float | None = None) -> Figure:
    """Draw one horizontal lane per resource with a bar per executed vertex, coloured by kind.

    Parameters
    ----------
    traces : pandas.DataFrame or mapping of str to pandas.DataFrame
        One trace, or label -> trace, drawn as subplots one above the other that share the
        time axis.
    path : str or Path, optional
        The image file to write (:func:`save`); None: not written.
    title : str
        The figure's title.
    memory : mapping of str to pandas.DataFrame, optional
        Label -> memory in use over time (as :func:`offloadlab.core.memory.memory_over_time`
        gives it): a panel under each schedule with each GPU's memory in use.
    capacity : float, optional
        The GPU's capacity in bytes, dashed in the memory panels.

    Returns
    -------
    matplotlib.figure.Figure
    """
    import pandas as pd
    from matplotlib.patches import Rectangle
    if isinstance(traces, pd.DataFrame):
        traces = {"": traces}
    memory = memory or {}
    lanes = {label: sorted(df["resource"].dropna().unique(), key=lane_key)
             for label, df in traces.items()}
    panels: list[tuple[str, str]] = []          # (label, "lanes" | "memory"), top to bottom
    heights: list[float] = []
    for label, names in lanes.items():
        panels.append((label, "lanes"))
        heights.append(max(len(names), 1))
        if label in memory:
            panels.append((label, "memory"))
            heights.append(2.5)
    fig = figure(figsize=(11, 1.0 + 0.45 * sum(heights) + 0.4 * len(traces)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})
    kinds_seen: set[str] = set()
    edge = 0.5 if max(len(df) for df in traces.values()) <= 500 else 0.0  # separate few bars
    for ax, (label, what) in zip(axes[:, 0], panels):
        if what == "memory":
            _memory_panel(ax, memory[label], capacity)
            continue
        df, names = traces[label], lanes[label]
        for y, resource in enumerate(names):
            rows = df[df["resource"] == resource]
            for kind, group in rows.groupby("kind", sort=False):
                kinds_seen.add(kind)
                spans = list(zip(group["start"], group["end"] - group["start"]))
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=KIND_COLORS.get(kind, _OTHER),
                               edgecolor="white", linewidth=edge)
        ax.set_yticks(range(len(names)), names)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
        if label and len(traces) > 1:
            ax.set_title(label, loc="left", fontsize=10)
    axes[-1, 0].set_xlabel("time (s)")
    order = [k for k in KIND_COLORS if k in kinds_seen] + sorted(kinds_seen - set(KIND_COLORS))
    handles = [Rectangle((0, 0), 1, 1, color=KIND_COLORS.get(k, _OTHER)) for k in order]
    fig.legend(handles, order, loc="upper right", ncols=max(len(order), 1), frameon=False)
    fig.suptitle(title, x=0.01, ha="left")
    return save(fig, path)


def _memory_panel(ax, memory: pd.DataFrame, capacity: float | None) -> None:
    """Each GPU's memory in use over time (steps), the capacity dashed."""
    rows = memory[memory["device"] != "host"]
    top = float(rows["bytes"].max()) if len(rows) else 0.0
    unit, scale = _byte_unit(max(top, capacity or 0.0))
    for device in sorted(rows["device"].unique(), key=lane_key):
        one = rows[rows["device"] == device].sort_values("time", kind="stable")
        ax.step(one["time"], one["bytes"] / scale, where="post", label=device)
    if capacity is not None:
        ax.axhline(capacity / scale, color="black", linestyle="--", linewidth=1,
                   label="capacity")
    ax.set_ylabel(f"in use ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)


def _byte_unit(peak: float) -> tuple[str, float]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak >= 4 * scale:
            return unit, scale
    return "B", 1


def memory_plot(memory: pd.DataFrame, path: str | Path | None = None,
                capacity: float | None = None, title: str = "Memory in use") -> Figure:
    """Step plot of memory in use over time, one line per GPU.

    Host (pinned) memory, if present, gets its own panel below.

    Parameters
    ----------
    memory : pandas.DataFrame
        Columns ``time, device, bytes``.
    path : str or Path, optional
        The image file to write (:func:`save`); None: not written.
    title : str
        The figure's title.
    capacity : float, optional
        The GPU's capacity in bytes, dashed.

    Returns
    -------
    matplotlib.figure.Figure
    """
    devices = sorted(memory["device"].unique(), key=lane_key)
    panels = [[d for d in devices if d != "host"], [d for d in devices if d == "host"]]
    panels = [p for p in panels if p] or [[]]
    fig = figure(figsize=(11, 1.0 + 2.8 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        rows = memory[memory["device"].isin(panel)]
        limit = capacity if capacity is not None and panel != ["host"] else None
        top = float(rows["bytes"].max()) if len(rows) else 0.0
        unit, scale = _byte_unit(max(top, limit or 0.0))
        for device in panel:
            one = rows[rows["device"] == device].sort_values("time", kind="stable")
            ax.step(one["time"], one["bytes"] / scale, where="post", label=device)
        if limit is not None:
            ax.axhline(limit / scale, color="black", linestyle="--", linewidth=1,
                       label="GPU capacity")
        ax.set_ylabel(f"memory ({unit})")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes[-1, 0].set_xlabel("time (s)")
    axes[0, 0].set_title(title, loc="left")
    return save(fig, path)


def compare_plot(table: pd.DataFrame, path: str | Path | None = None, title: str = ""
                 ) -> Figure:
    """``offloadlab compare``'s figure: a bar per planner with its simulated makespan.

    A tick at its plan's own lower bound, and the problem's lower bound dashed.  Planners
    that could not plan the problem are left out.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`~offloadlab.lab.compare.compare_planners`'s table.
    path : str or Path, optional
        The image file to write (:func:`save`); None: not written.
    title : str
        The figure's title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    ok = table[table["makespan"].notna()] if "makespan" in table else table.iloc[:0]
    fig = figure(figsize=(8, 1.2 + 0.45 * max(len(ok), 1)))
    ax = fig.subplots()
    y = range(len(ok))
    ax.barh(y, ok["makespan"], color=KIND_COLORS["compute"], label="makespan (simulated)")
    ax.scatter(ok["lower_bound"], y, marker="|", s=300, color="black",
               label="the plan's lower bound")
    if len(table) and table["problem_bound"].notna().any():
        ax.axvline(float(table["problem_bound"].iloc[0]), linestyle="--", color="grey",
                   label="the problem's lower bound")
    ax.set_yticks(list(y), list(ok["planner"]))
    ax.set_ylim(len(ok) - 0.5, -0.5)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, loc="left", fontsize=10)
    return save(fig, path)


def estimate_plot(found, path: str | Path | None = None, title: str = "") -> Figure:
    """``offloadlab estimate``'s figure: each planner's simulated makespan against GPU memory.

    Its smallest memory marked, and the problem's lower bound dashed.

    Parameters
    ----------
    found : Estimate
        :func:`~offloadlab.lab.estimate.estimate`'s result (its ``curve`` and ``smallest``).
    path : str or Path, optional
        The image file to write (:func:`save`); None: not written.
    title : str
        The figure's title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    for planner, rows in found.curve.groupby("planner", sort=False):
        ok = rows[rows["makespan"].notna()]
        line, = ax.plot(ok["gpu_memory"] / 2**30, ok["makespan"], marker="o", label=planner)
        smallest = found.smallest[found.smallest["planner"] == planner]
        if len(smallest) and smallest["makespan"].notna().all():
            ax.scatter(smallest["smallest_gpu_memory"] / 2**30, smallest["makespan"],
                       marker="x", s=80, color=line.get_color())
    ax.axhline(found.bound, linestyle="--", color="grey", label="lower bound")
    ax.set_xlabel("GPU memory (GiB; x: each planner's smallest)")
    ax.set_ylabel("makespan (s, simulated)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, loc="left", fontsize=10)
    return save(fig, path)


def ablation_plot(table: pd.DataFrame, path: str | Path | None = None, title: str = ""
                  ) -> Figure:
    """``offloadlab ablate determinism``'s figure: mean speedup of ``dynamic`` against noise.

    Each planner's mean speedup over the fixed order (percent) against the noise level, with
    95% confidence bars (a line per planner and fixed order where the table has several
    orders).

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`~offloadlab.lab.ablate.ablate_determinism`'s table.
    path : str or Path, optional
        The image file to write (:func:`save`); None: not written.
    title : str
        The figure's title.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    simulated = table[table["source"] == "sim"] if "source" in table else table
    orders = "fixed" in simulated and simulated["fixed"].nunique() > 1
    for key, rows in simulated.groupby(["planner", "fixed"] if orders else ["planner"],
                                       sort=False):
        mean = 100 * rows["mean_speedup"]
        err = [mean - 100 * rows["ci_low"], 100 * rows["ci_high"] - mean]
        label = f"{key[0]}, {key[1]} order" if orders else str(key[0])
        ax.errorbar(rows["noise"], mean, yerr=err, marker="o", capsize=3, label=label)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("noise (sigma of the lognormal factor on each duration)")
    ax.set_ylabel("dynamic over fixed (% faster)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, loc="left", fontsize=10)
    return save(fig, path)


def sweep_plot(table: pd.DataFrame, path: str | Path | None = None, title: str = "",
               x: str | None = None) -> Figure:
    """``offloadlab sweep``'s figure: makespan against a grid axis.

    A line per planner and policy (and per value of any other axis), the problem's lower
    bound dashed.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`~offloadlab.lab.sweep.sweep`'s table.
    path : str or Path, optional
        The image file to write (:func:`save`); None: not written.
    title : str
        The figure's title.
    x : str, optional
        The column along x (``offloadlab sweep`` passes its first grid axis); default, or
        a column the table lacks: ``planner``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    import pandas as pd
    fig = figure(figsize=(7, 4))
    ax = fig.subplots()
    ok = table[table["makespan"].notna()] if "makespan" in table else table.iloc[:0]
    if x is None or x not in ok:
        x = "planner"
    numeric = pd.to_numeric(ok[x], errors="coerce")
    xs = numeric if numeric.notna().all() else ok[x].astype(str)
    others = [c for c in ok.columns if c.startswith(("machine.", "workload.")) and c != x]
    def ordered(rows: pd.DataFrame) -> pd.Index:
        return xs[rows.index].sort_values().index if xs is numeric else rows.index

    for label, rows in ok.groupby(["planner", "policy", *others], sort=False):
        name = " ".join(str(v) for v in (label if isinstance(label, tuple) else (label,)))
        ax.plot(xs[ordered(rows)], rows.loc[ordered(rows), "makespan"], marker="o", label=name)
    bounds = ok.drop_duplicates([x, *others])
    for k, (_, rows) in enumerate(bounds.groupby(others, sort=False) if others
                                  else [(None, bounds)]):
        ax.plot(xs[ordered(rows)], rows.loc[ordered(rows), "problem_bound"], linestyle="--",
                color="grey", label="lower bound (any plan)" if k == 0 else None)
    ax.set_xlabel(x)
    ax.set_ylabel("makespan (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, loc="left", fontsize=10)
    return save(fig, path)
