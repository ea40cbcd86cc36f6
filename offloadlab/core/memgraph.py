"""MemGraph: the dependency DAG a planner produces (DESIGN.md, Vocabulary and Interchange).

Every TaskGraph vertex appears once (``task`` names it); planners add ``offload`` (GPU -> host),
``reload`` (host -> GPU, of an offloaded tensor) and ``load`` (host -> GPU, of a host-resident
input or CPU result) vertices, whose ``of`` names the TaskGraph vertex whose tensor they move.
Every vertex that writes GPU memory has a :class:`Loc`.  Edges are ``data`` or ``memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

from .devices import CPU, HOST, split_transfer
from .errors import GraphError
from .taskgraph import TaskGraph, _read, _write

TASK_KINDS = ("input", "compute", "transfer")
MOVE_KINDS = ("offload", "reload", "load")
EDGE_KINDS = ("data", "memory")


class Loc(NamedTuple):
    """A GPU memory location: ``size`` bytes at ``offset`` on ``device``."""

    device: str
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(slots=True)
class MemVertex:
    """One MemGraph vertex.  ``inputs`` are the MemGraph vertices it reads, in argument order;
    ``order`` is its position in the planner's serial order (a topological order of the
    MemGraph, set by the planner; ``fixed`` dispatch runs each resource in this order)."""

    id: str
    kind: str
    device: str
    bytes: int
    loc: Loc | None = None
    task: str | None = None
    of: str | None = None
    op: str | None = None
    flops: float = 0.0
    inputs: tuple[str, ...] = ()
    order: int = 0
    time: float | None = None   # profiled seconds; overrides the cost model when set
    shape: tuple[int, ...] | None = None   # of the tensor it writes or moves (None: flat)
    dtype: str = "float32"

    @property
    def out_device(self) -> str:
        """Where this vertex's output lives (``"host"`` for offloads, host inputs, CPU ops)."""
        if self.kind == "transfer":
            return split_transfer(self.device)[1]
        if self.kind == "offload" or self.device in (CPU, HOST):
            return HOST
        return self.device


class MemGraph:
    """Vertices in planner order plus typed edges; ``graph`` holds planner, options, machine."""

    def __init__(self, graph: dict | None = None):
        self.graph: dict = dict(graph or {})
        self.vertices: dict[str, MemVertex] = {}
        self.succ: dict[str, dict[str, str]] = {}
        self.pred: dict[str, dict[str, str]] = {}

    def add_vertex(self, v: MemVertex) -> MemVertex:
        if v.id in self.vertices:
            raise GraphError(f"duplicate MemGraph vertex {v.id!r}")
        self.vertices[v.id] = v
        self.succ[v.id] = {}
        self.pred[v.id] = {}
        return v

    def add_edge(self, u: str, v: str, kind: str = "data") -> None:
        """Add ``u -> v``; a data edge wins over a memory edge between the same pair."""
        self.add_edges((u,), v, kind)

    def add_edges(self, sources: Iterable[str], v: str, kind: str = "data") -> None:
        """Add ``u -> v`` for every ``u`` in ``sources`` (self-loops are skipped; a data edge
        wins over a memory edge between the same pair)."""
        succ, pred = self.succ, self.pred[v]
        for u in sources:
            out = succ[u]
            if u != v and out.get(v) != "data":
                out[v] = kind
                pred[u] = kind

    def __len__(self) -> int:
        return len(self.vertices)

    def __iter__(self):
        return iter(self.vertices.values())

    def __getitem__(self, id: str) -> MemVertex:
        return self.vertices[id]

    def edges(self):
        """Yield ``(source, target, kind)``."""
        for u, targets in self.succ.items():
            for v, kind in targets.items():
                yield u, v, kind

    def count(self, kind: str) -> int:
        return sum(1 for v in self.vertices.values() if v.kind == kind)

    def stamp_tensors(self, graph: TaskGraph) -> None:
        """Copy each tensor's shape and dtype from ``graph`` onto the vertices that write or
        move it (the executor needs them; planners call this in their shared closing step)."""
        tasks = graph.tasks
        for v in self.vertices.values():
            task = tasks.get(v.task or v.of or "")
            if task is not None:
                v.shape, v.dtype = task.shape, task.dtype

    def moved_bytes(self) -> dict[str, int]:
        """Bytes moved per kind of movement (offload, reload, load, transfer)."""
        out = {k: 0 for k in (*MOVE_KINDS, "transfer")}
        for v in self.vertices.values():
            if v.kind in out:
                out[v.kind] += v.bytes
        return out

    # -- interchange ------------------------------------------------------------------
    def to_networkx(self):
        """A networkx DiGraph with vertex fields as node attributes and ``kind`` on edges."""
        import networkx as nx
        g = nx.DiGraph(**self.graph)
        for node in self._nodes():
            g.add_node(node.pop("id"), **node)
        for u, v, kind in self.edges():
            g.add_edge(u, v, kind=kind)
        return g

    def _nodes(self) -> list[dict]:
        nodes = []
        for v in self.vertices.values():
            nodes.append({
                "id": v.id, "kind": v.kind, "device": v.device,
                "loc": ({"device": v.loc.device, "offset": v.loc.offset, "size": v.loc.size}
                        if v.loc else None),
                "task": v.task, "of": v.of, "op": v.op, "bytes": v.bytes, "flops": v.flops,
                "inputs": list(v.inputs), "order": v.order, "time": v.time,
                "shape": list(v.shape) if v.shape is not None else None, "dtype": v.dtype,
            })
        return nodes

    def to_dict(self) -> dict:
        return {"directed": True, "multigraph": False,
                "graph": {"type": "MemGraph", **self.graph}, "nodes": self._nodes(),
                "edges": [{"source": u, "target": v, "kind": k} for u, v, k in self.edges()]}

    def to_json(self, path: str | Path | None = None) -> str:
        """Node-link JSON text, also written to ``path`` if given."""
        return _write(self.to_dict(), path)

    @classmethod
    def from_dict(cls, data: dict, where: str = "MemGraph JSON") -> "MemGraph":
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) \
                or not isinstance(data.get("edges"), list):
            raise GraphError(f"{where}: expected node-link JSON with 'nodes' and 'edges' lists")
        meta = dict(data.get("graph") or {})
        meta.pop("type", None)
        mg = cls(meta)
        for n in data["nodes"]:
            try:
                loc = n.get("loc")
                mg.add_vertex(MemVertex(
                    id=str(n["id"]), kind=n["kind"], device=n["device"], bytes=int(n["bytes"]),
                    loc=Loc(loc["device"], int(loc["offset"]), int(loc["size"])) if loc else None,
                    task=n.get("task"), of=n.get("of"), op=n.get("op"),
                    flops=float(n.get("flops") or 0.0), inputs=tuple(n.get("inputs") or ()),
                    order=int(n.get("order", 0)), time=n.get("time"),
                    shape=tuple(map(int, n["shape"])) if n.get("shape") is not None else None,
                    dtype=str(n.get("dtype") or "float32")))
            except (KeyError, TypeError, ValueError) as exc:
                raise GraphError(f"{where}: node {str(n)[:200]} lacks or mistypes field {exc}") from None
            if mg.vertices[str(n["id"])].kind not in TASK_KINDS + MOVE_KINDS:
                raise GraphError(f"{where}: vertex {n['id']!r} has unknown kind {n['kind']!r}")
        for e in data["edges"]:
            try:
                u, v, kind = str(e["source"]), str(e["target"]), e.get("kind", "data")
            except (KeyError, TypeError):
                raise GraphError(f"{where}: edge {e!r} lacks 'source' or 'target'") from None
            for end in (u, v):
                if end not in mg.vertices:
                    raise GraphError(f"{where}: edge {u!r} -> {v!r} names unknown vertex {end!r}")
            if kind not in EDGE_KINDS:
                raise GraphError(f"{where}: edge {u!r} -> {v!r} has unknown kind {kind!r}")
            mg.add_edge(u, v, kind)
        return mg

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "MemGraph":
        """Read node-link JSON from a string or a file path."""
        data, where = _read(text_or_path, "MemGraph JSON")
        return cls.from_dict(data, where)
