"""The decomposed matrix multiply on three GPUs of TURNIP Fig. 3 / DISCO Fig. 4.

The figure's picture is not in the paper text; this graph is rebuilt from its prose: six kernel
calls and three GPU->GPU transfers; the first GPU (``gpu0``) deals with seven tensors, its inputs
``A`` and ``B`` and the outputs of ``1``, ``2``, ``3``, ``4`` and ``8``; ``A`` and ``1`` are read
only by ``3``, ``2`` only by ``4``, and ``3`` feeds ``8``.  It computes, with 2 x 2 blocks,

    [Z1; Z2] = [A B; E F] x [C; D]:   Z1 = A C + B D on gpu0,   Z2 = E C + F D on gpu1.
"""

from __future__ import annotations

from ..errors import SpecError
from ..taskgraph import TaskGraph
from .registry import workload


@workload("tp-matmul", vertices=lambda o: 15)
def tp_matmul(n: int = 1024, dtype_bytes: int = 4) -> TaskGraph:
    """Blocks of ``n x n``; every tensor has the same size, one "memory location" each.

    Parameters
    ----------
    n : int
        The blocks' side.
    dtype_bytes : int
        Bytes per element.

    Returns
    -------
    TaskGraph

    Raises
    ------
    SpecError
        ``n`` or ``dtype_bytes`` is not positive.
    """
    if n <= 0 or dtype_bytes <= 0:
        raise SpecError(f"tp-matmul: n and dtype_bytes must be positive, got {n}, {dtype_bytes}")
    size, shape, mm = n * n * dtype_bytes, (n, n), 2.0 * n**3
    g = TaskGraph(name="tp-matmul", meta=dict(n=n, dtype_bytes=dtype_bytes))
    for v, home in (("A", 0), ("B", 0), ("C", 1), ("E", 1), ("D", 2), ("F", 2)):
        g.add_input(v, size, home=f"gpu{home}", shape=shape)
    g.add_transfer("1", "C", "gpu0")
    g.add_transfer("2", "D", "gpu0")
    g.add_compute("3", "matmul", ["A", "1"], "gpu0", size, flops=mm, shape=shape)
    g.add_compute("4", "matmul", ["B", "2"], "gpu0", size, flops=mm, shape=shape)
    g.add_compute("5", "matmul", ["E", "C"], "gpu1", size, flops=mm, shape=shape)
    g.add_compute("6", "matmul", ["F", "D"], "gpu2", size, flops=mm, shape=shape)
    g.add_transfer("7", "6", "gpu1")
    g.add_compute("8", "add", ["3", "4"], "gpu0", size, flops=n * n, shape=shape)
    g.add_compute("9", "add", ["5", "7"], "gpu1", size, flops=n * n, shape=shape)
    return g
