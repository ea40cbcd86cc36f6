"""A TaskGraph as node-link JSON (docs/formats.md): its node and edge records for the writer,
the checking reader of node-link data and the builder from the typed reader's records."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..checks import edge_ends, ids, number, short, vertex_id
from ..errors import GraphError
from ..taskgraph import UNKNOWN, Task, TaskGraph
from ..util import no_gc
from . import nodelink, typed


def taskgraph_node_link(graph: TaskGraph) -> tuple[dict, Iterable[Task], Iterator[Any]]:
    """The ``graph`` attributes, the nodes and the edges as the records msgspec encodes,
    one at a time.

    Parameters
    ----------
    graph : TaskGraph
        The graph to write.

    Returns
    -------
    tuple of (dict, iterable, iterator)
        The attributes (with ``type`` and ``name``), the tasks (each :class:`Task` its node's
        record) and the data edges as one :class:`typed.EdgeRecord` each.
    """
    edges = (typed.EdgeRecord(u, t.id, "data") for t in graph.tasks.values()
             for u in dict.fromkeys(t.inputs))
    return {"type": "TaskGraph", "name": graph.name, **graph.meta}, graph.tasks.values(), edges


def taskgraph_from_dict(data: Any, where: str = "TaskGraph JSON") -> TaskGraph:
    """Read node-link data, checking every field.

    A node without ``inputs`` reads its edges' sources in edge order.

    Parameters
    ----------
    data : Any
        :func:`~offloadlab.core.formats.to_dict`'s, or networkx's with ``edges`` or ``links``.
    where : str, default "TaskGraph JSON"
        The file, for the errors.

    Returns
    -------
    TaskGraph

    Raises
    ------
    GraphError
        Naming ``where``, the vertex and the field.
    """
    with no_gc():
        return _from_dict(data, where)


def _from_dict(data: Any, where: str) -> TaskGraph:
    nodes, edges = nodelink.node_link(data, where)
    name, meta = nodelink.graph_meta(data, where, "TaskGraph")
    g = TaskGraph(name=name, meta=meta)
    edge_inputs: dict[str, list[str]] = {}
    for e in edges:
        if type(e) is dict:
            u, v = e.get("source"), e.get("target")
            if type(u) is not str or type(v) is not str:
                u, v = edge_ends(e, where)
        else:
            u, v = edge_ends(e, where)
        if v in edge_inputs:
            edge_inputs[v].append(u)
        else:
            edge_inputs[v] = [u]
    tasks = g.tasks
    for n in nodes:
        task = _read_task(n, where, edge_inputs)
        if task.id in tasks:
            raise GraphError(f"{where}: duplicate vertex id {task.id!r}")
        tasks[task.id] = task
    _link(g, edge_inputs, where)
    return g


def _link(graph: TaskGraph, edge_inputs: dict[str, list[str]], where: str) -> None:
    """The readers' last steps: every edge ``u -> v`` of the file (``edge_inputs[v]``) is
    one of ``v``'s inputs, each id is one string object, and :meth:`TaskGraph.validate`."""
    tasks = graph.tasks
    for v, sources in edge_inputs.items():
        target = tasks.get(v)
        for u in sources:
            if target is None or u not in tasks:
                raise GraphError(f"{where}: edge {u!r} -> {v!r} names unknown vertex "
                                 f"{v if target is None else u!r}")
            if u not in target.inputs:
                raise GraphError(f"{where}: edge {u!r} -> {v!r}, but vertex {v!r} does "
                                 f"not list {u!r} among its inputs {list(target.inputs)}")
    for task in tasks.values():      # one string object per id (see memgraph_json._share_ids)
        task.inputs = tuple([tasks[u].id if u in tasks else u for u in task.inputs])
    try:
        graph.validate()
    except GraphError as exc:
        raise GraphError(f"{where}: {exc}") from None
    compute = sum(t.kind == "compute" for t in tasks.values())
    if graph.meta.get("forward", 0) > compute:
        raise GraphError(f"{where}: graph.forward is {graph.meta['forward']} (the forward "
                         f"pass's compute vertices), but the graph has {compute}")


def taskgraph_from_json(text_or_path: str | Path) -> TaskGraph:
    """Read node-link JSON from a string or a file path.

    Typed records first (:mod:`.typed`), else checking every field
    (:func:`taskgraph_from_dict`).

    Parameters
    ----------
    text_or_path : str or Path
        The JSON text, or the file.

    Returns
    -------
    TaskGraph

    Raises
    ------
    GraphError
        Naming the file, the vertex and the field.
    """
    return typed.load(text_or_path, typed.TASKGRAPH, _from_records, taskgraph_from_dict,
                      "TaskGraph JSON")


def _from_records(graph: Any, nodes: Iterable[Any], edges: Iterable[Any]) -> TaskGraph:
    """The TaskGraph of :func:`typed.read`'s records: :func:`taskgraph_from_dict`'s steps,
    with any problem a :class:`GraphError` with no place (the checking reader names it)."""
    name, meta = nodelink.graph_meta({"graph": graph}, "", "TaskGraph")
    g = TaskGraph(name=name, meta=meta)
    edge_inputs: dict[str, list[str]] = {}
    for e in edges:
        if e.target in edge_inputs:
            edge_inputs[e.target].append(e.source)
        else:
            edge_inputs[e.target] = [e.source]
    tasks = g.tasks
    for n in nodes:
        if n.id in tasks:
            raise GraphError("")
        tasks[n.id] = Task(
            n.id, n.kind, n.device, n.bytes,
            tuple(edge_inputs.get(n.id, ()) if n.inputs is None else n.inputs), n.op,
            0.0 if n.flops is None else n.flops, None if n.shape is None else tuple(n.shape),
            n.dtype or "float32", n.time,
            UNKNOWN if n.category is None else n.category)
    _link(g, edge_inputs, "")
    return g


def _read_task(n: object, where: str, edge_inputs: dict[str, list[str]]) -> Task:
    """One node of a TaskGraph file.  Checks what :meth:`TaskGraph.validate` cannot see
    (a node that is no object, the id, the types of ``flops``, ``inputs`` and ``shape``, which
    are converted); ``validate`` checks the rest, by field."""
    if type(n) is not dict:
        raise GraphError(f"{where}: node {short(n)} is not a JSON object")
    nid: Any = n.get("id")
    if type(nid) is not str:
        nid = vertex_id(n, where)
    flops: Any = n.get("flops")
    if type(flops) is not float:
        flops = 0.0 if flops is None else number(flops, f"{where}: vertex {nid!r}", "flops")
    inputs: Any = n.get("inputs")
    if inputs is None:
        inputs = edge_inputs.get(nid, ())
    elif type(inputs) is not list:
        ids(inputs, f"{where}: vertex {nid!r}", "inputs")
    shape: Any = n.get("shape")
    if shape is not None:
        if type(shape) is not list:
            raise GraphError(f"{where}: vertex {nid!r}: shape must be a list of integers >= 0, "
                             f"got {short(shape)}")
        shape = tuple(shape)
    category: Any = n.get("category")
    return Task(nid, n.get("kind"), n.get("device"), n.get("bytes"),  # type: ignore[arg-type]
                tuple(map(str, inputs)), n.get("op"), flops, shape, n.get("dtype") or "float32",
                n.get("time"), UNKNOWN if category is None else category)
