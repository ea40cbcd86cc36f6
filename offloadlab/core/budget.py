"""Memory bounds at the boundary: before a command builds what a specification, an option or
an input file asks for, it estimates the RAM that takes and refuses, naming the value and the
estimate, what would not fit in the RAM available (issue 42: a spec like
``random:vertices=1e12`` or ``--streams 1000000000`` once grew until the machine ran out).

Each estimate is a measured rate (bytes per vertex, per GPU, per stream slot, per byte of an
input file) times the count; every rate below cites its measurement: peak RSS by
``/usr/bin/time -f %M`` of the command at two sizes on this project's 2-core development
machine (CPython 3.12), the difference over the difference in size.
"""

from __future__ import annotations

from .errors import SpecError
from .util import fmt_bytes

TASK_VERTEX = 2100
"""RAM per TaskGraph vertex of a command that builds and plans it: ``offloadlab plan
--workload random:vertices=N,gpus=2,host_fraction=1,min_bytes=4096,max_bytes=65536 --machine
p100x4:gpus=2,gpu_memory=64MiB`` peaked at 227 MB for N = 100k and 851 MB for 400k: 2.08 kB
per vertex (the TaskGraph, its MemGraph and the planner's state)."""

MACHINE_GPU = 1400
"""RAM per GPU of a machine: ``plan --workload matmul-chain:layers=2 --machine
p100x4:gpus=G`` peaked at 1.34 GB for G = 1M and 5.27 GB for 4M (1.31 kB per GPU: the
planners' per-GPU names and budgets); ``simulate`` of that plan 0.35 kB per GPU."""

STREAM_SLOT = 60
"""RAM per compute stream slot per GPU: ``run --workload tp-matmul:n=64 --machine
p100x4:gpus=3 --streams K`` peaked at 294 MB for K = 1M and 810 MB for 4M (57 B per slot of
each of its 3 GPUs); ``simulate --streams K`` of a 2-GPU plan 39 B."""

JSON_FILE_BYTE = 6
"""RAM per byte of a graph file this toolkit wrote (read by the typed reader): reading a
23.6 MB TaskGraph of 100k vertices peaked at 150 MB (5.8 B per byte), a 64 MB MemGraph at
330 MB (4.9 B per byte), both less 16 MB of interpreter and modules."""

OTHER_JSON_FILE_BYTE = 12
"""RAM per byte of any other JSON input, which may take the checking reader (Python's json
module on the decoded text): ``simulate`` of that 64 MB MemGraph with one ``NaN`` peaked at
776 MB (12 B per byte).  A file of nothing but empty objects ``[{},{},...]`` takes the most
per byte, 34 (1.03 GB for 30 MB), before it is refused as not node-link data."""

PARQUET_FILE_BYTE = 64
"""RAM per byte of a MemGraph Parquet file (its columns are compressed; the Arrow table and
the MemGraph built from it are not): reading the benchmark DAG's MemGraph (165k vertices,
7.3 MB of Parquet) peaked at 419 MB, LoRA 7B batch 8's (390k vertices, 16.5 MB) at 929 MB:
55-57 B per byte less the interpreter's 63 MB."""


def ram_available() -> int | None:
    """Bytes of RAM available now: the kernel's ``MemAvailable``, less where a cgroup (v2)
    limit leaves less (a container).

    Returns
    -------
    int or None
        The bytes available; None where neither can be read.
    """
    found = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                found.append(max(int(limit) - int(f.read()), 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_ram(what: str, need: float) -> None:
    """Refuse what would need ``need`` bytes of RAM when less is available.

    Parameters
    ----------
    what : str
        Names the value asked for (``"random:vertices=1e12 (10^12 vertices)"``).
    need : float
        The bytes of RAM it would need.

    Raises
    ------
    SpecError
        Less RAM is available than ``need`` (one line).
    """
    available = ram_available()
    if available is not None and need > available:
        raise SpecError(f"{what} would need about {fmt_bytes(need)} of RAM, more than the "
                        f"{fmt_bytes(available)} available")
