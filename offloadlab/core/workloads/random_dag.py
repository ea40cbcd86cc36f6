"""Random layered DAGs: the generator behind the property tests and the benchmarks."""

from __future__ import annotations

import math
import random

from ..devices import gpu_name
from ..errors import SpecError
from ..taskgraph import TaskGraph


def random_dag(vertices: int = 100, gpus: int = 2, seed: int = 0, min_bytes: int = 2**20,
               max_bytes: int = 2**24, max_inputs: int = 3, window: int = 16,
               input_fraction: float = 0.15, host_fraction: float = 0.5,
               transfer_fraction: float = 0.1, flops_per_byte: float = 64.0) -> TaskGraph:
    """A DAG of exactly ``vertices`` vertices spread over ``gpus`` GPUs.

    Each new vertex is an input (probability ``input_fraction``; in host RAM with probability
    ``host_fraction``, else on a GPU) or a compute vertex on a random GPU reading 1 to
    ``max_inputs`` tensors among the last ``window`` vertices, which keeps the graph local
    the way layered networks are.  A tensor needed on another GPU comes through a transfer
    vertex (drawn with probability ``transfer_fraction`` when a cross-GPU read is possible).
    Sizes are log-uniform in ``[min_bytes, max_bytes]``, rounded down to whole float32
    elements (so that every planned offset is aligned for the executor's kernels); flops are
    ``flops_per_byte`` per byte touched.
    """
    for name, count in (("vertices", vertices), ("gpus", gpus), ("max_inputs", max_inputs),
                        ("window", window)):
        if count <= 0:
            raise SpecError(f"random: {name} must be positive, got {count}")
    for name, share in (("input_fraction", input_fraction), ("host_fraction", host_fraction),
                        ("transfer_fraction", transfer_fraction)):
        if not 0 <= share <= 1:
            raise SpecError(f"random: {name} is a probability, between 0 and 1; got {share}")
    if not 0 < min_bytes <= max_bytes:
        raise SpecError(f"random: need 0 < min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
    rng = random.Random(seed)
    g = TaskGraph(name="random", meta=dict(vertices=vertices, gpus=gpus, seed=seed))
    lo, hi = math.log(min_bytes), math.log(max_bytes)
    where: list[str] = []    # each vertex's output device (host or a GPU), by index
    sizes: list[int] = []

    def size() -> int:
        nbytes = int(math.exp(rng.uniform(lo, hi)))
        return nbytes - nbytes % 4 or nbytes      # whole float32 elements (aligned views)

    def add(out_device: str, nbytes: int) -> None:
        where.append(out_device)
        sizes.append(nbytes)

    for n in range(vertices):
        if n == 0 or rng.random() < input_fraction:
            home = "host" if rng.random() < host_fraction else gpu_name(rng.randrange(gpus))
            nbytes = size()
            g.add_input(f"v{n}", nbytes, home=home)
            add(home, nbytes)
            continue
        recent = range(max(0, n - window), n)
        gpu_tensors = [u for u in recent if where[u] != "host"]
        if gpus > 1 and gpu_tensors and n + 1 < vertices and rng.random() < transfer_fraction:
            src = rng.choice(gpu_tensors)
            dst = gpu_name(rng.choice([i for i in range(gpus) if gpu_name(i) != where[src]]))
            g.add_transfer(f"v{n}", f"v{src}", dst)
            add(dst, sizes[src])
            continue
        device = gpu_name(rng.randrange(gpus))
        readable: list[int | None] = [u for u in recent if where[u] in (device, "host")]
        picks = (rng.choice(readable or [None]) for _ in range(rng.randint(1, max_inputs)))
        inputs = sorted({u for u in picks if u is not None})
        out = size()
        touched = out + sum([sizes[u] for u in inputs])
        g.add_compute(f"v{n}", "mix", [f"v{u}" for u in inputs], device, out,
                      flops=flops_per_byte * touched)
        add(device, out)
    return g
