import importlib
import os
import signal
from types import ModuleType

import pytest

from offloadlab.core.machine import MiB, machine_from_spec
from offloadlab.core.workloads import build_workload


@pytest.fixture
def disco():
    return machine_from_spec("disco-example")


@pytest.fixture
def ctrl_c():
    """Ctrl-C as a user's shell delivers it, whatever the test process inherited or an earlier
    test left (a test runner's worker may ignore SIGINT, and a process started while it is
    ignored ignores it too): Python's own handler for the test, the previous one after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def tp_machine(locations: int):
    """Three GPUs with room for ``locations`` tp-matmul tensors each (TURNIP Figs. 4/6)."""
    return machine_from_spec(f"p100x4:gpus=3,gpu_memory={4 * locations}MiB")


@pytest.fixture
def tp_graph():
    return build_workload("tp-matmul:n=1024")


def need_torch() -> ModuleType:
    """``torch``, or skip the test where it is not installed; with OFFLOADLAB_REQUIRE_TORCH=1
    (.ci/run, which installs the CPU wheel) a missing torch fails the test instead."""
    if os.environ.get("OFFLOADLAB_REQUIRE_TORCH") == "1":
        try:
            return importlib.import_module("torch")
        except ImportError as exc:
            pytest.fail(f"OFFLOADLAB_REQUIRE_TORCH=1 but torch does not import: {exc}")
    return pytest.importorskip("torch")


__all__ = ["MiB", "need_torch", "tp_machine"]
