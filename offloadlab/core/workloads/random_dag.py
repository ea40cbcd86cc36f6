"""Random layered DAGs: the generator behind the property tests and the benchmarks."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

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
    below, uniform01 = _below(rng), rng.random
    g = TaskGraph(name="random", meta=dict(vertices=vertices, gpus=gpus, seed=seed))
    lo, hi = math.log(min_bytes), math.log(max_bytes)
    where: list[str] = []    # each vertex's output device (host or a GPU), by index
    sizes: list[int] = []
    last_on_gpu = -window - 1   # the latest vertex whose output is on a GPU
    names = [gpu_name(i) for i in range(gpus)]

    def size() -> int:
        nbytes = int(math.exp(lo + (hi - lo) * uniform01()))   # rng.uniform(lo, hi)
        return nbytes - nbytes % 4 or nbytes      # whole float32 elements (aligned views)

    for n in range(vertices):
        recent = range(max(0, n - window), n)
        if n == 0 or uniform01() < input_fraction:
            home = "host" if uniform01() < host_fraction else names[below(gpus)]
            nbytes = size()
            g.add_input(f"v{n}", nbytes, home=home)
        elif (gpus > 1 and last_on_gpu >= n - window and n + 1 < vertices
              and uniform01() < transfer_fraction):
            gpu_tensors = [u for u in recent if where[u] != "host"]
            src = gpu_tensors[below(len(gpu_tensors))]
            others = [d for d in names if d != where[src]]
            home = others[below(len(others))]
            nbytes = sizes[src]
            g.add_transfer(f"v{n}", f"v{src}", home)
        else:
            home = names[below(gpus)]
            readable = [u for u in recent if where[u] in (home, "host")]
            picks = [below(len(readable) or 1) for _ in range(1 + below(max_inputs))]
            inputs = sorted({readable[i] for i in picks}) if readable else []
            nbytes = size()
            touched = nbytes + sum([sizes[u] for u in inputs])
            g.add_compute(f"v{n}", "mix", [f"v{u}" for u in inputs], home, nbytes,
                          flops=flops_per_byte * touched)
        where.append(home)
        sizes.append(nbytes)
        if home != "host":
            last_on_gpu = n
    return g


def _below(rng: random.Random) -> Callable[[int], int]:
    """``below(n)``: a uniform integer in ``[0, n)`` drawn as ``rng.randrange(n)`` and
    ``rng.choice`` draw it (rejection sampling on ``getrandbits``), without their layers of
    calls, so that a seed gives the graphs it always gave."""
    getrandbits = rng.getrandbits

    def below(n: int) -> int:
        k = n.bit_length()
        r = getrandbits(k)
        while r >= n:
            r = getrandbits(k)
        return r

    return below
