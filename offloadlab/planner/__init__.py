"""Planners: TaskGraph + Machine -> MemGraph, behind one protocol and a registry."""

from .registry import PLANNERS, Planner, get_planner, plan, planner_options, register

__all__ = ["PLANNERS", "Planner", "get_planner", "plan", "planner_options", "register"]
