"""Gemini's chunk size search: Colossal-AI's ``search_chunk_configuration``
(``colossalai/zero/gemini/chunk/search_utils.py``), with the GPU's memory as a constraint.

Colossal-AI keeps the chunk size of its range that leaves fewest bytes of chunks unused, and
does not look at the GPU.  Here the same waste is minimised over the sizes with which every
operator fits (:func:`misfit`), the range moving down by halves where none does, to one
parameter per chunk.  The candidates, the fit and the refusal: docs/gemini.md ("Chunk size
search").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ...core.errors import PlanError
from ...core.taskgraph import TaskGraph
from .chunks import NEVER, Trace, chunk_numbers, grouped


def waste(sizes: list[tuple[str, int]], chunk_size: int) -> int:
    """The bytes of chunks that no parameter fills (Colossal-AI's unused bytes).

    Parameters
    ----------
    sizes : list of tuple of str and int
        Each parameter's GPU and size, in order of first touch.
    chunk_size : int
        The chunk size: each chunk is a buffer of ``chunk_size`` bytes, or of its one
        parameter's where that is larger.

    Returns
    -------
    int
        Bytes.
    """
    held: dict[int, int] = {}
    for (_, size), n in zip(sizes, chunk_numbers(sizes, chunk_size)):
        held[n] = held.get(n, 0) + size
    return sum(max(chunk_size, h) - h for h in held.values())


@dataclass(frozen=True)
class Misfit:
    """An operator whose COMPUTE chunks' live tensors and own non-model tensors exceed its
    GPU's memory."""

    op: str
    device: str
    nonmodel: int
    chunks: int

    def message(self, capacity: int) -> str:
        """The refusal naming the operator, its non-model bytes and its parameters' bytes.

        Parameters
        ----------
        capacity : int
            The GPU's bytes.

        Returns
        -------
        str
        """
        return (f"operator {self.op!r} needs {self.nonmodel} bytes of non-model data and "
                f"{self.chunks} bytes of its parameters' tensors on {self.device}: more than "
                f"its {capacity} bytes with any chunk size (one parameter per chunk)")


class Fit:
    """What :func:`misfit` needs of a program, computed once for every chunk size: each
    slot's lifetime and each operator's own non-model bytes per GPU."""

    def __init__(self, graph: TaskGraph, tr: Trace, grad_chunks: bool):
        self.graph, self.tr, self.grad_chunks = graph, tr, grad_chunks
        self.sizes = tr.sizes(graph)
        position = {t: i for i, t in enumerate(tr.ops)}
        kept = set(graph.outputs())
        model = {s for slots in tr.members.values() for s in slots}
        # a slot is live from its writer (or the start, for an input) to its last reader
        # (to the end for the graph's outputs and for tensors nobody reads)
        self.born = {s: position.get(s[0], -1) for s in model}
        self.last = {s: NEVER if s[0] in kept or not tr.readers.get(s) else tr.readers[s][-1]
                     for s in model}
        self.own: list[dict[str, int]] = []
        for i, t in enumerate(tr.ops):
            task = graph[t]
            own: dict[str, int] = {}
            for u, dev in (*tr.reads[i], (t, task.out_device)):
                if (u, dev) not in model:
                    own[dev] = own.get(dev, 0) + graph[u].bytes
            self.own.append(own)

    def misfit(self, capacity: int, chunk_size: int) -> Misfit | None:
        """The first operator that does not fit ``capacity`` with chunks of ``chunk_size``.

        Parameters
        ----------
        capacity : int
            The GPU's bytes.
        chunk_size : int
            The chunks' bytes of parameters.

        Returns
        -------
        Misfit or None
            None if every operator fits.
        """
        tr, graph = self.tr, self.graph
        slots = [members for _, members in grouped(graph, tr, chunk_size, self.grad_chunks)]
        chunk_of = {s: n for n, members in enumerate(slots) for s in members}
        for i, t in enumerate(tr.ops):
            need = dict(self.own[i])
            chunks: dict[str, int] = {}
            for n in dict.fromkeys(chunk_of[s] for s in tr.touched[i]):
                for s in slots[n]:
                    if self.born[s] <= i <= self.last[s]:
                        chunks[s[1]] = chunks.get(s[1], 0) + graph[s[0]].bytes
            for dev, size in chunks.items():
                need[dev] = need.get(dev, 0) + size
            for dev, size in need.items():
                if size > capacity:
                    return Misfit(t, dev, self.own[i].get(dev, 0), chunks.get(dev, 0))
        return None


def search(graph: TaskGraph, tr: Trace, capacity: int, least: int, span: int,
           interval: int, grad_chunks: bool) -> int:
    """The chunk size leaving fewest bytes of chunks unused (ties: the smallest).

    Among ``start``, ``start + interval``, ... up to ``start + span`` with which every
    operator fits ``capacity``, ``start`` being ``least`` or the largest parameter (but
    outliers), rounded up to ``interval``; where none fits, the range starting at half of
    ``start``, and so on down to 1.

    Parameters
    ----------
    graph : TaskGraph
        A training step.
    tr : Trace
        Its trace.
    capacity : int
        The GPU's bytes.
    least : int
        The smallest chunk size to start from (Colossal-AI's ``min_chunk_size_m``).
    span : int
        The range's bytes (``search_range``).
    interval : int
        The step between candidates (``search_interval``).
    grad_chunks : bool
        Gradients in chunks of their own.

    Returns
    -------
    int
        The chunk size.

    Raises
    ------
    PlanError
        Naming the operator that fits with no chunk size.
    """
    fit = Fit(graph, tr, grad_chunks)
    sizes = [size for _, size in fit.sizes]
    if not sizes:
        return least
    limit = statistics.fmean(sizes) + 3 * statistics.pstdev(sizes)
    start = math.ceil(max(least, *(s for s in sizes if s <= limit)) / interval) * interval
    while True:
        candidates = range(start, start + span + 1, interval)
        if fit.misfit(capacity, start) is None:     # else smaller chunks: a range lower
            for size in sorted(candidates, key=lambda c: (waste(fit.sizes, c), c)):
                if fit.misfit(capacity, size) is None:
                    return size
        if start == 1:
            break
        start = max(1, start // 2)
    worst = fit.misfit(capacity, 1)
    assert worst is not None
    raise PlanError(worst.message(capacity))
