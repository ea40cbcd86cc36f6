"""``offloadlab validate``: its parser and its handler."""

from __future__ import annotations

import argparse

from .common import DEMO_PLANNERS, AddCommand, json_text, phases, read_taskgraph
from .options import executor_options, positive_int, problem_options
from .outputs import check_writable


def cmd_validate(args: argparse.Namespace) -> int:
    """Simulate and execute the same MemGraphs; report the makespan's error and each
    component's, and draw both timelines.

    Parameters
    ----------
    args : argparse.Namespace
        The ``validate`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0, or 1 when a run's outputs are wrong.
    """
    from ...core.machine import machine_from_spec
    from ..validate import validate

    check_writable(args, "plot", "table")
    graph = read_taskgraph(args)
    machine = machine_from_spec(args.machine)
    planners = args.planner or list(DEMO_PLANNERS)
    with phases(args).steps("validating", len(planners) + args.profile) as step:
        results = validate(graph, machine, planners, runs=args.runs, backend=args.backend,
                           policy=args.policy, rate_limit=not args.no_rate_limit,
                           progress=step,
                           workload=args.workload or args.taskgraph, machine_text=args.machine,
                           profile=args.profile)
    written = []
    if args.plot:
        from ..plots import gantt
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
        print(json_text([r.row() for r in results]))
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


def add_parser(add: AddCommand) -> None:
    """The ``validate`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``validate`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("validate", cmd_validate, "simulate and execute the same MemGraphs: the makespan's "
            "error and each component's (busy and idle time per resource, mean duration per "
            "vertex kind), and both timelines")
    problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC",
                   help="a calibrated Machine JSON file (offloadlab calibrate) or a preset")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner (repeatable; default: levelwise and buildmemgraph)")
    p.add_argument("--runs", type=positive_int, default=3,
                   help="executor runs per planner; the median is compared (3)")
    executor_options(p)
    p.add_argument("--profile", action="store_true",
                   help="first time every distinct kernel of the graph on --backend, and "
                        "simulate with those times instead of the machine's rates")
    p.add_argument("--json", action="store_true", help="print one JSON list, a row per planner")
    p.add_argument("--plot", metavar="PNG", help="draw simulated over measured timelines")
    p.add_argument("--table", metavar="CSV", help="write the component table")
