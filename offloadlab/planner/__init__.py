"""Planners: TaskGraph + Machine -> MemGraph, behind one protocol and a registry."""

# Importing the built-in planners registers them (greedy-offload, l2l, ilp-select and
# greedy-offload-nodiscount live in weight_offload).
from . import buildmemgraph, cotrain, flexgen, gemini, levelwise, turnip, weight_offload  # noqa: F401,E501
from .registry import PLANNERS, Planner, get_planner, plan, planner_options, register

__all__ = ["PLANNERS", "Planner", "get_planner", "plan", "planner_options", "register"]
