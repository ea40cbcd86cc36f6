"""Random layered DAGs: the generator behind the property tests and the benchmarks."""

from __future__ import annotations

from ..errors import SpecError
from ..taskgraph import TaskGraph
from .layered import draw_layered
from .registry import workload


@workload("random", vertices=lambda o: o["vertices"])
def random_dag(vertices: int = 100, gpus: int = 2, seed: int = 0, min_bytes: int = 2**20,
               max_bytes: int = 2**24, max_inputs: int = 3, window: int = 16,
               input_fraction: float = 0.15, host_fraction: float = 0.5,
               transfer_fraction: float = 0.1, flops_per_byte: float = 64.0) -> TaskGraph:
    """A DAG of exactly ``vertices`` vertices spread over ``gpus`` GPUs.

    Each new vertex is an input or a compute vertex on a random GPU reading tensors among the
    last vertices, which keeps the graph local the way layered networks are.  A tensor needed
    on another GPU comes through a transfer vertex.  Sizes are rounded down to whole float32
    elements, so that every planned offset is aligned for the executor's kernels.

    Parameters
    ----------
    vertices : int
        The vertex count.
    gpus : int
        GPUs.
    seed : int
        Seeds the drawing.
    min_bytes, max_bytes : int
        Sizes are log-uniform in ``[min_bytes, max_bytes]``.
    max_inputs : int
        The most tensors a compute vertex reads (at least one).
    window : int
        A compute vertex reads among the last ``window`` vertices.
    input_fraction : float
        The probability that a new vertex is an input.
    host_fraction : float
        The probability that an input lives in host RAM (else on a GPU).
    transfer_fraction : float
        The probability of a transfer vertex where a cross-GPU read is possible.
    flops_per_byte : float
        A compute vertex's flops per byte it touches.

    Returns
    -------
    TaskGraph

    Raises
    ------
    SpecError
        A count that is not positive, a probability outside [0, 1], or sizes out of order.
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
    g = TaskGraph(name="random", meta=dict(vertices=vertices, gpus=gpus, seed=seed))
    draw_layered(g, vertices, gpus, seed, min_bytes, max_bytes, max_inputs, window,
                 input_fraction, host_fraction, transfer_fraction, flops_per_byte)
    return g
