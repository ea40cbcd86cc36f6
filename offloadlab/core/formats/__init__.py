"""Reading and writing TaskGraphs and MemGraphs (docs/formats.md), apart from the graphs
themselves, as networkx keeps ``readwrite`` apart from its graph classes.

- :mod:`.nodelink`: node-link JSON (networkx's layout), the plumbing both graphs share;
- :mod:`.typed`: the typed fast path that reads it into msgspec records;
- :mod:`.taskgraph_json`, :mod:`.memgraph_json`: each graph's records and readers;
- :mod:`.parquet`: a MemGraph as one Parquet table, for large graphs.

>>> from offloadlab.core import TaskGraph, formats
>>> g = TaskGraph("tiny")
>>> _ = g.add_input("x", 64)
>>> formats.taskgraph_from_json(formats.to_json(g)).tasks["x"].bytes
64
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from ..memgraph import MemGraph
from ..taskgraph import TaskGraph
from . import nodelink

if TYPE_CHECKING:
    from .memgraph_json import memgraph_from_dict, memgraph_from_json
    from .taskgraph_json import taskgraph_from_dict, taskgraph_from_json

__all__ = ["to_json", "to_dict", "to_networkx", "read_memgraph", "write_memgraph",
           "memgraph_format", "memgraph_suffix", "PARQUET_VERTICES",
           "PARQUET_BYTES_PER_VERTEX",
           "taskgraph_from_json", "taskgraph_from_dict", "memgraph_from_json",
           "memgraph_from_dict"]

PARQUET_VERTICES = 350_000
"""Where the toolkit chooses a MemGraph file's format (a name ending in neither ``.json`` nor
``.parquet``, or a file it names itself), a MemGraph of this many vertices or more is written
as Parquet, a smaller one as node-link JSON: where Parquet's write and read, each in a fresh
process with pyarrow's import, take less time together than JSON's (``bench/bench_formats.py``:
JSON's at 331k vertices of the benchmark DAG, Parquet's at LoRA 7B batch 8's 390k; docs/formats.md,
Which format)."""
PARQUET_BYTES_PER_VERTEX = 44
"""About the most a large MemGraph's Parquet file takes per vertex (27-44 bytes for LLaMA
prefill, LoRA training and the benchmark DAG, against 370-750 for node-link JSON): what
``plan`` estimates a Parquet file's size from, to say how much smaller it would be."""


def __getattr__(name: str) -> Any:
    """The readers, imported on first use (PEP 562): their typed records (msgspec) are built
    when their module is imported, which a command that reads no graph file need not pay."""
    if name in ("taskgraph_from_json", "taskgraph_from_dict"):
        from . import taskgraph_json
        value = getattr(taskgraph_json, name)
    elif name in ("memgraph_from_json", "memgraph_from_dict"):
        from . import memgraph_json
        value = getattr(memgraph_json, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _parts(graph: TaskGraph | MemGraph) -> tuple[dict, Any, Any]:
    """The node-link parts ``(graph, nodes, edges)`` of either kind of graph."""
    if isinstance(graph, MemGraph):
        from .memgraph_json import memgraph_node_link
        return memgraph_node_link(graph)
    if isinstance(graph, TaskGraph):
        from .taskgraph_json import taskgraph_node_link
        return taskgraph_node_link(graph)
    raise TypeError(f"expected a TaskGraph or a MemGraph, got {type(graph).__name__}")


@overload
def to_json(graph: TaskGraph | MemGraph, path: None = None) -> str: ...
@overload
def to_json(graph: TaskGraph | MemGraph, path: str | Path) -> None: ...


def to_json(graph: TaskGraph | MemGraph, path: str | Path | None = None) -> str | None:
    """Node-link JSON text of a TaskGraph or a MemGraph, or, given ``path``, the same written there.

    Parameters
    ----------
    graph : TaskGraph or MemGraph
        The graph.
    path : str or Path, optional
        The file to write.

    Returns
    -------
    str or None
        The text, or None where it was written to ``path``.

    Raises
    ------
    GraphError
        For a NaN or an infinity (strict JSON refuses them).
    """
    what = "MemGraph" if isinstance(graph, MemGraph) else "TaskGraph"
    return nodelink.write(*_parts(graph), path, what)


def to_dict(graph: TaskGraph | MemGraph) -> dict:
    """Node-link data of a TaskGraph or a MemGraph as one dict.

    Parameters
    ----------
    graph : TaskGraph or MemGraph
        The graph.

    Returns
    -------
    dict
        In ``networkx.node_link_data``'s layout, with ``edges``.
    """
    return nodelink.as_dict(*_parts(graph))


def to_networkx(graph: TaskGraph | MemGraph) -> Any:
    """A networkx DiGraph with the vertex fields as node attributes and ``kind`` on edges.

    Parameters
    ----------
    graph : TaskGraph or MemGraph
        The graph.

    Returns
    -------
    networkx.DiGraph
    """
    return nodelink.to_networkx(*_parts(graph))


def memgraph_suffix(vertices: int) -> str:
    """The suffix of the format the toolkit chooses for a MemGraph of ``vertices`` vertices:
    ``.parquet`` from :data:`PARQUET_VERTICES` on (where pyarrow is installed), else ``.json``.

    Parameters
    ----------
    vertices : int
        The MemGraph's vertices.

    Returns
    -------
    str
        ``".parquet"`` or ``".json"``.
    """
    if vertices >= PARQUET_VERTICES and importlib.util.find_spec("pyarrow") is not None:
        return ".parquet"
    return ".json"


def memgraph_format(path: str | Path, vertices: int) -> str:
    """The format :func:`write_memgraph` writes a MemGraph of ``vertices`` vertices in to
    ``path``: the one its suffix names (``.json`` or ``.parquet``, in any case), else the one
    :func:`memgraph_suffix` chooses by size.

    Parameters
    ----------
    path : str or Path
        The file.
    vertices : int
        The MemGraph's vertices.

    Returns
    -------
    str
        ``"parquet"`` or ``"json"``.

    Examples
    --------
    >>> memgraph_format("mg.json", 10**6), memgraph_format("mg", 10)
    ('json', 'json')
    """
    suffix = Path(path).suffix.lower()
    if suffix not in (".json", ".parquet"):
        suffix = memgraph_suffix(vertices)
    return suffix[1:]


def write_memgraph(mg: MemGraph, path: str | Path) -> str:
    """Write ``mg`` to the file ``path``, in the format :func:`memgraph_format` says.

    Parameters
    ----------
    mg : MemGraph
        The graph.
    path : str or Path
        The file: one Parquet table if it ends in ``.parquet`` (:mod:`.parquet`, for large
        graphs), node-link JSON if it ends in ``.json``; any other name, Parquet from
        :data:`PARQUET_VERTICES` vertices on, else JSON (the readers tell them apart by
        their first bytes).

    Returns
    -------
    str
        The format written: ``"parquet"`` or ``"json"``.

    Raises
    ------
    GraphError
        For a NaN or an infinity.
    """
    fmt = memgraph_format(path, len(mg))
    if fmt == "parquet":
        from . import parquet  # pyarrow and NumPy only where Parquet is wanted
        parquet.write(mg, path)
    else:
        to_json(mg, path)
    return fmt


def read_memgraph(path: str | Path) -> MemGraph:
    """Read the MemGraph file ``path``.

    Parameters
    ----------
    path : str or Path
        Parquet (by its suffix or its first bytes) or node-link JSON.

    Returns
    -------
    MemGraph

    Raises
    ------
    GraphError
        Naming the file, the vertex and the field of anything wrong in it.
    """
    if nodelink.is_parquet(path):
        from . import parquet
        return parquet.read(path)
    from .memgraph_json import memgraph_from_json
    return memgraph_from_json(Path(path))
