"""The main entry points' docstrings: numpydoc sections, and examples that run (issue 44)."""

import doctest

import pytest

from offloadlab.executor import execute
from offloadlab.lab.compare import compare_planners
from offloadlab.lab.diff import diff
from offloadlab.lab.estimate import estimate
from offloadlab.lab.explain import explain
from offloadlab.planner import plan
from offloadlab.simulator import simulate

ENTRY_POINTS = [plan, simulate, execute, compare_planners, explain, diff, estimate]


@pytest.mark.parametrize("function", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_entry_point_docstring_has_its_sections(function):
    doc = function.__doc__
    for section in ("Parameters", "Returns", "Raises", "Examples"):
        assert f"\n    {section}\n    {'-' * len(section)}\n" in doc, section


@pytest.mark.parametrize("function", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_entry_point_examples_run_and_print_what_they_say(function):
    module = __import__(function.__module__, fromlist=["_"])
    finder = doctest.DocTestFinder(recurse=False)
    [test] = finder.find(function, function.__name__, globs=vars(module).copy())
    assert test.examples, f"{function.__name__} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test, out=lambda text: None)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
