"""Helpers shared by the benchmarks: timing, and the docs tables they regenerate (run them as
``python bench/NAME.py``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")


def best_of(repeat: int, fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of the fastest of ``repeat`` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        runs.append((time.perf_counter() - start, result))
    return min(runs, key=lambda r: r[0])


def stopwatch(row: dict) -> Callable[[str | None], None]:
    """``lap(stage)`` writes the seconds since the previous lap (or since the stopwatch was
    made) into ``row[stage]``; ``lap(None)`` restarts without writing."""
    clock = time.perf_counter()

    def lap(stage: str | None) -> None:
        nonlocal clock
        now = time.perf_counter()
        if stage is not None:
            row[stage] = now - clock
        clock = now
    return lap


def in_fresh_process(script: str, point: str, timeout: float) -> tuple[dict | None, str]:
    """Run ``python SCRIPT --one POINT`` (which prints one JSON row) in a process of its own:
    ``(row, "")``, or ``(None, why)`` if it timed out or failed (its last line on stderr)."""
    try:
        out = subprocess.run([sys.executable, script, "--one", point], capture_output=True,
                             text=True, check=True, timeout=timeout).stdout
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    except subprocess.CalledProcessError as exc:
        lines = exc.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {exc.returncode}"
    return json.loads(out), ""


def markdown(table: pd.DataFrame) -> list[str]:
    """``table`` as the lines of a Markdown table."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    return lines + ["| " + " | ".join(map(str, row)) + " |"
                    for row in table.itertuples(index=False)]


def write_between(page: Path, marker: str, text: str) -> None:
    """Replace what ``page`` has between its two ``marker`` lines with ``text``."""
    parts = page.read_text(encoding="utf-8").split(marker)
    if len(parts) != 3:
        raise SystemExit(f"{page}: needs two {marker!r} lines around the results")
    page.write_text(f"{parts[0]}{marker}\n{text}{marker}{parts[2]}", encoding="utf-8")


def replace_docs_block(page: Path, begin: str, end: str, text: str) -> bool:
    """Put ``text`` between the lines ``begin`` and ``end`` of the docs ``page``; False (and
    the page untouched) if it has no such block."""
    new, n = re.subn(re.escape(begin) + ".*?" + re.escape(end),
                     lambda _: f"{begin}\n{text}\n{end}", page.read_text(), flags=re.S)
    if n != 1:
        print(f"{page}: no {begin} ... {end} block", file=sys.stderr)
        return False
    page.write_text(new)
    return True
