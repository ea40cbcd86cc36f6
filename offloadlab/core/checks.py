"""Checking the fields of JSON input (TaskGraph, MemGraph and Machine files), by field.

The readers test each field with an inline fast path (``type(x) is int and x > 0``) and call
the helpers here only when it fails, so that a valid million-vertex file pays no function call
per field; the helpers decide (an integer subclass passes, a float such as ``4096.0`` where a
count is wanted does not) and raise :class:`GraphError` naming where (file, vertex) and which
field.

Everything offloadlab writes is strict JSON: :func:`dumps` refuses NaN and infinities, which
Python's json module would write as the non-standard ``NaN``/``Infinity`` (and accepts on
reading: the readers reject them field by field).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any, BinaryIO

from .errors import GraphError, OffloadlabError

INF = math.inf
MAX_COUNT = 2**63 - 1
"""Counts (bytes, offsets, sizes, orders) must fit in 64 bits, as traces and arrays store them."""


def _requirement(count: bool = False, positive: bool = False, unlimited: bool = False) -> str:
    """What a number field must be, in words."""
    if count:
        return "a positive integer" if positive else "an integer >= 0"
    bound = "> 0" if positive else ">= 0"
    if unlimited:
        return f"a number {bound}, not NaN (inf: unlimited)"
    return f"a finite number {bound}"


def number(value: object, where: str, field: str, *, count: bool = False,
           positive: bool = False, unlimited: bool = False,
           error: Callable[[str], OffloadlabError] = GraphError) -> Any:
    """``value`` as a number field must be: a JSON number (not a boolean, not a string), ``>= 0``
    (``positive``: ``> 0``), finite (``unlimited``: ``inf`` allowed), and for a ``count`` an
    integer (``4096``, not ``4096.0``) below 2**63.

    Parameters
    ----------
    value : object
        The field's value as read.
    where : str
        Where it was read (a file, a vertex), the message's start.
    field : str
        The field's name.
    count : bool, default False
        It must be an integer.
    positive : bool, default False
        It must be ``> 0``.
    unlimited : bool, default False
        ``inf`` is allowed.
    error : callable, default GraphError
        The error to raise, built from the message.

    Returns
    -------
    int or float
        ``value``, a ``float`` unless a count.

    Raises
    ------
    GraphError
        Or ``error`` where given: ``"{where}: {field} must be ..., got {value!r}"``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        pass
    elif count:
        if isinstance(value, int) and (value > 0 if positive else value >= 0) \
                and value <= MAX_COUNT:
            return value
    elif _finite(value) or unlimited and isinstance(value, float):
        x = float(value)        # compared as a float: numpy's float64 gives a numpy bool,
        if x > 0 if positive else x >= 0:       # which compiled code refuses as a bool
            return x
    got = "missing or null" if value is None else short(value)
    if type(value) is int and abs(value) > MAX_COUNT:    # 1.000e+400, not 401 digits
        got = f"{Decimal(value):.3e}" + (" (a count must be below 2**63)" if count else "")
    raise error(f"{where}: {field} must be {_requirement(count, positive, unlimited)}, got {got}")


def _finite(value: int | float) -> bool:
    """Whether ``value`` is a finite float, or an integer that converts to one."""
    try:
        return math.isfinite(value)
    except OverflowError:        # an integer beyond the float range (10**400)
        return False


def short(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a whole node would bury the message).

    Parameters
    ----------
    value : object
        Any value.
    limit : int, default 80
        The most characters.

    Returns
    -------
    str
        The text, ending in ``...`` where it was cut.
    """
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def ids(value: object, where: str, field: str) -> tuple[str, ...]:
    """A list of vertex ids (strings; integers are read as their decimal text).

    Parameters
    ----------
    value : object
        The field's value as read.
    where : str
        Where it was read, the message's start.
    field : str
        The field's name.

    Returns
    -------
    tuple of str
        The ids.

    Raises
    ------
    GraphError
        ``value`` is not a list of strings and integers.
    """
    if type(value) is not list:
        raise GraphError(f"{where}: {field} must be a list of vertex ids, got {short(value)}")
    out = []
    for x in value:
        if type(x) is not str:
            if type(x) is not int:
                raise GraphError(f"{where}: {field} must be a list of vertex ids, got "
                                 f"{short(value)}")
            x = str(x)
        out.append(x)
    return tuple(out)


def strings(node: dict, where: str, keys: tuple[str, ...], required: tuple[str, ...] = ()
            ) -> None:
    """Raise naming the first of a node's ``keys`` that is not a string.

    Parameters
    ----------
    node : dict
        The node as read.
    where : str
        Where it was read, the message's start.
    keys : tuple of str
        The keys whose values must be strings or null.
    required : tuple of str, default ()
        Those of ``keys`` that may not be null or missing either.

    Raises
    ------
    GraphError
        A value that is not a string (or null where allowed).
    """
    for key in keys:
        value = node.get(key)
        if not (type(value) is str or value is None and key not in required):
            raise GraphError(f"{where}: {key} must be a string, got "
                             f"{'missing or null' if value is None else short(value)}")


def vertex_id(node: dict, where: str) -> str:
    """A node's ``id``: a string, or an integer read as its decimal text.

    Parameters
    ----------
    node : dict
        A node of a graph file.
    where : str
        The file, which an error names first.

    Returns
    -------
    str
        The id.

    Raises
    ------
    GraphError
        The node has no string or integer ``id``.
    """
    nid = node.get("id")
    if type(nid) is str:
        return nid
    if type(nid) is int:
        return str(nid)
    raise GraphError(f"{where}: node {short(node)} has no 'id' (a string)")


def edge_ends(edge: object, where: str) -> tuple[str, str]:
    """An edge's ``(source, target)`` vertex ids.

    Parameters
    ----------
    edge : object
        An item of a graph file's edges.
    where : str
        The file, which an error names first.

    Returns
    -------
    tuple of (str, str)
        Its source and target ids (integers read as their decimal text).

    Raises
    ------
    GraphError
        The edge is not an object with a ``source`` and a ``target`` id.
    """
    if type(edge) is dict:
        u, v = edge.get("source"), edge.get("target")
        if type(u) is str and type(v) is str:
            return u, v
        if type(u) in (str, int) and type(v) in (str, int):
            return str(u), str(v)
    raise GraphError(f"{where}: edge {short(edge)} lacks a 'source' or 'target' vertex id")


def finite_tree(value: object, where: str) -> None:
    """Refuse a NaN or infinite number anywhere in a JSON value, naming its path.

    Parameters
    ----------
    value : object
        The JSON value (dicts, lists, numbers, ...).
    where : str
        Its path, the start of the paths named.

    Raises
    ------
    GraphError
        A NaN or infinite number is in ``value``.
    """
    bad = non_finite(value, where)
    if bad is not None:
        raise GraphError(f"{bad[0]} is {bad[1]!r}: not a finite number (JSON has no NaN or "
                         f"Infinity)")


def non_finite(value: object, path: str = "") -> tuple[str, float] | None:
    """The path (below ``path``) and value of the first NaN or infinite float in ``value``
    (dicts, lists, tuples).

    Parameters
    ----------
    value : object
        The value to search.
    path : str, default ""
        Its own path, the start of the one returned.

    Returns
    -------
    tuple of (str, float) or None
        The path and the float; None where every float is finite.
    """
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        x, p = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return p, x
        if isinstance(x, dict):
            stack.extend(reversed([(v, f"{p}.{k}" if p else str(k)) for k, v in x.items()]))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed([(v, f"{p}[{i}]") for i, v in enumerate(x)]))
    return None


def _where_not_finite(value: object, path: str = "") -> str | None:
    """``"path = value"`` of the first NaN or infinite float in ``value``, or None."""
    bad = non_finite(value, path)
    if bad is None:
        return None
    return f"{bad[0]} = {bad[1]!r}" if bad[0] else repr(bad[1])


def write_node_link(out: BinaryIO, graph: dict, nodes: Iterable[Any], edges: Iterable[Any],
                    what: str, chunk: int = 10_000) -> None:
    """Write strict node-link JSON (:meth:`TaskGraph.to_dict`'s layout) to ``out``, ``chunk``
    nodes or edges at a time, so that a large graph never exists whole as text.

    msgspec encodes the records as they stand, without a dict each, and would write a NaN or
    infinity as ``null``, so the graph's attributes and each node's float fields (``flops``,
    ``time``; the others are integers and strings) are checked first.

    Parameters
    ----------
    out : binary file
        Where to write.
    graph : dict
        The graph's attributes.
    nodes, edges : iterable
        Records whose fields are the JSON objects' (a :class:`MemVertex` or a :class:`Task`; a
        :class:`typed.EdgeRecord`).
    what : str
        Names the graph in an error.
    chunk : int, default 10000
        Nodes or edges encoded at a time.

    Raises
    ------
    GraphError
        A NaN or infinite number in the graph's attributes or a node's float fields.
    """
    import msgspec

    bad = _where_not_finite(graph, "graph")
    if bad is not None:
        raise GraphError(f"cannot write {what} as JSON: {bad} is not a finite number")
    encode = msgspec.json.Encoder(enc_hook=builtin_number).encode
    out.write(b'{"directed":true,"multigraph":false,"graph":' + encode(graph))
    for name, items in ((b"nodes", nodes), (b"edges", edges)):
        out.write(b',"' + name + b'":[')
        first = True
        for batch in _batches(items, chunk):
            if name == b"nodes":
                _check_floats(batch, what)
            out.write((b"" if first else b",") + encode(batch)[1:-1])
            first = False
        out.write(b"]")
    out.write(b"}")


def builtin_number(value: object) -> int | float:
    """A number of a subclass of ``float`` or ``int`` (numpy's ``float64``, which a graph's
    fields may hold and :meth:`TaskGraph.validate` takes) as the plain one msgspec encodes.

    Parameters
    ----------
    value : object
        What msgspec could not encode.

    Returns
    -------
    int or float
        The plain number.

    Raises
    ------
    TypeError
        ``value`` is not a number (not a JSON value, as msgspec raises).
    """
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"a graph file cannot hold a value of type {type(value).__name__!r}")


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter; none if there are no items)."""
    it = iter(items)
    while True:
        batch = list(itertools.islice(it, size))
        if not batch:
            return
        yield batch


def _check_floats(nodes: list[Any], what: str) -> None:
    for node in nodes:
        for key in ("flops", "time"):
            x = getattr(node, key)
            if type(x) is float and not math.isfinite(x):
                raise GraphError(f"cannot write {what} as JSON: vertex {node.id!r}: "
                                 f"{key} = {x!r} is not a finite number")


def dumps(data: object, what: str) -> str:
    """Strict JSON text of ``data``, refusing NaN and infinity instead of writing
    ``NaN``/``Infinity``.

    Parameters
    ----------
    data : object
        A JSON value.
    what : str
        Names it in an error.

    Returns
    -------
    str
        The JSON text.

    Raises
    ------
    GraphError
        Naming the first NaN or infinite number in ``data``.
    """
    try:
        return json.dumps(data, allow_nan=False)
    except ValueError:
        raise GraphError(f"cannot write {what} as JSON: {_where_not_finite(data)} is not a "
                         f"finite number") from None
