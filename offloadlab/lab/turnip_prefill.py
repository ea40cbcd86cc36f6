"""TURNIP's prefill grid in simulation (Sec. 8, Figs. 10-12): time to first token of LLaMA-7B
and 65B against the prompt's length, 1K-32K tokens, one sequence, on the paper's two servers
(``p100x4``: 4x P100 16 GB; ``a100x8``: 8x A100 40 GB), for BuildMemGraph with dynamic
dispatch (TURNIP) and for the level-wise baseline (DISCO).

Each point builds ``llama-prefill:model=M,seq=S,gpus=G`` (G the server's GPUs, the default
block), plans it, verifies the MemGraph and simulates it (``dynamic``); a planner that finds no
plan marks the point ``OOM`` with its reason.  The paper shows its prefill times only as bar
charts (Figs. 10-12; its text gives no value), so there is no number of the paper's to print
beside ours: :data:`PAPER` is empty, and the table says so.  The machine presets price every
kernel at their fp32 rate (19.5 TFLOP/s for the A100, 9.3 for the P100), not the fp16 tensor
cores the paper's kernels could use, so our times are an upper bound in that respect.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import PlanError, SpecError
from ..core.workloads.llama import CONFIGS

if TYPE_CHECKING:
    import pandas as pd

MODELS = ("7b", "65b")
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
MACHINES = ("p100x4", "a100x8")
PLANNERS = {"buildmemgraph": "TURNIP (buildmemgraph, dynamic)",
            "levelwise": "level-wise (DISCO)"}
PAPER: dict[tuple[str, int, str], float] = {}
"""The paper's prefill seconds by (model, seq, machine): none, as its Figs. 10-12 are bar
charts without values in the text."""
COLUMNS = ["model", "seq", "machine", "planner", "ttft", "status", "taskgraph", "memgraph",
           "offloads", "loads", "build_s", "plan_s", "simulate_s", "paper"]


@dataclass(frozen=True)
class Point:
    """One model, prompt length and server."""

    model: str
    seq: int
    machine: str

    def __str__(self) -> str:
        return f"{self.model}-{self.seq}@{self.machine}"


GRID = tuple(Point(m, s, machine) for machine in MACHINES for m in MODELS for s in SEQS)


def parse_points(text: str) -> list[Point]:
    """``"7b-1024,65b-32768@a100x8"`` -> points; without ``@MACHINE``, on both servers."""
    points = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        head, _, machine = item.partition("@")
        model, _, seq = head.partition("-")
        if model not in CONFIGS or not seq.isdigit() or int(seq) <= 0 or \
                (machine and machine not in MACHINES):
            raise SpecError(f"bad point {item!r}: expected MODEL-SEQ[@MACHINE], e.g. 7b-1024 or "
                            f"65b-32768@a100x8 (models {', '.join(CONFIGS)}; machines "
                            f"{', '.join(MACHINES)})")
        points += [Point(model, int(seq), m) for m in ([machine] if machine else MACHINES)]
    return points


def evaluate(point: Point, planners: Iterable[str] = PLANNERS) -> list[dict]:
    """A row per planner: the simulated time to first token (NaN and ``OOM: why`` if there
    is no plan), graph sizes and seconds spent."""
    from ..core.machine import machine_from_spec
    from ..core.verify import verify
    from ..core.workloads import llama_prefill
    from ..planner import plan
    from ..simulator import makespan
    machine = machine_from_spec(point.machine)
    start = time.perf_counter()
    graph = llama_prefill(model=point.model, seq=point.seq, gpus=machine.gpus)
    built = time.perf_counter() - start
    rows = []
    for planner in planners:
        row: dict = dict(model=point.model, seq=point.seq, machine=point.machine,
                         planner=planner, ttft=math.nan, status="ok", taskgraph=len(graph),
                         memgraph=0, offloads=0, loads=0, build_s=built, plan_s=math.nan,
                         simulate_s=math.nan,
                         paper=PAPER.get((point.model, point.seq, point.machine), math.nan))
        start = time.perf_counter()
        try:
            mg = plan(graph, machine, planner)
        except PlanError as exc:
            row.update(status=f"OOM: {exc}", plan_s=time.perf_counter() - start)
            rows.append(row)
            continue
        verify(mg, graph, machine)
        row.update(plan_s=time.perf_counter() - start, memgraph=len(mg),
                   offloads=mg.count("offload"), loads=mg.count("load"))
        start = time.perf_counter()
        row.update(ttft=makespan(mg, machine), simulate_s=time.perf_counter() - start)
        rows.append(row)
        del mg
    return rows


def turnip_prefill(points: Iterable[Point] = GRID, *, progress: bool = True) -> pd.DataFrame:
    """The grid: a row per point and planner."""
    import pandas as pd
    from tqdm import tqdm
    rows: list[dict] = []
    for point in tqdm(list(points), disable=not progress, unit="point", desc="points"):
        rows += evaluate(point)
    return pd.DataFrame(rows, columns=COLUMNS)


def plot(table: pd.DataFrame, path) -> None:
    """Time to first token against prompt length, a panel per server, a line per model and
    planner; OOM points as crosses on the panel's top edge."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    machines = list(dict.fromkeys(table["machine"]))
    fig, axes = plt.subplots(1, len(machines), figsize=(6 * len(machines), 4), squeeze=False)
    for ax, machine in zip(axes[0], machines):
        rows = table[table["machine"] == machine]
        top = rows["ttft"].max() if rows["ttft"].notna().any() else 1.0
        for k, ((model, planner), group) in enumerate(rows.groupby(["model", "planner"],
                                                                   sort=False)):
            style = "-o" if planner == "buildmemgraph" else "--s"
            ax.plot(group["seq"], group["ttft"], style, color=f"C{k}", markersize=4,
                    label=f"{model}, {PLANNERS.get(planner, planner)}")
            oom = group[group["ttft"].isna()]
            ax.plot(oom["seq"], [top * 1.5] * len(oom), "x", color=f"C{k}", markersize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt length (tokens)")
        ax.set_title(f"LLaMA prefill on {machine} (simulated; x: OOM)", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("time to first token (s)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
