"""The drawing loop behind :func:`~offloadlab.core.workloads.random_dag.random_dag`, in a
module of its own so that it is compiled (docs/install.md, The compiled build) while ``random_dag``,
whose signature and docstring are the workload's options and description, stays Python."""

from __future__ import annotations

import math
import random

from ..devices import gpu_name
from ..taskgraph import Task, TaskGraph


def draw_layered(g: TaskGraph, vertices: int, gpus: int, seed: int, min_bytes: int,
                 max_bytes: int, max_inputs: int, window: int, input_fraction: float,
                 host_fraction: float, transfer_fraction: float,
                 flops_per_byte: float) -> None:
    """Add ``random_dag``'s ``vertices`` vertices to the empty graph ``g``.

    Parameters
    ----------
    g : TaskGraph
        The empty graph, filled in place.
    vertices, gpus, seed, min_bytes, max_bytes, max_inputs
        :func:`~offloadlab.core.workloads.random_dag.random_dag`'s options, already checked,
    window, input_fraction, host_fraction, transfer_fraction, flops_per_byte
        and the rest of them.
    """
    rng = random.Random(seed)
    getrandbits, uniform01 = rng.getrandbits, rng.random
    tasks = g.tasks               # a fresh graph and fresh ids: no duplicate to check
    lo, hi = math.log(min_bytes), math.log(max_bytes)
    where: list[str] = []    # each vertex's output device (host or a GPU), by index
    sizes: list[int] = []
    ids: list[str] = []      # each vertex's id, by index: its readers name it by this object
    last_on_gpu = -window - 1   # the latest vertex whose output is on a GPU
    names = [gpu_name(i) for i in range(gpus)]
    for n in range(vertices):
        vid = f"v{n}"
        if n == 0 or uniform01() < input_fraction:
            home = "host" if uniform01() < host_fraction else names[_below(getrandbits, gpus)]
            nbytes = _draw_size(uniform01(), lo, hi)
            tasks[vid] = Task(vid, "input", home, nbytes)
        elif (gpus > 1 and last_on_gpu >= n - window and n + 1 < vertices
              and uniform01() < transfer_fraction):
            gpu_tensors = [u for u in range(max(0, n - window), n) if where[u] != "host"]
            src = gpu_tensors[_below(getrandbits, len(gpu_tensors))]
            others = [d for d in names if d != where[src]]
            home = others[_below(getrandbits, len(others))]
            nbytes = sizes[src]
            tasks[vid] = Task(vid, "transfer", f"{where[src]}->{home}", nbytes, (ids[src],))
        else:
            home = names[_below(getrandbits, gpus)]
            readable = [u for u in range(max(0, n - window), n) if where[u] in (home, "host")]
            picks = [_below(getrandbits, len(readable) or 1)
                     for _ in range(1 + _below(getrandbits, max_inputs))]
            inputs = sorted({readable[i] for i in picks}) if readable else []
            nbytes = _draw_size(uniform01(), lo, hi)
            touched = nbytes + sum([sizes[u] for u in inputs])
            tasks[vid] = Task(vid, "compute", home, nbytes, tuple([ids[u] for u in inputs]),
                              "mix", flops_per_byte * touched)
        ids.append(vid)
        where.append(home)
        sizes.append(nbytes)
        if home != "host":
            last_on_gpu = n


def _draw_size(u: float, lo: float, hi: float) -> int:
    """A log-uniform size in ``[e^lo, e^hi]`` from the uniform draw ``u`` (what
    ``rng.uniform(lo, hi)`` gives), rounded down to whole float32 elements (so that every
    planned offset is aligned for the executor's kernels)."""
    nbytes = int(math.exp(lo + (hi - lo) * u))
    return nbytes - nbytes % 4 or nbytes


def _below(getrandbits, n: int) -> int:
    """A uniform integer in ``[0, n)`` drawn as ``rng.randrange(n)`` and ``rng.choice`` draw
    it (rejection sampling on ``getrandbits``), without their layers of calls, so that a
    seed gives the graphs it always gave."""
    k = n.bit_length()
    r: int = getrandbits(k)
    while r >= n:
        r = getrandbits(k)
    return r
