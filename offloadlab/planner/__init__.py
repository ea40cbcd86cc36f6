"""Planners: TaskGraph + Machine -> MemGraph, behind one protocol and a registry."""

from .registry import PLANNERS, Planner, get_planner, plan, planner_options, register
from . import buildmemgraph, levelwise, turnip  # noqa: E402,F401  (the built-in planners)
from . import weight_offload  # noqa: E402,F401  (greedy-offload, l2l, ilp-select, ...)

__all__ = ["PLANNERS", "Planner", "get_planner", "plan", "planner_options", "register"]
