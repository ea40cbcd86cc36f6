"""``offloadlab run``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...core.devices import lane_key
from ...core.errors import SpecError
from .common import (
    AddCommand,
    check_categories,
    check_makespan,
    check_planned_from,
    check_streams,
    explained,
    json_text,
    leave,
    phases,
    plan_graph,
    planned,
    read_memgraph,
    read_taskgraph,
    verifying,
)
from .options import (
    executor_options,
    explain_options,
    nonnegative_int,
    positive_float,
    positive_int,
)
from .outputs import check_writable, write_plots_and_traces


def cmd_run(args: argparse.Namespace) -> int:
    """Execute a MemGraph for real (planning a workload first), print a summary or one JSON
    object, optionally check the outputs against a NumPy reference and write plots/traces.

    Parameters
    ----------
    args : argparse.Namespace
        The ``run`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0, or 1 when ``--check`` finds an output wrong.
    """
    from ...executor import RaceError, check_outputs, execute, expected_outputs, taskgraph_of

    if args.memgraph and args.planner:
        raise SpecError("--planner applies to --workload or --taskgraph, not to a MemGraph file")
    args.planner = args.planner or "buildmemgraph"
    check_writable(args, "gantt", "chrome", "categories")
    check_categories(args)
    mg, graph, machine = _source(args)
    leave(mg, graph)
    check_streams(args.streams, machine)
    try:
        with phases(args).phase(f"running on the {args.backend} backend",
                                 total=len(mg)) as report:
            result = execute(mg, machine, backend=args.backend, policy=args.policy,
                             seed=args.seed, streams=args.streams, poison=args.poison,
                             rate_limit=not args.no_rate_limit, watchdog=args.watchdog,
                             progress=report, verify=False,       # verified by _source
                             check_races=args.check)
    except RaceError as exc:
        print(f"offloadlab: check failed: {exc}", file=sys.stderr)
        return 1
    leave(result)
    check_makespan(result.makespan, "measured")
    wrong = None
    if args.check:
        reference, spread = expected_outputs(graph or taskgraph_of(mg), args.backend)
        wrong = check_outputs(result.outputs, reference, args.backend, spread)
    label = f"{mg.graph.get('planner')} ({args.backend}, {args.policy})"
    written = write_plots_and_traces(
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
    why = explained(args, summary, result.trace, mg, graph)
    written += [Path(args.categories)] if args.categories else []
    args.outputs.commit()
    if args.json:
        print(json_text(summary))
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


def _source(args: argparse.Namespace):
    """The MemGraph, TaskGraph and Machine ``run`` executes: a MEMGRAPH file with the TaskGraph
    of ``--workload``/``--taskgraph`` it was planned from (whose content hash it must record,
    if it records one), or None; else that TaskGraph planned.  A TaskGraph the executor cannot
    run is refused before planning; with ``--no-verify`` nothing is verified."""
    from ...executor import check_runnable
    if args.memgraph is None and args.workload is None and args.taskgraph is None:
        raise SpecError("run needs a MEMGRAPH file, --workload SPEC or --taskgraph FILE")
    if args.memgraph is not None:
        mg, machine = read_memgraph(args)
        graph = None
        if args.workload is not None or args.taskgraph is not None:
            graph = read_taskgraph(args)
            check_planned_from(mg, graph, args)
        elif args.check:
            print(f"offloadlab: warning: --check compares the outputs with the TaskGraph that "
                  f"{args.memgraph} computes, not with an independent reference; pass "
                  f"--workload or --taskgraph (the one it was planned from) for that",
                  file=sys.stderr)
        if not args.no_verify:
            with verifying(args, mg, graph, machine, args.memgraph, beside=False):
                pass
        return mg, graph, machine
    if not args.machine:
        raise SpecError("--machine is required with --workload or --taskgraph")
    graph = read_taskgraph(args)
    check_runnable(graph)
    if args.no_verify:
        mg, machine = plan_graph(args, graph)
        return mg, graph, machine
    return planned(args, graph)


def add_parser(add: AddCommand) -> None:
    """The ``run`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``run`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
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
    executor_options(p)
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="seed of the random policy (0)")
    p.add_argument("--streams", type=positive_int, metavar="K",
                   help="compute streams per GPU (default: the machine's)")
    p.add_argument("--check", action="store_true",
                   help="detect races (an overwrite of bytes a vertex still reads) and compare "
                        "the outputs with a NumPy evaluation of the TaskGraph; exit 1 naming "
                        "the race or the first wrong output")
    p.add_argument("--no-verify", action="store_true",
                   help="run the MemGraph without verifying it first (to test a broken plan)")
    p.add_argument("--poison", action="store_true",
                   help="fill each location with NaN bytes before it is written (finds races)")
    p.add_argument("--watchdog", type=positive_float, default=60.0, metavar="S",
                   help="stop if no vertex completes for S seconds (60)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")
    p.add_argument("--flows", action="store_true",
                   help="draw the data edges as flow arrows in the --chrome trace (off: they "
                        "crowd the view of large graphs)")
    explain_options(p)
