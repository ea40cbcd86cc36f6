"""``offloadlab ablate``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.dispatch import POLICIES
from ...core.errors import SpecError
from ...core.util import fmt_bytes
from .common import DEMO_PLANNERS, FIXED_SHOWN, AddCommand, json_text, phases, read_taskgraph
from .options import measured_options, noise_levels, positive_int, problem_options, table_options
from .outputs import check_table_suffix, check_writable, write_table_and_plot


def cmd_ablate(args: argparse.Namespace) -> int:
    """``determinism``: TURNIP's ablation, the same MemGraph under dynamic dispatch and in a
    fixed order (``--fixed``: each GPU's kernels in the planner's order, or a replay of the
    noiseless dynamic run), many noisy seeds per noise level (and on the executor with
    --measured); ``parts``: BuildMemGraph with one part changed at a time.

    Parameters
    ----------
    args : argparse.Namespace
        The ``ablate`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the table is printed or written.
    """
    from ...core.machine import machine_from_spec
    from ...planner.registry import check_spec
    from ..ablate import ablate_determinism

    check_writable(args, "out", "plot")
    check_table_suffix(args.out)
    planners = args.planner or list(DEMO_PLANNERS)
    for spec in planners:
        check_spec(spec)
    graph = read_taskgraph(args)
    machine = machine_from_spec(args.machine)
    if args.what == "parts":
        return _ablate_parts(args, graph, machine)
    fixed = args.fixed or "planned"
    steps = len(planners) * (1 + len(args.noise) + args.measured)   # ablate_determinism's
    with phases(args).steps("ablating", steps) as step:
        table = ablate_determinism(graph, machine, planners, args.noise, args.seeds,
                                   measured=args.measured, backend=args.backend,
                                   rate_limit=not args.no_rate_limit, progress=step,
                                   workload=args.workload or args.taskgraph,
                                   machine_text=args.machine, fixed=fixed)
    written = write_table_and_plot(args, table, "ablation_plot",
                                    f"{graph.name} on {args.machine}: dynamic vs the {fixed} "
                                    f"order, {args.seeds} seeds")
    if args.json:
        print(json_text(table.to_dict("records")))
        return 0
    shown = table[["planner", "source", "noise", "mean_speedup", "ci_low", "ci_high"]].copy()
    shown["noise"] = shown["noise"].map(lambda x: "real" if x is None or x != x else f"{x:g}")
    for column in ("mean_speedup", "ci_low", "ci_high"):
        shown[column] = shown[column].map(lambda x: f"{100 * x:+.2f}%")
    print(f"{graph.name} on {args.machine}: dynamic over {FIXED_SHOWN[fixed]}, mean of "
          f"{args.seeds} seeds, 95% bootstrap interval")
    print(shown.to_string(index=False))
    for path in written:
        print(f"wrote {path}")
    return 0


def _ablate_parts(args: argparse.Namespace, graph, machine) -> int:
    """``ablate parts``: BuildMemGraph's parts one at a time."""
    from ..ablate import PARTS, ablate_parts
    for flag, given in (("--plot", args.plot), ("--planner", args.planner),
                        ("--measured", args.measured), ("--fixed", args.fixed)):
        if given:
            raise SpecError(f"{flag} does not apply to ablate parts (it varies buildmemgraph's "
                            f"parts in the simulator)")
    with phases(args).steps("ablating parts", sum(len(s) for _, s in PARTS)) as step:
        table = ablate_parts(graph, machine, args.policy, progress=step,
                             workload=args.workload or args.taskgraph, machine_text=args.machine)
    written = write_table_and_plot(args, table, "", "")
    if args.json:
        print(json_text(table.to_dict("records")))
        return 0
    shown = table[["part", "setting", "makespan", "change", "bytes_moved"]].copy()
    shown["change"] = shown["change"].map(lambda x: f"{100 * x:+.1f}%")
    shown["bytes_moved"] = shown["bytes_moved"].map(fmt_bytes)
    print(f"{graph.name} on {args.machine}: BuildMemGraph with one part changed at a time "
          f"({args.policy} dispatch, simulated; change against the defaults)")
    print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for path in written:
        print(f"wrote {path}")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``ablate`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``ablate`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("ablate", cmd_ablate, "determinism: dynamic dispatch against a fixed order "
            "(TURNIP's ablation: each GPU's kernels in the planner's order) under noise, with "
            "confidence intervals; parts: BuildMemGraph with one part changed at a time")
    p.add_argument("what", choices=("determinism", "parts"))
    problem_options(p)
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. p100x4:gpus=2")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner (repeatable; default: levelwise and buildmemgraph)")
    p.add_argument("--noise", type=noise_levels, default=(0.0, 0.05, 0.1, 0.2),
                   metavar="X,Y,...", help="noise levels (0,0.05,0.1,0.2)")
    p.add_argument("--seeds", type=positive_int, default=30,
                   help="noisy runs per policy and noise level (30); with --measured also "
                        "the executor's runs per policy")
    p.add_argument("--fixed", choices=tuple(FIXED_SHOWN),
                   help="determinism: the fixed order, TURNIP's (planned: each GPU's kernels "
                        "in the planner's order, the default) or the order each resource "
                        "started its vertices in a noiseless dynamic run (replay)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="parts: the dispatch policy the plans are simulated with (dynamic)")
    measured_options(p)
    table_options(p, "draw the speedups with their intervals")
