"""``offloadlab taskgraph``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.errors import SpecError
from .common import AddCommand, check_writable, phases, read_taskgraph


def cmd_taskgraph(args: argparse.Namespace) -> int:
    """Write a workload's TaskGraph as node-link JSON (the file ``plan --taskgraph`` reads and
    ``run MEMGRAPH --check --taskgraph`` takes as the reference)."""
    from ...core.formats import to_json
    from ...core.formats.nodelink import parquet_name
    if parquet_name(args.out):
        raise SpecError(f"{args.out}: a TaskGraph is written as node-link JSON only; name the "
                        f"file .json")
    check_writable(args, "out")
    graph = read_taskgraph(args)
    with args.outputs.file(args.out) as tmp, phases(args).phase(f"writing {args.out}"):
        to_json(graph, tmp)
    args.outputs.commit()
    if not args.quiet:
        print(f"wrote {args.out}: {len(graph)} vertices, {graph.content_hash()}")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``taskgraph`` command and its options."""
    p = add("taskgraph", cmd_taskgraph, "write a workload's TaskGraph as node-link JSON")
    p.add_argument("--workload", required=True, metavar="SPEC",
                   help="e.g. matmul-chain:layers=4")
    p.add_argument("--out", required=True, metavar="FILE", help="TaskGraph JSON to write")
