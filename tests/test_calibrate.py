"""How ``calibrate`` measures kernels: in the conditions of a plan (docs/validation.md)."""

from __future__ import annotations

from collections import Counter

import pytest

from offloadlab.executor.calibrate import _kernels, workload_ops


@pytest.mark.parametrize("op", ["matmul", "add", "mix", "layer_forward", "relu", "linear"])
def test_each_kernel_calibrate_measures_reads_inputs_no_other_kernel_reads(op):
    # A kernel re-reading the inputs of the kernel before it finds them warm in the CPU's
    # caches; in a plan its inputs were written by another kernel or a copy.
    mg, size = _kernels(op, workload_ops()[op], (64, 128), reps=3)
    readers = Counter(u for v in mg if v.kind == "compute" for u in v.inputs)
    assert len(size) >= 3 and set(size) == {v.id for v in mg if v.kind == "compute"}
    assert readers and max(readers.values()) == 1
    assert all(mg[u].kind == "input" for u in readers)
