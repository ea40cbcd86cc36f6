"""``offloadlab estimate``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.errors import PlanError
from ...core.util import fmt_bytes
from .common import AddCommand, json_text, planners_problem, refusal
from .options import positive_float, positive_int, problem_options, table_options
from .outputs import write_table


def cmd_estimate(args: argparse.Namespace) -> int:
    """The smallest GPU memory each planner needs, the host RAM it then needs, and makespan
    against GPU memory beside the lower bound.

    Parameters
    ----------
    args : argparse.Namespace
        The ``estimate`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the estimates are printed or written.
    """
    from ..estimate import curve_table, estimate

    graph, machine, say = planners_problem(args)
    found = estimate(graph, machine, args.planner, points=args.points,
                     precision=args.precision, progress=say)
    if found.smallest["error"].notna().all():
        raise PlanError("no planner can plan it at any GPU memory: " + "; ".join(
            refusal(row["planner"], row["error"]) for _, row in found.smallest.iterrows()))
    title = f"{graph.name} on {args.machine}"
    written = write_table(args, found.curve)
    if args.plot:
        from ..plots import estimate_plot
        with args.outputs.file(args.plot) as tmp:
            estimate_plot(found, tmp, title=title)
        written.append(args.plot)
    args.outputs.commit()
    if args.json:
        def rows(table):
            return table.astype(object).where(table.notna(), None).to_dict("records")
        print(json_text({"workload": args.workload or args.taskgraph, "machine": args.machine,
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
        print(refusal(row["planner"], row["error"]))
    wide = curve_table(found)
    wide["gpu_memory"] = wide["gpu_memory"].map(lambda b: fmt_bytes(int(b)))
    print("makespan (s) against GPU memory:")
    print(wide.to_string(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-"))
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``estimate`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``estimate`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("estimate", cmd_estimate, "the smallest GPU memory each planner can plan a "
            "problem in, the host RAM it then needs, and makespan against GPU memory beside "
            "the lower bound")
    problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC",
                   help="the GPUs and links (its gpu_memory is varied), e.g. v100")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner and its options (repeatable; default: every planner)")
    p.add_argument("--points", type=positive_int, default=8,
                   help="GPU memories on the curve (8)")
    p.add_argument("--precision", type=positive_float, default=0.01,
                   help="the bisection's relative precision (0.01)")
    table_options(p, "draw makespan against GPU memory")
