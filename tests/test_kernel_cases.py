"""The GPU test's table of kernel cases (tests/kernel_cases.py) covers every kernel, and each
case runs on numpy: so that on a GPU every kernel is compared, none is missed or mis-shaped."""

import numpy as np
import pytest
from kernel_cases import KERNEL_SHAPES, kernel_case

from offloadlab.executor import kernels

pytestmark = pytest.mark.slow


def test_every_kernel_has_a_case():
    assert set(KERNEL_SHAPES) == set(kernels.KERNELS)


@pytest.mark.parametrize("op", sorted(kernels.KERNELS))
def test_each_case_runs_on_numpy(op):
    shape, args = kernel_case(op)
    k = kernels.KERNELS[op]
    out = np.full(shape, np.nan, np.float32)
    k.fn(np, out, args, np.full(k.scratch(out, args), 255, np.uint8))
    assert np.isfinite(out).all()


def _scaled(op: str, scale: int):
    """``op``'s case with every dimension times ``scale``, or, where that breaks the op's
    shape rules, only the first dimension of each 2-D shape, times ``32 * scale`` (None if
    neither runs)."""
    from kernel_cases import INTEGER_INPUTS
    shape, shapes = KERNEL_SHAPES[op]
    rng = np.random.default_rng(0)
    for grow in (lambda s: tuple(d * scale for d in s),
                 lambda s: (s[0] * 32 * scale, *s[1:]) if len(s) >= 2 else s):
        args = [rng.integers(0, INTEGER_INPUTS[op, j] * scale, size=grow(s)).astype(np.int64)
                if (op, j) in INTEGER_INPUTS else rng.standard_normal(grow(s)).astype(np.float32)
                for j, s in enumerate(shapes)]
        out = np.empty(grow(shape), np.float32)
        k = kernels.KERNELS[op]
        try:
            scratch = np.empty(k.scratch(out, args), np.uint8)
            k.fn(np, out, args, scratch)
        except (kernels.KernelError, ValueError):
            continue
        return k, out, args, scratch
    return None


def _transient(op: str, scale: int) -> tuple[int, int]:
    """The most memory ``op``'s kernel held at once beyond what it was given (tracemalloc's
    peak, which counts NumPy's arrays), and the bytes of its tensors, at ``scale``."""
    import tracemalloc
    case = _scaled(op, scale)
    if case is None:
        pytest.skip(f"{op}: no scaled case (its shapes are fixed)")
    k, out, args, scratch = case
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        k.fn(np, out, args, scratch)
        return tracemalloc.get_traced_memory()[1] - before, out.nbytes + sum(a.nbytes
                                                                             for a in args)
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("op", sorted(kernels.KERNELS))
def test_numpy_kernels_allocate_no_tensor(op):
    """The promise of kernels.py on the CPU: a kernel allocates no temporary that grows with
    its tensors.  Its transient memory at twice the size stays what it was (NumPy's ufunc
    iterator buffers, at most 8192 elements per operand, are the only allocations)."""
    small, small_tensors = _transient(op, 48)
    large, large_tensors = _transient(op, 96)
    assert large_tensors >= 2 * small_tensors - 64
    assert large <= small + 8192, (f"{op} held {small} bytes at once at scale 48 and {large} "
                                   f"at 96: a temporary grows with the tensors")
