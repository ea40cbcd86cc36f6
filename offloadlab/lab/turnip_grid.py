"""TURNIP's LLaMA experiments as grids in simulation (Sec. 8): the runner that the prefill
grid (:mod:`.turnip_prefill`, Figs. 10-12) and the LoRA training grid (:mod:`.turnip_lora`,
Fig. 13) share.

A point is a model, a sequence length, a batch and one of the paper's two servers (``p100x4``,
``a100x8``); each is planned by BuildMemGraph (TURNIP) and the level-wise baseline (DISCO),
verified and simulated, or ``OOM`` with its reason.  Rows give the stage seconds and the
paper's outcome where its text gives one.  docs/results/reproductions.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.errors import PlanError, SpecError
from ..core.host import host_overflow

if TYPE_CHECKING:
    import pandas as pd

MACHINES = ("p100x4", "a100x8")
PLANNERS = {"buildmemgraph": "TURNIP (buildmemgraph, dynamic)",
            "levelwise": "level-wise (DISCO)"}
STAGES = ("build_s", "plan_s", "verify_s", "simulate_s")


@dataclass(frozen=True)
class Point:
    """One model, sequence length, batch and server."""

    model: str
    seq: int
    machine: str
    batch: int = 1

    def __str__(self) -> str:
        batch = f"x{self.batch}" if self.batch != 1 else ""
        return f"{self.model}-{self.seq}{batch}@{self.machine}"


@dataclass(frozen=True)
class Experiment:
    """A grid of the paper's: its workload, the name of its simulated time's column, its
    default points, the paper's seconds where its text gives them and the points where its
    text says TURNIP ran out of memory."""

    name: str                   # the reproduction: "turnip-prefill"
    workload: str               # the builder: "llama-prefill"
    time: str                   # the column of the simulated seconds: "ttft"
    label: str                  # the plot's y axis
    grid: tuple[Point, ...]
    paper: Mapping[Point, float] = field(default_factory=dict)
    paper_oom: frozenset[Point] = frozenset()

    @property
    def columns(self) -> list[str]:
        return ["workload", "model", "seq", "batch", "machine", "planner", "policy", self.time,
                "status", "host_peak", "taskgraph", "memgraph", "offloads", "loads", *STAGES,
                "paper", "paper_outcome", "ratio", "version"]

    def paper_outcome(self, point: Point) -> str | None:
        """What the paper says of ``point``.

        Parameters
        ----------
        point : Point
            A point of the grid.

        Returns
        -------
        str or None
            ``"ok"`` where the paper gives the point's seconds, ``"OOM"`` where it says TURNIP ran
            out of memory, None where its text says nothing of the point.
        """
        if point in self.paper:
            return "ok"
        return "OOM" if point in self.paper_oom else None


def parse_points(experiment: Experiment, text: str) -> list[Point]:
    """``"7b-1024,65b-1024x8@a100x8"`` -> points (batch 1 unless ``xB``); without ``@MACHINE``, on
    both servers.

    Parameters
    ----------
    experiment : Experiment
        Whose models and servers.
    text : str
        The points, separated by commas.

    Returns
    -------
    list of Point
        The points.

    Raises
    ------
    SpecError
        A malformed point, or an unknown model or server; a point whose model cannot be cut over
        the server's GPUs is the builder's one error.
    """
    from ..core.machine import machine_from_spec
    from ..core.workloads.llama import CONFIGS, DEFAULT_BLOCK, check_options
    points = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        head, _, machine = item.partition("@")
        model, _, size = head.partition("-")
        seq, x, batch = size.partition("x")
        if model not in CONFIGS or not seq.isdigit() or int(seq) <= 0 or \
                (x and not (batch.isdigit() and int(batch) > 0)) or \
                (machine and machine not in MACHINES):
            raise SpecError(f"bad point {item!r}: expected MODEL-SEQ[xBATCH][@MACHINE], e.g. "
                            f"7b-1024 or 65b-1024x8@a100x8 (models {', '.join(CONFIGS)}; "
                            f"machines {', '.join(MACHINES)})")
        for m in [machine] if machine else MACHINES:
            point = Point(model, int(seq), m, int(batch or 1))
            check_options(experiment.workload, model, point.seq, point.batch,
                          machine_from_spec(m).gpus, DEFAULT_BLOCK, "")
            points.append(point)
    return points


def evaluate(experiment: Experiment, point: Point,
             planners: Iterable[str] = PLANNERS) -> list[dict]:
    """A row per planner: the simulated seconds, the host peak, graph sizes, the seconds of each
    stage and the paper's outcome.

    The seconds are NaN and the status ``OOM: why`` if there is no plan, or if the run's host
    peak exceeds the machine's ``host_memory``.

    Parameters
    ----------
    experiment : Experiment
        The experiment.
    point : Point
        Its point.
    planners : iterable of str
        The planner specs.

    Returns
    -------
    list of dict
        The rows.
    """
    from .. import __version__
    from ..core.machine import machine_from_spec
    from ..core.verify import verify
    from ..core.workloads import build_workload
    from ..planner import plan
    from ..simulator import makespan_and_host_peak
    machine = machine_from_spec(point.machine)
    start = time.perf_counter()
    workload = f"{experiment.workload}:model={point.model},seq={point.seq}," \
               f"batch={point.batch},gpus={machine.gpus}"
    graph = build_workload(workload)
    built = time.perf_counter() - start
    rows = []
    for planner in planners:
        row: dict = dict(workload=workload, model=point.model, seq=point.seq,
                         batch=point.batch, machine=point.machine, planner=planner,
                         policy="dynamic", status="ok", host_peak=None,
                         taskgraph=len(graph), memgraph=0, offloads=0, loads=0,
                         paper=experiment.paper.get(point, math.nan),
                         paper_outcome=experiment.paper_outcome(point), ratio=math.nan,
                         version=__version__)
        row.update({experiment.time: math.nan, **dict.fromkeys(STAGES, math.nan)},
                   build_s=built)
        start = time.perf_counter()
        try:
            mg = plan(graph, machine, planner)
        except PlanError as exc:
            row.update(status=f"OOM: {exc}", plan_s=time.perf_counter() - start)
            rows.append(row)
            continue
        row.update(plan_s=time.perf_counter() - start, memgraph=len(mg),
                   offloads=mg.count("offload"), loads=mg.count("load"))
        start = time.perf_counter()
        verify(mg, graph, machine)
        row.update(verify_s=time.perf_counter() - start)
        start = time.perf_counter()
        span, host_peak = makespan_and_host_peak(mg, machine)
        row.update(host_peak=host_peak, simulate_s=time.perf_counter() - start)
        over = host_overflow(host_peak, machine.host_memory)
        if over is None:
            row.update({experiment.time: span}, ratio=span / row["paper"])
        else:
            row.update(status=f"OOM: the simulated run is {over}")
        rows.append(row)
        del mg
    return rows


def run(experiment: Experiment, points: Iterable[Point] | None = None, *,
        progress: bool = True) -> pd.DataFrame:
    """The grid (``experiment.grid`` unless ``points``): a row per point and planner.

    Parameters
    ----------
    experiment : Experiment
        The experiment.
    points : iterable of Point, optional
        The points; ``experiment.grid`` when None.
    progress : bool
        Print a line as each point is done.

    Returns
    -------
    DataFrame
        A row per point and planner.
    """
    import pandas as pd
    from tqdm import tqdm
    rows: list[dict] = []
    todo = list(experiment.grid if points is None else points)
    for point in tqdm(todo, disable=not progress, unit="point", desc="points"):
        rows += evaluate(experiment, point)
    table = pd.DataFrame(rows, columns=experiment.columns)
    table["host_peak"] = table["host_peak"].astype("Int64")     # missing where no plan
    return table


def plot(experiment: Experiment, table: pd.DataFrame, path) -> None:
    """Simulated seconds against sequence length, a panel per server with its legend below, a
    line per model, batch and planner; OOM points as crosses on the panel's top edge, the
    paper's seconds as stars and its OOM points as black crosses above them.

    Parameters
    ----------
    experiment : Experiment
        The experiment.
    table : DataFrame
        What :func:`run` returned.
    path : str or Path
        The image file.
    """
    from .plots import figure
    machines = list(dict.fromkeys(table["machine"]))
    fig = figure(figsize=(6.5 * len(machines), 6))
    axes = fig.subplots(1, len(machines), squeeze=False)
    for ax, machine in zip(axes[0], machines):
        rows = table[table["machine"] == machine]
        top = rows[experiment.time].max() if rows[experiment.time].notna().any() else 1.0
        runs = list(dict.fromkeys(zip(rows["model"], rows["batch"])))
        for (model, batch, planner), group in rows.groupby(["model", "batch", "planner"],
                                                            sort=False):
            colour = f"C{runs.index((model, batch)) % 10}"
            style = "-o" if planner == "buildmemgraph" else "--s"
            name = model if set(table["batch"]) == {1} else f"{model} batch {batch}"
            ax.plot(group["seq"], group[experiment.time], style, color=colour, markersize=4,
                    label=f"{name}, {PLANNERS.get(planner, planner)}")
            oom = group[group[experiment.time].isna()]
            ax.plot(oom["seq"], [top * 1.5] * len(oom), "x", color=colour, markersize=8)
        paper = rows[rows["paper"].notna()].drop_duplicates(["model", "seq", "batch"])
        if len(paper):
            ax.plot(paper["seq"], paper["paper"], "*", color="black", markersize=10,
                    label="the paper's TURNIP")
        failed = rows[rows["paper_outcome"] == "OOM"].drop_duplicates(["model", "seq", "batch"])
        if len(failed):
            ax.plot(failed["seq"], [top * 2.2] * len(failed), "X", color="black", markersize=8,
                    label="the paper's TURNIP: OOM")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (tokens)")
        ax.set_title(f"{experiment.name} on {machine} (simulated; x: OOM)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    axes[0][0].set_ylabel(experiment.label)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
