"""``offloadlab diff``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.dispatch import POLICIES
from .common import AddCommand, json_text, leave, phases, stored_machine, verifying


def cmd_diff(args: argparse.Namespace) -> int:
    """Two MemGraph files of one TaskGraph: the moves only one makes, both simulated makespans,
    and where the timelines part.

    Parameters
    ----------
    args : argparse.Namespace
        The ``diff`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the differences are printed.
    """
    from ...core.formats import read_memgraph
    from ...core.machine import machine_from_spec
    from ..diff import check_same_taskgraph, diff, text

    names = (args.a, args.b)
    plans = []
    for path in names:
        with phases(args).phase(f"reading {path}"):
            plans.append(read_memgraph(path))
    a, b = plans
    leave(a, b)
    check_same_taskgraph(a, b, names)
    machine = machine_from_spec(args.machine) if args.machine else stored_machine(a, args.a)
    for mg, path in zip(plans, names):
        with verifying(args, mg, None, machine, path, beside=False):
            pass
    with phases(args).phase(f"simulating both ({args.policy})"):
        found = diff(a, b, machine, args.policy, names)
    if args.json:
        from dataclasses import asdict
        print(json_text({"a": args.a, "b": args.b, "machine": machine.name,
                          "policy": args.policy, **asdict(found)}))
    else:
        print(text(found, names))
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``diff`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``diff`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("diff", cmd_diff, "two MemGraphs of one TaskGraph: what each moves that the other "
            "does not, and where their simulated timelines part")
    p.add_argument("a", metavar="A", help="a MemGraph file")
    p.add_argument("b", metavar="B", help="another MemGraph file of the same TaskGraph")
    p.add_argument("--machine", metavar="SPEC",
                   help="simulate both on this machine (default: the one A stores)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy of both simulations (dynamic)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
