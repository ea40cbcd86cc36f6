"""The manual: the MkDocs site builds with --strict, and every runnable command example in
README.md and docs/ gives output of the shape its page shows (tests/docs_examples.py)."""

import os
import re
import subprocess
import sys

import pytest
from docs_examples import REPO, Example, examples, folder, mask, pages, run, shape_errors

RUNNABLE = [page for page in pages() if examples(page)]
# The site and the examples test the manual, not the build: the compiled pass of CI skips them.
slow = pytest.mark.slow


@slow
def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python",
                        reason="the docs extra is not installed: pip install '.[docs]'")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "--config-file", str(REPO / "mkdocs.yml"),
                            "--site-dir", str(tmp_path / "site")],
                           cwd=REPO, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})   # Material's banner
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "commands" / "plan" / "index.html").is_file()


@slow
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_command_examples_give_the_output_shown(page):
    with folder():
        for example in examples(page):
            status, printed, err = run(example.argv)
            errors = shape_errors(example, status, printed, err)
            assert not errors, f"{example}:\n  " + "\n  ".join(errors)


SLOW = {"calibrate", "import-torch"}
"""Commands whose examples take more than a few seconds: shown in ```text blocks, not run."""


def test_every_command_has_a_page_with_an_example_and_its_output():
    from offloadlab.lab.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command in sub.choices:
        page = REPO / "docs" / "commands" / f"{command}.md"
        assert page.is_file(), f"no page {page.relative_to(REPO)}"
        shown = examples(page, "text" if command in SLOW else "console")
        assert any(e.argv[0] == command and e.output for e in shown), f"{page}: no example"


def test_shape_check_catches_a_changed_header_status_or_first_line(tmp_path):
    """The check can fail: another column header, exit status or first line is reported."""
    page = tmp_path / "page.md"
    page.write_text("```console\n$ offloadlab list \\\n    planners\nplanners:\n"
                    "  name  options\n```\n", encoding="utf-8")
    example = examples(page)[0]
    assert example.argv == ["list", "planners"] and example.line == 2
    assert example.output == ["planners:", "  name  options"]
    assert shape_errors(example, 0, ["planners:", "name   options"], []) == []
    assert len(shape_errors(example, 0, ["planners:", "name size"], [])) == 1
    assert len(shape_errors(example, 2, ["offloadlab: error: x"], ["offloadlab: error: x"])) == 3
    assert len(shape_errors(example, 0, ["workloads:", "name options"], [])) == 1
    example.output = ["...", "  name  options"]                 # lines left out
    assert shape_errors(example, 0, ["workloads:", "name options"], []) == []
    assert mask("12 points in sweep-random-6cbea727df9e.sqlite, 0.4021 s") == \
        mask("7 points in sweep-random-0123456789ab.sqlite, 12 s")


def _sample(page: str, command: str, fence: str = "console") -> Example:
    """The example of ``docs/PAGE`` that runs ``offloadlab COMMAND``."""
    return next(e for e in examples(REPO / "docs" / page, fence) if e.argv[0] == command)


def test_compare_sample_has_every_planner():
    from offloadlab.planner import PLANNERS
    named = {line.split()[0].rstrip(":") for line in _sample("commands/compare.md",
                                                              "compare").output[2:]}
    assert named == set(PLANNERS)


def test_sweep_sample_is_what_the_sweep_gives(tmp_path):
    """Two of its points, rerun: the same figures, and the store the sweep names."""
    from offloadlab.lab.sweep import Store, default_store, grid, sweep
    lines = _sample("commands/sweep.md", "sweep", "text").output
    ps = grid("random:vertices=1000,gpus=4,seed=2", None, "p100x4:gpu_memory=300MB",
              ["levelwise", "buildmemgraph"], ["dynamic"],
              ["machine.h2d_bandwidth=2e9,4e9,8e9,12e9,16e9,25e9"])
    assert lines[0] == f"12 points: 0 already in {default_store(ps)}, 12 to run"
    rows = [line.split() for line in lines[2:14]]
    table = sweep([ps[0], ps[11]], Store(tmp_path / "s.sqlite"), workers=0)
    for row, (_, got) in zip((rows[0], rows[11]), table.iterrows()):
        assert row[:2] == [f"{got['machine.h2d_bandwidth'] / 1e9:g}e9", got.planner]
        assert row[3:6] == [f"{got.makespan:.4g}", f"{got.problem_bound:.4g}", f"{got.gap:.4g}"]


def test_readme_is_a_front_door():
    """At most 300 lines, its links into docs/ resolve, and no history in the manual."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).exists(), target
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\bcommits? [0-9a-f]{7,40}\b", text), page
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), page


SCRIPTS = ["README.md", "docs/getting-started.md", "docs/api/index.md"]
"""Pages whose ```python blocks are whole scripts (the other pages' are fragments)."""


@slow
@pytest.mark.parametrize("page", SCRIPTS)
def test_python_examples_run(page, capsys):
    blocks = re.findall(r"```python\n(.*?)```", (REPO / page).read_text(encoding="utf-8"), re.S)
    assert blocks, f"{page}: no python block"
    with folder():
        for block in blocks:
            exec(compile(block, page, "exec"), {})
    assert float(capsys.readouterr().out.split()[0]) > 0       # each prints a makespan first
