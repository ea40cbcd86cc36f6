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


def _functions(objects):
    """The functions among ``objects``, and the public methods of the classes among them."""
    for target in objects:
        if target.is_function:
            yield target
        elif target.is_class:
            yield from (method for method_name, method in target.members.items()
                        if not method_name.startswith("_") and not method.is_alias
                        and method.is_function and "property" not in method.labels)


def _rendered_functions(module):
    """The public functions a module's page shows, and the public methods of its classes."""
    return _functions(member.final_target if member.is_alias else member
                      for name, member in module.members.items()
                      if not name.startswith("_") and member.is_public)


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


def _fail_on_gaps(functions):
    gaps = [f"{function.path} ({function.relative_filepath}:{function.lineno}): {gap}"
            for function in functions for gap in _docstring_gaps(function)]
    if gaps:
        pytest.fail("\n".join(gaps), pytrace=False)


@pytest.mark.parametrize("name", API_MODULES)
def test_api_reference_functions_document_parameters_and_returns(package, name):
    _fail_on_gaps(_rendered_functions(package[name.removeprefix("offloadlab.")]))


# Every other public function: each module of the package (not the script that exports the
# traced models, package data under offloadlab/data) documents its OWN public functions and
# methods (not names it imports from elsewhere) as the API reference's do.
MODULES = sorted(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                 for path in (REPO / "offloadlab").rglob("*.py")
                 if "data" not in path.relative_to(REPO / "offloadlab").parts)


def _own_functions(module):
    """The public functions a module defines, and the public methods of the classes it defines."""
    return _functions(member for name, member in module.members.items()
                      if not name.startswith("_") and not member.is_alias)


@pytest.mark.parametrize("name", MODULES)
def test_every_public_function_documents_parameters_and_returns(package, name):
    module = package if name == "offloadlab" else package[name.removeprefix("offloadlab.")]
    _fail_on_gaps(_own_functions(module))
