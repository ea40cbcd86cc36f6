"""``offloadlab demo``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.util import fmt_bytes
from .common import DEMO_PLANNERS, AddCommand
from .options import positive_int
from .outputs import check_out_dir, write_plots_and_traces


def cmd_demo(args: argparse.Namespace) -> int:
    """The DISCO example: level-wise vs. buildMemGraph planning, simulated side by side.

    Parameters
    ----------
    args : argparse.Namespace
        The ``demo`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the plots and traces are written.
    """
    from ...core.machine import machine_from_spec
    from ...core.workloads import build_workload
    from ..compare import run_all, table

    check_out_dir(args.out)
    graph = build_workload(f"matmul-chain:layers={args.layers}")
    machine = machine_from_spec("disco-example")
    print(f"DISCO example: matmul-chain, {args.layers} layers, {len(graph)} vertices, on "
          f"{machine.name} ({machine.gpus} GPUs x {fmt_bytes(machine.gpu_memory)}; "
          f"1 time unit = 1 s)")
    runs = run_all(graph, machine, [(p, "dynamic") for p in DEMO_PLANNERS],
                   progress=None if args.quiet else print)
    shown = table(runs)
    for column in ("bytes_moved", "peak_gpu_memory"):
        shown[column] = shown[column].map(fmt_bytes)
    shown["makespan"] = shown["makespan"].map(lambda s: f"{s:.6g} s")
    print()
    print(shown.to_string(index=False))
    n = args.layers
    print(f"(DISCO Sec. 2 expects level-wise offloading to take 3n = {3 * n} time units and "
          f"overlapped offloading 2n + 1 = {2 * n + 1}, for n = {n} layers)")
    print()
    out = args.outputs.directory(args.out)
    if not args.quiet:
        print(f"writing plots and traces to {out}/ ...")
    written = write_plots_and_traces(
        args.outputs, {r.planner: r.result.trace for r in runs}, out / "gantt.png",
        {r.planner: out / f"{r.planner}.trace.json" for r in runs},
        title=f"DISCO example, {args.layers} layers on {machine.name} (dynamic dispatch)",
        memory={r.planner: r.result.memory for r in runs}, capacity=machine.gpu_memory,
        flows={r.planner: r.memgraph for r in runs})
    args.outputs.commit()
    for path in written:
        print(f"  wrote {path}")
    print("open the .trace.json files in https://ui.perfetto.dev or chrome://tracing")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``demo`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``demo`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("demo", cmd_demo, "the DISCO example: level-wise vs. buildMemGraph planning, "
            "simulated; prints a table, writes a Gantt chart and Chrome traces")
    p.add_argument("--layers", type=positive_int, default=8, help="matmul-chain layers (8)")
    p.add_argument("--out", default="offloadlab-out", metavar="DIR",
                   help="output directory (./offloadlab-out)")
