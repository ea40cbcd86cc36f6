"""Node-link JSON and networkx export, the plumbing the TaskGraph and MemGraph formats share
(docs/formats.md).  Each graph hands over its node-link parts, ``(graph, nodes,
edges)``: the ``graph`` attributes (``type`` first) and iterators of node and edge dicts."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import orjson

from ..budget import JSON_FILE_BYTE, OTHER_JSON_FILE_BYTE, PARQUET_FILE_BYTE, check_ram
from ..checks import builtin_number, finite_tree, short, write_node_link
from ..cycle import TrainingChain
from ..errors import GraphError, OffloadlabError
from ..util import no_gc

T = TypeVar("T")

STREAM_AT = 32 * 2**20
"""Files of this many bytes or more that this toolkit wrote are read a block at a time and
parsed a few thousand nodes or edges at a time, never whole: orjson parses a whole text into a
document tree first, and the text, the tree, the Python objects and the graph built from them
took 2.3 GB for a 241 MB MemGraph file."""

HEADER = b'{"directed":true,"multigraph":false,"graph":'
"""How the files :func:`write` writes begin; then the graph, ``,"nodes":[``, the nodes,
``],"edges":[``, the edges and ``]}``."""

BLOCK = 8 * 2**20

PARQUET_MAGIC = b"PAR1"
"""How every Parquet file begins (a MemGraph may be one: :mod:`.parquet`)."""

HASH_FIELD = "taskgraph_hash"
"""The field of a MemGraph's ``graph`` that holds the content hash of the TaskGraph it was
planned from (:meth:`TaskGraph.content_hash`), written and read with the other fields."""
HASH = re.compile(r"sha256:[0-9a-f]{64}")

#: Where an item of each array starts and where the array ends, as :func:`write` writes them.
#: Neither can occur inside a JSON string, where every quote is escaped.
_ARRAYS = {"nodes": (b',"nodes":[', b'},{"id":', b'}],"edges":['),
           "edges": (b'],"edges":[', b'},{"source":', b'}]}')}


class Unstreamable(Exception):
    """A file that the block reader cannot read (not laid out as :func:`write` lays it out,
    malformed, NaN, ...): it is read whole, whose errors name the problem."""


class Items:
    """The nodes or the edges (``which``) of a node-link file that :func:`write` wrote, read a
    block at a time and parsed a batch of items at a time each time this is iterated: by
    ``parse``, given the batch's items without the brackets around them (default: into JSON
    values, by orjson)."""

    def __init__(self, path: Path, which: str, parse: Callable[[bytes], list] | None = None):
        self.path, self.which, self.parse = path, which, parse or _parse

    def __iter__(self) -> Iterator[Any]:
        # the items of each batch straight from its list, not resumed through a generator
        # one by one: the items of a 165k-vertex MemGraph in 0.79 s against 0.81-0.88 s
        return itertools.chain.from_iterable(self._batches())

    def _batches(self) -> Iterator[list]:
        """The items, a parsed batch (a list) at a time."""
        begin, between, end = _ARRAYS[self.which]
        with open(self.path, "rb") as f:
            buf = _seek_past(f, begin)
            if buf[:1] == b"]":
                return
            while True:
                more = f.read(BLOCK)
                stop = buf.find(end)
                if stop >= 0:
                    yield self.parse(buf[:stop + 1])
                    if self.which == "edges" and (buf[stop + len(end):] + more + f.read()
                                                  ).strip():
                        raise Unstreamable("data after the end of the graph")
                    return
                if not more:
                    raise Unstreamable(f"no {end!r} after the {self.which}")
                cut = buf.rfind(between)
                if cut >= 0:
                    yield self.parse(buf[:cut + 1])
                    buf = buf[cut + 2:]
                buf += more


def _seek_past(f: BinaryIO, marker: bytes) -> bytes:
    """Read ``f`` past the first ``marker``; what was read after it."""
    buf = b""
    while True:
        more = f.read(BLOCK)
        if not more:
            raise Unstreamable(f"no {marker!r}")
        buf = buf[-len(marker):] + more
        at = buf.find(marker)
        if at >= 0:
            return buf[at + len(marker):]


def _parse(items: bytes) -> list:
    try:
        return orjson.loads(b"[" + items + b"]")
    except orjson.JSONDecodeError as exc:
        raise Unstreamable(str(exc)) from None


def load(build: Callable[[Any, str], T], text_or_path: str | Path, what: str) -> T:
    """``build(data, where)`` on the node-link data of a file or a JSON text; a large file this
    toolkit wrote is read in blocks (:data:`STREAM_AT`).

    Parameters
    ----------
    build : callable
        Builds the graph from the data and the place an error names.
    text_or_path : str or Path
        A JSON text, or a file's path.
    what : str
        What the data holds, e.g. ``MemGraph JSON``.

    Returns
    -------
    object
        What ``build`` returns.

    Raises
    ------
    GraphError
        The file cannot be read, is not JSON, or ``build`` refuses it.
    """
    data, where = read(text_or_path, what, stream=True)
    if type(data) is dict and type(data.get("nodes")) is Items:
        try:
            return build(data, where)
        except (Unstreamable, OffloadlabError):
            # read whole, which names the problem it meets first in the file, not the first
            # one in the order the blocks were read (a TaskGraph reads its edges first)
            data, where = read(text_or_path, what)
    return build(data, where)


def streamed(path: Path, at_least: int | None = None) -> dict | None:
    """Node-link data whose nodes and edges are :class:`Items`, if ``path`` is a file this
    toolkit wrote of ``at_least`` bytes or more.

    Parameters
    ----------
    path : Path
        The file.
    at_least : int, optional
        The least size read in blocks (default :data:`STREAM_AT`).

    Returns
    -------
    dict or None
        The data with its ``graph`` attributes parsed; None for a smaller file or one this
        toolkit did not write.
    """
    if path.stat().st_size < (STREAM_AT if at_least is None else at_least):
        return None
    with open(path, "rb") as f:
        head = f.read(2**20)                  # the graph's attributes are much shorter
    at = head.find(_ARRAYS["nodes"][0])
    if not head.startswith(HEADER) or at < 0:
        return None
    try:
        graph = orjson.loads(head[len(HEADER):at])
    except orjson.JSONDecodeError:
        return None
    return {"directed": True, "multigraph": False, "graph": graph,
            "nodes": Items(path, "nodes"), "edges": Items(path, "edges")}


SNIFF = 2**16
"""How many of a file's first bytes :func:`check_input` reads to find where its JSON begins."""

_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISSOCK, "a socket"))


def check_input(path: str | Path, what: str, sniff: bool = True) -> None:
    """Refuse the input file ``path`` at once, before reading it, with a :class:`GraphError`
    naming it.

    It is refused when it is not a regular file (a device such as ``/dev/zero``, a FIFO, a
    directory); with ``sniff``, when its first bytes are neither Parquet's magic nor, after
    whitespace, the ``{`` or ``[`` that JSON begins with; and when reading it would take more
    RAM than is available (:mod:`.budget`).

    Parameters
    ----------
    path : str or Path
        The file.
    what : str
        What it should hold, e.g. ``MemGraph JSON``.
    sniff : bool, default True
        Check its first bytes too.

    Raises
    ------
    GraphError
        For a file that is not regular, cannot be read or (``sniff``) is neither JSON nor
        Parquet.
    SpecError
        Reading it would need more RAM than is available.
    """
    where = f"{what} file {str(path)!r}"
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _NOT_REGULAR if test(info.st_mode)),
                        "not a file")
            raise GraphError(f"cannot read {where}: it is {kind}, not a regular file")
        if not sniff:
            return
        with open(path, "rb") as f:
            head = f.read(SNIFF)
    except OSError as exc:
        raise GraphError(f"cannot read {where}: {exc.strerror or exc}") from None
    if head.startswith(PARQUET_MAGIC):
        per_byte = PARQUET_FILE_BYTE
    else:
        text = head.lstrip(b" \t\r\n")
        if text[:1] not in (b"{", b"["):
            found = (f"it begins with {text[:8]!r}" if text else
                     "it is empty" if not head else f"its first {len(head)} bytes are blank")
            raise GraphError(f"{where}: neither a JSON object or array nor Parquet ({found})")
        per_byte = JSON_FILE_BYTE if head.startswith(HEADER) else OTHER_JSON_FILE_BYTE
    check_ram(f"reading {where} ({info.st_size} bytes)", info.st_size * per_byte)


def parquet_name(path: str | Path) -> bool:
    """Whether ``path``'s name says Parquet (it ends in ``.parquet``), whatever its size
    (``formats.memgraph_format``).

    Parameters
    ----------
    path : str or Path
        A file's path.

    Returns
    -------
    bool
        Its suffix is ``.parquet`` (in any case).
    """
    return Path(path).suffix.lower() == ".parquet"


def is_parquet(path: str | Path) -> bool:
    """Whether ``path`` names a Parquet file: by its name (:func:`parquet_name`) or its
    first bytes, Parquet's magic.

    Parameters
    ----------
    path : str or Path
        A file's path (a FIFO or a missing file is not Parquet).

    Returns
    -------
    bool
        It is Parquet.
    """
    if parquet_name(path):
        return True
    if not os.path.isfile(path):        # a FIFO would block here: check_input refuses it
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def node_link(data: object, where: str) -> tuple[Iterable, Iterable]:
    """The ``nodes`` and ``edges`` lists of networkx node-link JSON.

    ``links`` is read as a synonym of ``edges`` (networkx before 3.4 wrote ``links``); a file
    with both must give the same list in each, and one with neither is refused.

    Parameters
    ----------
    data : object
        The parsed JSON.
    where : str
        The file or text, which an error names.

    Returns
    -------
    tuple of (iterable, iterable)
        The nodes and the edges (lists, or :class:`Items` of a file read in blocks).

    Raises
    ------
    GraphError
        ``data`` is not an object with a ``nodes`` list and one ``edges`` list.
    """
    if type(data) is not dict:
        raise GraphError(f"{where}: expected a JSON object (networkx node-link data), got "
                         f"{type(data).__name__}")
    nodes = data.get("nodes")
    if type(nodes) is not list and type(nodes) is not Items:
        raise GraphError(f"{where}: expected node-link JSON with a 'nodes' list")
    edges, links = data.get("edges"), data.get("links")
    if edges is None and links is None:
        raise GraphError(f"{where}: node-link JSON needs an 'edges' list (or 'links', as "
                         f"networkx before 3.4 wrote it); write \"edges\": [] for none")
    if edges is not None and links is not None and edges != links:
        raise GraphError(f"{where}: has both 'edges' and 'links', with different contents; "
                         f"keep one")
    edges = links if edges is None else edges
    if type(edges) is not list and type(edges) is not Items:
        raise GraphError(f"{where}: 'edges' must be a list, got {type(edges).__name__}")
    return nodes, edges


def as_dict(graph: dict, nodes: Iterable[Any], edges: Iterable[Any]) -> dict:
    """Node-link data as one dict (``networkx.node_link_data``'s layout, ``edges`` key) of a
    graph's node and edge records (:func:`write`'s).

    Parameters
    ----------
    graph : dict
        The ``graph`` attributes.
    nodes, edges : iterable
        The node and edge records.

    Returns
    -------
    dict
        The node-link data.
    """
    return {"directed": True, "multigraph": False, "graph": graph, "nodes": _dicts(nodes),
            "edges": [{"source": e.source, "target": e.target, "kind": e.kind} for e in edges]}


def to_networkx(graph: dict, nodes: Iterable[Any], edges: Iterable[Any]):
    """A networkx DiGraph: the ``graph`` attributes, each node's fields but its id as node
    attributes, each edge's ``kind``.

    Parameters
    ----------
    graph : dict
        The graph's attributes.
    nodes, edges : iterable
        Its node records and edge records.

    Returns
    -------
    networkx.DiGraph
        The graph.
    """
    import networkx as nx
    g = nx.DiGraph(**graph)
    g.add_nodes_from((n.pop("id"), n) for n in _dicts(nodes))
    g.add_edges_from((e.source, e.target, {"kind": e.kind}) for e in edges)
    return g


def _dicts(records: Iterable[Any]) -> list[dict]:
    """Node records as the dicts of their JSON: a location as a dict, a tuple (``inputs``,
    ``shape``) as a list, a number of a subclass (numpy's ``float64``) as a plain one, and a
    NaN kept (the writer refuses it; a dict may hold it)."""
    import msgspec
    return [{k: list(v) if type(v) is tuple else v for k, v in d.items()}
            for d in msgspec.to_builtins(list(records), enc_hook=builtin_number)]


def write(graph: dict, nodes: Iterable[Any], edges: Iterable[Any], path: str | Path | None,
          what: str) -> str | None:
    """Strict node-link JSON (no NaN or Infinity) as text, or written to ``path``, of a
    graph's node and edge records (:func:`checks.write_node_link`).

    Parameters
    ----------
    graph : dict
        The ``graph`` attributes.
    nodes, edges : iterable
        The records, as :func:`checks.write_node_link` takes them.
    path : str or Path or None
        The file to write; None: return the text.
    what : str
        Names the graph in an error.

    Returns
    -------
    str or None
        The text where ``path`` is None; else None.

    Raises
    ------
    GraphError
        A NaN or infinite number in the graph.
    """
    with no_gc():                       # a record per edge, none of them cyclic
        if path is None:
            out = io.BytesIO()
            write_node_link(out, graph, nodes, edges, what)
            return out.getvalue().decode()
        with open(path, "wb") as f:
            write_node_link(f, graph, nodes, edges, what)
    return None


def read(text_or_path: str | Path, what: str, stream: bool = False) -> tuple[Any, str]:
    """Parse JSON from a string or a path, raising GraphError that names the file.

    A file is parsed from its bytes (no decoded copy of it is held); with ``stream``, a large
    file this toolkit wrote is left to be read item by item (:func:`load`).

    Parameters
    ----------
    text_or_path : str or Path
        A JSON text (a string starting with ``{``), or a file's path.
    what : str
        What it holds, e.g. ``MemGraph JSON``.
    stream : bool, default False
        Leave a large file this toolkit wrote to be read in blocks.

    Returns
    -------
    tuple of (object, str)
        The parsed data and the place an error about it names.

    Raises
    ------
    GraphError
        The file cannot be read, is Parquet, or is not UTF-8 or JSON.
    """
    where = what
    text: str | bytes = str(text_or_path)
    if isinstance(text_or_path, Path) or not str(text).lstrip().startswith("{"):
        path = Path(text_or_path)
        where = f"{what} file {str(path)!r}"
        check_input(path, what)
        try:
            blocks = streamed(path) if stream else None
            if blocks is not None:
                return blocks, where
            text = path.read_bytes()
        except OSError as exc:
            raise GraphError(f"cannot read {where}: {exc.strerror or exc}") from None
    if isinstance(text, bytes) and text.startswith(PARQUET_MAGIC):
        raise GraphError(f"{where}: a Parquet file, not node-link JSON (" + (
            "read MemGraph files with formats.read_memgraph, which reads both" if what.startswith(
                "MemGraph") else "only a MemGraph may be a Parquet table: give it to simulate "
            "or run") + ")")
    try:
        with no_gc():                       # millions of small objects, none of them cyclic
            try:
                return orjson.loads(text), where
            except orjson.JSONDecodeError:  # NaN, Infinity, huge integers, bad UTF-8, or
                if isinstance(text, bytes):  # malformed: json's message or the field checks
                    text = text.decode("utf-8")     # say which
                return json.loads(text), where
    except UnicodeDecodeError as exc:
        raise GraphError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                         ) from None
    except json.JSONDecodeError as exc:
        raise GraphError(f"{where}: malformed JSON ({exc})") from None
    except RecursionError:
        raise GraphError(f"{where}: malformed JSON (nested too deeply)") from None
    except ValueError as exc:   # e.g. an integer of more than 4300 digits
        raise GraphError(f"{where}: malformed JSON ({exc})") from None


def graph_meta(data: dict, where: str, kind: str) -> tuple[str, dict]:
    """The name and the other fields of node-link data's ``graph`` object, every number in
    them finite.

    Parameters
    ----------
    data : dict
        The node-link data.
    where : str
        The file or text, which an error names.
    kind : str
        ``"TaskGraph"`` or ``"MemGraph"``: the ``type`` the data must have, if any.

    Returns
    -------
    tuple of (str, dict)
        The name (a TaskGraph's; ``""`` for a MemGraph) and the other fields, ``type`` removed.

    Raises
    ------
    GraphError
        Another ``type`` (a MemGraph given as a TaskGraph), a non-finite number, or a
        malformed name, content hash, ``forward`` count or training chain.
    """
    meta = data.get("graph")
    if meta is None:
        meta = {}
    if type(meta) is not dict:
        raise GraphError(f"{where}: 'graph' must be a JSON object, got {short(meta)}")
    meta = dict(meta)
    found = meta.pop("type", kind)
    if found != kind:
        raise GraphError(f"{where}: holds a {short(found)}, not a {kind}"
                         + (" (give it to simulate or run)" if found == "MemGraph" else
                            " (plan it first: offloadlab plan --taskgraph)"
                            if found == "TaskGraph" else ""))
    name = meta.pop("name", "") if kind == "TaskGraph" else ""
    if type(name) is not str:
        raise GraphError(f"{where}: graph.name must be a string, got {short(name)}")
    # a MemGraph's machine is Machine.from_dict's to check: older files wrote unlimited rates
    # as Infinity
    finite_tree(meta if kind == "TaskGraph" else {k: v for k, v in meta.items() if k != "machine"},
                f"{where}: graph")
    digest = meta.get(HASH_FIELD)
    if kind == "MemGraph" and digest is not None and not (
            type(digest) is str and HASH.fullmatch(digest)):
        raise GraphError(f"{where}: graph.{HASH_FIELD} must be 'sha256:' and 64 lowercase hex "
                         f"digits (TaskGraph.content_hash), got {short(digest)}")
    forward = meta.get("forward", 0) if kind == "TaskGraph" else 0
    if type(forward) is not int or forward < 0:
        raise GraphError(f"{where}: graph.forward (the forward pass's compute vertices, "
                         f"core.anatomy) must be an integer >= 0, got {short(forward)}")
    if kind == "TaskGraph" and "chain" in meta:
        try:
            TrainingChain.from_dict(meta["chain"])
        except OffloadlabError as exc:
            raise GraphError(f"{where}: graph.chain: {exc}") from None
    return name, meta
