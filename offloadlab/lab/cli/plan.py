"""``offloadlab plan``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.util import fmt_bytes
from .common import AddCommand, leave, phases, plan_graph, read_taskgraph, verifying
from .options import problem_options
from .outputs import check_writable


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a workload or TaskGraph file on a machine, verify the MemGraph, write it (node-link
    JSON, or a Parquet table for ``--out *.parquet``).

    Parameters
    ----------
    args : argparse.Namespace
        The ``plan`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the MemGraph is written.
    """
    check_writable(args, "out")
    from ...core.formats import write_memgraph
    from ...core.formats.nodelink import parquet_name
    if parquet_name(args.out):                          # as write_memgraph decides
        from ...core.formats.parquet import need_pyarrow
        need_pyarrow("MemGraph Parquet files", "write .json")
    graph = read_taskgraph(args)
    mg, machine = plan_graph(args, graph)
    leave(graph, mg)
    with verifying(args, mg, graph, machine):
        with args.outputs.file(args.out) as tmp, phases(args).phase(f"writing {args.out}"):
            write_memgraph(mg, tmp)
        kinds = mg.counts()
        wrote = (f"wrote {args.out}: {len(mg)} vertices, {kinds.get('offload', 0)} offloads, "
                 f"{kinds.get('reload', 0)} reloads, {kinds.get('load', 0)} loads, "
                 f"{fmt_bytes(mg.host_bytes())} moved to/from host "
                 f"(planner {args.planner}, machine {machine.name})")  # while it verifies
    args.outputs.commit()
    print(wrote)
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``plan`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``plan`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("plan", cmd_plan, "plan a workload on a machine, verify the MemGraph, write it")
    problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. disco-example")
    p.add_argument("--planner", default="buildmemgraph", metavar="SPEC",
                   help="planner and its options (buildmemgraph)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="MemGraph to write: node-link JSON, or one Parquet table if FILE ends "
                        "in .parquet (faster for large graphs)")
