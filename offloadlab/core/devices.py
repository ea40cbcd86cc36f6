"""Device names: ``"gpu0"``, ``"cpu"``, ``"host"`` and transfers ``"gpu0->gpu1"``; the
resources vertices hold besides them: host links ``"h2d:gpu0"``/``"d2h:gpu0"`` and host buses
``"bus:h2d"`` (shared by all GPUs) or ``"bus1:h2d"`` (by a group of them)."""

from __future__ import annotations

import re

HOST = "host"
CPU = "cpu"


def is_gpu(device: str) -> bool:
    """Whether ``device`` is a GPU (``gpu0``), not a transfer between GPUs (``gpu0->gpu1``).

    Parameters
    ----------
    device : str
        A device or resource name.

    Returns
    -------
    bool
        It names a GPU.
    """
    return device.startswith("gpu") and "->" not in device


def is_gpu_name(device: object) -> bool:
    """Whether ``device`` is a well-formed GPU name: ``gpu`` and a decimal index without
    leading zeros (``gpu0``, ``gpu12``; not ``gpu``, ``gpu01``, ``gpuX``).

    Parameters
    ----------
    device : object
        The value to check.

    Returns
    -------
    bool
        It is a well-formed GPU name.
    """
    if type(device) is not str or not device.startswith("gpu"):
        return False
    index = device[3:]
    return index.isascii() and index.isdigit() and (index == "0" or index[0] != "0")


def gpu_name(index: int) -> str:
    """The name of GPU ``index``: ``3`` -> ``"gpu3"``.

    Parameters
    ----------
    index : int
        The GPU's index.

    Returns
    -------
    str
        Its device name.
    """
    return f"gpu{index}"


def gpu_index(device: str) -> int:
    """The index of GPU ``device``: ``"gpu3"`` -> ``3``.

    Parameters
    ----------
    device : str
        A GPU's name.

    Returns
    -------
    int
        Its index.
    """
    return int(device[3:])


def is_bus(resource: str) -> bool:
    """Whether ``resource`` is a host bus (:meth:`~offloadlab.core.machine.Machine.resources`).

    Parameters
    ----------
    resource : str
        A resource name.

    Returns
    -------
    bool
        It is a host bus (``bus:h2d``, ``bus1:d2h``).
    """
    return resource.startswith("bus")


def split_transfer(device: str) -> tuple[str, str]:
    """``"gpu0->gpu1"`` -> ``("gpu0", "gpu1")``.

    Parameters
    ----------
    device : str
        A transfer's device.

    Returns
    -------
    tuple of (str, str)
        Its source and destination.
    """
    src, _, dst = device.partition("->")
    return src, dst


_INDEX = re.compile(r"(\d+)")


def lane_key(resource: str) -> tuple:
    """Sort key for the lanes of a schedule (Gantt charts, Perfetto traces): GPUs, then their
    h2d/d2h links, shared buses, GPU->GPU links, the CPU, anything else; numbers inside names
    compare numerically (gpu2 < gpu10).

    Parameters
    ----------
    resource : str
        A lane's resource name.

    Returns
    -------
    tuple
        The key.
    """
    if resource.startswith(("h2d:", "d2h:")):
        group = 1
    elif is_bus(resource):
        group = 2
    elif "->" in resource:
        group = 3
    elif resource.startswith("gpu"):
        group = 0
    elif resource == "cpu":
        group = 4
    else:
        group = 5
    indices = tuple(int(n) for n in _INDEX.findall(resource))
    direction = 1 if "d2h" in resource else 0
    return group, indices, direction, resource
