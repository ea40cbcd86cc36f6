"""The typed reader of node-link JSON (docs/design.md, Interchange): msgspec decodes each node
and edge of a MemGraph or TaskGraph file straight into a typed record, checking field types
(and a MemGraph's ranges) in C, so that the builders of :mod:`.memgraph_json` and
:mod:`.taskgraph_json` are left the rules between fields.

It is a fast path, not a second definition of the format: it only *accepts*.  Anything it does
not take as it stands (a field of the wrong type or out of range, NaN, a missing field, ids
written as integers, networkx's older ``links``, a layout the block reader cannot follow, any
rule broken) makes it :class:`Declined`, and the file is read again by the checking reader
(``memgraph_from_dict``, ``taskgraph_from_dict``), whose error names the file, vertex and
field.  Reading the benchmark's 165k-vertex MemGraph: 1.2 s against 2.1 s.

Not compiled (mypyc does not compile msgspec's ``Struct`` classes); the MemGraph's loop over
the records is, in :mod:`.memgraph_json`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
import orjson

from ..checks import MAX_COUNT
from ..errors import GraphError
from ..memgraph import MOVE_KINDS, TASK_KINDS
from ..ops import DTYPES
from ..util import no_gc
from . import nodelink

T = TypeVar("T")

Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Int64 = Annotated[int, msgspec.Meta(ge=-2**63, le=2**63 - 1)]
"""An integer within 64 bits: beyond them orjson (the checking reader) gives a float, so a
larger one is declined (msgspec bounds fit in int64, so 2**63 to 2**64 - 1 are too)."""
Positive = Annotated[int, msgspec.Meta(gt=0, le=MAX_COUNT)]
Finite = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
if TYPE_CHECKING:
    Kind = str
    DType = str
else:       # decoded as the one string object each holds, as the checking reader interns them
    Kind = Literal[TASK_KINDS + MOVE_KINDS]
    DType = Literal[tuple(DTYPES)]


STREAM_AT = 256 * 2**20
"""Files of this many bytes or more that this toolkit wrote are decoded a batch of items at a
time (as :data:`nodelink.STREAM_AT`); smaller ones whole, which is faster (the benchmark's
74 MB MemGraph: 0.35 s against 0.49 s) and, unlike a whole JSON document tree, costs about
twice the file beside the graph (370 MB at the peak against 224 MB)."""


_NULL = msgspec.Raw(b"null")
_UNDECODABLE = (ValueError, RecursionError, msgspec.MsgspecError)
"""What decoding raises on text it cannot take (bad UTF-8 and orjson's errors are
ValueErrors)."""


class Declined(Exception):
    """The typed reader does not take this input as it stands; the checking reader will."""


class LocRecord(msgspec.Struct):
    device: str
    offset: Count
    size: Positive


class NodeRecord(msgspec.Struct):
    """A MemGraph node as :func:`~offloadlab.core.formats.to_json` writes it; an absent field
    takes the checking reader's default."""

    id: str
    kind: Kind
    device: str
    bytes: Positive
    loc: LocRecord | None = None
    task: str | None = None
    of: str | None = None
    op: str | None = None
    flops: Finite | None = None
    inputs: list[str] | None = None
    order: Count = 0
    time: Finite | None = None
    shape: list[Count] | None = None
    dtype: DType | None = None


class EdgeRecord(msgspec.Struct):
    source: str
    target: str
    kind: Literal["data", "memory"] = "data"


class MemGraphFile(msgspec.Struct):
    nodes: list[NodeRecord]
    edges: list[EdgeRecord] | None = None
    links: Any = None
    graph: msgspec.Raw = _NULL          # parsed by orjson, as the checking reader parses it


class TaskRecord(msgspec.Struct):
    """A TaskGraph node: what :meth:`TaskGraph.validate` checks (the kind, the device, the
    bytes, the op, the dtype, the time, the shape's values) keeps its JSON type, so that the
    same values reach it as from the checking reader."""

    id: str
    kind: str
    device: str
    bytes: Int64
    op: str | None = None
    flops: Finite | None = None
    inputs: list[str] | None = None
    shape: list[Int64] | None = None
    dtype: str | None = None
    time: Int64 | float | None = None
    category: str | None = None


class TaskEdgeRecord(msgspec.Struct):
    source: str
    target: str


class TaskGraphFile(msgspec.Struct):
    nodes: list[TaskRecord]
    edges: list[TaskEdgeRecord] | None = None
    links: Any = None
    graph: msgspec.Raw = _NULL


@dataclass(frozen=True)
class Format:
    """The decoders of one kind of graph file: whole, and its nodes and edges in batches."""

    file: msgspec.json.Decoder
    nodes: msgspec.json.Decoder
    edges: msgspec.json.Decoder


MEMGRAPH = Format(msgspec.json.Decoder(MemGraphFile), msgspec.json.Decoder(list[NodeRecord]),
                  msgspec.json.Decoder(list[EdgeRecord]))
TASKGRAPH = Format(msgspec.json.Decoder(TaskGraphFile), msgspec.json.Decoder(list[TaskRecord]),
                   msgspec.json.Decoder(list[TaskEdgeRecord]))


def read(text_or_path: str | Path, form: Format) -> tuple[Any, Iterable, Iterable]:
    """The ``graph`` object, nodes and edges of a node-link text or file, decoded into the
    records of ``form``; a large file this toolkit wrote a batch at a time (:data:`STREAM_AT`).

    Parameters
    ----------
    text_or_path : str or Path
        A JSON text or a file, as :func:`nodelink.read` takes it.
    form : Format
        The records to decode into (:data:`MEMGRAPH`, :data:`TASKGRAPH`).

    Returns
    -------
    tuple of (object, iterable, iterable)
        The ``graph`` object, the node records and the edge records.

    Raises
    ------
    Declined
        There or, for a file read in batches, while its nodes or edges are iterated: the
        checking reader must read it.
    """
    try:
        if isinstance(text_or_path, str) and text_or_path.lstrip().startswith("{"):
            data = form.file.decode(text_or_path)
        else:
            path = Path(text_or_path)
            streamed = nodelink.streamed(path, STREAM_AT)
            if streamed is not None:
                return (streamed["graph"], nodelink.Items(path, "nodes", _batch(form.nodes)),
                        nodelink.Items(path, "edges", _batch(form.edges)))
            data = form.file.decode(_utf8(path.read_bytes()))
        if data.edges is None or data.links is not None:
            raise Declined("no 'edges', or 'links'")
        graph = orjson.loads(memoryview(data.graph))
    except (OSError, *_UNDECODABLE) as exc:
        raise Declined(str(exc)) from None
    return graph, data.nodes, data.edges


def load(text_or_path: str | Path, form: Format, from_records: Callable[[Any, Any, Any], T],
         from_dict: Callable[[Any, str], T], what: str) -> T:
    """A graph read from a node-link text or file: ``from_records(graph, nodes, edges)`` on
    :func:`read`'s records, else ``from_dict`` on what the checking reader reads.

    The checking reader (:func:`nodelink.load`) reads it where the fast path is
    :class:`Declined` or raises a :class:`GraphError` (with no place).  A file is checked first
    (:func:`nodelink.check_input`).

    Parameters
    ----------
    text_or_path : str or Path
        A JSON text, or a file's path.
    form : Format
        The records to decode into.
    from_records : callable
        Builds the graph from the records.
    from_dict : callable
        Builds the graph from node-link data and the place an error names.
    what : str
        What it holds, e.g. ``MemGraph JSON``, which errors name.

    Returns
    -------
    object
        The graph.

    Raises
    ------
    GraphError
        The file or text cannot be read, or does not hold a valid graph.
    """
    if isinstance(text_or_path, Path) or not text_or_path.lstrip().startswith("{"):
        nodelink.check_input(text_or_path, what)
    try:
        with no_gc():
            graph, nodes, edges = read(text_or_path, form)
            return from_records(graph, nodes, edges)
    except (Declined, nodelink.Unstreamable, GraphError):
        pass
    return nodelink.load(from_dict, text_or_path, what)


def _batch(decoder: msgspec.json.Decoder) -> Any:
    """A batch parser for :class:`nodelink.Items` that decodes with ``decoder``."""
    def parse(items: bytes) -> list:
        try:
            return decoder.decode(_utf8(b"[" + items + b"]"))
        except _UNDECODABLE as exc:
            raise Declined(str(exc)) from None
    return parse


def _utf8(text: bytes) -> bytes | str:
    """``text``, checked to be UTF-8 (msgspec does not check the fields it skips): as it is if
    ASCII, else decoded (a ValueError if it cannot be)."""
    return text if text.isascii() else text.decode()
