"""A command's output files: staged and written all or none (:class:`Outputs`), checked
before any work, and its tables, plots and traces."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import SpecError

if TYPE_CHECKING:
    import pandas as pd

    from ...core.memgraph import MemGraph


class Outputs:
    """A command's output files, written all or none.

    :meth:`file` yields a temporary path beside the destination (same suffix) to write;
    :meth:`commit` renames every one into place once the command has succeeded;
    :meth:`discard` (``main`` calls it when a command ends) removes what was not committed,
    and the directories :meth:`directory` made for them.  Errors name the user's path, never a
    temporary one.
    """

    def __init__(self) -> None:
        self.staged: list[tuple[Path, Path]] = []     # (temporary, destination)
        self.made: list[Path] = []                    # directories created, outermost first

    def directory(self, path: str | Path) -> Path:
        """Create ``path`` and its missing parents (removed again on :meth:`discard`).

        Parameters
        ----------
        path : str or Path
            The directory.

        Returns
        -------
        Path
            ``path``.

        Raises
        ------
        OSError
            It cannot be made; the error names ``path``.
        """
        path = Path(path)
        missing = [p for p in (path, *path.parents) if not p.exists()]
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _user_path_error(exc, path) from None
        self.made.extend(reversed(missing))
        return path

    @contextmanager
    def file(self, path: str | Path) -> Iterator[Path]:
        """A temporary path to write ``path``'s contents to; it becomes ``path`` on commit.

        Parameters
        ----------
        path : str or Path
            The destination.

        Yields
        ------
        Path
            The temporary file, beside ``path`` with its suffix.

        Raises
        ------
        OSError
            It cannot be made or written; the error names ``path``, not the temporary file.
        """
        path = Path(path)
        try:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                        suffix=path.suffix)
        except OSError as exc:
            raise _user_path_error(exc, path) from None
        os.close(fd)
        tmp = Path(name)
        self.staged.append((tmp, path))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        try:
            yield tmp
        except OSError as exc:
            # a failed write (a full disk) names no file: it is this one's
            if exc.filename in (None, name, tmp):
                raise _user_path_error(exc, path) from None
            raise

    def commit(self) -> None:
        """Rename every staged file into place; if one cannot be, remove those already renamed
        (and the rest) and raise naming its destination."""
        done: list[Path] = []
        for tmp, path in self.staged:
            try:
                os.replace(tmp, path)
            except OSError as exc:
                for written in done:
                    written.unlink(missing_ok=True)
                self.staged = [(t, p) for t, p in self.staged if p not in done]
                self.discard()
                raise _user_path_error(exc, path) from None
            done.append(path)
        self.staged, self.made = [], []

    def discard(self) -> None:
        """Remove the temporary files not committed and the directories made for them."""
        for tmp, _ in self.staged:
            tmp.unlink(missing_ok=True)
        for directory in reversed(self.made):
            try:
                directory.rmdir()
            except OSError:
                break                       # not empty: something else lives there
        self.staged, self.made = [], []


def _user_path_error(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` (the user's) instead of a temporary file."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


IMAGE_OPTIONS = ("gantt", "memory", "plot")


TABLE_SUFFIXES = (".csv", ".parquet")


def check_writable(args: argparse.Namespace, *options: str) -> None:
    """Fail before any work if an output file named by one of ``options`` cannot be written.

    Its directory is missing, not a directory or not writable, the path is a directory or
    another non-file, two options name the same file, one names an input file (``memgraph``,
    ``--taskgraph``), or a plot's suffix is not an image format.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments.
    *options : str
        The ``args`` attributes that name output files, e.g. ``"gantt"``.

    Raises
    ------
    SpecError
        One of them cannot be written; the message names its option and path.
    """
    seen: dict[Path, str] = {}
    for option, flag in (("memgraph", "the input"), ("taskgraph", "the input --taskgraph")):
        if getattr(args, option, None):
            seen[Path(getattr(args, option)).resolve()] = flag
    for option in options:
        value = getattr(args, option, None)
        if value is None:
            continue
        flag = "--" + option.replace("_", "-")
        if not str(value).strip():
            raise SpecError(f"{flag}: an empty file name")
        path = Path(value)
        what = f"{flag}: cannot write {str(path)!r}"
        if path.is_dir():
            raise SpecError(f"{what}: it is a directory (give a file name)")
        if path.exists() and not path.is_file():
            raise SpecError(f"{what}: it exists and is not a regular file")
        _check_directory(path.parent, what)
        if option in IMAGE_OPTIONS and path.suffix.lower() not in IMAGE_SUFFIXES:
            raise SpecError(f"{what}: an image needs one of the suffixes "
                            f"{', '.join(IMAGE_SUFFIXES)}")
        key = path.resolve()
        if key in seen:
            raise SpecError(f"{seen[key]} and {flag} name the same file {str(path)!r}")
        seen[key] = flag


def _check_directory(directory: Path, what: str) -> None:
    """``directory`` exists, is a directory and can take new files."""
    if not directory.exists():
        raise SpecError(f"{what}: directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise SpecError(f"{what}: {str(directory)!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SpecError(f"{what}: directory {str(directory)!r} is not writable")


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """An output directory that exists or can be created: no file in its way, and its nearest
    existing ancestor writable.

    Parameters
    ----------
    path : str or Path
        The directory.
    flag : str
        The option that names it, for the error.

    Raises
    ------
    SpecError
        It cannot be written into.
    """
    path = Path(path)
    what = f"{flag}: cannot write into {str(path)!r}"
    if path.exists():
        if not path.is_dir():
            raise SpecError(f"{what}: it exists and is not a directory")
        _check_directory(path, what)
        return
    ancestor = next(p for p in path.parents if p.exists())
    if not ancestor.is_dir():
        raise SpecError(f"{what}: {str(ancestor)!r} is not a directory")
    _check_directory(ancestor, what)


def check_table_suffix(path: str | None, flag: str = "--out") -> None:
    """A table's file ends in ``.csv`` or ``.parquet`` (with pyarrow installed).

    Parameters
    ----------
    path : str or None
        The file; None checks nothing.
    flag : str
        Its option, for the error.

    Raises
    ------
    SpecError
        Another suffix, or Parquet without pyarrow.
    """
    if path and Path(path).suffix.lower() not in TABLE_SUFFIXES:
        raise SpecError(f"{flag}: cannot write {path!r}: a table needs one of the suffixes "
                        f"{', '.join(TABLE_SUFFIXES)}")
    if path and path.lower().endswith(".parquet"):
        from ...core.formats.parquet import need_pyarrow
        need_pyarrow("Parquet tables", "write .csv")


def write_plots_and_traces(outputs: Outputs, runs: Mapping[str, pd.DataFrame],
                            gantt_path: Path | None, chrome_paths: dict[str, Path],
                            title: str, memory: Mapping[str, pd.DataFrame] | None = None,
                            capacity: float | None = None,
                            flows: Mapping[str, MemGraph] | None = None) -> list[Path]:
    """Stage a Gantt chart of all ``runs`` and one Chrome trace per label.

    Parameters
    ----------
    outputs : Outputs
        Where the files are staged (committed by the caller).
    runs : mapping of str to DataFrame
        Label -> Trace.
    gantt_path : Path or None
        The Gantt chart's file; None writes none.
    chrome_paths : dict of str to Path
        Label -> its Chrome trace's file.
    title : str
        The chart's title.
    memory : mapping of str to DataFrame, optional
        Label -> memory in use: a memory panel under each run, counter tracks in its trace.
    capacity : float, optional
        GPU memory, a line in the memory panels.
    flows : mapping of str to MemGraph, optional
        Label -> its MemGraph: flow arrows along the data edges in its trace.

    Returns
    -------
    list of Path
        The files staged.
    """
    written: list[Path] = []
    if gantt_path is not None:
        from ..plots import gantt
        with outputs.file(gantt_path) as tmp:
            gantt(runs, tmp, title=title, memory=memory, capacity=capacity)
        written.append(gantt_path)
    if chrome_paths:
        from ...core.trace import write_chrome_trace
        for label, path in chrome_paths.items():
            mg = (flows or {}).get(label)
            edges = [(u, v) for u, v, kind in mg.edges() if kind == "data"] if mg else []
            with outputs.file(path) as tmp:
                write_chrome_trace(runs[label], tmp, (memory or {}).get(label), edges)
            written.append(path)
    return written


def write_table(args: argparse.Namespace, table: pd.DataFrame, option: str = "out"
                ) -> list[str]:
    """Write the file of ``--out`` (or of another ``option``; CSV, or Parquet for ``.parquet``),
    not yet committed.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments and its outputs.
    table : DataFrame
        The table.
    option : str
        The ``args`` attribute naming the file.

    Returns
    -------
    list of str
        Its path, or nothing when the option is not given.
    """
    path = getattr(args, option)
    if not path:
        return []
    with args.outputs.file(path) as tmp:
        if path.lower().endswith(".parquet"):
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
    return [path]


def write_table_and_plot(args: argparse.Namespace, table: pd.DataFrame, plot: str,
                          title: str, **options: object) -> list[str]:
    """Write ``--out`` (CSV or Parquet) and ``--plot`` (``plots.<plot>``), and commit.

    Parameters
    ----------
    args : argparse.Namespace
        Its ``--out``, ``--plot`` and outputs.
    table : DataFrame
        The rows to write and draw.
    plot : str
        The function of :mod:`offloadlab.lab.plots` that draws it.
    title : str
        The plot's title.
    **options
        More for the plot function.

    Returns
    -------
    list of str
        The paths written.
    """
    from .. import plots
    written = write_table(args, table)
    if args.plot:
        with args.outputs.file(args.plot) as tmp:
            getattr(plots, plot)(table, tmp, title=title, **options)
        written.append(args.plot)
    args.outputs.commit()
    return written
