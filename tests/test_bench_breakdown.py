"""bench/bench_breakdown.py (issue 43): where a simulated run's time goes, each vertex at the
seconds it takes alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_breakdown import breakdown, table  # noqa: E402

from offloadlab.core.kernel_model import CLASSES  # noqa: E402

WORKLOAD = "llama-lora-train:model=tiny,seq=256,batch=2,gpus=2"


@pytest.mark.parametrize("machine", ["a100x8:gpus=2", "a100x8:gpus=2,cost=roofline"])
def test_kernel_seconds_add_up_to_the_gpus_busy_time(machine):
    """A GPU's streams share its speed without losing any, so its kernels' own seconds add up
    to the time it was busy; the rows by op and shape hold the same vertices and seconds as the
    rows by class."""
    run, classes, shapes = breakdown(WORKLOAD, machine, "buildmemgraph")
    kernels = sum(classes[c][1] for c in CLASSES if c in classes)
    gpus = sum(seconds for name, seconds in run["busy"].items() if name.startswith("gpu")
               and "->" not in name)
    assert kernels == pytest.approx(gpus, rel=1e-9)
    assert "load" in classes
    for i in (0, 1):
        by_shape, by_class = (sum(r[i] for r in rows.values()) for rows in (shapes, classes))
        assert by_shape == pytest.approx(by_class)


def test_table_ranks_by_seconds_and_cuts_at_top():
    rows = {"a": [4, 1.0, 2e12], "b": [2, 3.0, 0.0], "c": [2, 2.0, 4e12]}
    lines = table(rows, gpus=2, top=2)
    assert lines[2].startswith("| b | 1 | 1.5000 |")
    assert lines[3].startswith("| c | 1 | 1.0000 | 2.00")
    assert len(lines) == 4
