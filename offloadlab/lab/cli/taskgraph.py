"""``offloadlab taskgraph``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.backends import backend_names
from ...core.errors import SpecError
from .common import AddCommand, phases, read_taskgraph
from .options import positive_int
from .outputs import check_writable

REPEATS = 5     # executor/profile.py's default, not imported: the CLI starts without NumPy


def cmd_taskgraph(args: argparse.Namespace) -> int:
    """Write a workload's TaskGraph as node-link JSON (the file ``plan --taskgraph`` reads and
    ``run MEMGRAPH --check --taskgraph`` takes as the reference).

    Parameters
    ----------
    args : argparse.Namespace
        The ``taskgraph`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the TaskGraph file is written.
    """
    from ...core.formats import to_json
    from ...core.formats.nodelink import parquet_name
    if parquet_name(args.out):
        raise SpecError(f"{args.out}: a TaskGraph is written as node-link JSON only; name the "
                        f"file .json")
    check_writable(args, "out")
    graph = read_taskgraph(args)
    if args.profile:
        graph = _profiled(graph, args)
    with args.outputs.file(args.out) as tmp, phases(args).phase(f"writing {args.out}"):
        to_json(graph, tmp)
    args.outputs.commit()
    if not args.quiet:
        print(f"wrote {args.out}: {len(graph)} vertices, {graph.content_hash()}")
    return 0


def _profiled(graph, args: argparse.Namespace):
    """``graph`` with its kernels timed on ``args.backend`` (``--profile``)."""
    from ...core.machine import machine_from_spec
    from ...executor.profile import profile, signatures
    machine = machine_from_spec(args.machine)
    with phases(args).phase("profiling kernels", len(signatures(graph)), "kernel") as report:
        return profile(graph, machine, args.backend, args.repeats,
                       progress=lambda done, _: report(done)).graph


def add_parser(add: AddCommand) -> None:
    """The ``taskgraph`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``taskgraph`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("taskgraph", cmd_taskgraph, "write a workload's TaskGraph as node-link JSON")
    p.add_argument("--workload", required=True, metavar="SPEC",
                   help="e.g. matmul-chain:layers=4")
    p.add_argument("--out", required=True, metavar="FILE", help="TaskGraph JSON to write")
    p.add_argument("--profile", action="store_true",
                   help="time every distinct kernel on --backend and write its seconds as "
                        "the vertices' time, which the simulator then uses")
    p.add_argument("--machine", default="p100x4", metavar="SPEC",
                   help="with --profile: the machine whose links pace the numpy backend's "
                        "copies (p100x4)")
    p.add_argument("--backend", choices=backend_names(), default="numpy",
                   help="with --profile: numpy (the CPU) or cupy (an NVIDIA GPU) (numpy)")
    p.add_argument("--repeats", type=positive_int, default=REPEATS,
                   help=f"with --profile: runs of each kernel, the median kept ({REPEATS})")
