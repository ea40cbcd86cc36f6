"""Planners: TaskGraph + Machine -> MemGraph, behind one protocol and a registry."""

from .registry import PLANNERS, Planner, get_planner, plan, planner_options, register
from . import buildmemgraph, levelwise  # noqa: E402,F401  (register the built-in planners)

__all__ = ["PLANNERS", "Planner", "get_planner", "plan", "planner_options", "register"]
