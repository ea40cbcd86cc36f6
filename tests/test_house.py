"""The house rules (issue 20): the whole package passes ruff and mypy with the settings in
``pyproject.toml``, so that CI (which runs this suite) keeps them."""

from __future__ import annotations

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
