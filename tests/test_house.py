"""The house rules (issue 20): the whole package passes ruff and mypy with the settings in
``pyproject.toml``, so that CI (which runs this suite) keeps them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True)


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_the_tool_is_installed_with_the_test_extras(tool):
    assert run(tool, "--version").returncode == 0, f"{tool} is in the test extras"


def test_ruff_passes():
    proc = run("ruff", "check", "--no-cache", "offloadlab", "tests", "bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_passes():
    proc = run("mypy", "--cache-dir", "/dev/null", "offloadlab")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_house_keeps_its_measures():
    """Issue 44's goals as ``bench/house.py`` measures them: no import circle (imports inside
    functions included), no private name imported from another module, no function over 80
    lines (docstrings not counted), and no file over 600 lines."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "house.py"), "--json"],
                          cwd=REPO, capture_output=True, text=True)
    found = json.loads(proc.stdout)
    assert found["circles"] == [] and found["private_imports"] == [], found
    assert found["functions_over"] == [], found
    assert found["files_over"] == [], found
