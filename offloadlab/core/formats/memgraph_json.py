"""A MemGraph as node-link JSON (docs/formats.md): its node and edge records for the writer,
the checking reader of node-link data and the builder from the typed reader's records (the
loop over a file's records, compiled)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from sys import intern
from typing import Any

from ..checks import INF, MAX_COUNT, edge_ends, ids, number, short, strings, vertex_id
from ..devices import is_gpu_name
from ..errors import GraphError
from ..memgraph import (
    EDGE_KINDS,
    MOVE_KINDS,
    TASK_KINDS,
    Loc,
    MemGraph,
    MemVertex,
    vertex_device_problem,
)
from ..ops import DTYPES, OPS, op_problem
from ..util import no_gc
from . import nodelink, typed


def memgraph_node_link(mg: MemGraph) -> tuple[dict, Iterable[MemVertex], Iterable[Any]]:
    """The ``graph`` attributes, the nodes and the edges as the records msgspec encodes.

    Parameters
    ----------
    mg : MemGraph
        The plan to write.

    Returns
    -------
    tuple of (dict, iterable, iterable)
        The attributes (with ``type``), the vertices (each its node's record: its fields are
        the node's) and the edges as one :class:`typed.EdgeRecord` each.
    """
    return ({"type": "MemGraph", **mg.graph}, mg.vertices.values(),
            itertools.chain.from_iterable(_edge_records(mg)))


def _edge_records(mg: MemGraph, size: int = 8192) -> Iterator[list[Any]]:
    """The edges as records, in lists of about ``size``: a compiled generator resumes once
    per list, not once per edge."""
    record: Any = typed.EdgeRecord          # whose kind is "data" or "memory", as here
    batch: list[Any] = []
    for u, targets in mg.succ.items():
        for v, kind in targets.items():
            batch.append(record(u, v, kind))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def memgraph_from_dict(data: Any, where: str = "MemGraph JSON") -> MemGraph:
    """Read node-link data, checking every field.

    The machine stored in ``graph`` is read by :meth:`Machine.from_dict`.

    Parameters
    ----------
    data : Any
        :func:`~offloadlab.core.formats.to_dict`'s, or networkx's with ``edges`` or ``links``.
    where : str, default "MemGraph JSON"
        The file, for the errors.

    Returns
    -------
    MemGraph

    Raises
    ------
    GraphError
        Naming ``where``, the vertex and the field.
    """
    with no_gc():
        return _from_dict(data, where)


def _from_dict(data: Any, where: str) -> MemGraph:
    nodes, edges = nodelink.node_link(data, where)
    _, meta = nodelink.graph_meta(data, where, "MemGraph")
    mg = MemGraph(meta)
    vertices = mg.vertices
    devices: dict[tuple[str, str], str | None] = {}   # (kind, device) -> problem or None
    for n in nodes:
        vertex = _read_vertex(n, where, devices)
        if vertex.id in vertices:
            raise GraphError(f"{where}: duplicate vertex id {vertex.id!r}")
        mg.add_vertex(vertex)
    _share_ids(mg)
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


def memgraph_from_json(text_or_path: str | Path) -> MemGraph:
    """Read node-link JSON from a string or a file path.

    Typed records first (:mod:`.typed`), else checking every field
    (:func:`memgraph_from_dict`).

    Parameters
    ----------
    text_or_path : str or Path
        The JSON text, or the file.

    Returns
    -------
    MemGraph

    Raises
    ------
    GraphError
        Naming the file, the vertex and the field.
    """
    return typed.load(text_or_path, typed.MEMGRAPH, _from_records, memgraph_from_dict,
                      "MemGraph JSON")


def _from_records(graph: Any, nodes: Iterable[Any], edges: Iterable[Any]) -> MemGraph:
    """The MemGraph of :func:`typed.read`'s records, whose fields have their types and
    ranges; the rules between fields are :func:`memgraph_from_dict`'s, and any broken one, or a
    duplicate or unknown vertex, raises :class:`GraphError` (with no place: the checking
    reader names it)."""
    _, meta = nodelink.graph_meta({"graph": graph}, "", "MemGraph")
    mg = MemGraph(meta)
    vertices = mg.vertices
    # the one string object of each device, op and location GPU (the records' kinds and
    # dtypes are already one object each), once found fine: devices per vertex kind
    devices: dict[str, dict[str, str]] = {kind: {} for kind in TASK_KINDS + MOVE_KINDS}
    ops: dict[str, str] = {}
    gpus: dict[str, str] = {}
    for n in nodes:
        kind, nbytes, dtype = n.kind, n.bytes, n.dtype or "float32"
        fine = devices[kind]
        device = fine.get(n.device)
        if device is None:
            if vertex_device_problem(kind, n.device) is not None:
                raise GraphError("")
            device = fine[n.device] = intern(n.device)
        op = n.op
        if op is None:
            if kind == "compute":                   # op_problem(None): no op
                raise GraphError("")
        else:
            known = ops.get(op)
            if known is None:
                if kind == "compute" and op_problem(op) is not None:
                    raise GraphError("")
                known = intern(op)
                if kind == "compute":
                    ops[op] = known
            op = known
        loc = n.loc
        if loc is not None:
            gpu = gpus.get(loc.device)
            if gpu is None:
                if not is_gpu_name(loc.device):
                    raise GraphError("")
                gpu = gpus[loc.device] = intern(loc.device)
            loc = Loc(gpu, loc.offset, loc.size)
        shape = n.shape
        if shape is not None:
            if math.prod(shape) * DTYPES[dtype] > nbytes:
                raise GraphError("")
            shape = tuple(shape)
        inputs = n.inputs
        mg.add_vertex(MemVertex(
            n.id, kind, device, nbytes, loc, n.task, n.of, op,
            0.0 if n.flops is None else n.flops, () if inputs is None else tuple(inputs),
            n.order, n.time, shape, dtype))
    _share_ids(mg)
    succ, pred = mg.succ, mg.pred
    u = ""
    name: str | None = None                         # the last edge's source
    out: dict[str, str] = {}
    for e in edges:
        if e.source != name:                        # a file this toolkit wrote lists each
            name = e.source                         # vertex's out-edges together
            source = vertices.get(e.source)
            if source is None:
                raise GraphError("")
            u = source.id
            out = succ[u]
        target = vertices.get(e.target)
        if target is None:
            raise GraphError("")
        v = target.id
        if u != v and out.get(v) != "data":
            out[v] = pred[v][u] = e.kind
    return mg


def _share_ids(mg: MemGraph) -> None:
    """Make each id one string object: the JSON parser makes a new one for every
    occurrence, and at a million vertices the copies in inputs cost gigabytes."""
    vertices = mg.vertices
    for vertex in vertices.values():
        vertex.inputs = tuple([vertices[x].id if x in vertices else x
                               for x in vertex.inputs])
        if vertex.task == vertex.id:
            vertex.task = vertex.id
        elif vertex.of is not None and vertex.of in vertices:
            vertex.of = vertices[vertex.of].id


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
        problem = devices[kind, device] = vertex_device_problem(kind, device)
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
        loc = _read_loc(loc, where, nid)
    shape: Any = n.get("shape")
    if shape is not None:
        shape = _read_shape(shape, nbytes, dtype, f"{where}: vertex {nid!r}")
    return MemVertex(nid, intern(kind), intern(device), nbytes, loc, task, of,
                     None if op is None else intern(op), flops, tuple(map(str, inputs)), order,
                     time, shape, intern(dtype))


def _read_loc(loc: object, where: str, nid: str) -> Loc:
    """The location ``{"device", "offset", "size"}`` of vertex ``nid``: offset >= 0, size > 0
    (that the device is the vertex's GPU is the verifier's rule)."""
    if type(loc) is not dict:
        raise GraphError(f"{where}: vertex {nid!r}: loc must be null or an object "
                         f"{{device, offset, size}}, got {short(loc)}")
    device, offset, size = loc.get("device"), loc.get("offset"), loc.get("size")
    if not is_gpu_name(device):
        raise GraphError(f"{where}: vertex {nid!r}: loc.device must be a GPU ('gpu0', 'gpu1', "
                         f"...), got {short(device)}")
    if type(offset) is not int or not 0 <= offset <= MAX_COUNT:
        number(offset, f"{where}: vertex {nid!r}", "loc.offset", count=True)
    if type(size) is not int or not 0 < size <= MAX_COUNT:
        number(size, f"{where}: vertex {nid!r}", "loc.size", count=True, positive=True)
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
