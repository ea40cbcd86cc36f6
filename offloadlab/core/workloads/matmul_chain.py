"""The DISCO motivating example (DISCO Sec. 2, Figs. 1-3): ``X(i+1) = X(i) x Y(i)``."""

from __future__ import annotations

from ..devices import gpu_name
from ..errors import SpecError
from ..taskgraph import TaskGraph
from .registry import workload


def _vertices(o: dict) -> int:
    """An upper bound of the vertices :func:`matmul_chain` builds with options ``o``
    (tests/test_adversarial.py checks it against the graphs built)."""
    return o["gpus"] + o["layers"] * o["gpus"] * (o["gpus"] + 1)


@workload("matmul-chain", vertices=_vertices)
def matmul_chain(layers: int = 8, gpus: int = 2, batch: int = 1024, hidden: int = 4096,
                 dtype_bytes: int = 4) -> TaskGraph:
    """``layers`` levels of ``X(i+1) = X(i) x Y(i)``, tensor-parallel over ``gpus`` GPUs.

    GPU j holds the column shard ``X(i).j`` of the activations and multiplies the whole
    ``X(i)`` (its own shard plus the others', received by GPU->GPU transfers) by its column
    shard ``Y(i).j`` of the weight, which lives in host RAM.  Vertices are added in the order
    they would run: a level's activation exchange, then for each GPU its weight and matmul.

    Parameters
    ----------
    layers : int
        Levels.
    gpus : int
        GPUs, dividing ``hidden``.
    batch : int
        Rows of the activations.
    hidden : int
        Columns of the activations, and the weights' size (``hidden x hidden``).
    dtype_bytes : int
        Bytes per element.

    Returns
    -------
    TaskGraph

    Raises
    ------
    SpecError
        A value that is not positive, or ``gpus`` that does not divide ``hidden``.
    """
    for key, value in dict(layers=layers, gpus=gpus, batch=batch, hidden=hidden,
                           dtype_bytes=dtype_bytes).items():
        if value <= 0:
            raise SpecError(f"matmul-chain: {key} must be positive, got {value}")
    if hidden % gpus:
        raise SpecError(f"matmul-chain: hidden ({hidden}) must be divisible by gpus ({gpus})")
    shard = hidden // gpus
    g = TaskGraph(name="matmul-chain", meta=dict(layers=layers, gpus=gpus, batch=batch,
                                                 hidden=hidden, dtype_bytes=dtype_bytes))
    act = batch * shard * dtype_bytes
    for j in range(gpus):
        g.add_input(f"X1.{j}", act, home=gpu_name(j), shape=(batch, shard))
    for i in range(1, layers + 1):
        for j in range(gpus):
            for k in range(gpus):
                if k != j:
                    g.add_transfer(f"X{i}.{k}>gpu{j}", f"X{i}.{k}", gpu_name(j))
        for j in range(gpus):
            w = g.add_input(f"Y{i}.{j}", hidden * shard * dtype_bytes, shape=(hidden, shard))
            xs = [f"X{i}.{k}" if k == j else f"X{i}.{k}>gpu{j}" for k in range(gpus)]
            g.add_compute(f"X{i + 1}.{j}", "matmul", [*xs, w.id], gpu_name(j), act,
                          flops=2.0 * batch * hidden * shard, shape=(batch, shard))
    return g
