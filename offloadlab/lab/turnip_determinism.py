"""TURNIP's determinism ablation (Sec. 8 (3), Figure 14) in simulation: the average speedup
of dynamic dispatch over TURNIP's fixed order (:func:`~offloadlab.lab.ablate.planned`: each
GPU's kernels in the order input into BuildMemGraph) for inference and training on the
paper's two servers, beside the paper's four cells.

Figure 14 gives one average speedup per experiment and server, "over all experiments":
4.02% (A100 inference), 6.45% (P100 inference), 13.4% (A100 training) and 14.5% (P100
training).  Inference is ``llama-prefill`` (the workload of Figs. 10-12), training
``llama-lora-train`` (Fig. 13's); each point is built with the server's GPUs as
:mod:`.turnip_grid` builds it, planned by ``buildmemgraph``, verified, and simulated under
``dynamic`` dispatch and in the fixed order, ``seeds`` runs each per noise level, paired by
seed.  A cell's speedup for a seed is the mean over its points; the cell reports the mean
over seeds and a 95% bootstrap interval over them.  The paper measured real GPUs, whose
durations vary by themselves; here they vary only by the seeded noise (each duration times a
lognormal factor of sigma ``noise``), so each cell is given at each noise level.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import PlanError
from .turnip_grid import MACHINES, Experiment, Point
from .turnip_lora import LORA
from .turnip_prefill import PREFILL

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Cell:
    """One cell of Figure 14: an experiment on a server and the paper's average speedup."""

    experiment: str     # "inference" or "training"
    machine: str        # "a100x8" or "p100x4"
    paper: float        # fixed / dynamic - 1, averaged over the paper's experiments


CELLS = (Cell("inference", "a100x8", 0.0402), Cell("inference", "p100x4", 0.0645),
         Cell("training", "a100x8", 0.134), Cell("training", "p100x4", 0.145))
EXPERIMENTS: dict[str, Experiment] = {"inference": PREFILL, "training": LORA}
PLANNER = "buildmemgraph"

#: The points of each experiment by default and with ``quick``; every point on both servers.
POINTS = {"inference": tuple(Point(model, s, m, b) for m in MACHINES
                             for model, s, b in (("7b", 1024, 1), ("7b", 4096, 1),
                                                 ("7b", 16384, 1), ("65b", 1024, 1),
                                                 ("7b", 1024, 8))),
          "training": tuple(Point("7b", s, m, b) for m in MACHINES
                            for s, b in ((1024, 1), (4096, 1), (1024, 2)))}
QUICK = {e: tuple(Point("7b", 1024, m) for m in MACHINES) for e in EXPERIMENTS}
NOISES = (0.0, 0.1)     # the noise levels by default
SEEDS = 10              # noisy runs per point, order and noise level by default

NOTE = ("the paper's cells (TURNIP Sec. 8 (3), Figure 14: 'Observed speedup due to "
        "nondeterministic ordering, compared to (partially) deterministic ordering', the "
        "average over all experiments): inference 4.02% (A100) and 6.45% (P100), training "
        "13.4% (A100) and 14.5% (P100)")

COLUMNS = ["scope", "experiment", "workload", "machine", "model", "seq", "batch", "planner",
           "fixed", "noise", "seeds", "points", "mean_speedup", "ci_low", "ci_high", "paper",
           "difference", "mean_makespan_dynamic", "mean_makespan_fixed", "status", "build_s",
           "plan_s", "verify_s", "simulate_s", "version"]


def _cell_of(experiment: str, point: Point) -> Cell:
    """The cell a point of ``experiment`` counts in (by its server's preset name)."""
    machine = point.machine.partition(":")[0]
    return next(c for c in CELLS if (c.experiment, c.machine) == (experiment, machine))


def _evaluate(experiment: str, point: Point, noises: Sequence[float], seeds: int,
              fixed: str = "planned") -> tuple[list[dict], dict[float, list[float]]]:
    """A row per noise level for one point (an ``OOM: why`` row if BuildMemGraph finds no
    plan), and each noise level's speedups, one per seed."""
    from .. import __version__
    from ..core.machine import machine_from_spec
    from ..core.verify import verify
    from ..core.workloads import build_workload
    from ..planner import plan
    from .ablate import mean_ci, pair, simulated, speedups
    machine = machine_from_spec(point.machine)
    cell = _cell_of(experiment, point)
    workload = f"{EXPERIMENTS[experiment].workload}:model={point.model},seq={point.seq}," \
               f"batch={point.batch},gpus={machine.gpus}"
    base = dict(scope="point", experiment=experiment, workload=workload,
                machine=point.machine, model=point.model, seq=point.seq, batch=point.batch,
                planner=PLANNER, fixed=fixed, seeds=seeds, points=1, paper=cell.paper,
                status="ok", version=__version__)
    start = time.perf_counter()
    graph = build_workload(workload)
    base["build_s"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
        mg = plan(graph, machine, PLANNER)
    except PlanError as exc:
        return [_blank(base, noise, f"OOM: {exc}", plan_s=time.perf_counter() - start)
                for noise in noises], {}
    base["plan_s"] = time.perf_counter() - start
    start = time.perf_counter()
    verify(mg, graph, machine)
    base["verify_s"] = time.perf_counter() - start
    runs = pair(mg, machine, fixed)
    rows: list[dict] = []
    found: dict[float, list[float]] = {}
    for noise in noises:
        start = time.perf_counter()
        a, b = simulated(runs, machine, noise, seeds)
        found[noise] = speedups(a, b)
        mean, low, high = mean_ci(found[noise])
        rows.append({**base, "noise": noise, "mean_speedup": mean, "ci_low": low,
                     "ci_high": high, "difference": mean - cell.paper,
                     "mean_makespan_dynamic": sum(a) / len(a),
                     "mean_makespan_fixed": sum(b) / len(b),
                     "simulate_s": time.perf_counter() - start})
    return rows, found


def _blank(base: dict, noise: float, status: str, **times: float) -> dict:
    """A row without a measurement: ``status`` says why."""
    row = {**base, "noise": noise, "status": status, **times}
    return {column: row.get(column, math.nan) for column in COLUMNS}


def run(points: Mapping[str, Sequence[Point]] | None = None, noises: Iterable[float] = NOISES,
        seeds: int = SEEDS, fixed: str = "planned", *, progress: bool = True) -> pd.DataFrame:
    """Each experiment's points, a row per point and noise level, then a row per cell of
    Figure 14 and noise level.

    A cell's row (``scope`` ``cell``; its ``workload`` lists the points', ``points`` counts
    those planned) holds the mean over seeds of the mean over its points, with a 95% bootstrap
    interval over seeds.  A cell with no point planned has an empty speedup and says so in
    ``status``.

    Parameters
    ----------
    points : mapping of str to sequence of Point, optional
        Experiment -> its points; :data:`POINTS` when None.
    noises : iterable of float
        The noise levels.
    seeds : int
        Seeds per noise level.
    fixed : str
        The fixed order: ``"planned"`` or ``"replay"``.
    progress : bool
        Print a line per point.

    Returns
    -------
    DataFrame
        The table.
    """
    import pandas as pd
    from tqdm import tqdm

    from .. import __version__
    from .ablate import check_fixed, check_seeds, mean_ci
    check_fixed(fixed)
    check_seeds(seeds)
    levels = list(dict.fromkeys(noises))
    todo = [(e, p) for e, ps in (POINTS if points is None else points).items() for p in ps]
    rows: list[dict] = []
    found: dict[tuple[Cell, float], list[list[float]]] = {}
    workloads: dict[Cell, list[str]] = {}
    for experiment, point in tqdm(todo, disable=not progress, unit="point", desc="points"):
        point_rows, speedups = _evaluate(experiment, point, levels, seeds, fixed)
        rows += point_rows
        cell = _cell_of(experiment, point)
        workloads.setdefault(cell, []).append(point_rows[0]["workload"])
        for noise, values in speedups.items():
            found.setdefault((cell, noise), []).append(values)
    for cell in CELLS:
        for noise in levels:
            per_point = found.get((cell, noise), [])
            base = dict(scope="cell", experiment=cell.experiment,
                        workload=";".join(workloads.get(cell, [])), machine=cell.machine,
                        planner=PLANNER, fixed=fixed, seeds=seeds, points=len(per_point),
                        paper=cell.paper, version=__version__)
            listed = len(workloads.get(cell, []))
            if not per_point:
                rows.append(_blank(base, noise, "no point planned" if listed else
                                   "no points"))
                continue
            by_seed = [sum(values) / len(values) for values in zip(*per_point)]
            mean, low, high = mean_ci(by_seed)
            status = "ok" if len(per_point) == listed else \
                f"{listed - len(per_point)} of {listed} points OOM"
            rows.append({**base, "noise": noise, "mean_speedup": mean, "ci_low": low,
                         "ci_high": high, "difference": mean - cell.paper, "status": status})
    table = pd.DataFrame(rows, columns=COLUMNS)
    for column in ("seq", "batch"):             # whole numbers, empty in a cell's rows
        table[column] = pd.Series([None if x != x else int(x) for x in table[column]],
                                  dtype=object)
    return table


def plot(table: pd.DataFrame, path) -> None:
    """Each cell's speedup at each noise level (bars with their intervals) beside the
    paper's (black).

    Parameters
    ----------
    table : DataFrame
        What :func:`run` returned.
    path : str or Path
        The image file.
    """
    from .plots import figure
    cells = table[table["scope"] == "cell"]
    noises = list(dict.fromkeys(cells["noise"]))
    fig = figure(figsize=(8, 4))
    ax = fig.subplots()
    width = 0.8 / (len(noises) + 1)
    for i, cell in enumerate(CELLS):
        ax.bar(i, 100 * cell.paper, width, color="black",
               label="the paper (Fig. 14)" if i == 0 else None)
    for k, noise in enumerate(noises):
        rows = cells[cells["noise"] == noise].set_index(["experiment", "machine"])
        at = [i + (k + 1) * width for i in range(len(CELLS))]
        mean = [100 * rows.loc[(c.experiment, c.machine), "mean_speedup"] for c in CELLS]
        low = [100 * rows.loc[(c.experiment, c.machine), "ci_low"] for c in CELLS]
        high = [100 * rows.loc[(c.experiment, c.machine), "ci_high"] for c in CELLS]
        ax.bar(at, mean, width, color=f"C{k}", label=f"simulated, noise {noise:g}",
               yerr=[[m - lo for m, lo in zip(mean, low)], [h - m for m, h in zip(mean, high)]],
               capsize=3)
    ax.set_xticks([i + len(noises) * width / 2 for i in range(len(CELLS))],
                  [f"{c.experiment}\n{c.machine}" for c in CELLS])
    ax.set_ylabel("dynamic over the fixed order (% faster)")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("TURNIP Figure 14 in simulation (buildmemgraph)", loc="left", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
