"""Host RAM as a resource (docs/host-memory.md): which tensors a plan holds in host RAM, a
plan's host peak in its own order (what planners check against the machine's
``host_memory``), and the one-line out-of-memory message.  No numpy: planning imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .devices import CPU, HOST

if TYPE_CHECKING:
    from .memgraph import MemGraph, MemVertex

GiB = 2**30


def in_host_ram(v: MemVertex) -> bool:
    """Whether ``v``'s output lives in host RAM: a host input (for the whole run), an
    offload's copy or a CPU op's result (from its start until its last reader ends), as the
    executor's host block holds them (:mod:`offloadlab.executor.loop`).

    Parameters
    ----------
    v : MemVertex
        A vertex of a plan.

    Returns
    -------
    bool
        Its output is in host RAM.
    """
    return v.kind == "offload" or v.device == CPU or v.device == HOST


def planned_host_peak(memgraph: MemGraph) -> int:
    """The most bytes ``memgraph`` holds in host RAM at once when its vertices run one at a
    time in planner order (``order``).

    The host inputs count throughout, and each offload's copy and CPU result from its vertex
    until its last data reader (:func:`in_host_ram`).  What a planner knows of its plan's host
    memory; a run that overlaps vertices can hold more or less
    (:func:`offloadlab.core.memory.host_lifetimes`).

    Parameters
    ----------
    memgraph : MemGraph
        The plan, run in its ``order``.

    Returns
    -------
    int
        The host peak, in bytes.
    """
    succ = memgraph.succ
    used = 0                                # the host inputs, held throughout
    held: list[tuple[MemVertex, list[str]]] = []    # the others and their data readers
    named: set[str] = set()                 # the vertices whose place in the order counts
    for v in memgraph:
        if not in_host_ram(v):
            continue
        if v.kind == "input":
            used += v.bytes
            continue
        readers = [w for w, kind in succ[v.id].items() if kind == "data"]
        held.append((v, readers))
        named.add(v.id)
        named.update(readers)
    place = {v.id: (v.order, k) for k, v in enumerate(memgraph) if v.id in named}
    # each held tensor from its vertex to its last data reader, in planner order (ties in
    # insertion order): allocated as its vertex runs, freed once that reader has run
    events: list[tuple[tuple[int, int], int, int]] = []
    for v, readers in held:
        first = place[v.id]
        events.append((first, 0, v.bytes))
        events.append((max([first, *[place[w] for w in readers]]), 1, -v.bytes))
    events.sort()
    peak = used
    for _, _, change in events:
        used += change
        if used > peak:
            peak = used
    return peak


def host_overflow(peak: int, host_memory: int | None) -> str | None:
    """Why a host peak of ``peak`` bytes does not fit in ``host_memory``, in one line with the
    numbers.

    Parameters
    ----------
    peak : int
        The host peak, in bytes.
    host_memory : int or None
        The machine's host memory in bytes; None: unlimited.

    Returns
    -------
    str or None
        The message; None if the peak fits.
    """
    if host_memory is None or peak <= host_memory:
        return None
    return (f"out of host memory: a host peak of {peak} bytes ({peak / GiB:.4g} GiB) exceeds "
            f"the machine's host_memory of {host_memory} bytes ({host_memory / GiB:.4g} GiB)")
