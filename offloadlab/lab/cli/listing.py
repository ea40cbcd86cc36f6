"""``offloadlab list``: its parser and its handler."""

from __future__ import annotations

import argparse

from ...core.util import fmt_bytes
from .common import AddCommand


def cmd_list(args: argparse.Namespace) -> int:
    """List workloads, machine presets and planners with their options (``all``), or the
    dispatch policies, backends or ops.

    Parameters
    ----------
    args : argparse.Namespace
        The ``list`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the list is printed.
    """
    what = args.what
    if what in ("all", "workloads"):
        from ...core.workloads import WORKLOADS
        print("workloads (--workload NAME:key=value,...):")
        for entry in WORKLOADS.entries():
            print(f"  {entry.name:<14} {entry.doc}\n  {'':<14} {_options(dict(entry.options))}")
    if what in ("all", "machines"):
        from ...core.kernel_model import FIT_SOURCE
        from ...core.machine import PRESETS
        from ...core.presets import HOST_MEMORY
        print("machine presets (--machine NAME:field=value,...):")
        for name, m in PRESETS.items():
            host = "unlimited" if m.host_memory is None else fmt_bytes(m.host_memory)
            if name in HOST_MEMORY:
                host += f" ({HOST_MEMORY[name][1]})"
            fitted = f"; cost=fitted: {FIT_SOURCE}" if m.cost == "fitted" else ""
            print(f"  {name:<14} {m.gpus} GPU(s) x {fmt_bytes(m.gpu_memory)}, host memory "
                  f"{host}; {m.source}{fitted}")
    if what in ("all", "planners"):
        from dataclasses import fields

        from ...planner import PLANNERS
        print("planners (--planner NAME:key=value,...):")
        for entry in PLANNERS.entries():
            print(f"  {entry.name:<14} {entry.doc}")
            options = fields(PLANNERS[entry.name].options)
            if not options:
                print(f"  {'':<14} (no options)")
            for f in options:
                print(f"  {'':<14} {_options({f.name: f.default}):<18} {f.metadata['doc']}")
    if what in ("policies", "backends", "ops"):
        _list_names(what)
    return 0


def _options(options: dict[str, object]) -> str:
    """``key=value, ...`` as a spec would write them (``true``, not ``True``)."""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in options.items()) or "(no options)"


def _list_names(what: str) -> None:
    """``list policies``, ``list backends`` or ``list ops``: each name and what it is (an op's
    parameters with their defaults below it)."""
    from ...core.registry import Registry
    registry: Registry
    if what == "backends":
        from ...executor import BACKENDS  # the backends' modules declare them (NumPy)
        heading, registry = "executor backends (--backend NAME):", BACKENDS
    elif what == "policies":
        from ...core.dispatch import POLICIES
        heading, registry = "dispatch policies (--policy NAME):", POLICIES
    else:
        from ...core.ops import OPS
        heading, registry = "ops (a compute vertex's op, NAME or NAME:key=value,...):", OPS
    print(heading)
    for entry in registry.entries():
        print(f"  {entry.name:<14} {entry.doc}")
        if entry.options:
            print(f"  {'':<14} {_options(dict(entry.options))}")


def add_parser(add: AddCommand) -> None:
    """The ``list`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``list`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("list", cmd_list, "list workloads, machine presets and planners (all), or the "
            "dispatch policies, backends or ops")
    p.add_argument("what", nargs="?", default="all",
                   choices=("all", "workloads", "machines", "planners", "policies", "backends",
                            "ops"))
