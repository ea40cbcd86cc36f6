"""Planners: TaskGraph + Machine -> MemGraph, behind one protocol and a registry.

Every module of the package is imported here, found by :mod:`pkgutil`, so that each planner
registers itself (``@register``) where it is defined: a new planner is a new module.
"""

import importlib
import pkgutil

from .registry import PLANNERS, Planner, get_planner, plan, planner_options, register

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PLANNERS", "Planner", "get_planner", "plan", "planner_options", "register"]
