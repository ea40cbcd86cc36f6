"""MemGraph: the dependency DAG a planner produces (docs/design.md, Vocabulary and Interchange).

Every TaskGraph vertex appears once (``task`` names it); planners add ``offload`` (GPU -> host),
``reload`` (host -> GPU, of an offloaded tensor) and ``load`` (host -> GPU, of a host-resident
input or CPU result) vertices, whose ``of`` names the TaskGraph vertex whose tensor they move.
Every vertex that writes GPU memory has a :class:`Loc`.  Edges are ``data`` or ``memory``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from sys import intern
from typing import Any, NamedTuple, overload

from . import nodelink
from .checks import INF, MAX_COUNT, edge_ends, ids, number, short, strings, vertex_id
from .devices import CPU, HOST, is_gpu_name, split_transfer
from .errors import GraphError
from .ops import DTYPES, OPS, op_problem
from .taskgraph import KINDS, TaskGraph
from .taskgraph import device_problem as task_device_problem
from .util import no_gc

TASK_KINDS = KINDS             # a TaskGraph vertex's kinds, which it keeps in a MemGraph
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

    def host_bytes(self) -> int:
        """Bytes moved between host RAM and the GPUs (offloads, reloads and loads)."""
        return sum([v.bytes for v in self.vertices.values() if v.kind in MOVE_KINDS])

    # -- interchange ------------------------------------------------------------------
    def to_networkx(self):
        """A networkx DiGraph with vertex fields as node attributes and ``kind`` on edges."""
        return nodelink.to_networkx(*self._node_link())

    def _node_link(self) -> tuple[dict, Iterator[dict], Iterator[dict]]:
        return {"type": "MemGraph", **self.graph}, self._nodes(), self._edge_dicts()

    def _nodes(self) -> Iterator[dict]:
        for v in self.vertices.values():
            yield {
                "id": v.id, "kind": v.kind, "device": v.device,
                "loc": ({"device": v.loc.device, "offset": v.loc.offset, "size": v.loc.size}
                        if v.loc else None),
                "task": v.task, "of": v.of, "op": v.op, "bytes": v.bytes, "flops": v.flops,
                "inputs": list(v.inputs), "order": v.order, "time": v.time,
                "shape": list(v.shape) if v.shape is not None else None, "dtype": v.dtype,
            }

    def _edge_dicts(self) -> Iterator[dict]:
        for u, v, kind in self.edges():
            yield {"source": u, "target": v, "kind": kind}

    def to_dict(self) -> dict:
        return nodelink.as_dict(*self._node_link())

    @overload
    def to_json(self, path: None = None) -> str: ...
    @overload
    def to_json(self, path: str | Path) -> None: ...

    def to_json(self, path: str | Path | None = None) -> str | None:
        """Node-link JSON text, or, given ``path``, the same written there."""
        return nodelink.write(*self._node_link(), path, "MemGraph")

    @classmethod
    def from_dict(cls, data: Any, where: str = "MemGraph JSON") -> MemGraph:
        """Read node-link data (:meth:`to_dict`'s, or networkx's with ``edges`` or ``links``),
        checking every field; a :class:`GraphError` names ``where`` (the file), the vertex and
        the field.  The machine stored in ``graph`` is read by :meth:`Machine.from_dict`."""
        with no_gc():
            return cls._from_dict(data, where)

    @classmethod
    def _from_dict(cls, data: Any, where: str) -> MemGraph:
        nodes, edges = nodelink.node_link(data, where)
        _, meta = nodelink.graph_meta(data, where, "MemGraph")
        mg = cls(meta)
        vertices = mg.vertices
        devices: dict[tuple[str, str], str | None] = {}   # (kind, device) -> problem or None
        for n in nodes:
            vertex = _read_vertex(n, where, devices)
            if vertex.id in vertices:
                raise GraphError(f"{where}: duplicate vertex id {vertex.id!r}")
            mg.add_vertex(vertex)
        # Each id is one string object: the JSON parser makes a new one for every occurrence,
        # and at a million vertices the copies in edges and inputs cost gigabytes.
        for vertex in vertices.values():
            vertex.inputs = tuple([vertices[x].id if x in vertices else x
                                   for x in vertex.inputs])
            if vertex.task == vertex.id:
                vertex.task = vertex.id
            elif vertex.of is not None and vertex.of in vertices:
                vertex.of = vertices[vertex.of].id
        for e in edges:
            u, v = edge_ends(e, where)
            kind = e.get("kind", "data")
            if u not in vertices or v not in vertices:
                raise GraphError(f"{where}: edge {u!r} -> {v!r} names unknown vertex "
                                 f"{u if u not in vertices else v!r}")
            if kind not in EDGE_KINDS:
                raise GraphError(f"{where}: edge {u!r} -> {v!r} has unknown kind {short(kind)} "
                                 f"(expected one of {', '.join(EDGE_KINDS)})")
            mg.add_edge(vertices[u].id, vertices[v].id, "data" if kind == "data" else "memory")
        return mg

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> MemGraph:
        """Read node-link JSON from a string or a file path."""
        return nodelink.load(cls.from_dict, text_or_path, "MemGraph JSON")

    def write(self, path: str | Path) -> None:
        """Write the file ``path``: one Parquet table if it ends in ``.parquet``
        (:mod:`offloadlab.core.columnar`, for large graphs), else node-link JSON."""
        if nodelink.parquet_name(path):
            from . import columnar
            columnar.write(self, path)
        else:
            self.to_json(path)

    @classmethod
    def read(cls, path: str | Path) -> MemGraph:
        """Read the file ``path``: Parquet (by its suffix or its first bytes) or node-link
        JSON."""
        if nodelink.is_parquet(path):
            from . import columnar
            return columnar.read(path)
        return cls.from_json(Path(path))


def _device_problem(kind: str, device: str) -> str | None:
    """What is wrong with a MemGraph vertex of ``kind`` on ``device``, or None."""
    if kind in MOVE_KINDS:
        return None if is_gpu_name(device) else \
            f"an {kind} vertex's device must be a GPU ('gpu0', 'gpu1', ...), got {device!r}"
    if kind in TASK_KINDS:
        return task_device_problem(kind, device)
    return f"unknown kind {kind!r} (expected one of {', '.join(TASK_KINDS + MOVE_KINDS)})"


def _read_vertex(n: object, where: str, devices: dict[tuple[str, str], str | None]) -> MemVertex:
    """One node of a MemGraph file, every field checked (the inline tests pass valid fields
    without a call); ``devices`` caches the verdict on each ``(kind, device)``."""
    if type(n) is not dict:
        raise GraphError(f"{where}: node {short(n)} is not a JSON object")
    nid: Any = n.get("id")
    if type(nid) is not str:
        nid = vertex_id(n, where)
    kind: Any = n.get("kind")
    device: Any = n.get("device")
    if type(kind) is not str or type(device) is not str:
        strings(n, f"{where}: vertex {nid!r}", ("kind", "device"), ("kind", "device"))
    problem = devices.get((kind, device), "")
    if problem == "":
        problem = devices[kind, device] = _device_problem(kind, device)
    if problem is not None:
        raise GraphError(f"{where}: vertex {nid!r}: {problem}")
    task: Any = n.get("task")
    of: Any = n.get("of")
    op: Any = n.get("op")
    dtype: Any = n.get("dtype") or "float32"
    if not ((task is None or type(task) is str) and (of is None or type(of) is str)
            and (op is None or type(op) is str) and type(dtype) is str):
        strings(n, f"{where}: vertex {nid!r}", ("task", "of", "op", "dtype"))
    if kind == "compute" and op not in OPS:
        problem = op_problem(op)
        if problem is not None:
            raise GraphError(f"{where}: vertex {nid!r}: {problem}")
    if dtype not in DTYPES:
        raise GraphError(f"{where}: vertex {nid!r}: unknown dtype {dtype!r}; known: "
                         f"{', '.join(DTYPES)}")
    nbytes: Any = n.get("bytes")
    if type(nbytes) is not int or not 0 < nbytes <= MAX_COUNT:
        number(nbytes, f"{where}: vertex {nid!r}", "bytes", count=True, positive=True)
    flops: Any = n.get("flops")
    if type(flops) is not float or not 0.0 <= flops < INF:
        flops = 0.0 if flops is None else number(flops, f"{where}: vertex {nid!r}", "flops")
    time: Any = n.get("time")
    if time is not None and (type(time) is not float or not 0.0 <= time < INF):
        time = number(time, f"{where}: vertex {nid!r}", "time")
    order: Any = n.get("order", 0)
    if type(order) is not int or not 0 <= order <= MAX_COUNT:
        number(order, f"{where}: vertex {nid!r}", "order", count=True)
    inputs: Any = n.get("inputs")
    if inputs is None:
        inputs = ()
    elif type(inputs) is not list:
        ids(inputs, f"{where}: vertex {nid!r}", "inputs")
    loc: Any = n.get("loc")
    if loc is not None:
        loc = _read_loc(loc, f"{where}: vertex {nid!r}")
    shape: Any = n.get("shape")
    if shape is not None:
        shape = _read_shape(shape, nbytes, dtype, f"{where}: vertex {nid!r}")
    return MemVertex(nid, intern(kind), intern(device), nbytes, loc, task, of,
                     None if op is None else intern(op), flops, tuple(map(str, inputs)), order,
                     time, shape, intern(dtype))


def _read_loc(loc: object, where: str) -> Loc:
    """A location ``{"device", "offset", "size"}``: offset >= 0, size > 0 (that the device is
    the vertex's GPU is the verifier's rule)."""
    if type(loc) is not dict:
        raise GraphError(f"{where}: loc must be null or an object {{device, offset, size}}, got "
                         f"{short(loc)}")
    device, offset, size = loc.get("device"), loc.get("offset"), loc.get("size")
    if not is_gpu_name(device):
        raise GraphError(f"{where}: loc.device must be a GPU ('gpu0', 'gpu1', ...), got "
                         f"{short(device)}")
    if type(offset) is not int or not 0 <= offset <= MAX_COUNT:
        number(offset, where, "loc.offset", count=True)
    if type(size) is not int or not 0 < size <= MAX_COUNT:
        number(size, where, "loc.size", count=True, positive=True)
    return Loc(intern(device), offset, size)  # type: ignore[arg-type]


def _read_shape(shape: object, nbytes: int, dtype: str, where: str) -> tuple[int, ...]:
    """A shape: integers >= 0 whose elements fit in ``nbytes``."""
    if type(shape) is not list or not all(type(x) is int and x >= 0 for x in shape):
        raise GraphError(f"{where}: shape must be a list of integers >= 0, got {short(shape)}")
    need = math.prod(shape) * DTYPES[dtype]
    if need > nbytes:
        raise GraphError(f"{where}: shape {shape} of {dtype} needs {need} bytes, more than its "
                         f"{nbytes} bytes")
    return tuple(shape)
