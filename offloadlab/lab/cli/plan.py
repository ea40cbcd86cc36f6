"""``offloadlab plan``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...core.util import fmt_bytes
from .common import AddCommand, leave, phases, plan_graph, read_taskgraph, verifying
from .options import problem_options
from .outputs import check_writable

FORMATS = {"json": "node-link JSON", "parquet": "Parquet"}


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a workload or TaskGraph file on a machine, verify the MemGraph, write it (node-link
    JSON for ``--out *.json``, a Parquet table for ``--out *.parquet``, else by its size:
    :func:`~offloadlab.core.formats.memgraph_format`).

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
    if parquet_name(args.out):      # asked for by name (one left to its size is JSON without)
        from ...core.formats.parquet import need_pyarrow
        need_pyarrow("MemGraph Parquet files", "write .json")
    graph = read_taskgraph(args)
    mg, machine = plan_graph(args, graph)
    leave(graph, mg)
    with verifying(args, mg, graph, machine):
        with args.outputs.file(args.out) as tmp, phases(args).phase(f"writing {args.out}"):
            fmt = write_memgraph(mg, tmp)
        asked = Path(args.out).suffix.lower()[1:]
        note = _parquet_note(args, len(mg), tmp) if asked == "json" else None
        kinds = mg.counts()
        chosen = "" if fmt == asked else f" as {FORMATS[fmt]}"
        wrote = (f"wrote {args.out}{chosen}: {len(mg)} vertices, "
                 f"{kinds.get('offload', 0)} offloads, "
                 f"{kinds.get('reload', 0)} reloads, {kinds.get('load', 0)} loads, "
                 f"{fmt_bytes(mg.host_bytes())} moved to/from host "
                 f"(planner {args.planner}, machine {machine.name})")  # while it verifies
    args.outputs.commit()
    if note:
        print(note, file=sys.stderr)
    print(wrote)
    return 0


def _parquet_note(args: argparse.Namespace, vertices: int, written: Path) -> str | None:
    """The informational line for a MemGraph asked for as JSON (``--out *.json``, written to
    ``written``) from :data:`~offloadlab.core.formats.PARQUET_VERTICES` vertices on, where Parquet
    would be smaller and faster to read; None for any other, or under ``-q``."""
    from ...core.formats import PARQUET_BYTES_PER_VERTEX, PARQUET_VERTICES
    if args.quiet or vertices < PARQUET_VERTICES:
        return None
    times = written.stat().st_size / (PARQUET_BYTES_PER_VERTEX * vertices)
    return (f"offloadlab: note: {args.out} holds {vertices} vertices; as Parquet (--out "
            f"{Path(args.out).with_suffix('.parquet')}) it would be about {times:.0f} times "
            f"smaller and faster to read")


def add_parser(add: AddCommand) -> None:
    """The ``plan`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``plan`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    from ...core.formats import PARQUET_VERTICES
    p = add("plan", cmd_plan, "plan a workload on a machine, verify the MemGraph, write it")
    problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. disco-example")
    p.add_argument("--planner", default="buildmemgraph", metavar="SPEC",
                   help="planner and its options (buildmemgraph)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="MemGraph to write: node-link JSON if FILE ends in .json, one Parquet "
                        "table (smaller, faster to read) if it ends in .parquet; any other "
                        f"name: Parquet from {PARQUET_VERTICES:,} vertices on, else JSON")
