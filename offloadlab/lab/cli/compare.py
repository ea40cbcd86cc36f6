"""``offloadlab compare``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.dispatch import POLICIES
from ...core.errors import PlanError
from ...core.util import fmt_bytes
from .common import AddCommand, json_text, planners_problem, refusal
from .options import measured_options, problem_options, table_options
from .outputs import write_table_and_plot


def cmd_compare(args: argparse.Namespace) -> int:
    """Every planner on one problem, simulated: a row each with its makespan, traffic, memory,
    planning time, its plan's lower bound and its gap to the problem's.

    Parameters
    ----------
    args : argparse.Namespace
        The ``compare`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the table is printed or written.
    """
    from ..compare import compare_planners

    graph, machine, say = planners_problem(args)
    table = compare_planners(graph, machine, args.planner, policy=args.policy,
                             measured=args.measured, backend=args.backend,
                             rate_limit=not args.no_rate_limit, progress=say,
                             workload=args.workload or args.taskgraph, machine_text=args.machine)
    failed = table["error"].notna()
    if failed.all():
        raise PlanError("every planner failed: " + "; ".join(
            refusal(row["planner"], row["error"]) for _, row in table.iterrows()))
    written = write_table_and_plot(args, table, "compare_plot",
                                    f"{graph.name} on {args.machine} ({args.policy} dispatch)")
    if args.json:
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        print(json_text(records))
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
        print(refusal(row["planner"], row["error"]))
    if machine.host_memory is not None and (table["outcome"] == "OOM").any():
        print(f"OOM: a host peak above the machine's host_memory "
              f"({fmt_bytes(machine.host_memory)}) does not fit in host RAM")
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``compare`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``compare`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("compare", cmd_compare, "every planner on one problem, simulated: makespan, "
            "traffic, memory, planning time, and the gap to the problem's lower bound")
    problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. disco-example")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner and its options (repeatable; default: every planner)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    measured_options(p)
    table_options(p, "draw each planner's makespan and bounds")
