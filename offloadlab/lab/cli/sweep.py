"""``offloadlab sweep``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys

from ...core.dispatch import POLICIES
from ...core.errors import PlanError
from ...core.util import fmt_bytes
from .common import DEMO_PLANNERS, AddCommand, json_text, phases
from .options import nonnegative_int, problem_options, table_options
from .outputs import check_table_suffix, check_writable, write_table_and_plot


def cmd_sweep(args: argparse.Namespace) -> int:
    """Plan, verify and simulate every point of a grid on dask.distributed; finished points
    are kept in ``--store`` and never rerun.

    Parameters
    ----------
    args : argparse.Namespace
        The ``sweep`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once every point is done.

    Raises
    ------
    PlanError
        When every point failed (each failure is kept in the store all the same).
    """
    import pandas as pd

    from ..sweep import Store, grid, sweep

    check_writable(args, "out", "plot", "store")
    check_table_suffix(args.out)
    if args.taskgraph is not None:                  # before its contents are hashed
        from ...core.formats.nodelink import check_input
        check_input(args.taskgraph, "TaskGraph JSON")
    points = grid(args.workload, args.taskgraph, args.machine,
                  args.planner or list(DEMO_PLANNERS), args.policy or ["dynamic"], args.grid)
    if args.workload is not None:                   # each workload spec, before any work
        from ...core.workloads import check_workload
        for spec in dict.fromkeys(p.workload for p in points):
            check_workload(spec)
    store = Store(args.store) if args.store else None      # None: the sweep's own
    say = (lambda line: print(line, file=sys.stderr)) if not args.quiet else None
    with phases(args).phase("sweeping", total=len(points), unit="point") as report:
        table = sweep(points, store, cluster=args.cluster, workers=args.workers,
                      progress=lambda done, total: report(done), say=say)
    errors = table["error"] if "error" in table else None
    if errors is not None and len(table) and errors.notna().all():    # as compare does
        kinds = errors.drop_duplicates()
        raise PlanError(f"every point failed: {kinds.iloc[0]}" + (
            f" (and {len(kinds) - 1} other error(s))"
            if len(kinds) > 1 else ""))
    axes = [c for c in table.columns if c.startswith(("machine.", "workload."))]
    what = args.workload or args.taskgraph
    written = write_table_and_plot(args, table, "sweep_plot", f"{what} on {args.machine}",
                                    x=axes[0] if axes else None)
    if args.json:
        print(json_text(table.astype(object).where(table.notna(), None).to_dict("records")))
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


def add_parser(add: AddCommand) -> None:
    """The ``sweep`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``sweep`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("sweep", cmd_sweep, "plan and simulate a grid of workload, machine, planner and "
            "policy parameters on dask.distributed; resumable")
    problem_options(p)
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
    p.add_argument("--workers", type=nonnegative_int, metavar="N",
                   help="LocalCluster worker processes (default: one per core; 0: run here)")
    table_options(p, "draw makespan against the first axis")
