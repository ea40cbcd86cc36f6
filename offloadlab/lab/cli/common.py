"""What the commands share: staging their output files, argument types, checking outputs
before any work, reading and planning graphs, writing tables and plots, the option
groups several commands take."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.backends import backend_names
from ...core.devices import lane_key
from ...core.dispatch import POLICIES
from ...core.errors import GraphError, SpecError, VerificationError
from ...core.util import fmt_bytes

if TYPE_CHECKING:
    import pandas as pd

    from ...core.memgraph import MemGraph


AddCommand = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]
"""What a command module's ``add_parser`` is given: ``add(name, handler, help)`` makes the
command's parser with the options every command takes (:func:`.parser.build_parser`)."""

DEMO_PLANNERS = ("levelwise", "buildmemgraph")


FIXED_SHOWN = {"planned": "each GPU's kernels in the planner's order (TURNIP's fixed order)",
               "replay": "a fixed order (the noiseless dynamic run's)"}


SPECS = """\
specifications:
  workloads, machines and planners are named as NAME or NAME:key=value,...  e.g.
  matmul-chain:layers=4   disco-example:gpu_memory=64MiB   buildmemgraph
  'offloadlab list' shows the names and their options."""


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


def positive_int(text: str) -> int:
    value = nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = nonnegative_float(text)
    if value == 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


IMAGE_OPTIONS = ("gantt", "memory", "plot")


TABLE_SUFFIXES = (".csv", ".parquet")


def check_writable(args: argparse.Namespace, *options: str) -> None:
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


def check_out_dir(path: str | Path, flag: str = "--out") -> None:
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


def progress_shown(args: argparse.Namespace) -> bool:
    """Whether to show progress on stderr: on a terminal or with ``--progress``, never with
    ``--quiet``."""
    return not args.quiet and (args.progress or sys.stderr.isatty())


def phases(args: argparse.Namespace):
    """The command's progress bars (:class:`~offloadlab.lab.progress.Phases`)."""
    from ..progress import Phases
    return Phases(progress_shown(args))


def refusal(planner: str, error: str) -> str:
    """A planner's failure in one line, naming the planner (with its options) once: an error
    that already starts with its name loses that prefix."""
    return f"{planner}: {error.removeprefix(planner.split(':')[0] + ': ')}"


def json_text(data: object) -> str:
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


def check_streams(streams: int | None, machine) -> None:
    """Refuse ``--streams`` whose slots on every GPU of ``machine`` would not fit in the RAM
    available (:mod:`offloadlab.core.budget`)."""
    from ...core.budget import STREAM_SLOT, check_ram
    if streams is not None:
        check_ram(f"--streams {streams} on {machine.gpus} GPU(s)",
                  streams * machine.gpus * STREAM_SLOT)


def check_makespan(makespan: float, what: str) -> None:
    """A run whose makespan is not finite came from absurd times, flops or rates."""
    if not math.isfinite(makespan):
        raise GraphError(f"the {what} makespan is {makespan}: the vertices' times, flops or "
                         f"bytes are too large for the machine's rates")


def write_plots_and_traces(outputs: Outputs, runs: Mapping[str, pd.DataFrame],
                            gantt_path: Path | None, chrome_paths: dict[str, Path],
                            title: str, memory: Mapping[str, pd.DataFrame] | None = None,
                            capacity: float | None = None,
                            flows: Mapping[str, MemGraph] | None = None) -> list[Path]:
    """Stage a Gantt chart of all ``runs`` (label -> Trace; with ``memory``, label -> memory
    in use, a memory panel under each) and one Chrome trace per label (with its memory as
    counter tracks, and flow arrows along the data edges of the ``flows`` MemGraph)."""
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


def read_taskgraph(args: argparse.Namespace):
    """The TaskGraph of ``--workload`` or ``--taskgraph``."""
    from ...core.formats import taskgraph_from_json
    from ...core.workloads import build_workload
    if args.workload is not None:           # '' too: build_workload names the empty spec
        with phases(args).phase(f"building {args.workload}"):
            return build_workload(args.workload)
    with phases(args).phase(f"reading {args.taskgraph}"):
        graph = taskgraph_from_json(args.taskgraph)
    graph.name = graph.name or Path(args.taskgraph).stem     # plans name what they planned
    return graph


def planners_problem(args: argparse.Namespace):
    """What ``compare`` and ``estimate`` start from: their outputs and every ``--planner`` spec
    checked before any work, then the TaskGraph, the machine, and where progress lines go
    (stderr, or None when progress is off)."""
    from ...core.machine import machine_from_spec
    from ...planner.registry import check_spec
    check_writable(args, "out", "plot")
    check_table_suffix(args.out)
    for spec in args.planner or ():
        check_spec(spec)
    graph = read_taskgraph(args)
    machine = machine_from_spec(args.machine)
    say = (lambda line: print(line, file=sys.stderr)) if progress_shown(args) else None
    return graph, machine, say


def planned(args: argparse.Namespace, graph):
    """``graph``, the TaskGraph of ``--workload``/``--taskgraph``, planned with ``--planner``
    on ``--machine`` and verified: (MemGraph, TaskGraph, Machine)."""
    mg, machine = plan_graph(args, graph)
    with verifying(args, mg, graph, machine, beside=False):
        pass
    return mg, graph, machine


def plan_graph(args: argparse.Namespace, graph):
    """``graph`` planned with ``--planner`` on ``--machine``, not verified yet: (MemGraph,
    Machine)."""
    from ...core.machine import machine_from_spec
    from ...planner import plan

    machine = machine_from_spec(args.machine)
    with phases(args).phase(f"planning with {args.planner}", total=len(graph)) as report:
        mg = plan(graph, machine, args.planner, progress=report, evaluate=simulated_makespan)
    return mg, machine


@contextmanager
def verifying(args: argparse.Namespace, mg, graph, machine, path: str | None = None,
               beside: bool = True) -> Iterator[None]:
    """Verify ``mg`` against ``graph`` and ``machine`` while the block runs, on another core
    where it can and ``beside`` (:mod:`offloadlab.lab.beside`), else before the block; a
    failure raises VerificationError naming the MemGraph file ``path`` if given."""
    from ..beside import verifying

    try:
        with verifying(mg, graph, machine, beside, shown=lambda: phases(args).phase(
                f"verifying {len(mg)} MemGraph vertices")):
            yield
    except VerificationError as exc:
        if path is None:
            raise
        raise VerificationError(f"{memgraph_file_name(path)} is not a correct plan: "
                                f"{exc}") from None


def simulated_makespan(memgraph, machine) -> float:
    """The simulated makespan, for planners that search; imports the simulator only then."""
    from ...simulator import makespan as simulated
    return simulated(memgraph, machine)


def memgraph_file(args: argparse.Namespace):
    """The MemGraph file ``args.memgraph`` and the machine it runs on (``--machine``, else
    the one stored in the file), verified against it."""
    mg, machine = read_memgraph(args)
    with verifying(args, mg, None, machine, args.memgraph, beside=False):
        pass
    return mg, machine


def read_memgraph(args: argparse.Namespace):
    """The MemGraph file ``args.memgraph``, not verified yet, and the machine it runs on
    (``--machine``, else the one stored in the file)."""
    from ...core.formats import read_memgraph as read
    from ...core.machine import machine_from_spec

    path = args.memgraph
    with phases(args).phase(f"reading {path}"):
        mg = read(path)
    machine = machine_from_spec(args.machine) if args.machine else stored_machine(mg, path)
    return mg, machine


def memgraph_file_name(path: str) -> str:
    """How errors name a MemGraph file: ``MemGraph JSON file 'mg.json'``."""
    from ...core.formats.nodelink import is_parquet
    return f"MemGraph {'Parquet' if is_parquet(path) else 'JSON'} file {path!r}"


def stored_machine(mg, path: str):
    """The machine a MemGraph file stores (``graph.machine``), checked field by field."""
    from ...core.machine import Machine
    data = mg.graph.get("machine")
    if data is None:
        raise SpecError(f"{path} stores no machine; pass --machine")
    return Machine.from_dict(data, f"{memgraph_file_name(path)}: graph.machine")


def check_table_suffix(path: str | None, flag: str = "--out") -> None:
    if path and Path(path).suffix.lower() not in TABLE_SUFFIXES:
        raise SpecError(f"{flag}: cannot write {path!r}: a table needs one of the suffixes "
                        f"{', '.join(TABLE_SUFFIXES)}")
    if path and path.lower().endswith(".parquet"):
        from ...core.formats.parquet import need_pyarrow
        need_pyarrow("Parquet tables", "write .csv")


def write_table(args: argparse.Namespace, table: pd.DataFrame, option: str = "out"
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


def write_table_and_plot(args: argparse.Namespace, table: pd.DataFrame, plot: str,
                          title: str, **options: object) -> list[str]:
    """Write ``--out`` (CSV or Parquet) and ``--plot`` (``plots.<plot>``); the paths."""
    from .. import plots
    written = write_table(args, table)
    if args.plot:
        with args.outputs.file(args.plot) as tmp:
            getattr(plots, plot)(table, tmp, title=title, **options)
        written.append(args.plot)
    args.outputs.commit()
    return written


def explain_options(p: argparse.ArgumentParser) -> None:
    """``simulate``'s and ``run``'s ``--explain`` and ``--categories``."""
    p.add_argument("--explain", action="store_true",
                   help="say why the run is fast or slow: per GPU, the share of host copies "
                        "hidden under compute, the idle time by cause and memory by tensor "
                        "category (docs/explain.md)")
    p.add_argument("--categories", metavar="CSV", help="with --explain, write GPU memory in "
                   "use over time by category (.csv or .parquet)")


def check_categories(args: argparse.Namespace) -> None:
    """``--categories`` needs ``--explain`` and a table's suffix."""
    if args.categories and not args.explain:
        raise SpecError("--categories writes what --explain finds: add --explain")
    check_table_suffix(args.categories, "--categories")


def explained(args: argparse.Namespace, summary: dict, trace, mg, graph=None) -> str:
    """With ``--explain``: each GPU's overlap and idle causes and its memory by category
    (lab/explain.py; categories from ``graph``, the TaskGraph, when at hand) into the summary,
    and as the text to print; ``--categories`` gets the memory by category over time (not yet
    committed)."""
    if not args.explain:
        return ""
    from ..explain import category_table, category_text, explain, memory_by_category, records
    from ..explain import text as explain_text
    table = explain(trace, mg)
    summary["explain"] = records(table)
    series = memory_by_category(trace, mg, graph)
    categories = category_table(series)
    summary["memory_by_category"] = records(categories)
    write_table(args, series, "categories")
    return explain_text(table) + "\n" + category_text(categories)


def check_planned_from(mg, graph, args: argparse.Namespace) -> None:
    """Refuse a MEMGRAPH that records the content hash of a TaskGraph other than ``graph``."""
    from ...core.formats.nodelink import HASH_FIELD
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


def print_summary(summary: dict, capacity: int) -> None:
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


def noise_levels(text: str) -> tuple[float, ...]:
    """``0,0.05,0.1``: noise levels, each a finite number >= 0."""
    try:
        levels = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}"
                                         ) from None
    if not all(math.isfinite(x) and x >= 0 for x in levels):
        raise argparse.ArgumentTypeError(f"noise levels must be finite and >= 0, got {text!r}")
    return levels


def measured_options(p: argparse.ArgumentParser) -> None:
    """``--measured`` and how: the executor's backend and its copies' pacing."""
    p.add_argument("--measured", action="store_true",
                   help="also run each plan on the executor and report what it measured")
    p.add_argument("--backend", choices=backend_names(), default="numpy",
                   help="executor backend for --measured (numpy)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy at memcpy speed instead of the machine's links")


def table_options(p: argparse.ArgumentParser, plot: str) -> None:
    """``--json``, ``--out`` and ``--plot`` of the commands that make a table."""
    p.add_argument("--json", action="store_true", help="print one JSON list of rows")
    p.add_argument("--out", metavar="FILE", help="write the table (.csv, or .parquet)")
    p.add_argument("--plot", metavar="PNG", help=plot)


def problem_options(p: argparse.ArgumentParser) -> None:
    """``--workload SPEC`` or ``--taskgraph FILE``, one of them required."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file")


def executor_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that execute MemGraphs."""
    p.add_argument("--backend", choices=backend_names(), default="numpy",
                   help="numpy: threads on the CPU (any machine); cupy: an NVIDIA GPU (numpy)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy as fast as memcpy instead of at the machine's "
                        "link bandwidths")


def leave(*objects: object) -> None:
    """Keep a command's large objects alive until the process ends (the package's
    :func:`~offloadlab.lab.cli.leave`; imported when called, as the package imports this
    module first)."""
    from . import leave as keep
    keep(*objects)
