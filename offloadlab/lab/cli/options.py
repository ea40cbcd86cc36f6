"""The commands' argument types (numbers, noise levels) and the option groups several
commands take."""

from __future__ import annotations

import argparse
import math

from ...core.backends import backend_names
from ...core.dispatch import POLICIES


def positive_int(text: str) -> int:
    """An argument type: an integer > 0.

    Parameters
    ----------
    text : str
        The argument, e.g. ``8``.

    Returns
    -------
    int
        The integer.

    Raises
    ------
    argparse.ArgumentTypeError
        Not an integer, or not positive.
    """
    value = nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An argument type: an integer >= 0.

    Parameters
    ----------
    text : str
        The argument, e.g. ``0``.

    Returns
    -------
    int
        The count.

    Raises
    ------
    argparse.ArgumentTypeError
        Not an integer, or negative.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """An argument type: a number >= 0 (``inf`` too).

    Parameters
    ----------
    text : str
        The argument, e.g. ``0.05`` or ``inf``.

    Returns
    -------
    float
        The number.

    Raises
    ------
    argparse.ArgumentTypeError
        Not a number, NaN or negative.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argument type: a finite number > 0.

    Parameters
    ----------
    text : str
        The argument, e.g. ``2.5``.

    Returns
    -------
    float
        The value.

    Raises
    ------
    argparse.ArgumentTypeError
        Not a number, or not positive and finite.
    """
    value = nonnegative_float(text)
    if value == 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def noise_levels(text: str) -> tuple[float, ...]:
    """An argument type: ``0,0.05,0.1``, noise levels, each a finite number >= 0.

    Parameters
    ----------
    text : str
        The argument.

    Returns
    -------
    tuple of float
        The levels.

    Raises
    ------
    argparse.ArgumentTypeError
        Not numbers, or one not finite and >= 0.
    """
    try:
        levels = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}"
                                         ) from None
    if not all(math.isfinite(x) and x >= 0 for x in levels):
        raise argparse.ArgumentTypeError(f"noise levels must be finite and >= 0, got {text!r}")
    return levels


def explain_options(p: argparse.ArgumentParser) -> None:
    """``simulate``'s and ``run``'s ``--explain`` and ``--categories``.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The command's parser.
    """
    p.add_argument("--explain", action="store_true",
                   help="say why the run is fast or slow: per GPU, the share of host copies "
                        "hidden under compute, the idle time by cause and memory by tensor "
                        "category (docs/explain.md)")
    p.add_argument("--categories", metavar="CSV", help="with --explain, write GPU memory in "
                   "use over time by category (.csv or .parquet)")


def measured_options(p: argparse.ArgumentParser) -> None:
    """``--measured`` and how: the executor's backend and its copies' pacing.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The command's parser.
    """
    p.add_argument("--measured", action="store_true",
                   help="also run each plan on the executor and report what it measured")
    p.add_argument("--backend", choices=backend_names(), default="numpy",
                   help="executor backend for --measured (numpy)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy at memcpy speed instead of the machine's links")


def table_options(p: argparse.ArgumentParser, plot: str) -> None:
    """``--json``, ``--out`` and ``--plot`` of the commands that make a table.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The command's parser.
    plot : str
        ``--plot``'s help.
    """
    p.add_argument("--json", action="store_true", help="print one JSON list of rows")
    p.add_argument("--out", metavar="FILE", help="write the table (.csv, or .parquet)")
    p.add_argument("--plot", metavar="PNG", help=plot)


def problem_options(p: argparse.ArgumentParser) -> None:
    """``--workload SPEC`` or ``--taskgraph FILE``, one of them required.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The command's parser.
    """
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file")


def executor_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that execute MemGraphs.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The command's parser.
    """
    p.add_argument("--backend", choices=backend_names(), default="numpy",
                   help="numpy: threads on the CPU (any machine); cupy: an NVIDIA GPU (numpy)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy as fast as memcpy instead of at the machine's "
                        "link bandwidths")
