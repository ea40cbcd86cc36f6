"""The main entry points' docstrings: numpydoc sections, and examples that run (issue 44)."""

import doctest
import re
from pathlib import Path

import pytest

from offloadlab.executor import execute
from offloadlab.lab.compare import compare_planners
from offloadlab.lab.diff import diff
from offloadlab.lab.estimate import estimate
from offloadlab.lab.explain import explain
from offloadlab.planner import plan
from offloadlab.simulator import simulate

REPO = Path(__file__).resolve().parent.parent
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


# The API reference's functions: every public function and method of a module a page of
# docs/api/ renders (`::: offloadlab...`, names it re-exports included) documents each parameter
# in a numpydoc `Parameters` section, and what it returns in `Returns` (`Yields`).  Read from the
# source with griffe, as mkdocstrings reads it for the site.
API_PAGES = REPO / "docs" / "api"
API_MODULES = sorted({name for page in API_PAGES.glob("*.md")
                      for name in re.findall(r"^::: (\S+)", page.read_text("utf-8"), re.M)})
NO_RESULT = {"None", "NoReturn", "Never"}


@pytest.fixture(scope="module")
def package():
    griffe = pytest.importorskip("griffe", reason="the docs extra is not installed")
    loader = griffe.GriffeLoader(search_paths=[str(REPO)], docstring_parser=griffe.Parser.numpy)
    loaded = loader.load("offloadlab")
    loader.resolve_aliases(implicit=False, external=False)
    return loaded


def _rendered_functions(module, own=False):
    """The public functions a module's page shows, and the public methods of its classes;
    ``own``: only those the module defines (by name, not the names it re-exports)."""
    for name, member in module.members.items():
        if name.startswith("_") or (member.is_alias if own else not member.is_public):
            continue
        target = member.final_target if member.is_alias else member
        if target.is_function:
            yield target
        elif target.is_class:
            yield from (method for method_name, method in target.members.items()
                        if not method_name.startswith("_") and not method.is_alias
                        and method.is_function and "property" not in method.labels)


def _docstring_gaps(function) -> list[str]:
    sections: dict[str, list[str]] = {}
    if function.docstring is not None:
        for section in function.docstring.parsed:
            names = [getattr(item, "name", "") for item in getattr(section, "value", [])] \
                if isinstance(section.value, list) else []
            sections.setdefault(section.kind.value, []).extend(names)
    taken = [p.name for p in function.parameters if p.name not in ("self", "cls")]
    listed = [name.lstrip("*") for name in sections.get("parameters", [])]
    gaps = [f"parameter {name!r} not in its Parameters section" for name in taken
            if name not in listed]
    gaps += [f"Parameters lists {name!r}, which it does not take" for name in listed
             if name not in taken]
    returns = str(function.returns) if function.returns is not None else "None"
    if returns not in NO_RESULT and not {"returns", "yields"} & set(sections):
        gaps.append(f"returns {returns} but has no Returns section")
    return gaps


@pytest.mark.parametrize("name", API_MODULES)
def test_api_reference_functions_document_parameters_and_returns(package, name):
    gaps = [f"{function.path} ({function.relative_filepath}:{function.lineno}): {gap}"
            for function in _rendered_functions(package[name.removeprefix("offloadlab.")])
            for gap in _docstring_gaps(function)]
    if gaps:
        pytest.fail("\n".join(gaps), pytrace=False)


# Every other public function and method of the covered packages: the module's own members,
# public by name, document their parameters and results the same way.
COVERED = ("offloadlab.lab", "offloadlab.planner", "offloadlab.executor", "offloadlab.simulator",
           "offloadlab.ilp")
MODULES = sorted(".".join(path.parent.parts if path.name == "__init__.py"
                          else path.with_suffix("").parts)
                 for path in (p.relative_to(REPO) for p in (REPO / "offloadlab").rglob("*.py")))


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith(COVERED)])
def test_every_public_function_documents_parameters_and_returns(package, name):
    gaps = [f"{function.path} ({function.relative_filepath}:{function.lineno}): {gap}"
            for function in _rendered_functions(package[name.removeprefix("offloadlab.")], own=True)
            for gap in _docstring_gaps(function)]
    if gaps:
        pytest.fail("\n".join(gaps), pytrace=False)
