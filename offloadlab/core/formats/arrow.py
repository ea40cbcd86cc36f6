"""Arrow arrays made from Python lists and NumPy arrays through their buffers, as the Arrow
columnar format lays them out (a validity bitmap, offsets, values), for the Parquet writer.

``pyarrow.array`` imports pandas on its first call, to ask whether its argument is a pandas
object: 0.4-0.55 s and 46 MB that a ``plan`` writing Parquet need not pay
(``Array.from_buffers`` does not).  Nothing here imports pyarrow: the writer passes it in.
"""

from __future__ import annotations

from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np

__all__ = ["numbers", "strings", "names", "lists", "booleans"]

TYPES = {"int64": np.int64, "int32": np.int32, "float64": np.float64}


def _validity(valid: Any, pa: Any) -> Any:
    """The validity bitmap of the bools ``valid``, or None where every one is true."""
    if valid is None:
        return None
    valid = np.asarray(valid, dtype=bool)
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _nulls(values: list, fill: Any) -> tuple[list, Any]:
    """``values`` with ``fill`` for each None, and which were not None (None: all were)."""
    if None not in values:
        return values, None
    valid = np.fromiter(map(is_not, values, repeat(None)), bool, len(values))
    return [fill if x is None else x for x in values], valid


def numbers(values: Any, kind: str, pa: Any) -> Any:
    """A column of ``kind`` (``int64``, ``int32``, ``float64``) of the list or array
    ``values``, null for None.

    Parameters
    ----------
    values : list or ndarray
        The numbers; a list may hold None.
    kind : str
        The column's type: ``int64``, ``int32`` or ``float64``.
    pa : module
        pyarrow.

    Returns
    -------
    pyarrow.Array

    Raises
    ------
    OverflowError
        For an integer beyond the type, as ``pyarrow.array`` does.
    """
    valid = None
    if isinstance(values, list):
        values, valid = _nulls(values, 0)
    data = np.ascontiguousarray(values, dtype=TYPES[kind])
    return pa.Array.from_buffers(getattr(pa, kind)(), len(data),
                                 [_validity(valid, pa), pa.py_buffer(data)])


def booleans(values: Any, pa: Any) -> Any:
    """A boolean column of the bools ``values`` (none null).

    Parameters
    ----------
    values : sequence of bool
        The values.
    pa : module
        pyarrow.

    Returns
    -------
    pyarrow.Array
    """
    values = np.asarray(values, dtype=bool)
    return pa.Array.from_buffers(pa.bool_(), len(values),
                                 [None, pa.py_buffer(np.packbits(values, bitorder="little"))])


def strings(values: list, pa: Any) -> Any:
    """A string column of ``values``, null for None (``large_string`` beyond 2 GiB).

    Parameters
    ----------
    values : list of str or None
        The strings.
    pa : module
        pyarrow.

    Returns
    -------
    pyarrow.Array

    Raises
    ------
    UnicodeEncodeError
        For a string UTF-8 cannot encode (a lone surrogate), as ``pyarrow.array`` does.
    """
    values, valid = _nulls(values, "")
    encoded = list(map(str.encode, values))
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    small = offsets[-1] < 2**31
    kind = pa.string() if small else pa.large_string()
    return pa.Array.from_buffers(kind, len(encoded), [
        _validity(valid, pa), pa.py_buffer(offsets.astype(np.int32) if small else offsets),
        pa.py_buffer(b"".join(encoded))])


def names(values: list, pa: Any) -> Any:
    """A dictionary-encoded string column of ``values`` (few distinct ones), null for None.

    Parameters
    ----------
    values : list of str or None
        The strings.
    pa : module
        pyarrow.

    Returns
    -------
    pyarrow.DictionaryArray
    """
    distinct = [x for x in dict.fromkeys(values) if x is not None]
    index: dict[str | None, int] = {x: i for i, x in enumerate(distinct)}
    index[None] = -1
    rows = np.fromiter(map(index.__getitem__, values), np.int32, len(values))
    valid = rows >= 0
    rows[~valid] = 0
    return pa.DictionaryArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), len(rows), [_validity(valid, pa), pa.py_buffer(rows)]),
        strings(distinct, pa))


def lists(values: Any, lengths: Any, valid: Any, pa: Any) -> Any:
    """A column of lists: ``values`` flat, ``lengths[i]`` of them in row i, null where
    ``valid`` is false.

    Parameters
    ----------
    values : pyarrow.Array
        Every list's items, one after the other.
    lengths : sequence of int
        Each row's number of items.
    valid : sequence of bool or None
        Which rows are not null (None: every one).
    pa : module
        pyarrow.

    Returns
    -------
    pyarrow.ListArray
    """
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.list_(values.type), len(lengths),
                                 [_validity(valid, pa), pa.py_buffer(offsets)],
                                 children=[values])
