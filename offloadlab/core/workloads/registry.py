"""The workload registry: builders registered with :func:`workload` where they are defined.

A workload is a function whose keyword arguments, with their defaults, are its options and
whose docstring's first paragraph is its description (docs/extending.md, A workload).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

from ..registry import Registry
from ..taskgraph import TaskGraph

Builder = TypeVar("Builder", bound=Callable[..., TaskGraph])
Estimate = Callable[[dict], int]


def _signature_options(fn: Callable[..., object]) -> dict[str, object]:
    """A builder's options: its keyword arguments with their defaults."""
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()}


WORKLOADS: Registry[Callable[..., TaskGraph]] = Registry("workload", options=_signature_options)
"""The workload builders by name, in the order ``offloadlab list`` shows them."""

VERTICES: dict[str, Estimate] = {}
"""Each workload's vertex estimate from its options (:func:`workload`'s ``vertices``)."""


def workload(name: str, vertices: Estimate | None = None) -> Callable[[Builder], Builder]:
    """Register a builder as workload ``name``.

    Parameters
    ----------
    name : str
        The workload's name in specs (``NAME:key=value,...``).
    vertices : callable, optional
        ``vertices(options)`` bounds the vertices the builder builds (at most 1.6 times the
        count) before anything is built, so that a spec too large for the RAM available is
        refused at once (docs/limits.md); without it nothing is checked.

    Returns
    -------
    callable
        The decorator; it returns the builder unchanged.
    """
    def deco(fn: Builder) -> Builder:
        WORKLOADS[name] = fn
        if vertices is not None:
            VERTICES[name] = vertices
        return fn
    return deco
