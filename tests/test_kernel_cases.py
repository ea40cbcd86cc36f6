"""The GPU test's table of kernel cases (tests/kernel_cases.py) covers every kernel, and each
case runs on numpy: so that on a GPU every kernel is compared, none is missed or mis-shaped."""

import numpy as np
import pytest
from kernel_cases import KERNEL_SHAPES, kernel_case

from offloadlab.executor import kernels


def test_every_kernel_has_a_case():
    assert set(KERNEL_SHAPES) == set(kernels.KERNELS)


@pytest.mark.parametrize("op", sorted(kernels.KERNELS))
def test_each_case_runs_on_numpy(op):
    shape, args = kernel_case(op)
    k = kernels.KERNELS[op]
    out = np.full(shape, np.nan, np.float32)
    k.fn(np, out, args, np.full(k.scratch(out, args), 255, np.uint8))
    assert np.isfinite(out).all()
