"""``offloadlab simulate``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...core.dispatch import POLICIES
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
    print_summary,
    read_memgraph,
    read_taskgraph,
    verifying,
)
from .options import explain_options, nonnegative_float, nonnegative_int, positive_int
from .outputs import check_writable, write_plots_and_traces


def cmd_simulate(args: argparse.Namespace) -> int:
    """Verify and simulate a MemGraph file; print a summary (or one JSON object), write plots
    and traces.

    Parameters
    ----------
    args : argparse.Namespace
        The ``simulate`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0, or 1 when the run holds more in host RAM than ``host_memory``.
    """
    from ...simulator import simulate

    check_writable(args, "gantt", "memory", "chrome", "categories")
    check_categories(args)
    mg, machine = read_memgraph(args)
    graph = None
    if args.workload is not None or args.taskgraph is not None:
        graph = read_taskgraph(args)
        check_planned_from(mg, graph, args)
    leave(mg, graph)
    check_streams(args.streams, machine)
    with verifying(args, mg, None, machine, args.memgraph), \
            phases(args).phase(f"simulating ({args.policy})", total=len(mg)) as report:
        result = simulate(mg, machine, policy=args.policy, noise=args.noise, seed=args.seed,
                          streams=args.streams, progress=report)
    leave(result)
    check_makespan(result.makespan, "simulated")
    label = f"{args.memgraph} ({args.policy})"
    written = write_plots_and_traces(
        args.outputs, {label: result.trace}, Path(args.gantt) if args.gantt else None,
        {label: Path(args.chrome)} if args.chrome else {}, title=label,
        memory={label: result.memory}, capacity=machine.gpu_memory,
        flows={label: mg} if args.flows else None)
    if args.memory:
        from ..plots import memory_plot
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
    why = explained(args, summary, result.trace, mg, graph)
    written += [Path(args.categories)] if args.categories else []
    args.outputs.commit()
    if args.json:
        print(json_text(summary))
    else:
        print_summary(summary, machine.gpu_memory)
        if why:
            print(why)
        for path in written:
            print(f"wrote {path}")
    if result.out_of_memory is not None:
        print(f"offloadlab: {result.out_of_memory}", file=sys.stderr)
        return 1
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``simulate`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``simulate`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("simulate", cmd_simulate, "verify and simulate a MemGraph file (exit 1 if the run "
            "holds more in host RAM than the machine's host_memory)")
    p.add_argument("memgraph", metavar="MEMGRAPH",
                   help="MemGraph file written by 'plan' (JSON or Parquet)")
    p.add_argument("--machine", metavar="SPEC",
                   help="machine to simulate on (default: the one stored in the MemGraph)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--noise", type=nonnegative_float, default=0.0,
                   help="relative duration noise (0)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="noise seed (0)")
    p.add_argument("--streams", type=positive_int, metavar="K",
                   help="compute streams per GPU (default: the machine's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--memory", metavar="PNG", help="write a plot of GPU memory in use")
    p.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")
    explain_options(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", metavar="SPEC", help="the workload MEMGRAPH was planned "
                     "from: --explain splits memory by its categories")
    src.add_argument("--taskgraph", metavar="FILE", help="the TaskGraph file MEMGRAPH was "
                     "planned from: --explain splits memory by its categories")
    p.add_argument("--flows", action="store_true",
                   help="draw the data edges as flow arrows in the --chrome trace (off: they "
                        "crowd the view of large graphs)")
