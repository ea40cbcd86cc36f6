"""Timing helper shared by the benchmarks (run them as ``python bench/NAME.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def best_of(repeat: int, fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of the fastest of ``repeat`` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        runs.append((time.perf_counter() - start, result))
    return min(runs, key=lambda r: r[0])
