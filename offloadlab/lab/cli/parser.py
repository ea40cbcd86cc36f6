"""The ``offloadlab`` parser: the global options, then each command's, added by its module in
the order ``--help`` lists them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from ...core.errors import SpecError
from . import (
    ablate,
    calibrate,
    compare,
    demo,
    diff,
    estimate,
    execute,
    import_torch,
    listing,
    plan,
    reproduce,
    simulate,
    sweep,
    taskgraph,
    validate,
)
from .common import SPECS

COMMANDS = (demo, taskgraph, plan, compare, estimate, ablate, sweep, import_torch, diff, simulate,
            execute, calibrate, validate, reproduce, listing)
"""The command modules, in the order ``offloadlab --help`` lists them."""


def version() -> str:
    """The installed distribution's version (the package's own when not installed).

    Returns
    -------
    str
        The version, e.g. ``1.2.0``.
    """
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed
    try:
        return installed("offloadlab")
    except PackageNotFoundError:
        from ... import __version__
        return __version__


class _VersionAction(argparse.Action):
    """``--version``: print ``offloadlab X.Y.Z`` and exit 0 (the version is looked up only
    then, so that building the parser stays fast)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"offloadlab {version()}")
        parser.exit()


QUIET_HELP = "no progress output and no informational lines on stderr"


PROGRESS_HELP = "progress bars on stderr even when it is not a terminal (default: on a terminal)"


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors end like every other error: one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise SpecError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``offloadlab`` parser: every command of :data:`COMMANDS` and the options they all take.

    Returns
    -------
    argparse.ArgumentParser
        The parser; each command's ``func`` is its handler.
    """
    parser = _Parser(
        prog="offloadlab", epilog=SPECS, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan and simulate CPU-RAM offload of GPU computations.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    parser.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=SPECS,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=fn)
        # also after the command; SUPPRESS keeps the global flag's value when absent here
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help=QUIET_HELP)
        p.add_argument("--progress", action="store_true", default=argparse.SUPPRESS,
                       help=PROGRESS_HELP)
        return p
    for command in COMMANDS:
        command.add_parser(add)
    return parser
