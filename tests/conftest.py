import pytest

from offloadlab.core.machine import MiB, machine_from_spec
from offloadlab.core.workloads import build_workload


@pytest.fixture
def disco():
    return machine_from_spec("disco-example")


def tp_machine(locations: int):
    """Three GPUs with room for ``locations`` tp-matmul tensors each (TURNIP Figs. 4/6)."""
    return machine_from_spec(f"p100x4:gpus=3,gpu_memory={4 * locations}MiB")


@pytest.fixture
def tp_graph():
    return build_workload("tp-matmul:n=1024")


__all__ = ["MiB", "tp_machine"]
