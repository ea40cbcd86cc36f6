"""The race detector's checksum kernel on a GPU (needs CuPy and an NVIDIA GPU; skipped
otherwise): it agrees with NumPy's checksum at any size and alignment and allocates nothing."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    GPUS = cupy.cuda.runtime.getDeviceCount()
except Exception as exc:           # no driver, no device: CuPy raises CUDARuntimeError
    pytest.skip(f"no CUDA device visible: {exc}", allow_module_level=True)

from offloadlab.executor.races import checksum  # noqa: E402

pytestmark = pytest.mark.gpu


def test_the_cuda_checksum_is_numpys_and_allocates_nothing():
    data = np.random.default_rng(0).integers(0, 256, 2**22 + 7, dtype=np.uint8)
    device = cupy.asarray(data)
    slots = cupy.zeros(2, cupy.uint64)
    out, host = slots[1:2].reshape(()), np.zeros((), np.uint64)
    checksum(cupy, device[:5], out)                 # compiles the kernel
    previous = cupy.cuda.get_allocator()

    def refuse(nbytes):
        raise AssertionError(f"allocated {nbytes} bytes")

    cupy.cuda.set_allocator(refuse)
    try:
        for size in (1, 3, 4, 5, 1000, 4097, 2**20, 2**22 + 4):
            for offset in range(4):
                checksum(cupy, device[offset:offset + size], out)
                checksum(np, data[offset:offset + size], host)
                assert int(out.get()) == int(host), (size, offset)
    finally:
        cupy.cuda.set_allocator(previous)
