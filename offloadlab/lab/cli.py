"""The ``offloadlab`` command line: demo, plan, simulate, run, calibrate, validate, reproduce,
list.

Every user error (an :class:`~offloadlab.core.errors.OffloadlabError`, an unwritable output,
a bad argument, running out of memory) ends with one line ``offloadlab: error: ...`` on stderr
and exit status 2, Ctrl-C with ``offloadlab: interrupted`` and status 130, and SIGTERM with
``offloadlab: terminated`` and status 143; never a traceback.  Every output path
is checked before any work starts; outputs are written to temporary files beside their
destinations (:class:`Outputs`) and renamed into place together once the command has
succeeded, so a failed command leaves none of them.  JSON on stdout and in files is strict
(no NaN or Infinity).  Heavy modules (pandas, matplotlib, simpy) are imported only by the
commands that need them, so ``offloadlab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ..core.devices import lane_key
from ..core.dispatch import POLICIES
from ..core.errors import GraphError, OffloadlabError, PlanError, SpecError, VerificationError
from ..core.ops import GENERIC, op_name
from ..core.util import fmt_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ..core.memgraph import MemGraph

DEMO_PLANNERS = ("levelwise", "buildmemgraph")
FIXED_SHOWN = {"planned": "each GPU's kernels in the planner's order (TURNIP's fixed order)",
               "replay": "a fixed order (the noiseless dynamic run's)"}

SPECS = """\
specifications:
  workloads, machines and planners are named as NAME or NAME:key=value,...  e.g.
  matmul-chain:layers=4   disco-example:gpu_memory=64MiB   buildmemgraph
  'offloadlab list' shows the names and their options."""


# -- helpers ------------------------------------------------------------------------------
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
        """Create ``path`` and its missing parents (removed again on :meth:`discard`)."""
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
        """A temporary path to write ``path``'s contents to; it becomes ``path`` on commit."""
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
            if exc.filename in (name, tmp):
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


def _positive_int(text: str) -> int:
    value = _nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _nonnegative_float(text)
    if value == 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
IMAGE_OPTIONS = ("gantt", "memory", "plot")
TABLE_SUFFIXES = (".csv", ".parquet")


def _check_writable(args: argparse.Namespace, *options: str) -> None:
    """Fail before any work if an output file named by one of ``options`` (``args``
    attributes, e.g. ``"gantt"``) cannot be written: its directory is missing, not a directory
    or not writable, the path is a directory or another non-file, two options name the same
    file, one names an input file (``memgraph``, ``--taskgraph``), or a plot's suffix is not an
    image format."""
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


def _check_out_dir(path: str | Path, flag: str = "--out") -> None:
    """An output directory that exists or can be created: no file in its way, and its nearest
    existing ancestor writable."""
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


def _progress(args: argparse.Namespace) -> bool:
    """Whether to show progress on stderr: on a terminal or with ``--progress``, never with
    ``--quiet``."""
    return not args.quiet and (args.progress or sys.stderr.isatty())


def _phases(args: argparse.Namespace):
    """The command's progress bars (:class:`~offloadlab.lab.progress.Phases`)."""
    from .progress import Phases
    return Phases(_progress(args))


def _json_text(data: object) -> str:
    """Strict JSON for stdout: a value that is not a finite number becomes ``null``."""
    return json.dumps(_finite_or_none(data), allow_nan=False)


def _finite_or_none(data: object) -> object:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite_or_none(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_or_none(v) for v in data]
    return data


def _check_streams(streams: int | None, machine) -> None:
    """Refuse ``--streams`` whose slots on every GPU of ``machine`` would not fit in the RAM
    available (:mod:`offloadlab.core.budget`)."""
    from ..core.budget import STREAM_SLOT, check_ram
    if streams is not None:
        check_ram(f"--streams {streams} on {machine.gpus} GPU(s)",
                  streams * machine.gpus * STREAM_SLOT)


def _check_makespan(makespan: float, what: str) -> None:
    """A run whose makespan is not finite came from absurd times, flops or rates."""
    if not math.isfinite(makespan):
        raise GraphError(f"the {what} makespan is {makespan}: the vertices' times, flops or "
                         f"bytes are too large for the machine's rates")


def _write_plots_and_traces(outputs: Outputs, runs: Mapping[str, pd.DataFrame],
                            gantt_path: Path | None, chrome_paths: dict[str, Path],
                            title: str, memory: Mapping[str, pd.DataFrame] | None = None,
                            capacity: float | None = None,
                            flows: Mapping[str, MemGraph] | None = None) -> list[Path]:
    """Stage a Gantt chart of all ``runs`` (label -> Trace; with ``memory``, label -> memory
    in use, a memory panel under each) and one Chrome trace per label (with its memory as
    counter tracks, and flow arrows along the data edges of the ``flows`` MemGraph)."""
    written: list[Path] = []
    if gantt_path is not None:
        from .plots import gantt
        with outputs.file(gantt_path) as tmp:
            gantt(runs, tmp, title=title, memory=memory, capacity=capacity)
        written.append(gantt_path)
    if chrome_paths:
        from ..core.trace import write_chrome_trace
        for label, path in chrome_paths.items():
            mg = (flows or {}).get(label)
            edges = [(u, v) for u, v, kind in mg.edges() if kind == "data"] if mg else []
            with outputs.file(path) as tmp:
                write_chrome_trace(runs[label], tmp, (memory or {}).get(label), edges)
            written.append(path)
    return written


# -- commands -----------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """The DISCO example: level-wise vs. buildMemGraph planning, simulated side by side."""
    from ..core.machine import machine_from_spec
    from ..core.workloads import build_workload
    from .compare import run_all, table

    _check_out_dir(args.out)
    graph = build_workload(f"matmul-chain:layers={args.layers}")
    machine = machine_from_spec("disco-example")
    print(f"DISCO example: matmul-chain, {args.layers} layers, {len(graph)} vertices, on "
          f"{machine.name} ({machine.gpus} GPUs x {fmt_bytes(machine.gpu_memory)}; "
          f"1 time unit = 1 s)")
    runs = run_all(graph, machine, [(p, "dynamic") for p in DEMO_PLANNERS],
                   progress=None if args.quiet else print)
    shown = table(runs)
    for column in ("bytes_moved", "peak_gpu_memory"):
        shown[column] = shown[column].map(fmt_bytes)
    shown["makespan"] = shown["makespan"].map(lambda s: f"{s:.6g} s")
    print()
    print(shown.to_string(index=False))
    n = args.layers
    print(f"(DISCO Sec. 2 expects level-wise offloading to take 3n = {3 * n} time units and "
          f"overlapped offloading 2n + 1 = {2 * n + 1}, for n = {n} layers)")
    print()
    out = args.outputs.directory(args.out)
    if not args.quiet:
        print(f"writing plots and traces to {out}/ ...")
    written = _write_plots_and_traces(
        args.outputs, {r.planner: r.result.trace for r in runs}, out / "gantt.png",
        {r.planner: out / f"{r.planner}.trace.json" for r in runs},
        title=f"DISCO example, {args.layers} layers on {machine.name} (dynamic dispatch)",
        memory={r.planner: r.result.memory for r in runs}, capacity=machine.gpu_memory,
        flows={r.planner: r.memgraph for r in runs})
    args.outputs.commit()
    for path in written:
        print(f"  wrote {path}")
    print("open the .trace.json files in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _taskgraph(args: argparse.Namespace):
    """The TaskGraph of ``--workload`` or ``--taskgraph``."""
    from ..core.taskgraph import TaskGraph
    from ..core.workloads import build_workload
    if args.workload is not None:           # '' too: build_workload names the empty spec
        with _phases(args).phase(f"building {args.workload}"):
            return build_workload(args.workload)
    with _phases(args).phase(f"reading {args.taskgraph}"):
        graph = TaskGraph.from_json(args.taskgraph)
    graph.name = graph.name or Path(args.taskgraph).stem     # plans name what they planned
    return graph


def _planned(args: argparse.Namespace, graph):
    """``graph``, the TaskGraph of ``--workload``/``--taskgraph``, planned with ``--planner``
    on ``--machine`` and verified: (MemGraph, TaskGraph, Machine)."""
    mg, machine = _plan(args, graph)
    with _verifying(args, mg, graph, machine, beside=False):
        pass
    return mg, graph, machine


def _plan(args: argparse.Namespace, graph):
    """``graph`` planned with ``--planner`` on ``--machine``, not verified yet: (MemGraph,
    Machine)."""
    from ..core.machine import machine_from_spec
    from ..planner import plan

    machine = machine_from_spec(args.machine)
    with _phases(args).phase(f"planning with {args.planner}", total=len(graph)) as report:
        mg = plan(graph, machine, args.planner, progress=report, evaluate=_makespan)
    return mg, machine


@contextmanager
def _verifying(args: argparse.Namespace, mg, graph, machine, path: str | None = None,
               beside: bool = True) -> Iterator[None]:
    """Verify ``mg`` against ``graph`` and ``machine`` while the block runs, on another core
    where it can and ``beside`` (:mod:`offloadlab.lab.beside`), else before the block; a
    failure raises VerificationError naming the MemGraph file ``path`` if given."""
    from .beside import verifying

    try:
        with verifying(mg, graph, machine, beside, shown=lambda: _phases(args).phase(
                f"verifying {len(mg)} MemGraph vertices")):
            yield
    except VerificationError as exc:
        if path is None:
            raise
        raise VerificationError(f"{_memgraph_file_name(path)} is not a correct plan: "
                                f"{exc}") from None


def _makespan(memgraph, machine) -> float:
    """The simulated makespan, for planners that search; imports the simulator only then."""
    from ..simulator import makespan as simulated
    return simulated(memgraph, machine)


def _memgraph_file(args: argparse.Namespace):
    """The MemGraph file ``args.memgraph`` and the machine it runs on (``--machine``, else
    the one stored in the file), verified against it."""
    mg, machine = _read_memgraph(args)
    with _verifying(args, mg, None, machine, args.memgraph, beside=False):
        pass
    return mg, machine


def _read_memgraph(args: argparse.Namespace):
    """The MemGraph file ``args.memgraph``, not verified yet, and the machine it runs on
    (``--machine``, else the one stored in the file)."""
    from ..core.machine import machine_from_spec
    from ..core.memgraph import MemGraph

    path = args.memgraph
    with _phases(args).phase(f"reading {path}"):
        mg = MemGraph.read(path)
    machine = machine_from_spec(args.machine) if args.machine else _stored_machine(mg, path)
    return mg, machine


def _memgraph_file_name(path: str) -> str:
    """How errors name a MemGraph file: ``MemGraph JSON file 'mg.json'``."""
    from ..core.nodelink import is_parquet
    return f"MemGraph {'Parquet' if is_parquet(path) else 'JSON'} file {path!r}"


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a workload or TaskGraph file on a machine, verify the MemGraph, write it (node-link
    JSON, or a Parquet table for ``--out *.parquet``)."""
    _check_writable(args, "out")
    from ..core.nodelink import parquet_name
    if parquet_name(args.out):                          # as MemGraph.write decides
        from ..core.columnar import need_pyarrow
        need_pyarrow("MemGraph Parquet files", "write .json")
    graph = _taskgraph(args)
    mg, machine = _plan(args, graph)
    _leave(graph, mg)
    with _verifying(args, mg, graph, machine):
        with args.outputs.file(args.out) as tmp, _phases(args).phase(f"writing {args.out}"):
            mg.write(tmp)
        kinds = mg.counts()
        wrote = (f"wrote {args.out}: {len(mg)} vertices, {kinds.get('offload', 0)} offloads, "
                 f"{kinds.get('reload', 0)} reloads, {kinds.get('load', 0)} loads, "
                 f"{fmt_bytes(mg.host_bytes())} moved to/from host "
                 f"(planner {args.planner}, machine {machine.name})")  # while it verifies
    args.outputs.commit()
    print(wrote)
    return 0


def _stored_machine(mg, path: str):
    """The machine a MemGraph file stores (``graph.machine``), checked field by field."""
    from ..core.machine import Machine
    data = mg.graph.get("machine")
    if data is None:
        raise SpecError(f"{path} stores no machine; pass --machine")
    return Machine.from_dict(data, f"{_memgraph_file_name(path)}: graph.machine")


def cmd_simulate(args: argparse.Namespace) -> int:
    """Verify and simulate a MemGraph file; print a summary (or one JSON object), write plots
    and traces."""
    from ..simulator import simulate

    _check_writable(args, "gantt", "memory", "chrome", "categories")
    _check_categories(args)
    mg, machine = _read_memgraph(args)
    graph = None
    if args.workload is not None or args.taskgraph is not None:
        graph = _taskgraph(args)
        _check_planned_from(mg, graph, args)
    _leave(mg, graph)
    _check_streams(args.streams, machine)
    with _verifying(args, mg, None, machine, args.memgraph), \
            _phases(args).phase(f"simulating ({args.policy})", total=len(mg)) as report:
        result = simulate(mg, machine, policy=args.policy, noise=args.noise, seed=args.seed,
                          streams=args.streams, progress=report)
    _leave(result)
    _check_makespan(result.makespan, "simulated")
    label = f"{args.memgraph} ({args.policy})"
    written = _write_plots_and_traces(
        args.outputs, {label: result.trace}, Path(args.gantt) if args.gantt else None,
        {label: Path(args.chrome)} if args.chrome else {}, title=label,
        memory={label: result.memory}, capacity=machine.gpu_memory,
        flows={label: mg} if args.flows else None)
    if args.memory:
        from .plots import memory_plot
        with args.outputs.file(args.memory) as tmp:
            memory_plot(result.memory, tmp, capacity=machine.gpu_memory, title=label)
        written.append(Path(args.memory))
    summary = {
        "memgraph": args.memgraph, "planner": mg.graph.get("planner"), "machine": machine.name,
        "policy": args.policy, "noise": args.noise, "seed": args.seed,
        "streams": args.streams or machine.streams, "vertices": len(mg),
        "makespan": float(result.makespan),
        "busy": {k: float(v) for k, v in result.busy.items()},
        "peak_memory": {k: int(v) for k, v in result.peak_memory.items()},
        "host_peak": result.host_peak, "host_memory": machine.host_memory,
        "outcome": "ok" if result.out_of_memory is None else "OOM",
    }
    why = _explained(args, summary, result.trace, mg, graph)
    written += [Path(args.categories)] if args.categories else []
    args.outputs.commit()
    if args.json:
        print(_json_text(summary))
    else:
        _print_summary(summary, machine.gpu_memory)
        if why:
            print(why)
        for path in written:
            print(f"wrote {path}")
    if result.out_of_memory is not None:
        print(f"offloadlab: {result.out_of_memory}", file=sys.stderr)
        return 1
    return 0


def _source(args: argparse.Namespace):
    """The MemGraph, TaskGraph and Machine ``run`` executes: a MEMGRAPH file with the TaskGraph
    of ``--workload``/``--taskgraph`` it was planned from (whose content hash it must record,
    if it records one), or None; else that TaskGraph planned.  A TaskGraph the executor cannot
    run is refused before planning; with ``--no-verify`` nothing is verified."""
    from ..executor import check_runnable
    if args.memgraph is None and args.workload is None and args.taskgraph is None:
        raise SpecError("run needs a MEMGRAPH file, --workload SPEC or --taskgraph FILE")
    if args.memgraph is not None:
        mg, machine = _read_memgraph(args)
        graph = None
        if args.workload is not None or args.taskgraph is not None:
            graph = _taskgraph(args)
            _check_planned_from(mg, graph, args)
        elif args.check:
            print(f"offloadlab: warning: --check compares the outputs with the TaskGraph that "
                  f"{args.memgraph} computes, not with an independent reference; pass "
                  f"--workload or --taskgraph (the one it was planned from) for that",
                  file=sys.stderr)
        if not args.no_verify:
            with _verifying(args, mg, graph, machine, args.memgraph, beside=False):
                pass
        return mg, graph, machine
    if not args.machine:
        raise SpecError("--machine is required with --workload or --taskgraph")
    graph = _taskgraph(args)
    check_runnable(graph)
    if args.no_verify:
        mg, machine = _plan(args, graph)
        return mg, graph, machine
    return _planned(args, graph)


def _check_planned_from(mg, graph, args: argparse.Namespace) -> None:
    """Refuse a MEMGRAPH that records the content hash of a TaskGraph other than ``graph``."""
    from ..core.nodelink import HASH_FIELD
    recorded = mg.graph.get(HASH_FIELD)
    if recorded is None:
        print(f"offloadlab: warning: {args.memgraph} records no TaskGraph hash (planned before "
              f"plans recorded one); checked against {args.workload or args.taskgraph} by "
              f"verifying and comparing outputs only", file=sys.stderr)
        return
    found = graph.content_hash()
    if recorded != found:
        raise SpecError(f"{args.memgraph} was planned from TaskGraph {recorded[:19]}..., not "
                        f"from {args.workload or args.taskgraph} ({found[:19]}...)")


def cmd_run(args: argparse.Namespace) -> int:
    """Execute a MemGraph for real (planning a workload first), print a summary or one JSON
    object, optionally check the outputs against a NumPy reference and write plots/traces."""
    from ..executor import RaceError, check_outputs, execute, expected_outputs, taskgraph_of

    if args.memgraph and args.planner:
        raise SpecError("--planner applies to --workload or --taskgraph, not to a MemGraph file")
    args.planner = args.planner or "buildmemgraph"
    _check_writable(args, "gantt", "chrome", "categories")
    _check_categories(args)
    mg, graph, machine = _source(args)
    _leave(mg, graph)
    _check_streams(args.streams, machine)
    try:
        with _phases(args).phase(f"running on the {args.backend} backend",
                                 total=len(mg)) as report:
            result = execute(mg, machine, backend=args.backend, policy=args.policy,
                             seed=args.seed, streams=args.streams, poison=args.poison,
                             rate_limit=not args.no_rate_limit, watchdog=args.watchdog,
                             progress=report, verify=False,       # verified by _source
                             check_races=args.check)
    except RaceError as exc:
        print(f"offloadlab: check failed: {exc}", file=sys.stderr)
        return 1
    _leave(result)
    _check_makespan(result.makespan, "measured")
    wrong = None
    if args.check:
        reference, spread = expected_outputs(graph or taskgraph_of(mg), args.backend)
        wrong = check_outputs(result.outputs, reference, args.backend, spread)
    label = f"{mg.graph.get('planner')} ({args.backend}, {args.policy})"
    written = _write_plots_and_traces(
        args.outputs, {label: result.trace}, Path(args.gantt) if args.gantt else None,
        {label: Path(args.chrome)} if args.chrome else {}, title=label,
        memory={label: result.memory}, capacity=machine.gpu_memory,
        flows={label: mg} if args.flows else None)
    summary = {
        "source": args.memgraph or args.workload or args.taskgraph,
        "planner": mg.graph.get("planner"), "machine": machine.name, "backend": args.backend,
        "policy": args.policy, "seed": args.seed, "streams": args.streams or machine.streams,
        "vertices": len(mg), "makespan": float(result.makespan),
        "correct": None if not args.check else wrong is None,
        "busy": {k: float(v) for k, v in result.busy.items()},
        "peak_memory": {k: int(v) for k, v in result.peak_memory.items()},
    }
    why = _explained(args, summary, result.trace, mg, graph)
    written += [Path(args.categories)] if args.categories else []
    args.outputs.commit()
    if args.json:
        print(_json_text(summary))
    else:
        print(f"{summary['source']}: {len(mg)} vertices (planner {summary['planner']}) on "
              f"{machine.name}, {args.backend} backend, {args.policy} dispatch, seed {args.seed}")
        print(f"measured makespan: {result.makespan:.6g} s")
        busy = sorted(summary["busy"].items(), key=lambda kv: lane_key(kv[0]))
        span = result.makespan
        print("busy:", ", ".join(f"{r} {t:.4g} s" + (f" ({100 * t / span:.0f}%)" if span else "")
                                 for r, t in busy))
        if args.check:
            print("outputs:", "equal to the reference" if wrong is None else f"WRONG: {wrong}")
        if why:
            print(why)
        for path in written:
            print(f"wrote {path}")
    if wrong is not None:
        print(f"offloadlab: check failed: {wrong}", file=sys.stderr)
        return 1
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure a backend's kernel rates, copy bandwidths, duplex factor and dispatch overhead
    through the executor and write them as a Machine JSON file."""
    from ..core.machine import machine_from_spec
    from ..executor.calibrate import calibrate

    out = Path(args.out)
    if args.table is None:
        args.table = str(out.with_suffix(".csv"))
    table_path = Path(args.table)
    _check_writable(args, "out", "table")
    base = machine_from_spec(args.machine)
    say = (lambda what: print(f"measuring {what} ...", file=sys.stderr)) \
        if _progress(args) else None
    result = calibrate(base, args.backend, quick=args.quick, progress=say)
    m = result.machine
    with args.outputs.file(out) as tmp:
        tmp.write_text(m.to_json())
    with args.outputs.file(table_path) as tmp:
        result.table.to_csv(tmp, index=False)
    args.outputs.commit()
    print(f"{m.name}: {m.source}")
    print(f"  matmul {m.gpu_flops / 1e9:.4g} GFLOP/s, add {m.gpu_mem_bandwidth / 1e9:.4g} GB/s "
          f"touched, kernel latency + dispatch {m.kernel_latency * 1e6:.3g} us")
    print(f"  float16 matmul {m.gpu_half_flops / 1e9:.4g} GFLOP/s")
    print("  other ops (GB/s written/read): " + ", ".join(
        f"{op} {written / 1e9:.3g}/{read / 1e9:.3g}" for op, written, read in m.op_rates))
    print(f"  host->GPU {m.h2d_bandwidth / 1e9:.4g} GB/s, GPU->host {m.d2h_bandwidth / 1e9:.4g} "
          f"GB/s, latency {m.link_latency * 1e6:.3g} us, duplex factor {m.duplex:.3g}")
    if m.gpus > 1:
        print(f"  GPU->GPU {m.gpu_gpu_bandwidth / 1e9:.4g} GB/s")
    print(f"  CPU matmul {m.cpu_flops / 1e9:.4g} GFLOP/s")
    print(f"  GPU engine {m.engine}")
    print(f"wrote {out} (use it as --machine {out}) and {table_path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Every planner on one problem, simulated: a row each with its makespan, traffic, memory,
    planning time, its plan's lower bound and its gap to the problem's."""
    from ..core.machine import machine_from_spec
    from ..planner.registry import check_spec
    from .compare import compare_planners

    _check_writable(args, "out", "plot")
    _check_table_suffix(args.out)
    for spec in args.planner or ():
        check_spec(spec)
    graph = _taskgraph(args)
    machine = machine_from_spec(args.machine)
    say = (lambda line: print(line, file=sys.stderr)) if _progress(args) else None
    table = compare_planners(graph, machine, args.planner, policy=args.policy,
                             measured=args.measured, backend=args.backend,
                             rate_limit=not args.no_rate_limit, progress=say,
                             workload=args.workload or args.taskgraph, machine_text=args.machine)
    failed = table["error"].notna()
    if failed.all():
        raise PlanError("every planner failed: " + "; ".join(
            f"{row['planner']}: {row['error']}" for _, row in table.iterrows()))
    written = _write_table_and_plot(args, table, "compare_plot",
                                    f"{graph.name} on {args.machine} ({args.policy} dispatch)")
    if args.json:
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        print(_json_text(records))
        return 0
    print(f"{graph.name} on {args.machine}, {args.policy} dispatch; no plan can beat "
          f"{table['problem_bound'].iloc[0]:.4g} s ({table['bound_limit'].iloc[0]} binds)")
    shown = table[~failed].drop(columns=["workload", "machine", "policy", "problem_bound",
                                         "bound_limit", "version", "error"], errors="ignore")
    if len(shown):
        for column in ("bytes_h2d", "bytes_d2h", "peak_memory", "host_peak"):
            shown[column] = shown[column].map(lambda b: fmt_bytes(int(b)))
        print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for _, row in table[failed].iterrows():
        print(f"{row['planner']}: {row['error']}")
    if machine.host_memory is not None and (table["outcome"] == "OOM").any():
        print(f"OOM: a host peak above the machine's host_memory "
              f"({fmt_bytes(machine.host_memory)}) does not fit in host RAM")
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    """The smallest GPU memory each planner needs, the host RAM it then needs, and makespan
    against GPU memory beside the lower bound."""
    from ..core.machine import machine_from_spec
    from ..planner.registry import check_spec
    from .estimate import curve_table, estimate

    _check_writable(args, "out", "plot")
    _check_table_suffix(args.out)
    for spec in args.planner or ():
        check_spec(spec)
    graph = _taskgraph(args)
    machine = machine_from_spec(args.machine)
    say = (lambda line: print(line, file=sys.stderr)) if _progress(args) else None
    found = estimate(graph, machine, args.planner, points=args.points,
                     precision=args.precision, progress=say)
    if found.smallest["error"].notna().all():
        raise PlanError("no planner can plan it at any GPU memory: " + "; ".join(
            f"{row['planner']}: {row['error']}" for _, row in found.smallest.iterrows()))
    title = f"{graph.name} on {args.machine}"
    written = _write_table(args, found.curve)
    if args.plot:
        from .plots import estimate_plot
        with args.outputs.file(args.plot) as tmp:
            estimate_plot(found, tmp, title=title)
        written.append(args.plot)
    args.outputs.commit()
    if args.json:
        def rows(table):
            return table.astype(object).where(table.notna(), None).to_dict("records")
        print(_json_text({"workload": args.workload or args.taskgraph, "machine": args.machine,
                          "bound": found.bound, "smallest": rows(found.smallest),
                          "curve": rows(found.curve)}))
        return 0
    print(f"{title} ({machine.gpus} GPU(s)); no plan can beat {found.bound:.4g} s")
    shown = found.smallest.copy()
    for column in ("smallest_gpu_memory", "host_peak"):
        shown[column] = shown[column].map(lambda b: fmt_bytes(int(b)) if b == b else "-")
    print(shown.drop(columns="error").rename(columns={
        "smallest_gpu_memory": "smallest GPU memory", "host_peak": "host RAM there",
        "makespan": "makespan there (s)"}).to_string(index=False,
                                                    float_format=lambda x: f"{x:.4g}"))
    for _, row in found.smallest[found.smallest["error"].notna()].iterrows():
        print(f"{row['planner']}: {row['error']}")
    wide = curve_table(found)
    wide["gpu_memory"] = wide["gpu_memory"].map(lambda b: fmt_bytes(int(b)))
    print("makespan (s) against GPU memory:")
    print(wide.to_string(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-"))
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    """``determinism``: TURNIP's ablation, the same MemGraph under dynamic dispatch and in a
    fixed order (``--fixed``: each GPU's kernels in the planner's order, or a replay of the
    noiseless dynamic run), many noisy seeds per noise level (and on the executor with
    --measured); ``parts``: BuildMemGraph with one part changed at a time."""
    from ..core.machine import machine_from_spec
    from ..planner.registry import check_spec
    from .ablate import ablate_determinism

    _check_writable(args, "out", "plot")
    _check_table_suffix(args.out)
    planners = args.planner or list(DEMO_PLANNERS)
    for spec in planners:
        check_spec(spec)
    graph = _taskgraph(args)
    machine = machine_from_spec(args.machine)
    if args.what == "parts":
        return _ablate_parts(args, graph, machine)
    fixed = args.fixed or "planned"
    steps = len(planners) * (1 + len(args.noise) + args.measured)   # ablate_determinism's
    with _phases(args).steps("ablating", steps) as step:
        table = ablate_determinism(graph, machine, planners, args.noise, args.seeds,
                                   measured=args.measured, backend=args.backend,
                                   rate_limit=not args.no_rate_limit, progress=step,
                                   workload=args.workload or args.taskgraph,
                                   machine_text=args.machine, fixed=fixed)
    written = _write_table_and_plot(args, table, "ablation_plot",
                                    f"{graph.name} on {args.machine}: dynamic vs the {fixed} "
                                    f"order, {args.seeds} seeds")
    if args.json:
        print(_json_text(table.to_dict("records")))
        return 0
    shown = table[["planner", "source", "noise", "mean_speedup", "ci_low", "ci_high"]].copy()
    shown["noise"] = shown["noise"].map(lambda x: "real" if x is None or x != x else f"{x:g}")
    for column in ("mean_speedup", "ci_low", "ci_high"):
        shown[column] = shown[column].map(lambda x: f"{100 * x:+.2f}%")
    print(f"{graph.name} on {args.machine}: dynamic over {FIXED_SHOWN[fixed]}, mean of "
          f"{args.seeds} seeds, 95% bootstrap interval")
    print(shown.to_string(index=False))
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Plan, verify and simulate every point of a grid on dask.distributed; finished points
    are kept in ``--store`` and never rerun."""
    import pandas as pd

    from .sweep import Store, grid, sweep

    _check_writable(args, "out", "plot", "store")
    _check_table_suffix(args.out)
    if args.taskgraph is not None:                  # before its contents are hashed
        from ..core.nodelink import check_input
        check_input(args.taskgraph, "TaskGraph JSON")
    points = grid(args.workload, args.taskgraph, args.machine,
                  args.planner or list(DEMO_PLANNERS), args.policy or ["dynamic"], args.grid)
    if args.workload is not None:                   # each workload spec, before any work
        from ..core.workloads import check_workload
        for spec in dict.fromkeys(p.workload for p in points):
            check_workload(spec)
    store = Store(args.store) if args.store else None      # None: the sweep's own
    say = (lambda line: print(line, file=sys.stderr)) if not args.quiet else None
    with _phases(args).phase("sweeping", total=len(points), unit="point") as report:
        table = sweep(points, store, cluster=args.cluster, workers=args.workers,
                      progress=lambda done, total: report(done), say=say)
    axes = [c for c in table.columns if c.startswith(("machine.", "workload."))]
    what = args.workload or args.taskgraph
    written = _write_table_and_plot(args, table, "sweep_plot", f"{what} on {args.machine}",
                                    x=axes[0] if axes else None)
    if args.json:
        print(_json_text(table.astype(object).where(table.notna(), None).to_dict("records")))
        return 0
    shown = table[[*axes, "planner", "policy",
                   *[c for c in ("makespan", "problem_bound", "gap", "bytes_h2d", "bytes_d2h",
                                 "error") if c in table]]].copy()
    for column in ("bytes_h2d", "bytes_d2h"):
        if column in shown:
            shown[column] = shown[column].map(lambda b: "" if pd.isna(b) else fmt_bytes(b))
    for axis in axes:                     # each grid value as given (8GiB, 4e9)
        shown[axis] = [dict(p.coordinates)[axis] for p in points]
    if "error" in shown:
        shown["error"] = shown["error"].fillna("")
        if not (shown["error"] != "").any():
            shown = shown.drop(columns="error")
    print(shown.to_string(index=False, na_rep="", float_format=lambda x: f"{x:.4g}"))
    for path in written:
        print(f"wrote {path}")
    return 0


def _ablate_parts(args: argparse.Namespace, graph, machine) -> int:
    """``ablate parts``: BuildMemGraph's parts one at a time."""
    from .ablate import PARTS, ablate_parts
    for flag, given in (("--plot", args.plot), ("--planner", args.planner),
                        ("--measured", args.measured), ("--fixed", args.fixed)):
        if given:
            raise SpecError(f"{flag} does not apply to ablate parts (it varies buildmemgraph's "
                            f"parts in the simulator)")
    with _phases(args).steps("ablating parts", sum(len(s) for _, s in PARTS)) as step:
        table = ablate_parts(graph, machine, args.policy, progress=step,
                             workload=args.workload or args.taskgraph, machine_text=args.machine)
    written = _write_table_and_plot(args, table, "", "")
    if args.json:
        print(_json_text(table.to_dict("records")))
        return 0
    shown = table[["part", "setting", "makespan", "change", "bytes_moved"]].copy()
    shown["change"] = shown["change"].map(lambda x: f"{100 * x:+.1f}%")
    shown["bytes_moved"] = shown["bytes_moved"].map(fmt_bytes)
    print(f"{graph.name} on {args.machine}: BuildMemGraph with one part changed at a time "
          f"({args.policy} dispatch, simulated; change against the defaults)")
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for path in written:
        print(f"wrote {path}")
    return 0


def _check_table_suffix(path: str | None, flag: str = "--out") -> None:
    if path and Path(path).suffix.lower() not in TABLE_SUFFIXES:
        raise SpecError(f"{flag}: cannot write {path!r}: a table needs one of the suffixes "
                        f"{', '.join(TABLE_SUFFIXES)}")
    if path and path.lower().endswith(".parquet"):
        from ..core.columnar import need_pyarrow
        need_pyarrow("Parquet tables", "write .csv")


def _write_table(args: argparse.Namespace, table: pd.DataFrame, option: str = "out"
                 ) -> list[str]:
    """Write the file of ``--out`` (or of another ``option``; CSV, or Parquet for
    ``.parquet``), not yet committed; its path."""
    path = getattr(args, option)
    if not path:
        return []
    with args.outputs.file(path) as tmp:
        if path.lower().endswith(".parquet"):
            table.to_parquet(tmp, index=False)
        else:
            table.to_csv(tmp, index=False)
    return [path]


def _write_table_and_plot(args: argparse.Namespace, table: pd.DataFrame, plot: str,
                          title: str, **options: object) -> list[str]:
    """Write ``--out`` (CSV or Parquet) and ``--plot`` (``plots.<plot>``); the paths."""
    from . import plots
    written = _write_table(args, table)
    if args.plot:
        with args.outputs.file(args.plot) as tmp:
            getattr(plots, plot)(table, tmp, title=title, **options)
        written.append(args.plot)
    args.outputs.commit()
    return written


def cmd_taskgraph(args: argparse.Namespace) -> int:
    """Write a workload's TaskGraph as node-link JSON (the file ``plan --taskgraph`` reads and
    ``run MEMGRAPH --check --taskgraph`` takes as the reference)."""
    from ..core.nodelink import parquet_name
    if parquet_name(args.out):
        raise SpecError(f"{args.out}: a TaskGraph is written as node-link JSON only; name the "
                        f"file .json")
    _check_writable(args, "out")
    graph = _taskgraph(args)
    with args.outputs.file(args.out) as tmp, _phases(args).phase(f"writing {args.out}"):
        graph.to_json(tmp)
    args.outputs.commit()
    if not args.quiet:
        print(f"wrote {args.out}: {len(graph)} vertices, {graph.content_hash()}")
    return 0


def cmd_import_torch(args: argparse.Namespace) -> int:
    """Trace a PyTorch module (built by ``MODULE:FACTORY`` on the meta device, no weights
    allocated) into a TaskGraph file."""
    _check_writable(args, "out")
    try:
        import torch
    except ImportError:
        raise SpecError("import-torch needs PyTorch: pip install \"offloadlab[torch]\""
                        ) from None
    from ..core.workloads.from_torch import from_torch
    factory = _factory(args.factory)
    with _phases(args).phase(f"building {args.factory} on the meta device"):
        try:
            with torch.device("meta"):
                module = factory()
        except Exception as exc:   # noqa: BLE001 - the user's code: say what it raised
            raise SpecError(f"{args.factory}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(module, torch.nn.Module):
        raise SpecError(f"{args.factory}() returned a {type(module).__name__}, not a "
                        f"torch.nn.Module")
    inputs = [torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
              for shape, dtype in args.input]
    target = None
    if args.target:
        (shape, dtype), = args.target
        target = torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
    with _phases(args).phase("tracing"):
        graph = from_torch(module, inputs, train=args.train, gpus=args.gpus, dtype=args.dtype,
                           name=args.name or args.factory.rpartition(":")[2],
                           loss=args.loss, target=target, optimizer=args.optimizer,
                           generic=args.generic)
    with args.outputs.file(args.out) as tmp, _phases(args).phase(f"writing {args.out}"):
        graph.to_json(tmp)
    args.outputs.commit()
    if not args.quiet:
        weights = sum(t.bytes for t in graph if t.kind == "input")
        generic = sum(t.op is not None and op_name(t.op) == GENERIC for t in graph)
        print(f"wrote {args.out}: {len(graph)} vertices ({graph.meta['mode']}, "
              f"{args.gpus} GPU(s)), {fmt_bytes(weights)} of inputs and weights in host RAM"
              + (f"; {generic} generic op(s) priced from shapes alone: it plans and simulates, "
                 f"the executor refuses it" if generic else ""))
    return 0


def _factory(spec: str) -> Callable[[], object]:
    """``package.module:function`` (or ``path/to/file.py:function``) -> the function.  A
    module is looked up in the working directory first, a file's imports beside the file (as
    ``uvicorn module:app`` and ``python file.py`` do)."""
    import importlib
    import importlib.util
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise SpecError(f"expected MODULE:FACTORY (e.g. mypackage.models:build or "
                        f"models.py:build), got {spec!r}")
    path = Path(where)
    if where.endswith(".py") and not path.is_file():
        raise SpecError(f"{spec}: no file {where!r}")
    first = str(path.resolve().parent) if where.endswith(".py") else os.getcwd()
    sys.path.insert(0, first)
    try:
        if where.endswith(".py"):
            found = importlib.util.spec_from_file_location(path.stem, path)
            assert found is not None and found.loader is not None
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as exc:   # noqa: BLE001 - importing the user's module ran their code
        raise SpecError(f"{spec}: importing {where!r} raised {type(exc).__name__}: {exc}"
                        ) from None
    finally:
        sys.path.remove(first)
    if not hasattr(module, name):
        raise SpecError(f"{spec}: {where!r} has no attribute {name!r}")
    factory = getattr(module, name)
    if not callable(factory):
        raise SpecError(f"{spec}: {name!r} is a {type(factory).__name__}, not a function "
                        f"returning an nn.Module")
    return factory


def _tensor_spec(text: str) -> tuple[tuple[int, ...], str]:
    """``32,256`` or ``4,64:int64`` -> (shape, dtype)."""
    shape_text, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    if dtype not in TORCH_DTYPES:
        raise argparse.ArgumentTypeError(f"dtype {dtype!r}: use one of "
                                         f"{', '.join(TORCH_DTYPES)}")
    try:
        shape = tuple(int(x) for x in shape_text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 32,256 (and :int64 for "
                                         f"indices), got {text!r}") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"a shape's sizes must be positive, got {text!r}")
    return shape, dtype


TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")


def cmd_validate(args: argparse.Namespace) -> int:
    """Simulate and execute the same MemGraphs; report the makespan's error and each
    component's, and draw both timelines."""
    from ..core.machine import machine_from_spec
    from .validate import validate

    _check_writable(args, "plot", "table")
    graph = _taskgraph(args)
    machine = machine_from_spec(args.machine)
    planners = args.planner or list(DEMO_PLANNERS)
    with _phases(args).steps("validating", len(planners)) as step:
        results = validate(graph, machine, planners, runs=args.runs, backend=args.backend,
                           policy=args.policy, rate_limit=not args.no_rate_limit,
                           progress=lambda spec: step(f"{spec}: planning, simulating and "
                                                      f"running {args.runs} time(s)"),
                           workload=args.workload or args.taskgraph, machine_text=args.machine)
    written = []
    if args.plot:
        from .plots import gantt
        traces = {}
        for r in results:
            traces[f"{r.planner}: simulated, makespan {r.table['simulated'].iloc[0]:.4g} s"] = \
                r.simulated
            traces[f"{r.planner}: measured ({args.backend}), makespan "
                   f"{r.table['measured'].iloc[0]:.4g} s; "
                   f"simulated error {100 * r.error:+.1f}%"] = r.measured
        with args.outputs.file(args.plot) as tmp:
            gantt(traces, tmp, title=f"{graph.name} on {args.machine}: simulated vs measured "
                                      f"({args.policy} dispatch)")
        written.append(args.plot)
    if args.table:
        import pandas as pd
        with args.outputs.file(args.table) as tmp:
            pd.concat([r.components() for r in results]).to_csv(tmp, index=False)
        written.append(args.table)
    args.outputs.commit()
    if args.json:
        print(_json_text([r.row() for r in results]))
    else:
        if results and results[0].noise is not None:
            print(results[0].noise)
        for r in results:
            shown = r.table.drop(columns="planner").copy()
            shown["error"] = shown["error"].map(lambda e: f"{100 * e:+.1f}%")
            print(f"{r.planner}: simulated {r.table['simulated'].iloc[0]:.4g} s, measured "
                  f"{r.table['measured'].iloc[0]:.4g} s (median of "
                  f"{', '.join(f'{s:.4g}' for s in r.makespans)}), error {100 * r.error:+.1f}%; "
                  f"outputs {'correct' if r.correct else 'WRONG'}")
            if r.warning:
                print(f"WARNING: {r.warning}")
            print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
            print()
        for path in written:
            print(f"wrote {path}")
    return 0 if all(r.correct for r in results) else 1


def cmd_diff(args: argparse.Namespace) -> int:
    """Two MemGraph files of one TaskGraph: the moves only one makes, both simulated makespans,
    and where the timelines part."""
    from ..core.machine import machine_from_spec
    from ..core.memgraph import MemGraph
    from .diff import check_same_taskgraph, diff, text

    names = (args.a, args.b)
    plans = []
    for path in names:
        with _phases(args).phase(f"reading {path}"):
            plans.append(MemGraph.read(path))
    a, b = plans
    _leave(a, b)
    check_same_taskgraph(a, b, names)
    machine = machine_from_spec(args.machine) if args.machine else _stored_machine(a, args.a)
    for mg, path in zip(plans, names):
        with _verifying(args, mg, None, machine, path, beside=False):
            pass
    with _phases(args).phase(f"simulating both ({args.policy})"):
        found = diff(a, b, machine, args.policy, names)
    if args.json:
        from dataclasses import asdict
        print(_json_text({"a": args.a, "b": args.b, "machine": machine.name,
                          "policy": args.policy, **asdict(found)}))
    else:
        print(text(found, names))
    return 0


def _explain_options(p: argparse.ArgumentParser) -> None:
    """``simulate``'s and ``run``'s ``--explain`` and ``--categories``."""
    p.add_argument("--explain", action="store_true",
                   help="say why the run is fast or slow: per GPU, the share of host copies "
                        "hidden under compute, the idle time by cause and memory by tensor "
                        "category (docs/explain.md)")
    p.add_argument("--categories", metavar="CSV", help="with --explain, write GPU memory in "
                   "use over time by category (.csv or .parquet)")


def _check_categories(args: argparse.Namespace) -> None:
    """``--categories`` needs ``--explain`` and a table's suffix."""
    if args.categories and not args.explain:
        raise SpecError("--categories writes what --explain finds: add --explain")
    _check_table_suffix(args.categories, "--categories")


def _explained(args: argparse.Namespace, summary: dict, trace, mg, graph=None) -> str:
    """With ``--explain``: each GPU's overlap and idle causes and its memory by category
    (lab/explain.py; categories from ``graph``, the TaskGraph, when at hand) into the summary,
    and as the text to print; ``--categories`` gets the memory by category over time (not yet
    committed)."""
    if not args.explain:
        return ""
    from .explain import category_table, category_text, explain, memory_by_category, records
    from .explain import text as explain_text
    table = explain(trace, mg)
    summary["explain"] = records(table)
    series = memory_by_category(trace, mg, graph)
    categories = category_table(series)
    summary["memory_by_category"] = records(categories)
    _write_table(args, series, "categories")
    return explain_text(table) + "\n" + category_text(categories)


def _print_summary(summary: dict, capacity: int) -> None:
    """The human-readable form of ``simulate``'s summary."""
    span = summary["makespan"]
    print(f"{summary['memgraph']}: {summary['vertices']} vertices (planner {summary['planner']}) "
          f"on {summary['machine']}, {summary['policy']} dispatch, noise {summary['noise']}, "
          f"seed {summary['seed']}")
    print(f"makespan: {span:.6g} s")
    busy = sorted(summary["busy"].items(), key=lambda kv: lane_key(kv[0]))
    print("busy:", ", ".join(f"{r} {t:.4g} s" + (f" ({100 * t / span:.0f}%)" if span else "")
                             for r, t in busy))
    peaks = sorted(summary["peak_memory"].items(), key=lambda kv: lane_key(kv[0]))
    print("peak memory:", ", ".join(f"{d} {fmt_bytes(b)}" for d, b in peaks),
          f"(GPU capacity {fmt_bytes(capacity)})")
    limit = summary["host_memory"]
    print(f"host peak: {fmt_bytes(summary['host_peak'])} of "
          f"{'unlimited' if limit is None else fmt_bytes(limit)} host memory"
          f"{': OUT OF MEMORY' if summary['outcome'] == 'OOM' else ''}")


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Recreate a figure or table of a paper from our cost model: a CSV table and a plot."""
    from .reproduce import COLUMNS, REPRODUCTIONS, parse_setting, shape_checks

    if args.what != "turnip-determinism":
        for flag, given in (("--noise", args.noise), ("--seeds", args.seeds),
                            ("--quick", args.quick), ("--fixed", args.fixed)):
            if given is not None:
                raise SpecError(f"{flag} applies to reproduce turnip-determinism only")
    if args.what == "turnip-determinism":
        return _reproduce_determinism(args)
    if args.what.startswith("turnip-"):
        return _reproduce_grid(args)
    run, plot, default = REPRODUCTIONS[args.what]
    settings = [parse_setting(s) for s in args.only.split(",")] if args.only else list(default)
    if not args.json:
        _check_out_dir(args.out)
    table = run(settings, solver=args.solver, time_limit=args.time_limit, weights=args.weights,
                progress=not args.json and _progress(args))
    if args.json:
        print(_json_text(table[COLUMNS + (["bandwidth"] if args.what == "beaumont-bandwidth"
                                          else [])].to_dict(orient="records")))
        return 0
    out = args.outputs.directory(args.out)
    with args.outputs.file(out / f"{args.what}.csv") as tmp:
        table.to_csv(tmp, index=False)
    with args.outputs.file(out / f"{args.what}.png") as tmp:
        plot(table, tmp)
    args.outputs.commit()
    shown = table.drop(columns=["workload", "machine", "planners", "version"])
    for column in ("sum_u", "ilp", "greedy", "l2l", "greedy_nodiscount", "first_last"):
        shown[column] = (1000 * shown[column]).round(1)
    shown["bandwidth"] = shown["bandwidth"] / 1e9
    shown["memory"] = shown["memory"].map(fmt_bytes)
    shown["weight_bytes"] = shown["weight_bytes"].map(fmt_bytes)
    print("iteration times in ms; bandwidth in GB/s each way")
    print(shown.to_string(index=False))
    if args.what == "beaumont-table1":
        failures = shape_checks(table)
        print()
        print("shape of Sec. 7.1 (bound = Σu, Greedy within 5%, L2L 10-50% above, "
              "Greedy* never better):", "holds" if not failures else "")
        for failure in failures:
            print(f"  does not hold: {failure}")
    print()
    print(f"wrote {out / (args.what + '.csv')} and {out / (args.what + '.png')}")
    return 0


def _reproduce_grid(args: argparse.Namespace) -> int:
    """One of TURNIP's LLaMA grids in simulation (prefill, Figs. 10-12; LoRA training, Fig.
    13): a CSV table and a plot."""
    from . import turnip_grid, turnip_lora, turnip_prefill

    experiment, note = {"turnip-prefill": (turnip_prefill.PREFILL, turnip_prefill.NOTE),
                        "turnip-lora": (turnip_lora.LORA, turnip_lora.NOTE)}[args.what]
    points = turnip_grid.parse_points(experiment, args.only) if args.only else None
    if not args.json:
        _check_out_dir(args.out)
    table = turnip_grid.run(experiment, points, progress=not args.json and _progress(args))
    out = _reproduction_written(args, table, lambda path: turnip_grid.plot(experiment, table,
                                                                           path))
    if out is None:
        return 0
    shown = table.drop(columns=["workload", "policy", "version"])
    for column in (experiment.time, "paper", "ratio"):
        shown[column] = shown[column].map(lambda t: "" if t != t else f"{t:.3g}")
    shown.loc[table[experiment.time].isna(), experiment.time] = "OOM"
    shown["host_peak"] = [fmt_bytes(int(b)) if notna else ""
                          for b, notna in zip(table["host_peak"], table["host_peak"].notna())]
    shown["paper_outcome"] = shown["paper_outcome"].fillna("")
    for column in turnip_grid.STAGES:
        shown[column] = shown[column].round(2)
    shown["status"] = shown["status"].str.slice(0, 60)
    if table["paper_outcome"].isna().all():
        shown = shown.drop(columns=["paper", "paper_outcome", "ratio"])
    print(f"{experiment.time}: {experiment.label}, simulated; build/plan/verify/simulate in "
          f"seconds of this machine")
    print(shown.to_string(index=False))
    print()
    print(note)
    print(f"wrote {out / (args.what + '.csv')} and {out / (args.what + '.png')}")
    return 0


def _reproduction_written(args: argparse.Namespace, table: pd.DataFrame,
                          plot: Callable[[Path], None]) -> Path | None:
    """``--json``: print the table's rows, and None; else write ``WHAT.csv`` and ``WHAT.png``
    (``plot(path)``) into ``--out``, and return that directory."""
    if args.json:
        print(_json_text(table.astype(object).where(table.notna(), None).to_dict("records")))
        return None
    out = args.outputs.directory(args.out)
    with args.outputs.file(out / f"{args.what}.csv") as tmp:
        table.to_csv(tmp, index=False)
    with args.outputs.file(out / f"{args.what}.png") as tmp:
        plot(tmp)
    args.outputs.commit()
    return out


def _reproduce_determinism(args: argparse.Namespace) -> int:
    """TURNIP's determinism ablation, Figure 14, in simulation: the paper's four cells
    beside ours, a CSV table and a plot."""
    from . import turnip_determinism as fig14
    from .turnip_grid import parse_points

    if args.only and args.quick:
        raise SpecError("--only and --quick pick the points both: give one of them")
    points = {e: parse_points(x, args.only) for e, x in fig14.EXPERIMENTS.items()} \
        if args.only else fig14.QUICK if args.quick else None
    if not args.json:
        _check_out_dir(args.out)
    table = fig14.run(points, args.noise or fig14.NOISES, args.seeds or fig14.SEEDS,
                      args.fixed or "planned", progress=not args.json and _progress(args))
    out = _reproduction_written(args, table, lambda path: fig14.plot(table, path))
    if out is None:
        return 0

    def percent(x: float) -> str:
        return "" if x != x else f"{100 * x:+.2f}%"

    shown = table.copy()
    shown["speedup (95% CI)"] = [
        "" if m != m else f"{percent(m)} ({100 * lo:+.2f} to {100 * hi:+.2f})"
        for m, lo, hi in zip(table["mean_speedup"], table["ci_low"], table["ci_high"])]
    shown["paper"] = table["paper"].map(lambda x: f"{100 * x:.2f}%")
    shown["difference"] = table["difference"].map(
        lambda x: "" if x != x else f"{100 * x:+.2f} pp")
    cells = shown["scope"] == "cell"
    print(f"Figure 14: dynamic over {FIXED_SHOWN[args.fixed or 'planned']}, buildmemgraph, "
          f"simulated; mean of {args.seeds or fig14.SEEDS} seeds, 95% bootstrap interval")
    print(shown.loc[cells, ["experiment", "machine", "noise", "points", "paper",
                            "speedup (95% CI)", "difference", "status"]].to_string(index=False))
    print()
    print("points:")
    print(shown.loc[~cells, ["experiment", "machine", "model", "seq", "batch", "noise",
                             "speedup (95% CI)", "status"]].to_string(index=False))
    print()
    print(fig14.NOTE)
    print(f"wrote {out / (args.what + '.csv')} and {out / (args.what + '.png')}")
    return 0


def _first_line(fn: Callable) -> str:
    """The first paragraph of ``fn``'s docstring, on one line."""
    return _first_paragraph(fn.__doc__ or "")


def _first_paragraph(doc: str) -> str:
    """The first paragraph of a docstring, on one line."""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    return paragraph.rstrip(".;:").replace("``", "")


def _options(options: dict[str, object]) -> str:
    """``key=value, ...`` as a spec would write them (``true``, not ``True``)."""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in options.items()) or "(no options)"


def cmd_list(args: argparse.Namespace) -> int:
    """List workloads, machine presets and planners with their options."""
    what = args.what
    if what in ("all", "workloads"):
        from ..core.workloads import WORKLOADS, workload_options
        print("workloads (--workload NAME:key=value,...):")
        for name, fn in WORKLOADS.items():
            print(f"  {name:<14} {_first_line(fn)}\n  {'':<14} {_options(workload_options(name))}")
    if what in ("all", "machines"):
        from ..core.kernel_model import FIT_SOURCE
        from ..core.machine import HOST_MEMORY, PRESETS
        print("machine presets (--machine NAME:field=value,...):")
        for name, m in PRESETS.items():
            host = "unlimited" if m.host_memory is None else fmt_bytes(m.host_memory)
            if name in HOST_MEMORY:
                host += f" ({HOST_MEMORY[name][1]})"
            fitted = f"; cost=fitted: {FIT_SOURCE}" if m.cost == "fitted" else ""
            print(f"  {name:<14} {m.gpus} GPU(s) x {fmt_bytes(m.gpu_memory)}, host memory "
                  f"{host}; {m.source}{fitted}")
    if what in ("all", "planners"):
        from dataclasses import fields

        from ..planner import PLANNERS
        print("planners (--planner NAME:key=value,...):")
        for name, planner in sorted(PLANNERS.items()):
            print(f"  {name:<14} {_first_paragraph(planner.doc)}")
            options = fields(planner.options)
            if not options:
                print(f"  {'':<14} (no options)")
            for f in options:
                print(f"  {'':<14} {_options({f.name: f.default}):<18} {f.metadata['doc']}")
    return 0


# -- parser -------------------------------------------------------------------------------
def _noise_levels(text: str) -> tuple[float, ...]:
    """``0,0.05,0.1``: noise levels, each a finite number >= 0."""
    try:
        levels = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}"
                                         ) from None
    if not all(math.isfinite(x) and x >= 0 for x in levels):
        raise argparse.ArgumentTypeError(f"noise levels must be finite and >= 0, got {text!r}")
    return levels


def _measured_options(p: argparse.ArgumentParser) -> None:
    """``--measured`` and how: the executor's backend and its copies' pacing."""
    p.add_argument("--measured", action="store_true",
                   help="also run each plan on the executor and report what it measured")
    p.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                   help="executor backend for --measured (numpy)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy at memcpy speed instead of the machine's links")


def _table_options(p: argparse.ArgumentParser, plot: str) -> None:
    """``--json``, ``--out`` and ``--plot`` of the commands that make a table."""
    p.add_argument("--json", action="store_true", help="print one JSON list of rows")
    p.add_argument("--out", metavar="FILE", help="write the table (.csv, or .parquet)")
    p.add_argument("--plot", metavar="PNG", help=plot)


def _problem_options(p: argparse.ArgumentParser) -> None:
    """``--workload SPEC`` or ``--taskgraph FILE``, one of them required."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file")


def _executor_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that execute MemGraphs."""
    p.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                   help="numpy: threads on the CPU (any machine); cupy: an NVIDIA GPU (numpy)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy as fast as memcpy instead of at the machine's "
                        "link bandwidths")


def version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed("offloadlab")
    except PackageNotFoundError:
        from .. import __version__
        return __version__


class _VersionAction(argparse.Action):
    """``--version``: print ``offloadlab X.Y.Z`` and exit 0 (the version is looked up only
    then, so that building the parser stays fast)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"offloadlab {version()}")
        parser.exit()


QUIET_HELP = "no progress output and no informational lines on stderr"
PROGRESS_HELP = "progress bars on stderr even when it is not a terminal (default: on a terminal)"


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors end like every other error: one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise SpecError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="offloadlab", epilog=SPECS, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan and simulate CPU-RAM offload of GPU computations.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    parser.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=SPECS,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=fn)
        # also after the command; SUPPRESS keeps the global flag's value when absent here
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help=QUIET_HELP)
        p.add_argument("--progress", action="store_true", default=argparse.SUPPRESS,
                       help=PROGRESS_HELP)
        return p

    p = add("demo", cmd_demo, "the DISCO example: level-wise vs. buildMemGraph planning, "
            "simulated; prints a table, writes a Gantt chart and Chrome traces")
    p.add_argument("--layers", type=_positive_int, default=8, help="matmul-chain layers (8)")
    p.add_argument("--out", default="offloadlab-out", metavar="DIR",
                   help="output directory (./offloadlab-out)")

    p = add("taskgraph", cmd_taskgraph, "write a workload's TaskGraph as node-link JSON")
    p.add_argument("--workload", required=True, metavar="SPEC",
                   help="e.g. matmul-chain:layers=4")
    p.add_argument("--out", required=True, metavar="FILE", help="TaskGraph JSON to write")

    p = add("plan", cmd_plan, "plan a workload on a machine, verify the MemGraph, write it")
    _problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. disco-example")
    p.add_argument("--planner", default="buildmemgraph", metavar="SPEC",
                   help="planner and its options (buildmemgraph)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="MemGraph to write: node-link JSON, or one Parquet table if FILE ends "
                        "in .parquet (faster for large graphs)")

    p = add("compare", cmd_compare, "every planner on one problem, simulated: makespan, "
            "traffic, memory, planning time, and the gap to the problem's lower bound")
    _problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. disco-example")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner and its options (repeatable; default: every planner)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    _measured_options(p)
    _table_options(p, "draw each planner's makespan and bounds")

    p = add("estimate", cmd_estimate, "the smallest GPU memory each planner can plan a "
            "problem in, the host RAM it then needs, and makespan against GPU memory beside "
            "the lower bound")
    _problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC",
                   help="the GPUs and links (its gpu_memory is varied), e.g. v100")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner and its options (repeatable; default: every planner)")
    p.add_argument("--points", type=_positive_int, default=8,
                   help="GPU memories on the curve (8)")
    p.add_argument("--precision", type=_positive_float, default=0.01,
                   help="the bisection's relative precision (0.01)")
    _table_options(p, "draw makespan against GPU memory")

    p = add("ablate", cmd_ablate, "determinism: dynamic dispatch against a fixed order "
            "(TURNIP's ablation: each GPU's kernels in the planner's order) under noise, with "
            "confidence intervals; parts: BuildMemGraph with one part changed at a time")
    p.add_argument("what", choices=("determinism", "parts"))
    _problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. p100x4:gpus=2")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner (repeatable; default: levelwise and buildmemgraph)")
    p.add_argument("--noise", type=_noise_levels, default=(0.0, 0.05, 0.1, 0.2),
                   metavar="X,Y,...", help="noise levels (0,0.05,0.1,0.2)")
    p.add_argument("--seeds", type=_positive_int, default=30,
                   help="noisy runs per policy and noise level (30); with --measured also "
                        "the executor's runs per policy")
    p.add_argument("--fixed", choices=tuple(FIXED_SHOWN),
                   help="determinism: the fixed order, TURNIP's (planned: each GPU's kernels "
                        "in the planner's order, the default) or the order each resource "
                        "started its vertices in a noiseless dynamic run (replay)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="parts: the dispatch policy the plans are simulated with (dynamic)")
    _measured_options(p)
    _table_options(p, "draw the speedups with their intervals")

    p = add("sweep", cmd_sweep, "plan and simulate a grid of workload, machine, planner and "
            "policy parameters on dask.distributed; resumable")
    _problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. p100x4:gpus=2")
    p.add_argument("--grid", action="append", default=[], metavar="AXIS=V1,V2",
                   help="a grid axis (repeatable): machine.FIELD=..., workload.OPTION=..., "
                        "planner=SPEC;SPEC or policy=P,P")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner (repeatable; default: levelwise and buildmemgraph)")
    p.add_argument("--policy", action="append", choices=POLICIES,
                   help="dispatch policy (repeatable; default: dynamic)")
    p.add_argument("--store", metavar="FILE",
                   help="where finished points are kept (offloadlab-out/sweep-NAME-HASH.sqlite, "
                        "one per sweep); a rerun skips them")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="a dask.distributed scheduler to run on (default: a LocalCluster)")
    p.add_argument("--workers", type=_nonnegative_int, metavar="N",
                   help="LocalCluster worker processes (default: one per core; 0: run here)")
    _table_options(p, "draw makespan against the first axis")

    p = add("import-torch", cmd_import_torch, "trace a PyTorch module (on the meta device, "
            "no weights allocated) into a TaskGraph: its forward pass, or with --train one "
            "training step")
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a function returning the nn.Module: package.module:build or "
                        "path/to/models.py:build")
    p.add_argument("--input", action="append", type=_tensor_spec, required=True,
                   metavar="SHAPE[:DTYPE]",
                   help="an input's shape (repeatable, in the forward's argument order), "
                        "e.g. 32,256 or 4,64:int64 for token ids")
    p.add_argument("--out", required=True, metavar="FILE", help="TaskGraph JSON to write")
    p.add_argument("--train", action="store_true",
                   help="one training step: forward, loss, backward, an optimizer update per "
                        "weight")
    p.add_argument("--gpus", type=_positive_int, default=1,
                   help="pipeline stages, one per GPU (1)")
    p.add_argument("--dtype", choices=("float16", "float32", "float64"),
                   help="recast every floating-point weight and input")
    p.add_argument("--loss", choices=("mean", "cross_entropy"), default="mean",
                   help="--train: the loss (mean of the output, or cross_entropy against "
                        "--target)")
    p.add_argument("--target", action="append", type=_tensor_spec, metavar="SHAPE[:DTYPE]",
                   help="--train with cross_entropy: the target's shape, e.g. 4,64:int64")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="--train: the update per weight (adam)")
    p.add_argument("--generic", action="store_true",
                   help="price an ATen op the toolkit does not know from its shapes alone (one "
                        "flop per output element, its inputs and outputs touched) as a "
                        "generic:<op> vertex, instead of an error; the executor refuses such "
                        "a graph")
    p.add_argument("--name", help="the TaskGraph's name (default: the factory's)")

    p = add("diff", cmd_diff, "two MemGraphs of one TaskGraph: what each moves that the other "
            "does not, and where their simulated timelines part")
    p.add_argument("a", metavar="A", help="a MemGraph file")
    p.add_argument("b", metavar="B", help="another MemGraph file of the same TaskGraph")
    p.add_argument("--machine", metavar="SPEC",
                   help="simulate both on this machine (default: the one A stores)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy of both simulations (dynamic)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = add("simulate", cmd_simulate, "verify and simulate a MemGraph file (exit 1 if the run "
            "holds more in host RAM than the machine's host_memory)")
    p.add_argument("memgraph", metavar="MEMGRAPH",
                   help="MemGraph file written by 'plan' (JSON or Parquet)")
    p.add_argument("--machine", metavar="SPEC",
                   help="machine to simulate on (default: the one stored in the MemGraph)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--noise", type=_nonnegative_float, default=0.0,
                   help="relative duration noise (0)")
    p.add_argument("--seed", type=_nonnegative_int, default=0, help="noise seed (0)")
    p.add_argument("--streams", type=_positive_int, metavar="K",
                   help="compute streams per GPU (default: the machine's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--memory", metavar="PNG", help="write a plot of GPU memory in use")
    p.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")
    _explain_options(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", metavar="SPEC", help="the workload MEMGRAPH was planned "
                     "from: --explain splits memory by its categories")
    src.add_argument("--taskgraph", metavar="FILE", help="the TaskGraph file MEMGRAPH was "
                     "planned from: --explain splits memory by its categories")
    p.add_argument("--flows", action="store_true",
                   help="draw the data edges as flow arrows in the --chrome trace (off: they "
                        "crowd the view of large graphs)")

    p = add("run", cmd_run, "execute a MemGraph for real (planning a workload or TaskGraph "
            "first) on the numpy or cupy backend and measure it")
    p.add_argument("memgraph", metavar="MEMGRAPH", nargs="?",
                   help="MemGraph file (JSON or Parquet)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4; with a "
                     "MEMGRAPH, the workload it was planned from (the --check reference)")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file; "
                     "with a MEMGRAPH, the one it was planned from (the --check reference)")
    p.add_argument("--machine", metavar="SPEC",
                   help="preset or Machine JSON file (default for a MEMGRAPH: its stored one)")
    p.add_argument("--planner", metavar="SPEC", help="planner for --workload/--taskgraph "
                   "(buildmemgraph)")
    _executor_options(p)
    p.add_argument("--seed", type=_nonnegative_int, default=0,
                   help="seed of the random policy (0)")
    p.add_argument("--streams", type=_positive_int, metavar="K",
                   help="compute streams per GPU (default: the machine's)")
    p.add_argument("--check", action="store_true",
                   help="detect races (an overwrite of bytes a vertex still reads) and compare "
                        "the outputs with a NumPy evaluation of the TaskGraph; exit 1 naming "
                        "the race or the first wrong output")
    p.add_argument("--no-verify", action="store_true",
                   help="run the MemGraph without verifying it first (to test a broken plan)")
    p.add_argument("--poison", action="store_true",
                   help="fill each location with NaN bytes before it is written (finds races)")
    p.add_argument("--watchdog", type=_positive_float, default=60.0, metavar="S",
                   help="stop if no vertex completes for S seconds (60)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")
    p.add_argument("--flows", action="store_true",
                   help="draw the data edges as flow arrows in the --chrome trace (off: they "
                        "crowd the view of large graphs)")
    _explain_options(p)

    p = add("calibrate", cmd_calibrate, "measure a backend's kernel rates, copy bandwidths, "
            "duplex factor and dispatch overhead through the executor; write a Machine JSON")
    p.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                   help="backend to measure (numpy)")
    p.add_argument("--machine", default="p100x4", metavar="SPEC",
                   help="the machine to start from: its fields that are not measured are kept, "
                        "and the numpy backend paces copies to its links (p100x4)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--out", required=True, metavar="JSON", help="Machine JSON file to write")
    p.add_argument("--table", metavar="CSV",
                   help="every measurement as CSV (default: beside --out, .csv)")

    p = add("validate", cmd_validate, "simulate and execute the same MemGraphs: the makespan's "
            "error and each component's (busy and idle time per resource, mean duration per "
            "vertex kind), and both timelines")
    _problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC",
                   help="a calibrated Machine JSON file (offloadlab calibrate) or a preset")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner (repeatable; default: levelwise and buildmemgraph)")
    p.add_argument("--runs", type=_positive_int, default=3,
                   help="executor runs per planner; the median is compared (3)")
    _executor_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON list, a row per planner")
    p.add_argument("--plot", metavar="PNG", help="draw simulated over measured timelines")
    p.add_argument("--table", metavar="CSV", help="write the component table")

    p = add("reproduce", cmd_reproduce, "recreate a paper's table or figure from our cost model "
            "(beaumont-table1: Table 1; beaumont-bandwidth: Figure 4; turnip-prefill: "
            "TURNIP's LLaMA prefill grid, Figs. 10-12; turnip-lora: its LoRA training grid, "
            "Fig. 13; turnip-determinism: its determinism ablation, Fig. 14)")
    p.add_argument("what", choices=("beaumont-table1", "beaumont-bandwidth", "turnip-prefill",
                                    "turnip-lora", "turnip-determinism"))
    p.add_argument("--only", metavar="SETTINGS",
                   help="comma-separated settings NETWORK-DEPTHxBATCH, e.g. gpt2-38x16,bert-96x16 "
                        "(turnip-*: MODEL-SEQ[xBATCH][@MACHINE], e.g. 7b-1024,65b-1024x8@a100x8; "
                        "turnip-determinism runs each as inference and as training)")
    p.add_argument("--quick", action="store_true", default=None,
                   help="turnip-determinism: one point per cell (7b, 1K tokens, batch 1)")
    p.add_argument("--noise", type=_noise_levels, metavar="X,Y,...",
                   help="turnip-determinism: noise levels (0,0.1)")
    p.add_argument("--seeds", type=_positive_int,
                   help="turnip-determinism: noisy runs per point, order and noise level (10)")
    p.add_argument("--fixed", choices=tuple(FIXED_SHOWN),
                   help="turnip-determinism: the fixed order (planned, TURNIP's; or replay, "
                        "as for ablate determinism)")
    p.add_argument("--solver", choices=("auto", "cbc", "highs"), default="auto",
                   help="MILP solver (auto: HiGHS if installed, else CBC)")
    p.add_argument("--time-limit", type=_nonnegative_float, default=60.0, metavar="S",
                   help="MILP time limit per setting in seconds (60); the best proven bound "
                        "is reported")
    p.add_argument("--weights", choices=("paper", "hyperparameters"), default="paper",
                   help="layer weight sizes: calibrated to the paper's transfer times (paper: "
                        "GPT-2 432 MB, BERT 160 MB) or from hidden 3072 in fp16 (226 MB)")
    p.add_argument("--json", action="store_true",
                   help="print the table as one JSON list of rows (times in seconds)")
    p.add_argument("--out", default="offloadlab-out", metavar="DIR",
                   help="output directory (./offloadlab-out)")

    p = add("list", cmd_list, "list workloads, machine presets and planners")
    p.add_argument("what", nargs="?", default="all",
                   choices=("all", "workloads", "machines", "planners"))
    return parser


_left: list[object] | None = None
"""What the running command leaves for the process's end to reclaim (:func:`run`), or None
(:func:`main` called in a process that goes on)."""


def _leave(*objects: object) -> None:
    """Keep a command's large objects (its graphs) alive until :func:`run` ends the process,
    which returns their memory at once instead of freeing them one object at a time as the
    command returns; nothing when :func:`main` runs in a process that goes on."""
    if _left is not None:
        _left.extend(objects)


def run() -> NoReturn:
    """The ``offloadlab`` command and ``python -m offloadlab``: :func:`main`, then the process
    ends at once (:func:`os._exit`) with its status once the standard streams are flushed and
    the exit handlers have run (temporary files' finalizers among them).  The interpreter's
    own teardown would free every object a command made, one by one (0.15-0.25 s of ``plan``
    of the 100k-vertex benchmark DAG, for its TaskGraph and MemGraph, which the command
    hands to :func:`_leave`), and collect those in reference cycles (0.7 s of ``simulate``
    of a 165k-vertex MemGraph), only to return memory the process is about to return anyway.
    Its output is written all the same, or the status says it was not (:func:`_end`)."""
    global _left
    _left = []
    _end(main())


def _end(code: int) -> NoReturn:
    """End the process with status ``code`` now (:func:`run`): flush the standard streams
    (stdout closed early: status 141, quietly; stdout failing otherwise, a full disk: one
    error line and status 2; Ctrl-C: one line and 130), run the exit handlers, then
    :func:`os._exit`."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is None:                  # started with the stream closed
                continue
            try:
                stream.flush()
            except BrokenPipeError:
                if stream is sys.stdout:
                    code = 141
            except (OSError, ValueError) as exc:
                if stream is sys.stdout:
                    code = code or 2
                    _say(f"offloadlab: error: stdout: {getattr(exc, 'strerror', None) or exc}")
    except KeyboardInterrupt:
        _say("offloadlab: interrupted")
        code = 130
    _exit_handlers()
    _exit(code)


def _say(line: str) -> None:
    """``line`` on file descriptor 2, bypassing ``sys.stderr`` (:func:`_end` has flushed it
    or found it failing); nothing if that fails too."""
    try:
        os.write(2, line.encode(errors="replace") + b"\n")
    except OSError:
        pass


_exit_handlers = atexit._run_exitfuncs     # what runs the exit handlers,
_exit = os._exit                           # and what ends the process (tests replace both)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status: 0, 2 for any user error (one line
    ``offloadlab: error: ...`` on stderr, running out of memory too), 130 on Ctrl-C
    (``offloadlab: interrupted``), 143 on SIGTERM (``offloadlab: terminated``), or what a
    command returns (1 for a failed ``--check``)."""
    from .signals import Terminated, sigterm_stops
    try:
        with sigterm_stops():
            return _main(argv)
    except Terminated:
        print("offloadlab: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("offloadlab: interrupted", file=sys.stderr)
        return 130
    except OutOfMemory:
        progress = sys.modules.get(f"{__package__}.progress")   # imported by any phase
        what = progress.ran_out_while() if progress else None
        _error(f"out of memory while {what or 'running the command'}: the RAM available (or "
               f"the process's memory limit) is too small for it")
    except BrokenPipeError:             # stdout closed early (offloadlab ... | head): stop quietly
        _silence_stdout()
        return 141
    except OffloadlabError as exc:
        _error(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _error(f"{where}{exc.strerror or exc}")
    return 2


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    args.outputs = Outputs()
    try:
        return args.func(args)
    except MemoryError:
        # the exception's frames hold what was being built: they go at the end of this block,
        # before the files staged are removed and the error is reported
        pass
    finally:
        args.outputs.discard()          # what a failed command staged; nothing after commit()
    raise OutOfMemory()


class OutOfMemory(Exception):
    """A command ran out of memory (:func:`_main`; its MemoryError and frames are gone)."""


def _silence_stdout() -> None:
    """Point stdout at the null device, so that flushing it at exit raises no second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no real file descriptor (captured)
        pass


def _error(message: str) -> None:
    """``offloadlab: error: MESSAGE`` on stderr, on one line whatever the message holds."""
    line = " ".join(part.strip() for part in message.splitlines()).strip() or "unknown error"
    print(f"offloadlab: error: {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
