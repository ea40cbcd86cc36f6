"""Plan and simulate one workload under several (planner, dispatch policy) pairs and tabulate
the outcome: the building block of the demo and of sweeps."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.devices import is_gpu
from ..core.machine import Machine
from ..core.memgraph import MemGraph
from ..core.taskgraph import TaskGraph

if TYPE_CHECKING:
    import pandas as pd

    from ..simulator import SimResult

#: Columns of :func:`table` / :func:`compare`, in order.
COLUMNS = ("planner", "policy", "makespan", "bytes_moved", "offloads", "reloads", "loads",
           "peak_gpu_memory")


@dataclass
class Run:
    """One planned and simulated combination."""

    planner: str
    policy: str
    memgraph: MemGraph
    result: SimResult

    def row(self) -> dict[str, object]:
        """This run as a row of :func:`table`.  ``bytes_moved`` counts host<->GPU traffic
        (offloads, reloads, loads); GPU->GPU transfers are TaskGraph vertices every plan has."""
        moved = self.memgraph.moved_bytes()
        gpu_peaks = [b for d, b in self.result.peak_memory.items() if is_gpu(d)]
        return {
            "planner": self.planner,
            "policy": self.policy,
            "makespan": float(self.result.makespan),
            "bytes_moved": int(moved["offload"] + moved["reload"] + moved["load"]),
            "offloads": self.memgraph.count("offload"),
            "reloads": self.memgraph.count("reload"),
            "loads": self.memgraph.count("load"),
            "peak_gpu_memory": int(max(gpu_peaks, default=0)),
        }


def run_all(graph: TaskGraph, machine: Machine, runs: Iterable[tuple[str, str]], *,
            noise: float = 0.0, seed: int = 0, verify: bool = True,
            progress: Callable[[str], None] | None = None) -> list[Run]:
    """Plan ``graph`` with each planner spec (once per spec), verify the MemGraph, and simulate
    it with each policy.  ``progress`` receives a line per step."""
    from ..core.verify import verify as verify_memgraph
    from ..planner import plan
    from ..simulator import makespan, simulate

    say = progress or (lambda line: None)
    plans: dict[str, MemGraph] = {}
    out: list[Run] = []
    for planner, policy in runs:
        if planner not in plans:
            say(f"planning with {planner} ...")
            plans[planner] = mg = plan(graph, machine, planner, evaluate=makespan)
            if verify:
                verify_memgraph(mg, graph, machine)
            say(f"  {len(mg)} vertices, {mg.count('offload')} offloads, "
                f"{mg.count('reload')} reloads, {mg.count('load')} loads")
        say(f"simulating {planner} with {policy} dispatch ...")
        result = simulate(plans[planner], machine, policy=policy, noise=noise, seed=seed)
        say(f"  makespan {result.makespan:.6g} s")
        out.append(Run(planner, policy, plans[planner], result))
    return out


def table(runs: Iterable[Run]) -> pd.DataFrame:
    """One row per run with the :data:`COLUMNS`."""
    import pandas as pd
    return pd.DataFrame([r.row() for r in runs], columns=list(COLUMNS))


def compare(graph: TaskGraph, machine: Machine, runs: Iterable[tuple[str, str]], *,
            noise: float = 0.0, seed: int = 0, verify: bool = True) -> pd.DataFrame:
    """Plan and simulate each ``(planner_spec, policy)`` pair; one row per pair
    (:data:`COLUMNS`)."""
    return table(run_all(graph, machine, runs, noise=noise, seed=seed, verify=verify))
