"""What the commands share: reading, planning and verifying graphs, explaining runs,
progress and JSON on stdout (their output files: :mod:`.outputs`; their argument types and
option groups: :mod:`.options`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ...core.devices import lane_key
from ...core.errors import GraphError, SpecError, VerificationError
from ...core.util import fmt_bytes
from .outputs import check_table_suffix, check_writable, write_table

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


def progress_shown(args: argparse.Namespace) -> bool:
    """Whether to show progress on stderr: on a terminal or with ``--progress``, never with
    ``--quiet``.

    Parameters
    ----------
    args : argparse.Namespace
        The command's ``--quiet`` and ``--progress``.

    Returns
    -------
    bool
        Whether to show it.
    """
    return not args.quiet and (args.progress or sys.stderr.isatty())


def phases(args: argparse.Namespace):
    """The command's progress bars (:class:`~offloadlab.lab.progress.Phases`).

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments (``--quiet``, ``--progress``).

    Returns
    -------
    Phases
        Shown or silent, as :func:`progress_shown` says.
    """
    from ..progress import Phases
    return Phases(progress_shown(args))


def refusal(planner: str, error: str) -> str:
    """A planner's failure in one line, naming the planner (with its options) once: an error
    that already starts with its name loses that prefix.

    Parameters
    ----------
    planner : str
        The planner as given, with its options (``gemini:max_prefetch=2``).
    error : str
        What the planner said.

    Returns
    -------
    str
        ``"planner: error"``.
    """
    return f"{planner}: {error.removeprefix(planner.split(':')[0] + ': ')}"


def json_text(data: object) -> str:
    """Strict JSON for stdout: a value that is not a finite number becomes ``null``.

    Parameters
    ----------
    data : object
        Dicts, lists, tuples and JSON scalars.

    Returns
    -------
    str
        One line of JSON.
    """
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
    available (:mod:`offloadlab.core.budget`).

    Parameters
    ----------
    streams : int or None
        ``--streams``; None checks nothing.
    machine : Machine
        The machine, for its GPUs.

    Raises
    ------
    SpecError
        The slots would not fit.
    """
    from ...core.budget import STREAM_SLOT, check_ram
    if streams is not None:
        check_ram(f"--streams {streams} on {machine.gpus} GPU(s)",
                  streams * machine.gpus * STREAM_SLOT)


def check_makespan(makespan: float, what: str) -> None:
    """A run whose makespan is not finite came from absurd times, flops or rates.

    Parameters
    ----------
    makespan : float
        The run's makespan.
    what : str
        Which run, for the error (``"simulated"``).

    Raises
    ------
    GraphError
        The makespan is not finite.
    """
    if not math.isfinite(makespan):
        raise GraphError(f"the {what} makespan is {makespan}: the vertices' times, flops or "
                         f"bytes are too large for the machine's rates")


def read_taskgraph(args: argparse.Namespace):
    """The TaskGraph of ``--workload`` or ``--taskgraph``.

    Parameters
    ----------
    args : argparse.Namespace
        Its ``workload`` or ``taskgraph``.

    Returns
    -------
    TaskGraph
        The graph, named after its file when it has no name.
    """
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
    """What ``compare`` and ``estimate`` start from, every ``--planner`` spec and output checked
    before any work.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments.

    Returns
    -------
    tuple
        The TaskGraph, the machine, and where progress lines go (stderr, or None when progress
        is off).

    Raises
    ------
    SpecError
        A bad output, planner spec or machine.
    """
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
    """``graph`` planned with ``--planner`` on ``--machine`` and verified.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments.
    graph : TaskGraph
        The TaskGraph of ``--workload``/``--taskgraph``.

    Returns
    -------
    tuple
        (MemGraph, TaskGraph, Machine).

    Raises
    ------
    VerificationError
        The plan is not correct.
    """
    mg, machine = plan_graph(args, graph)
    with verifying(args, mg, graph, machine, beside=False):
        pass
    return mg, graph, machine


def plan_graph(args: argparse.Namespace, graph):
    """``graph`` planned with ``--planner`` on ``--machine``, not verified yet.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments.
    graph : TaskGraph
        The graph to plan.

    Returns
    -------
    tuple
        (MemGraph, Machine).
    """
    from ...core.machine import machine_from_spec
    from ...planner import plan

    machine = machine_from_spec(args.machine)
    with phases(args).phase(f"planning with {args.planner}", total=len(graph)) as report:
        mg = plan(graph, machine, args.planner, progress=report, evaluate=_simulated_makespan)
    return mg, machine


@contextmanager
def verifying(args: argparse.Namespace, mg, graph, machine, path: str | None = None,
               beside: bool = True) -> Iterator[None]:
    """Verify ``mg`` against ``graph`` and ``machine`` while the block runs.

    On another core where it can and ``beside`` (:mod:`offloadlab.lab.beside`), else before
    the block.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments (its progress).
    mg : MemGraph
        The plan.
    graph : TaskGraph or None
        What it was planned from, if at hand.
    machine : Machine
        What it runs on.
    path : str, optional
        The MemGraph file, named by the error.
    beside : bool
        Whether it may verify beside the block.

    Yields
    ------
    None
        While the block runs.

    Raises
    ------
    VerificationError
        The plan is not correct.
    """
    from ..beside import verifying

    try:
        with verifying(mg, graph, machine, beside, shown=lambda: phases(args).phase(
                f"verifying {len(mg)} MemGraph vertices")):
            yield
    except VerificationError as exc:
        if path is None:
            raise
        raise VerificationError(f"{_memgraph_file_name(path)} is not a correct plan: "
                                f"{exc}") from None


def _simulated_makespan(memgraph, machine) -> float:
    """The simulated makespan, for planners that search; imports the simulator only then."""
    from ...simulator import makespan as simulated
    return simulated(memgraph, machine)


def read_memgraph(args: argparse.Namespace):
    """The MemGraph file ``args.memgraph``, not verified yet, and the machine it runs on.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments: ``memgraph``, and ``machine`` (``--machine``, else the one
        stored in the file).

    Returns
    -------
    tuple
        (MemGraph, Machine).
    """
    from ...core.formats import read_memgraph as read
    from ...core.machine import machine_from_spec

    path = args.memgraph
    with phases(args).phase(f"reading {path}"):
        mg = read(path)
    machine = machine_from_spec(args.machine) if args.machine else stored_machine(mg, path)
    return mg, machine


def _memgraph_file_name(path: str) -> str:
    """How errors name a MemGraph file: ``MemGraph JSON file 'mg.json'``."""
    from ...core.formats.nodelink import is_parquet
    return f"MemGraph {'Parquet' if is_parquet(path) else 'JSON'} file {path!r}"


def stored_machine(mg, path: str):
    """The machine a MemGraph file stores (``graph.machine``), checked field by field.

    Parameters
    ----------
    mg : MemGraph
        The MemGraph read.
    path : str
        Its file, named by the errors.

    Returns
    -------
    Machine
        The stored machine.

    Raises
    ------
    SpecError
        It stores none, or a bad field.
    """
    from ...core.machine import Machine
    data = mg.graph.get("machine")
    if data is None:
        raise SpecError(f"{path} stores no machine; pass --machine")
    return Machine.from_dict(data, f"{_memgraph_file_name(path)}: graph.machine")


def check_categories(args: argparse.Namespace) -> None:
    """``--categories`` needs ``--explain`` and a table's suffix.

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments.

    Raises
    ------
    SpecError
        ``--categories`` without ``--explain``, or a bad suffix.
    """
    if args.categories and not args.explain:
        raise SpecError("--categories writes what --explain finds: add --explain")
    check_table_suffix(args.categories, "--categories")


def explained(args: argparse.Namespace, summary: dict, trace, mg, graph=None) -> str:
    """With ``--explain``, why the run is fast or slow (:mod:`offloadlab.lab.explain`).

    Each GPU's overlap and idle causes and its memory by category go into ``summary``;
    ``--categories`` gets the memory by category over time (not yet committed).

    Parameters
    ----------
    args : argparse.Namespace
        The command's arguments.
    summary : dict
        The run's summary, extended in place.
    trace : DataFrame
        The run's Trace.
    mg : MemGraph
        The plan it ran.
    graph : TaskGraph, optional
        What it was planned from, for the categories, when at hand.

    Returns
    -------
    str
        The text to print; empty without ``--explain``.
    """
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
    """Refuse a MEMGRAPH that records the content hash of a TaskGraph other than ``graph``.

    Parameters
    ----------
    mg : MemGraph
        The plan read.
    graph : TaskGraph
        The TaskGraph of ``--workload``/``--taskgraph``.
    args : argparse.Namespace
        The command's arguments, for the messages.

    Raises
    ------
    SpecError
        The hashes differ.
    """
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
    """The human-readable form of ``simulate``'s summary.

    Parameters
    ----------
    summary : dict
        The summary ``--json`` prints.
    capacity : int
        The machine's GPU memory.
    """
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


def leave(*objects: object) -> None:
    """Keep a command's large objects alive until the process ends.

    The package's :func:`~offloadlab.lab.cli.leave`; imported when called, as the package
    imports this module first.

    Parameters
    ----------
    *objects : object
        The objects.
    """
    from . import leave as keep
    keep(*objects)
