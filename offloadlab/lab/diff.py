"""Two MemGraphs of one TaskGraph side by side: what each moves that the other does not, and
where their simulated timelines part (``offloadlab diff``, issue 45).

A move is a load, reload or offload of a tensor (a TaskGraph vertex) to or from a GPU; two plans
are compared as multisets of ``(kind, tensor, device)``.  Their timelines part at the first
TaskGraph vertex, in order of its earlier start, whose start differs between the two runs; for
that vertex each side names what it waited for last (its predecessor that finished last).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.errors import SpecError

if TYPE_CHECKING:
    import pandas as pd

    from ..core.machine import Machine
    from ..core.memgraph import MemGraph

MOVES = ("load", "reload", "offload")
TASK_KINDS = ("input", "compute", "transfer")
TOLERANCE = 1e-9     # of the longer makespan: starts closer than this are the same


@dataclass(frozen=True)
class Move:
    """A load, reload or offload of ``tensor`` to or from ``device``, ``count`` times."""

    kind: str
    tensor: str
    device: str
    bytes: int
    count: int


@dataclass(frozen=True)
class Parting:
    """The first TaskGraph vertex that starts at different times in the two runs, and the
    predecessor each run waited for last (None: it waited for none)."""

    vertex: str
    start_a: float
    start_b: float
    waited_a: str | None
    waited_b: str | None


@dataclass
class Diff:
    """What :func:`diff` found: the moves only one plan makes, both makespans, where the
    timelines part (None if they never do)."""

    makespan_a: float
    makespan_b: float
    only_a: list[Move] = field(default_factory=list)
    only_b: list[Move] = field(default_factory=list)
    parting: Parting | None = None

    def moved_bytes(self, side: str) -> int:
        """Bytes of the moves only plan ``side`` (``"a"`` or ``"b"``) makes.

        Parameters
        ----------
        side : str
            ``"a"`` or ``"b"``.

        Returns
        -------
        int
            The bytes.
        """
        return sum(m.bytes * m.count for m in (self.only_a if side == "a" else self.only_b))


def moves(memgraph: MemGraph) -> Counter:
    """Each ``(kind, tensor, device, bytes)`` the plan moves, with how often.

    Parameters
    ----------
    memgraph : MemGraph
        One side of the diff.

    Returns
    -------
    Counter
        ``(kind, tensor, device, bytes)`` -> how often.
    """
    return Counter((v.kind, v.of or "", v.device, v.bytes) for v in memgraph if v.kind in MOVES)


def check_same_taskgraph(a: MemGraph, b: MemGraph, names: tuple[str, str]) -> None:
    """Refuse two MemGraphs planned from different TaskGraphs (by their recorded content hash,
    else by their TaskGraph vertices).

    Parameters
    ----------
    a, b : MemGraph
        The two plans.
    names : tuple of str
        Their names in the message (their files).

    Raises
    ------
    SpecError
        They were planned from different TaskGraphs.
    """
    ha, hb = a.graph.get("taskgraph_hash"), b.graph.get("taskgraph_hash")
    if ha and hb:
        if ha != hb:
            raise SpecError(f"{names[0]} and {names[1]} were planned from different TaskGraphs "
                            f"(content hashes {ha} and {hb})")
        return
    ta = {v.id for v in a if v.kind in TASK_KINDS}
    tb = {v.id for v in b if v.kind in TASK_KINDS}
    if ta != tb:
        only = sorted(ta ^ tb)
        raise SpecError(f"{names[0]} and {names[1]} do not hold the same TaskGraph: "
                        f"{len(only)} vertex(es) in one only, e.g. {only[0]!r}")


def diff(a: MemGraph, b: MemGraph, machine: Machine, policy: str = "dynamic",
         names: tuple[str, str] = ("A", "B")) -> Diff:
    """Compare two MemGraphs of one TaskGraph, both simulated on ``machine`` with ``policy``.

    Parameters
    ----------
    a, b : MemGraph
        Two plans of the same TaskGraph.
    machine : Machine
        The machine both are simulated on.
    policy : str
        The dispatch policy of both simulations.
    names : tuple of str
        How errors name the two plans.

    Returns
    -------
    Diff

    Raises
    ------
    SpecError
        The two plans hold different TaskGraphs.

    Examples
    --------
    >>> from offloadlab.core.machine import machine_from_spec
    >>> from offloadlab.core.workloads import build_workload
    >>> from offloadlab.planner import plan
    >>> graph = build_workload("training-chain")
    >>> machine = machine_from_spec("v100:gpu_memory=1.5GB")
    >>> d = diff(plan(graph, machine), plan(graph, machine, "levelwise"), machine)
    >>> round(d.makespan_a, 4), round(d.makespan_b, 4), d.parting.vertex
    (3.6667, 3.7667, 'F2@1')
    """
    from ..simulator import simulate

    check_same_taskgraph(a, b, names)
    ma, mb = moves(a), moves(b)
    ta, tb = simulate(a, machine, policy).trace, simulate(b, machine, policy).trace
    makespan_a = float(ta["end"].max()) if len(ta) else 0.0
    makespan_b = float(tb["end"].max()) if len(tb) else 0.0
    return Diff(makespan_a, makespan_b, _moves(ma - mb), _moves(mb - ma),
                _parting(a, b, ta, tb, max(makespan_a, makespan_b) * TOLERANCE))


def _moves(counts: Counter) -> list[Move]:
    return sorted((Move(kind, tensor, device, nbytes, n)
                   for (kind, tensor, device, nbytes), n in counts.items()),
                  key=lambda m: (-m.bytes * m.count, m.kind, m.tensor, m.device))


def _parting(a: MemGraph, b: MemGraph, ta: pd.DataFrame, tb: pd.DataFrame,
             tolerance: float) -> Parting | None:
    start_a = dict(zip(ta["vertex"], ta["start"]))
    start_b = dict(zip(tb["vertex"], tb["start"]))
    tasks = [v.id for v in a if v.kind in ("compute", "transfer")]
    parted = [t for t in tasks if abs(start_a[t] - start_b[t]) > tolerance]
    if not parted:
        return None
    first = min(parted, key=lambda t: (min(start_a[t], start_b[t]), t))
    return Parting(first, start_a[first], start_b[first], _waited(a, ta, first),
                   _waited(b, tb, first))


def _waited(memgraph: MemGraph, trace: pd.DataFrame, vertex: str) -> str | None:
    """The predecessor of ``vertex`` that finished last in ``trace`` (inputs finish at 0)."""
    end = dict(zip(trace["vertex"], trace["end"]))
    preds = list(memgraph.pred[vertex])
    return max(preds, key=lambda u: (end.get(u, 0.0), u)) if preds else None


def text(d: Diff, names: tuple[str, str]) -> str:
    """:func:`diff`'s findings as printed lines.

    Parameters
    ----------
    d : Diff
        What :func:`diff` found.
    names : tuple of str
        The two plans' names.

    Returns
    -------
    str
        The lines.
    """
    from ..core.util import fmt_bytes
    a, b = names
    lines = [f"makespan: {a} {d.makespan_a:.6g} s, {b} {d.makespan_b:.6g} s"]
    for side, only, name in (("a", d.only_a, a), ("b", d.only_b, b)):
        lines.append(f"moves only {name} makes: {sum(m.count for m in only)} "
                     f"({fmt_bytes(d.moved_bytes(side))})")
        for m in only[:10]:
            lines.append(f"  {m.kind} {m.tensor} {'to' if m.kind != 'offload' else 'from'} "
                         f"{m.device}: {fmt_bytes(m.bytes)}" + (f" x{m.count}" if m.count > 1
                                                                else ""))
        if len(only) > 10:
            lines.append(f"  ... and {len(only) - 10} more")
    p = d.parting
    if p is None:
        lines.append("the timelines never part: every TaskGraph vertex starts at the same time")
    else:
        lines.append(f"the timelines part at {min(p.start_a, p.start_b):.6g} s: {p.vertex!r} "
                     f"starts at {p.start_a:.6g} s in {a} (after {p.waited_a!r}) and at "
                     f"{p.start_b:.6g} s in {b} (after {p.waited_b!r})")
    return "\n".join(lines)
