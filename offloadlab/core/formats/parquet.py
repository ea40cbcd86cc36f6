"""A MemGraph as one Parquet table, one row per vertex (docs/design.md, Interchange): the
columnar file for large graphs beside node-link JSON, which stays the default.

Each field is a typed column, checked with NumPy in one pass, with the JSON reader's messages;
docs/formats.md (MemGraphs as Parquet tables) lists the columns.  pyarrow, a dependency, is
imported only here and only when a Parquet file is read or written.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from itertools import chain, islice
from operator import attrgetter
from pathlib import Path
from sys import intern
from typing import Any

import numpy as np
import orjson

from ..checks import MAX_COUNT, non_finite, number, short
from ..devices import is_gpu_name
from ..errors import GraphError, OffloadlabError
from ..memgraph import EDGE_KINDS, Loc, MemGraph, MemVertex, vertex_device_problem
from ..ops import DTYPES, op_problem
from ..util import no_gc
from . import arrow, nodelink

GRAPH_KEY = b"offloadlab.graph"
FORMAT_KEY = b"offloadlab.format"
FORMAT = b"1"

#: The columns, in order: name -> (arrow type name, what a value must be, in words).
COLUMNS: dict[str, tuple[str, str]] = {
    "id": ("string", "a string"),
    "kind": ("string", "a string"),
    "device": ("string", "a string"),
    "bytes": ("int64", "an integer"),
    "loc_device": ("string", "a string"),
    "loc_offset": ("int64", "an integer"),
    "loc_size": ("int64", "an integer"),
    "task": ("string", "a string"),
    "of": ("string", "a string"),
    "op": ("string", "a string"),
    "flops": ("float64", "a number"),
    "inputs": ("list<int32>", "a list of row numbers"),
    "order": ("int64", "an integer"),
    "time": ("float64", "a number"),
    "shape": ("list<int64>", "a list of integers"),
    "dtype": ("string", "a string"),
    "succ": ("list<int32>", "a list of row numbers"),
    "succ_data": ("list<bool>", "a list of booleans"),
}
REQUIRED = ("id", "kind", "device", "bytes")
FIELDS = ("kind", "device", "bytes", "loc", "task", "of", "op", "flops", "inputs", "order",
          "time", "shape", "dtype")
"""The MemVertex fields the writer reads, a column each."""
NAMES = ("kind", "device", "loc_device", "op", "dtype")
"""The columns of names: few distinct values, dictionary-encoded."""


def need_pyarrow(what: str, instead: str = "") -> Any:
    """The ``pyarrow`` module (a dependency, imported only where Parquet is read or written).

    Parameters
    ----------
    what : str
        What needs it, for the error (``"MemGraph Parquet files"``).
    instead : str, default ""
        What else would do, for the error.

    Returns
    -------
    module
        ``pyarrow``.

    Raises
    ------
    OffloadlabError
        Saying that ``what`` needs it and how to install it, where it is missing.
    """
    try:     # through importlib, which honours a module blocked in sys.modules in both builds
        return importlib.import_module("pyarrow")
    except ImportError:
        raise OffloadlabError(f"{what} need pyarrow, which is missing here: pip install pyarrow"
                              + (f" (or {instead})" if instead else "")) from None


# -- writing ----------------------------------------------------------------------------------
def write(mg: MemGraph, path: str | Path) -> None:
    """Write ``mg`` to ``path`` as one Parquet table (the columns of :data:`COLUMNS`).

    Parameters
    ----------
    mg : MemGraph
        The graph.
    path : str or Path
        The file to write.

    Raises
    ------
    GraphError
        If a graph attribute, a vertex's flops or time is not a finite number, or a vertex
        names one that is not in ``mg``.
    OffloadlabError
        If pyarrow is missing.
    """
    pa = need_pyarrow("MemGraph Parquet files", "write .json")
    import pyarrow.parquet as pq

    with no_gc():
        table = _table(mg, pa)
    try:
        with open(path, "wb") as f:
            # dictionary pages for the columns of names only, and no statistics: 0.13 s
            # instead of 0.42 s for the benchmark's 165k vertices (zstd, every column), and a
            # smaller file
            pq.write_table(table, f, use_dictionary=list(NAMES), write_statistics=False)
    except OSError as exc:              # a full disk: name the file, as open() does
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def _table(mg: MemGraph, pa: Any) -> Any:
    """The Parquet table of ``mg``: the graph's attributes as strict JSON (refusing NaN and
    infinities, as the JSON writer does) and a column per field."""
    what = "MemGraph as Parquet"
    graph = {"type": "MemGraph", **mg.graph}
    bad = non_finite(graph, "graph")
    if bad is not None:
        raise GraphError(f"cannot write {what}: {bad[0]} = {bad[1]!r} is not a finite number")
    vertices = list(mg.vertices.values())
    ids = list(mg.vertices)
    row = {x: i for i, x in enumerate(ids)}
    (kind, device, nbytes, loc, task, of, op, flops, ins, order, times, shapes, dtype) = [
        list(map(attrgetter(field), vertices)) for field in FIELDS]
    for field, values in (("flops", flops), ("time", [0.0 if t is None else t for t in times])):
        infinite = ~np.isfinite(values)
        if infinite.any():
            v = vertices[_first(infinite)]
            raise GraphError(f"cannot write {what}: vertex {v.id!r}: {field} = "
                             f"{getattr(v, field)!r} is not a finite number")
    out = list(mg.succ.values())        # in vertex order, as add_vertex made them
    if len(out) != len(ids) or list(mg.succ) != ids:
        out = [mg.succ[x] for x in ids]
    try:
        inputs = list(map(row.__getitem__, chain.from_iterable(ins)))
        succ = list(map(row.__getitem__, chain.from_iterable(out)))
    except KeyError as exc:
        v = next(v for v in vertices if exc.args[0] in v.inputs or exc.args[0] in mg.succ[v.id])
        raise GraphError(f"cannot write {what}: vertex {v.id!r} names {exc.args[0]!r}, which "
                         f"is not a vertex") from None
    succ_data = np.array(list(chain.from_iterable(map(dict.values, out))), object) == "data"
    shaped = np.fromiter((x is not None for x in shapes), bool, len(shapes))
    shape = list(chain.from_iterable([x for x in shapes if x is not None]))
    lengths = list(map(len, out))

    def names(values: list) -> Any:
        return arrow.names(values, pa)

    def numbers(values: Any, kind: str = "int64") -> Any:
        return arrow.numbers(values, kind, pa)

    columns = {
        "id": arrow.strings(ids, pa),
        "kind": names(kind),
        "device": names(device),
        "bytes": numbers(nbytes),
        "loc_device": names([x and x.device for x in loc]),
        "loc_offset": numbers([x and x.offset for x in loc]),
        "loc_size": numbers([x and x.size for x in loc]),
        "task": arrow.strings(task, pa),
        "of": arrow.strings(of, pa),
        "op": names(op),
        "flops": numbers(flops, "float64"),
        "inputs": arrow.lists(numbers(inputs, "int32"), list(map(len, ins)), None, pa),
        "order": numbers(order),
        "time": numbers(times, "float64"),
        "shape": arrow.lists(numbers(shape), [0 if x is None else len(x) for x in shapes],
                             shaped, pa),
        "dtype": names(dtype),
        "succ": arrow.lists(numbers(succ, "int32"), lengths, None, pa),
        "succ_data": arrow.lists(arrow.booleans(succ_data, pa), lengths, None, pa),
    }
    meta = orjson.dumps(graph)
    return pa.table(columns).replace_schema_metadata({GRAPH_KEY: meta, FORMAT_KEY: FORMAT})


# -- reading ----------------------------------------------------------------------------------
def read(path: str | Path) -> MemGraph:
    """Read the MemGraph Parquet file ``path``, every field checked.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    MemGraph

    Raises
    ------
    GraphError
        Naming the file, the vertex and the field, as the JSON reader's do.
    OffloadlabError
        If pyarrow is missing.
    """
    pa = need_pyarrow("MemGraph Parquet files")
    import pyarrow.parquet as pq

    where = f"MemGraph Parquet file {str(path)!r}"
    nodelink.check_input(path, "MemGraph Parquet")
    try:
        with open(path, "rb") as f:     # names what is wrong with the path, as JSON's reader
            head = f.read(1)
    except OSError as exc:
        raise GraphError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        table = pq.ParquetFile(str(path)).read()
        table.validate(full=True)       # UTF-8 strings, dictionary indices within range
    except (OSError, pa.ArrowException, ValueError) as exc:
        hint = " (it begins with '{': node-link JSON? name it .json)" if head == b"{" else ""
        raise GraphError(f"{where}: not a readable Parquet file ({exc}){hint}") from None
    with no_gc():
        mg = _memgraph(table, where, pa)
    del table       # its buffers back to the system: Arrow's allocator keeps what it frees,
    pa.default_memory_pool().release_unused()   # 600 bytes a vertex of the benchmark DAG
    return mg


def _memgraph(table: Any, where: str, pa: Any) -> MemGraph:
    """The MemGraph of a table read from ``where``: the metadata, then column by column."""
    meta = table.schema.metadata or {}
    if meta.get(FORMAT_KEY) != FORMAT or GRAPH_KEY not in meta:
        raise GraphError(f"{where}: not a MemGraph Parquet file of offloadlab (its schema "
                         f"metadata lacks {FORMAT_KEY.decode()}={FORMAT.decode()} or "
                         f"{GRAPH_KEY.decode()})")
    try:
        graph = orjson.loads(meta[GRAPH_KEY])
    except orjson.JSONDecodeError as exc:
        raise GraphError(f"{where}: {GRAPH_KEY.decode()} is not strict JSON ({exc})") from None
    _, attrs = nodelink.graph_meta({"graph": graph}, where, "MemGraph")
    cols = _Columns(table, where, pa)
    ids = cols.ids()
    n = len(ids)
    vertex = cols.vertex

    kind, device = cols.strings("kind"), cols.strings("device")
    _check_kinds(kind, device, vertex)
    nbytes = cols.numbers("bytes", count=True, positive=True)
    flops = cols.numbers("flops", default=0.0)
    order = cols.numbers("order", count=True, default=0)
    time = cols.numbers("time")
    op = cols.strings("op")
    for i in _firsts(op, [k == "compute" for k in kind]):
        problem = op_problem(op[i])
        if problem is not None:
            raise GraphError(f"{vertex(i)}: {problem}")
    dtype = [x or "float32" for x in cols.strings("dtype", default="float32")]   # as JSON
    for i in _firsts(dtype):
        if dtype[i] not in DTYPES:
            raise GraphError(f"{vertex(i)}: unknown dtype {dtype[i]!r}; known: "
                             f"{', '.join(DTYPES)}")
    locs = _locations(cols)
    shapes = _shapes(cols, nbytes, dtype)
    ids_at = np.array(ids, dtype=object)
    offsets, inputs = cols.rows("inputs")
    at, flat_inputs = offsets.tolist(), ids_at[inputs].tolist()
    inputs_of = [tuple(flat_inputs[at[i]:at[i + 1]]) for i in range(n)]   # a tuple of its size
    mg = MemGraph(attrs)
    vertices = mg.vertices = dict(zip(ids, map(
        MemVertex, ids, kind, device, nbytes, locs, cols.vertex_names("task", ids_at),
        cols.vertex_names("of", ids_at), op, flops, inputs_of, order, time, shapes, dtype)))
    if len(vertices) < n:
        seen: set[str] = set()
        for x in ids:
            if x in seen:
                raise GraphError(f"{where}: duplicate vertex id {x!r}")
            seen.add(x)
    _edges(mg, cols, ids, ids_at)
    return mg


class _Columns:
    """The columns of a MemGraph table, each checked for its type (:data:`COLUMNS`) and
    given as NumPy arrays or Python lists; a missing optional column is all null."""

    def __init__(self, table: Any, where: str, pa: Any):
        self.pa, self.where, self.n = pa, where, table.num_rows
        self.columns: dict[str, Any] = {}
        names = table.column_names
        for name in REQUIRED:
            if name not in names:
                raise GraphError(f"{where}: no {name!r} column (a MemGraph table has "
                                 f"{', '.join(COLUMNS)})")
        for name in COLUMNS:                  # "id" first: the others' errors name vertices
            if names.count(name) > 1:
                raise GraphError(f"{where}: column {name!r} appears {names.count(name)} times")
            if name in names:
                self.columns[name] = self._typed(name, table.column(name).combine_chunks())

    def vertex(self, i: int) -> str:
        """Where an error in row ``i`` is: the file and the row's vertex."""
        return f"{self.where}: vertex {self.columns['id'][i].as_py()!r}"

    def _typed(self, name: str, col: Any) -> Any:
        """``col`` as its column's type (:data:`COLUMNS`): strings may stay dictionary-encoded,
        integers become floats as JSON reads them; a type that cannot stand for it, or an
        integer beyond the type's range, is refused."""
        pa, want = self.pa, COLUMNS[name][0]
        if not _accepts(want, col.type, pa):
            raise GraphError(f"{self.where}: column {name!r} must hold {COLUMNS[name][1]}, "
                             f"got {col.type}")
        target = _arrow_type(want, pa)
        if col.type == target or col.type == pa.dictionary(pa.int32(), target) and \
                not col.dictionary.null_count:
            return col
        if want in ("int64", "list<int32>", "list<int64>"):
            self._check_range(name, col, 31 if want == "list<int32>" else 63)
        try:
            return col.cast(target, safe=False)     # in range: only floats can lose digits
        except pa.ArrowException as exc:              # e.g. lists of over 2**31 values
            raise GraphError(f"{self.where}: column {name!r}: {exc}") from None

    def _check_range(self, name: str, col: Any, bits: int) -> None:
        """Refuse an integer of ``col`` (or of its lists) outside ``bits`` signed bits, naming
        its vertex as the JSON reader would."""
        import pyarrow.compute as pc
        listed = name in ("inputs", "shape", "succ")
        flat = pc.list_flatten(col) if listed else col
        values = np.asarray(flat.fill_null(0))
        bad = (values > (1 << bits) - 1) | (values < -(1 << bits)) if values.dtype.kind == "i" \
            else values > (1 << bits) - 1
        if not bad.any():
            return
        at = _first(bad)
        value = int(values[at])
        if not listed:
            number(value, self.vertex(at), name, count=True, positive=name in REQUIRED)
        i = _row(_offsets(col), at)
        if name == "shape":
            raise GraphError(f"{self.vertex(i)}: shape {col[i].as_py()} has an element beyond "
                             f"64 bits")
        raise GraphError(f"{self.vertex(i)}: {name} names row {value}, but the file has "
                         f"{self.n} rows")

    def ids(self) -> list[str]:
        """The ``id`` column, none of it null."""
        col = self.columns["id"]
        if col.null_count:
            i = _first(np.asarray(col.is_null()))
            raise GraphError(f"{self.where}: row {i} has no id (a string)")
        return col.to_pylist()

    def strings(self, name: str, default: str | None = None) -> list:
        """The column's strings (few distinct values: kinds, devices, ops), interned,
        ``default`` for null; a null in a required column is refused."""
        col = self.columns.get(name)
        if col is None:
            return [default] * self.n
        if name in REQUIRED and col.null_count:
            raise GraphError(f"{self.vertex(_first(np.asarray(col.is_null())))}: {name} must be "
                             f"a string, got missing or null")
        encoded = col if self.pa.types.is_dictionary(col.type) else col.dictionary_encode()
        values: list[str | None] = [None if x is None else intern(x)
                                     for x in encoded.dictionary.to_pylist()]
        values.append(default)
        index = np.asarray(encoded.indices.fill_null(len(values) - 1))
        return np.array(values, dtype=object)[index].tolist()

    def vertex_names(self, name: str, ids_at: Any) -> list:
        """The column's strings (``task``, ``of``), None for null, and each that is a
        vertex's id as that id's own string object (``ids_at``: the ids by row), so that a
        name costs no string of its own, as the JSON reader keeps them."""
        col = self.columns.get(name)
        if col is None:
            return [None] * self.n
        import pyarrow.compute as pc
        ids = self.columns["id"]
        plain = [c.dictionary_decode() if self.pa.types.is_dictionary(c.type) else c
                 for c in (col, ids)]
        rows = pc.index_in(plain[0], value_set=plain[1])
        found = np.asarray(rows.is_valid())
        out = np.empty(self.n, dtype=object)
        out[found] = ids_at[np.asarray(rows.drop_null())]
        out[~found] = plain[0].filter(pc.invert(rows.is_valid())).to_pylist()
        return out.tolist()

    def numbers(self, name: str, count: bool = False, positive: bool = False,
                default: float | None = None) -> list:
        """The column's numbers, checked as :func:`checks.number` checks a JSON field;
        null is ``default`` (a required column may hold none)."""
        col = self.columns.get(name)
        if col is None:
            return [default] * self.n
        valid = np.asarray(col.is_valid())
        values = np.asarray(col.fill_null(0))
        ok = (values > 0 if positive else values >= 0) & (values <= MAX_COUNT if count
                                                         else np.isfinite(values))
        bad = ~ok & valid
        if name in REQUIRED:
            bad |= ~valid
        if bad.any():
            i = _first(bad)
            got = values[i].item() if valid[i] else None
            number(got, self.vertex(i), name, count=count, positive=positive)
        out = values.tolist()
        if not valid.all():
            for i in np.flatnonzero(~valid).tolist():
                out[i] = default
        return out

    def lists(self, name: str) -> tuple[Any, Any, Any]:
        """A list column as (offsets, flat values, valid): row i's values are
        ``values[offsets[i]:offsets[i + 1]]``; a null list is empty, a null in a list is
        refused."""
        col = self.columns.get(name)
        if col is None:
            return np.zeros(self.n + 1, np.int64), np.zeros(0, np.int64), \
                np.zeros(self.n, bool)
        import pyarrow.compute as pc
        offsets = _offsets(col)
        flat = pc.list_flatten(col)
        if flat.null_count:
            i = _row(offsets, _first(np.asarray(flat.is_null())))
            raise GraphError(f"{self.vertex(i)}: {name} must be {COLUMNS[name][1]}, got "
                             f"{col[i].as_py()}")
        return offsets, np.asarray(flat), np.asarray(col.is_valid())

    def rows(self, name: str) -> tuple[Any, Any]:
        """A column of row numbers: (offsets, flat row numbers), each checked."""
        offsets, values, _ = self.lists(name)
        n = self.n
        if len(values) and not (values.min() >= 0 and values.max() < n):
            at = _first((values < 0) | (values >= n))
            raise GraphError(f"{self.vertex(_row(offsets, at))}: {name} names row {values[at]}, "
                             f"but the file has {n} rows")
        return offsets, values


def _check_kinds(kind: list[str], device: list[str], vertex: Callable[[int], str]) -> None:
    """Each distinct (kind, device) once: what the JSON reader checks per vertex."""
    for i in _firsts(list(zip(kind, device))):
        problem = vertex_device_problem(kind[i], device[i])
        if problem is not None:
            raise GraphError(f"{vertex(i)}: {problem}")


def _locations(cols: _Columns) -> list[Loc | None]:
    """The ``loc`` of each vertex from its three columns, all given or all null."""
    n, vertex = cols.n, cols.vertex
    device = cols.strings("loc_device")
    offset = cols.numbers("loc_offset", count=True)
    size = cols.numbers("loc_size", count=True, positive=True)
    for i in _firsts(device):
        if device[i] is not None and not is_gpu_name(device[i]):
            raise GraphError(f"{vertex(i)}: loc.device must be a GPU ('gpu0', 'gpu1', ...), "
                             f"got {short(device[i])}")
    given = [np.asarray(cols.columns[c].is_valid()) if c in cols.columns else np.zeros(n, bool)
             for c in ("loc_device", "loc_offset", "loc_size")]
    partly = (given[0] | given[1] | given[2]) & ~(given[0] & given[1] & given[2])
    if partly.any():
        raise GraphError(f"{vertex(_first(partly))}: loc_device, loc_offset and loc_size must "
                         f"be all given or all null")
    return [d and Loc(d, o, s) for d, o, s in zip(device, offset, size)]


def _shapes(cols: _Columns, nbytes: list[int], dtype: list[str]
            ) -> list[tuple[int, ...] | None]:
    """Each vertex's shape: integers >= 0 whose elements fit in its bytes, or None."""
    vertex = cols.vertex
    offsets, values, valid = cols.lists("shape")
    if len(values) and values.min() < 0:
        i = _row(offsets, _first(values < 0))
        raise GraphError(f"{vertex(i)}: shape must be a list of integers >= 0, got "
                         f"{values[offsets[i]:offsets[i + 1]].tolist()}")
    at, flat = offsets.tolist(), values.tolist()
    shapes: list[tuple[int, ...] | None] = [None] * len(nbytes)
    known: dict[tuple[int, ...], tuple[int, ...]] = {}      # one tuple per distinct shape
    for i in np.flatnonzero(valid).tolist():
        shape = tuple(flat[at[i]:at[i + 1]])
        shape = shapes[i] = known.setdefault(shape, shape)
        need = math.prod(shape) * DTYPES[dtype[i]]
        if need > nbytes[i]:
            raise GraphError(f"{vertex(i)}: shape {list(shape)} of {dtype[i]} needs {need} "
                             f"bytes, more than its {nbytes[i]} bytes")
    return shapes


def _edges(mg: MemGraph, cols: _Columns, ids: list[str], ids_at: Any) -> None:
    """The edges from ``succ`` and ``succ_data``: each vertex's successors in the file's
    order, and its predecessors in row order, as the JSON reader adds them."""
    n = len(ids)
    at, targets = cols.rows("succ")
    data_at, data, data_valid = cols.lists("succ_data")
    lengths = np.diff(at)
    given = data_valid & (np.diff(data_at) != lengths)
    if given.any():
        i = _first(given)
        raise GraphError(f"{cols.vertex(i)}: succ_data must give one kind per successor in succ "
                         f"({lengths[i]}), got {int(data_at[i + 1] - data_at[i])}")
    is_data = np.ones(len(targets), bool)
    rows_given = np.repeat(data_valid, lengths)
    is_data[rows_given] = data
    sources = np.repeat(np.arange(n), lengths)
    kinds = np.array([intern(k) for k in EDGE_KINDS[::-1]], dtype=object)[is_data.astype(int)]
    flat_targets, flat_kinds = ids_at[targets].tolist(), kinds.tolist()
    mg.succ = dict(zip(ids, _grouped(flat_targets, flat_kinds, lengths.tolist())))
    if (sources == targets).any() or sum(map(len, mg.succ.values())) < len(targets):
        mg.succ = {x: {} for x in ids}         # a self-loop or a repeated edge: as JSON does,
        mg.pred = {x: {} for x in ids}         # skip self-loops, and a data edge wins
        for u, v, k in zip(ids_at[sources].tolist(), flat_targets, flat_kinds):
            mg.add_edge(u, v, k)
        return
    del flat_targets, flat_kinds
    by_target = np.argsort(targets, kind="stable")
    mg.pred = dict(zip(ids, _grouped(ids_at[sources[by_target]].tolist(),
                                     kinds[by_target].tolist(),
                                     np.bincount(targets, minlength=n).tolist())))


def _grouped(keys: list, values: list, lengths: list[int]) -> list[dict[str, str]]:
    """A dict per group, of ``lengths[i]`` consecutive (key, value) pairs of ``keys`` and
    ``values``: no slice or list per group."""
    pairs = zip(keys, values)
    return [dict(islice(pairs, k)) for k in lengths]


def _accepts(want: str, t: Any, pa: Any) -> bool:
    """Whether a column of arrow type ``t`` can stand for one of type ``want`` (no booleans
    or fractions for counts, as in JSON)."""
    types = pa.types
    if types.is_null(t):
        return True
    if types.is_dictionary(t):
        return _accepts(want, t.value_type, pa)
    if want.startswith("list<"):
        return (types.is_list(t) or types.is_large_list(t)) and \
            _accepts(want[5:-1], t.value_type, pa)
    if want == "string":
        return bool(types.is_string(t) or types.is_large_string(t))
    if want in ("int64", "int32"):
        return bool(types.is_integer(t))
    if want == "float64":
        return bool(types.is_integer(t) or types.is_floating(t))
    return bool(types.is_boolean(t))


def _arrow_type(want: str, pa: Any) -> Any:
    """The arrow type named ``want`` (:data:`COLUMNS`' spelling)."""
    if want.startswith("list<"):
        return pa.list_(_arrow_type(want[5:-1], pa))
    return {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(),
            "float64": pa.float64(), "bool": pa.bool_()}[want]


def _offsets(col: Any) -> Any:
    """Where each list of the list column ``col`` starts in its flat values, and the end: a
    null list is empty."""
    import pyarrow.compute as pc
    offsets = np.zeros(len(col) + 1, np.int64)
    np.cumsum(np.asarray(pc.list_value_length(col).fill_null(0)), out=offsets[1:])
    return offsets


def _row(offsets: Any, at: int) -> int:
    """The row whose list holds flat value ``at``."""
    return int(np.searchsorted(offsets, at, side="right")) - 1


def _first(mask: Any) -> int:
    """The index of the first true value of ``mask``."""
    return int(np.argmax(mask))


def _firsts(values: list, keep: list[bool] | None = None) -> list[int]:
    """The row of the first occurrence of each distinct value (among ``keep`` rows)."""
    rows = range(len(values)) if keep is None else [i for i, k in enumerate(keep) if k]
    kept = values if keep is None else [values[i] for i in rows]
    first = dict(zip(reversed(kept), reversed(rows)))      # the last write of each is its first
    return sorted(first.values())
