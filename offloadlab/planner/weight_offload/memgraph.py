"""A weight-offloading :class:`Schedule` laid out as the MemGraph of an unrolled TaskGraph.

The TaskGraph of ``unroll(chain, T)`` runs ``F@1`` (the *preamble*, whose ``load`` vertices
bring the weights into their blocks), then ``T - 1`` of the schedule's cycles ``B@t, F@t+1``,
then ``B@T``.  Vertices are named by the chain (``TrainingChain.vertex``); memory edges carry
the schedule's orderings (per resource, per cycle) and the reuse of bytes.  Locations, edges
and order: docs/beaumont.md.
"""

from __future__ import annotations

from ...core.devices import HOST
from ...core.errors import PlanError
from ...core.intervals import LastWriter
from ...core.memgraph import Loc, MemGraph, MemVertex
from ...core.taskgraph import TaskGraph
from .schedule import GPU, Event, Schedule


class _Emitter:
    """Builds the MemGraph vertex by vertex, in a topological order."""

    def __init__(self, graph: TaskGraph, schedule: Schedule):
        self.g, self.s = graph, schedule
        chain = self.chain = schedule.chain
        self.T = graph.meta.get("iterations", 0)
        self.batch = chain.batch
        if schedule.base != self.T * self.batch:
            raise PlanError(f"the schedule reserves {schedule.base} bytes for batches, the "
                            f"TaskGraph's {self.T} iterations need {self.T * self.batch}")
        self.S = chain.stack(schedule.base)
        self.mg = MemGraph()
        self.writers: LastWriter[str] = LastWriter()
        self.waits: dict[str, list[str]] = {}         # writer -> what its deletion waited for
        self.gone: dict[int, list[str]] = {}          # layer -> what its last removal waited for
        self.gpu: dict[int, str | None] = {k: None for k in range(1, chain.L + 1)}
        self.host: dict[int, str | None] = {k: chain.vertex("w", k, 0)
                                             for k in range(1, chain.L + 1)}
        self.version = {k: 0 for k in range(1, chain.L + 1)}
        self.last: dict[str, str] = {}                 # resource -> its last vertex
        self.barrier: list[str] = []
        self.first: set[str] = set()
        self.moves = 0

    # -- vertices ----------------------------------------------------------------------------
    def add(self, id: str, kind: str, nbytes: int, *, resource: str | None,
            offset: int | None = None, inputs: tuple[str, ...] = (), of: str | None = None,
            device: str = GPU) -> str:
        task = self.g.tasks.get(id) if kind in ("input", "compute") else None
        loc = Loc(GPU, offset, nbytes) if offset is not None else None
        self.mg.add_vertex(MemVertex(
            id, kind, device, nbytes, loc=loc, task=id if task else None, of=of,
            op=task.op if task else None, flops=task.flops if task else 0.0, inputs=inputs,
            order=len(self.mg), time=task.time if task else None))
        for u in inputs:
            self.mg.add_edge(u, id, "data")
        if loc is not None:
            for x in self.writers.overwrite(loc.offset, loc.end, id):
                readers = [r for r, k in self.mg.succ[x].items() if k == "data"]
                for u in [x, *readers, *self.waits.get(x, ())]:
                    self.mg.add_edge(u, id, "memory")
        if resource is not None:
            if resource not in self.first:
                self.first.add(resource)
                for u in self.barrier:
                    self.mg.add_edge(u, id, "memory")
            if resource in self.last:
                self.mg.add_edge(self.last[resource], id, "memory")
            self.last[resource] = id
        return id

    def task(self, id: str, inputs: tuple[str, ...], offset: int) -> str:
        return self.add(id, "compute", self.g[id].bytes, resource="gpu", offset=offset,
                        inputs=inputs)

    def new_segment(self) -> None:
        """What follows starts once everything before has ended, on every resource."""
        self.barrier, self.first = list(self.last.values()), set()

    # -- the TaskGraph's vertices -------------------------------------------------------------
    def inputs(self) -> None:
        v = self.chain.vertex
        for k in range(1, self.chain.L + 1):
            self.add(v("w", k, 0), "input", self.g[v("w", k, 0)].bytes, resource=None,
                     device=HOST)
        for t in range(1, self.T + 1):
            self.add(self.chain.activation(0, t), "input", self.batch, resource=None,
                     offset=(t - 1) * self.batch)

    def forward(self, k: int, t: int) -> str:
        act = self.chain.activation(k - 1, t)
        return self.task(self.chain.vertex("F", k, t), (act, self.weight(k)), self.S[k - 1])

    def backward(self, k: int, t: int) -> str:
        """``B_k`` as the paper's three atomic steps: dw_k, δ^{k-1}, the in-place update."""
        chain, v = self.chain, self.chain.vertex
        act, delta = chain.activation(k - 1, t), chain.delta(k, t)
        copy = self.weight(k)
        self.task(v("G", k, t), (act, delta), self.S[k])
        self.mg.add_edge(copy, v("G", k, t), "memory")     # B_k starts once w_k is there
        self.task(v("B", k, t), (delta, copy), self.S[k - 2] if k > 1 else (t - 1) * self.batch)
        update = self.task(v("w", k, t), (copy, v("G", k, t)), self.offset(copy))
        self.gpu[k], self.host[k], self.version[k] = update, None, t
        return update

    def weight(self, k: int) -> str:
        copy = self.gpu[k]
        if copy is None:
            raise PlanError(f"internal: w{k} is read while not on the GPU")
        return copy

    def offset(self, id: str) -> int:
        loc = self.mg[id].loc
        if loc is None:
            raise PlanError(f"internal: {id} has no GPU location")
        return loc.offset

    # -- moves ------------------------------------------------------------------------------
    def prefetch(self, k: int, offset: int, after: str | None = None) -> str:
        of, source = self.chain.vertex("w", k, self.version[k]), self.host[k]
        if source is None:
            raise PlanError(f"internal: {of} is prefetched with no copy on host")
        kind = "load" if self.version[k] == 0 else "reload"
        id = self.add(f"{kind}:{of}#{self.moves}", kind, self.chain.w[k - 1], resource="h2d",
                      offset=offset, inputs=(source,), of=of)
        self.moves += 1
        for u in [after, *self.gone.pop(k, ())]:
            if u is not None:
                self.mg.add_edge(u, id, "memory")
        self.gpu[k] = id
        return id

    def offload(self, k: int, after: str | None, drop: bool) -> str:
        of = self.chain.vertex("w", k, self.version[k])
        if after is None:
            raise PlanError(f"internal: the offload of {of} follows no operation")
        id = self.add(f"offload:{of}#{self.moves}", "offload", self.chain.w[k - 1],
                      resource="d2h", inputs=(self.weight(k),), of=of)
        self.moves += 1
        self.mg.add_edge(after, id, "memory")
        self.host[k] = id
        if drop:
            self.gpu[k], self.gone[k] = None, [id]
        return id

    def delete(self, k: int, after: str | None) -> None:
        copy = self.weight(k)
        waits = [] if after is None else [after]
        self.waits.setdefault(copy, []).extend(waits)
        self.gone[k] = [r for r, kind in self.mg.succ[copy].items() if kind == "data"] + waits
        self.gpu[k] = None

    # -- the run ----------------------------------------------------------------------------
    def preamble(self) -> None:
        """``F@1``: each weight is loaded into its block of the cycle's ``F_k`` before ``F_k``
        and deleted after it unless it stays there across the cycle boundary; the weights
        prefetched before ``B_L`` are then loaded into their homes."""
        s = self.s
        block = dict(s.homes)
        at_forward: dict[int, int] = {}
        for e in sorted(s.events, key=_start):
            if e.kind == "prefetch":
                block[e.layer] = _block(e)
            elif e.kind == "F":
                at_forward[e.layer] = block[e.layer]
        for k in range(1, self.chain.L + 1):
            if self.gpu[k] is None:
                self.prefetch(k, at_forward[k])
            self.forward(k, 1)
            if k not in s.homes or k in s.precut:
                self.gpu[k] = None
        for k in s.precut:
            self.prefetch(k, s.homes[k])

    def cycle(self, t: int, backward_only: bool) -> None:
        """The cycle ``B@t, F@t+1`` (only ``B@t`` when ``backward_only``)."""
        self.new_segment()
        ids: dict[int, str] = {}
        for i, e in sorted(enumerate(self.s.events), key=lambda ie: (_start(ie[1]), ie[0])):
            if backward_only and e.phase != "B":
                continue
            after = ids.get(e.after) if e.after is not None else None
            if e.kind == "B":
                ids[i] = self.backward(e.layer, t)
            elif e.kind == "F":
                ids[i] = self.forward(e.layer, t + 1)
            elif e.kind == "prefetch":
                ids[i] = self.prefetch(e.layer, _block(e), after)
            elif e.kind == "offload":
                ids[i] = self.offload(e.layer, after, e.drop)
            else:
                self.delete(e.layer, after)


def _start(e: Event) -> float:
    return e.start


def _block(e: Event) -> int:
    """The block a prefetch writes."""
    if e.offset is None:
        raise PlanError(f"internal: the prefetch of w{e.layer} has no block")
    return e.offset


def to_memgraph(graph: TaskGraph, schedule: Schedule) -> MemGraph:
    """The MemGraph of ``graph`` (``schedule.chain`` unrolled) following ``schedule``.

    Parameters
    ----------
    graph : TaskGraph
        The unrolled training TaskGraph.
    schedule : Schedule
        The steady-state schedule.

    Returns
    -------
    MemGraph

    Raises
    ------
    PlanError
        The schedule reserves other bytes for batches than the graph's iterations need.
    """
    em = _Emitter(graph, schedule)
    if em.T < 1:
        raise PlanError(f"TaskGraph {graph.name!r} has no iterations")
    em.inputs()
    em.preamble()
    for t in range(1, em.T + 1):
        em.cycle(t, backward_only=t == em.T)
    if len(em.mg) != len(graph) + em.moves:
        raise PlanError(f"TaskGraph {graph.name!r} is not the unrolled chain of its meta['chain']")
    return em.mg
