"""The TaskGraph and the MemGraph by number, as BuildMemGraph works on them (:class:`Numbered`,
:class:`Emitted`): what it keeps per vertex is a list indexed by the vertex's number, so that
its hot loop looks nothing up by id in the graphs' dicts of hundreds of thousands of entries."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.memgraph import MemGraph, MemVertex
from ..core.taskgraph import Task, TaskGraph


@dataclass(slots=True, eq=False)
class Numbered:
    """A TaskGraph as the planner reads it: vertices numbered in insertion order, devices
    numbered in ``gpus`` order with ``len(gpus)`` for host RAM and the CPU (and any GPU not
    in ``gpus``), and each field a list by vertex number (:func:`number`)."""

    ids: list[str]
    index: dict[str, int]
    tasks: list[Task]
    gpus: list[str]
    is_input: list[bool]
    bytes: list[int]
    out: list[int]                  # where the output lives (:attr:`Task.out_device`)
    read: list[int]                 # where it reads its inputs (:attr:`Task.read_device`)
    inputs: list[tuple[int, ...]]   # in argument order


def number(graph: TaskGraph, gpus: list[str]) -> Numbered:
    """``graph`` numbered for planning on ``gpus`` (:class:`Numbered`)."""
    ids, tasks = list(graph.tasks), list(graph.tasks.values())
    index = {t: i for i, t in enumerate(ids)}
    host = len(gpus)
    gpu = {d: k for k, d in enumerate(gpus)}
    where: dict[str, tuple[int, int]] = {}   # device -> (out, read), once per device
    is_input, nbytes, out, read = [], [], [], []
    inputs: list[tuple[int, ...]] = []
    for task in tasks:
        pair = where.get(task.device)
        if pair is None:
            pair = where[task.device] = (gpu.get(task.out_device, host),
                                         gpu.get(task.read_device, host))
        is_input.append(task.kind == "input")
        nbytes.append(task.bytes)
        out.append(pair[0])
        read.append(pair[1])
        inputs.append(tuple([index[u] for u in task.inputs]))
    return Numbered(ids, index, tasks, gpus, is_input, nbytes, out, read, inputs)


class Emitted:
    """The MemGraph a planner builds, its vertices numbered as they are added: ``ids``,
    ``vertices`` and their edge dicts (the MemGraph's own ``succ`` and ``pred`` entries) by
    number, so that adding an edge looks up no id (:meth:`link`)."""

    def __init__(self, mg: MemGraph):
        self.mg = mg
        self.ids: list[str] = []
        self.vertices: list[MemVertex] = []
        self.succ: list[dict[str, str]] = []
        self.pred: list[dict[str, str]] = []

    def add(self, v: MemVertex) -> int:
        """Add ``v`` to the MemGraph (:meth:`MemGraph.add_vertex`); return its number.

        Parameters
        ----------
        v : MemVertex

        Returns
        -------
        int
        """
        mg = self.mg
        mg.add_vertex(v)
        self.ids.append(v.id)
        self.vertices.append(v)
        self.succ.append(mg.succ[v.id])
        self.pred.append(mg.pred[v.id])
        return len(self.ids) - 1

    def link(self, sources: list[int], v: int, kind: str) -> None:
        """:meth:`MemGraph.add_edges` by number: ``u -> v`` for every ``u`` in ``sources``.

        Parameters
        ----------
        sources : list of int
        v : int
        kind : str
            ``data`` or ``memory``; a data edge wins over a memory edge between the same pair.
        """
        ids, succ = self.ids, self.succ
        target, pred = ids[v], self.pred[v]
        for u in sources:
            out = succ[u]
            if u != v and out.get(target) != "data":
                out[target] = kind
                pred[ids[u]] = kind
