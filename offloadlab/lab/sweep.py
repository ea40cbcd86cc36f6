"""Sweeps: one problem's parameters over a grid, each point planned, verified and simulated on
``dask.distributed``, finished points kept in a store so that a sweep resumes where it stopped.

A grid axis is ``machine.FIELD=v1,v2,...`` (any Machine field), ``workload.OPTION=...`` (an
option of the workload), ``planner=spec1;spec2`` or ``policy=dynamic,fixed``.  Each point has
a content hash of everything that determines its result (the workload spec or the TaskGraph
file's bytes, the machine's fields, the planner spec, the policy and the toolkit's code:
:func:`code_hash`, so that a changed planner reruns); the store, an SQLite file written by this
process only and named after the sweep by default (:func:`default_store`), maps hashes to
finished rows, and a point whose hash is there is never run again.  The table is the store's
rows in grid order, so an interrupted sweep that is run again ends with the same table as one
that never stopped.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import SpecError
from ..core.spec import parse_spec

if TYPE_CHECKING:
    import pandas as pd

@dataclass(frozen=True)
class Point:
    """One point of a sweep: the full specs it runs and its grid coordinates."""

    workload: str
    machine: str
    planner: str
    policy: str
    coordinates: tuple[tuple[str, str], ...]
    taskgraph: str | None = None      # a TaskGraph file, read where the point runs

    def key(self, salt: str) -> str:
        """The content hash of everything that determines this point's row.

        Parameters
        ----------
        salt : str
            The hash of the TaskGraph file the point reads ("" for a workload spec).

        Returns
        -------
        str
            A SHA-256 hex digest.
        """
        from ..core.machine import machine_from_spec
        text = json.dumps([self.workload, salt, machine_from_spec(self.machine).to_dict(),
                           self.planner, self.policy, code_hash()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def code_hash() -> str:
    """:func:`tree_hash` of the offloadlab package this process runs, computed once.

    Its sources, compiled modules and bundled model graphs: any change to the code that
    plans, verifies or simulates a point changes every point's key.

    Returns
    -------
    str
    """
    return tree_hash(Path(__file__).resolve().parents[1])


def tree_hash(folder: Path) -> str:
    """The SHA-256 of the names and contents of the files under ``folder``, less bytecode.

    Parameters
    ----------
    folder : Path
        The folder.

    Returns
    -------
    str
        The hex digest.
    """
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            name = path.relative_to(folder).as_posix().encode()
            digest.update(len(name).to_bytes(4, "big") + name)
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def default_store(points: Sequence[Point]) -> Path:
    """Where a sweep keeps its points unless told: ``offloadlab-out/sweep-NAME-HASH.sqlite``.

    NAME the workload's (or the TaskGraph file's), HASH of the sweep's points (their specs,
    planners and policies), so that two sweeps do not share a store by accident.

    Parameters
    ----------
    points : sequence of Point
        The sweep's points.

    Returns
    -------
    Path
    """
    name = "empty"
    if points:
        first = points[0]
        name = Path(first.taskgraph).stem if first.taskgraph else parse_spec(first.workload)[0]
    what = [(p.workload, p.taskgraph, p.machine, p.planner, p.policy) for p in points]
    digest = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path("offloadlab-out") / f"sweep-{safe}-{digest}.sqlite"


def parse_axis(text: str) -> tuple[str, list[str]]:
    """``machine.h2d_bandwidth=4e9,12e9`` -> ``("machine.h2d_bandwidth", ["4e9", "12e9"])``.

    Planner specs, which contain commas, are separated by ``;``.

    Parameters
    ----------
    text : str
        One ``--grid`` axis.

    Returns
    -------
    (str, list of str)
        The axis and its values.

    Raises
    ------
    SpecError
        Not an axis, an empty value or a value given twice.
    """
    key, eq, values = text.partition("=")
    key = key.strip()
    field = key.partition(".")[2]
    if not eq or not (key in ("planner", "policy") or (
            key.startswith(("machine.", "workload.")) and field.isidentifier())):
        raise SpecError(f"--grid {text!r}: expected machine.FIELD=..., workload.OPTION=..., "
                        f"planner=SPEC;SPEC or policy=P,P")
    items = [v.strip() for v in values.split(";" if key == "planner" else ",")]
    if not all(items):
        raise SpecError(f"--grid {text!r}: an empty value")
    if len(set(items)) != len(items):
        raise SpecError(f"--grid {text!r}: a value given twice")
    return key, items


def _with(spec: str, key: str, value: str) -> str:
    """``spec`` with option ``key`` set to ``value``."""
    name, options = parse_spec(spec)
    options[key] = value
    return name + ":" + ",".join(f"{k}={v}" for k, v in options.items())


def grid(workload: str | None, taskgraph: str | None, machine: str, planners: Sequence[str],
         policies: Sequence[str], axes: Sequence[str]) -> list[Point]:
    """Every point of the grid, each spec checked before anything runs.

    In order: the last axis varies fastest.

    Parameters
    ----------
    workload : str or None
        The workload spec (or None, with ``taskgraph``).
    taskgraph : str or None
        A TaskGraph file instead.
    machine : str
        The machine spec.
    planners : sequence of str
        Planner specs.
    policies : sequence of str
        Dispatch policies.
    axes : sequence of str
        ``--grid`` axes (:func:`parse_axis`).

    Returns
    -------
    list of Point

    Raises
    ------
    SpecError
        A bad axis or spec, or an axis given twice.
    """
    from ..core.dispatch import check_policy
    from ..core.machine import machine_from_spec
    from ..core.workloads import build_workload
    from ..planner.registry import check_spec

    parsed = [parse_axis(a) for a in axes]
    names = [k for k, _ in parsed]
    if len(set(names)) != len(names):
        raise SpecError(f"--grid: an axis given twice: {', '.join(names)}")
    if taskgraph and any(k.startswith("workload.") for k in names):
        raise SpecError("--grid: workload.* axes need --workload, not --taskgraph")
    if "planner" not in names:
        parsed.insert(0, ("planner", list(planners)))
    if "policy" not in names:
        parsed.insert(1, ("policy", list(policies)))
    points = []
    for values in itertools.product(*(v for _, v in parsed)):
        w, m = workload or "", machine
        chosen = dict(zip((k for k, _ in parsed), values))
        for key, value in chosen.items():
            if key.startswith("machine."):
                m = _with(m, key[len("machine."):], value)
            elif key.startswith("workload."):
                w = _with(w, key[len("workload."):], value)
        coordinates = tuple((k, chosen[k]) for k in names if k not in ("planner", "policy"))
        points.append(Point(w, m, chosen["planner"], chosen["policy"], coordinates, taskgraph))
    checked: set[str] = set()
    for p in points:                      # each distinct spec once, before any work
        for spec, check in ((p.machine, machine_from_spec), (p.planner, check_spec),
                            (p.policy, check_policy)):
            if spec not in checked:
                check(spec)
                checked.add(spec)
        if p.workload and p.workload not in checked:
            _check_workload(p.workload, build_workload)
            checked.add(p.workload)
    return points


def _check_workload(spec: str, build: Callable[[str], Any]) -> None:
    from ..core.spec import apply_options
    from ..core.workloads import WORKLOADS, workload_options
    name, options = parse_spec(spec)
    if name not in WORKLOADS:
        build(spec)                       # raises the usual error naming the known workloads
    apply_options(workload_options(name), options, f"workload {name!r}")


def run_point(point: Point) -> dict[str, object]:
    """Plan, verify and simulate one point.

    Parameters
    ----------
    point : Point
        The point.

    Returns
    -------
    dict of str to object
        Its row: the full workload and machine specs, the grid coordinates, then the columns
        of :func:`offloadlab.lab.compare.compare_planners`.
    """
    from .. import __version__
    from ..core.errors import OffloadlabError
    from ..core.formats import taskgraph_from_json
    from ..core.machine import machine_from_spec
    from ..core.workloads import build_workload
    from .compare import compare_planners

    workload = point.taskgraph or point.workload
    where = {"workload": workload, "machine": point.machine, **coordinate_values(point)}
    try:
        graph = taskgraph_from_json(point.taskgraph) if point.taskgraph else \
            build_workload(point.workload)
    except OffloadlabError as exc:        # e.g. a grid value the workload cannot be built with
        return {**where, "planner": point.planner, "policy": point.policy,
                "version": __version__, "error": str(exc)}
    table = compare_planners(graph, machine_from_spec(point.machine), [point.planner],
                             policy=point.policy, workload=workload,
                             machine_text=point.machine)
    row = table.astype(object).where(table.notna(), None).to_dict("records")[0]
    return {**where, **row}


def coordinate_values(point: Point) -> dict[str, object]:
    """The point's grid coordinates as the values they set.

    A machine field in its unit (bytes, bytes/s, seconds; an unlimited rate or host memory
    ``None``), a workload option as its type.

    Parameters
    ----------
    point : Point
        The point.

    Returns
    -------
    dict of str to object
    """
    from ..core.machine import machine_from_spec
    from ..core.spec import apply_options
    from ..core.workloads import workload_options

    machine = machine_from_spec(point.machine).to_dict()
    options: dict[str, object] = {}
    if point.workload:
        name, given = parse_spec(point.workload)
        options = apply_options(workload_options(name), given, f"workload {name!r}")
    return {key: machine.get(key[len("machine."):]) if key.startswith("machine.")
            else options[key[len("workload."):]] for key, _ in point.coordinates}


class Store:
    """Finished points of a sweep: an SQLite file mapping each point's hash to its row,
    written by one process (the one running the sweep) and committed point by point."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with closing(self._connect()) as db, db:
                db.execute("CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, row TEXT)")
        except sqlite3.DatabaseError as exc:
            raise SpecError(f"--store {str(self.path)!r} is not a sweep store: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(self.path)
        except sqlite3.Error as exc:
            raise SpecError(f"--store: cannot open {str(self.path)!r}: {exc}") from None

    def rows(self, keys: Sequence[str]) -> dict[str, dict]:
        """The finished rows among ``keys``.

        Parameters
        ----------
        keys : sequence of str
            Points' keys (:meth:`Point.key`).

        Returns
        -------
        dict of str to dict
            The rows found, by key.

        Raises
        ------
        SpecError
            The file is not a sweep store.
        """
        with closing(self._connect()) as db:
            try:
                found = dict(db.execute("SELECT key, row FROM points"))
            except sqlite3.DatabaseError as exc:
                raise SpecError(f"--store {str(self.path)!r} is not a sweep store: {exc}"
                                ) from None
        return {k: json.loads(found[k]) for k in keys if k in found}

    def add(self, db: sqlite3.Connection, key: str, row: dict) -> None:
        """Store ``row`` under ``key``, committed at once.

        Parameters
        ----------
        db : sqlite3.Connection
            A connection to the store.
        key : str
            The point's key.
        row : dict
            Its row (finite numbers only).
        """
        with db:
            db.execute("INSERT OR REPLACE INTO points VALUES (?, ?)",
                       (key, json.dumps(row, allow_nan=False)))


def sweep(points: Sequence[Point], store: Store | None = None, *, cluster: str | None = None,
          workers: int | None = None, progress: Callable[[int, int], None] | None = None,
          say: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Run the points not yet in ``store``, storing each row as it finishes.

    Parameters
    ----------
    points : sequence of Point
        The grid (:func:`grid`).
    store : Store, optional
        Where finished rows are kept; default :func:`default_store`'s.
    cluster : str, optional
        The address of a dask scheduler to run on.
    workers : int, optional
        Processes of a ``LocalCluster`` (default one per core); 0 (and no ``cluster``):
        in this process.
    progress : callable, optional
        ``progress(done, total)`` hears of each finished point.
    say : callable, optional
        ``say(line)`` hears how many points are already stored.

    Returns
    -------
    pandas.DataFrame
        Every point's row, in grid order.

    Raises
    ------
    SpecError
        A bad store or cluster, an unreadable TaskGraph file, or no dask.distributed.
    """
    import pandas as pd

    if store is None:
        path = default_store(points)
        path.parent.mkdir(parents=True, exist_ok=True)
        store = Store(path)
    salt = _salts(points)
    keys = [p.key(salt.get(p.taskgraph or "", "")) for p in points]
    done = store.rows(keys)
    todo = list({k: p for k, p in zip(keys, points) if k not in done}.items())  # each once
    with _runner(cluster, workers if todo else 0) as run, closing(store._connect()) as db:
        (say or (lambda line: None))(f"{len(points)} points: {len(points) - len(todo)} "
                                     f"already in {store.path}, {len(todo)} to run")
        for n, (key, row) in enumerate(run(todo), 1):
            store.add(db, key, row)
            done[key] = row
            if progress is not None:
                progress(n, len(todo))
    from .compare import typed
    return typed(pd.DataFrame([done[k] for k in keys]))


def _salts(points: Sequence[Point]) -> dict[str, str]:
    """The SHA-256 of each TaskGraph file the points read (so that an edited file reruns)."""
    out = {}
    for path in {p.taskgraph for p in points if p.taskgraph}:
        try:
            out[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError as exc:
            raise SpecError(f"cannot read TaskGraph file {path!r}: {exc.strerror}") from None
    return out


Runner = Callable[[Sequence[tuple[str, Point]]], Iterator[tuple[str, dict]]]


@contextmanager
def _runner(cluster: str | None, workers: int | None) -> Iterator[Runner]:
    """A function from ``(key, point)`` pairs to ``(key, row)`` pairs as points finish: in
    this process (``workers=0`` and no ``cluster``), or on dask.distributed, connected (or the
    LocalCluster started) before anything runs and closed after."""
    if workers == 0 and cluster is None:
        yield lambda todo: ((key, run_point(point)) for key, point in todo)
        return
    try:
        from dask.distributed import as_completed
    except ImportError:
        raise SpecError("sweep runs on dask.distributed: pip install \"offloadlab[dist]\" "
                        "(or --workers 0 to run in this process)") from None
    from .signals import deferred

    local = client = None
    with _quiet_dask():
        try:
            # a SIGTERM or Ctrl-C while the cluster starts stops the sweep once it has: a
            # cluster cut off half-started cannot be closed, and dask's exit handler then
            # fails loudly
            with deferred():
                client, local = _client(cluster, workers)
            yield _run_on(client, as_completed)
        finally:
            with deferred():
                _close(client, local)


QUIET = "DASK_LOGGING__DISTRIBUTED"
"""The environment variable that sets a dask process's ``distributed`` log level as it
starts (dask's config, ``logging.distributed``)."""


@contextmanager
def _quiet_dask() -> Iterator[None]:
    """dask's log lines hidden while a sweep's cluster lives and closes: in this process (the
    ``distributed`` logger's level; LocalCluster's ``silence_logs`` restores its handlers'
    levels before its scheduler has stopped logging) and in the worker processes it starts
    (:data:`QUIET`).  What fails reaches the sweep as an exception; the lines are those of a
    worker or a connection closed mid-sweep (a Ctrl-C or SIGTERM to the process group)."""
    import logging
    import os

    logger, env = logging.getLogger("distributed"), os.environ.get(QUIET)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    os.environ[QUIET] = "critical"
    try:
        yield
    finally:
        logger.setLevel(level)
        if env is None:
            os.environ.pop(QUIET, None)
        else:
            os.environ[QUIET] = env


CLOSE_TIMEOUT = 30
"""Seconds that closing the client, and then the LocalCluster, may take: a worker still
running then ends with this process (it watches a pipe from it)."""


def _close(client, local) -> None:
    """Close ``client`` and ``local`` (either may be None), each within
    :data:`CLOSE_TIMEOUT`."""
    for what in (client, local):
        if what is not None:
            try:
                what.close(timeout=CLOSE_TIMEOUT)
            except TimeoutError:
                pass


def _client(cluster: str | None, workers: int | None):
    """A dask client of the scheduler at ``cluster``, or of a new LocalCluster of ``workers``
    processes: (client, the LocalCluster or None)."""
    from dask.distributed import Client, LocalCluster

    if cluster is not None:
        try:
            return Client(cluster, timeout=5), None
        except (OSError, TimeoutError) as exc:
            raise SpecError(f"--cluster {cluster}: no scheduler answers ({exc})") from None
        except ValueError as exc:           # dask's parsing of the address: 'nonsense'
            raise SpecError(f"--cluster {cluster}: not a scheduler address ({exc})") from None
    import logging
    import os

    from .signals import sigint_blocked
    # The workers never see Ctrl-C (SIGINT reaches the whole process group): this process
    # stops them.
    with sigint_blocked():
        # ":0": any free port for the scheduler's HTTP server, which runs whatever the
        # dashboard setting (None took 8787, and warned in several lines where it was taken).
        # dask's log lines stay hidden: what fails reaches this process as an exception, and
        # a worker logs a traceback where it closes during a heartbeat (a Ctrl-C mid-sweep)
        local = LocalCluster(n_workers=workers or os.cpu_count() or 1,
                             threads_per_worker=1, processes=True, dashboard_address=":0",
                             silence_logs=logging.CRITICAL)
    try:
        return Client(local), local
    except BaseException:
        _close(None, local)
        raise


def _run_on(client, as_completed) -> Runner:
    """A :data:`Runner` on ``client``'s workers."""
    def run(todo: Sequence[tuple[str, Point]]) -> Iterator[tuple[str, dict]]:
        futures = {client.submit(run_point, point, pure=False): key for key, point in todo}
        for future in as_completed(futures):
            yield futures[future], future.result()
    return run
