"""Device names: ``"gpu0"``, ``"cpu"``, ``"host"`` and transfers ``"gpu0->gpu1"``."""

from __future__ import annotations

HOST = "host"
CPU = "cpu"


def is_gpu(device: str) -> bool:
    return device.startswith("gpu") and "->" not in device


def gpu_name(index: int) -> str:
    return f"gpu{index}"


def gpu_index(device: str) -> int:
    return int(device[3:])


def split_transfer(device: str) -> tuple[str, str]:
    """``"gpu0->gpu1"`` -> ``("gpu0", "gpu1")``."""
    src, _, dst = device.partition("->")
    return src, dst
