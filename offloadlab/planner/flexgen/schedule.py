"""FlexGen's block schedule for a policy, laid out as a MemGraph (``flexgen/flex_opt.py``,
``OptLM.generation_loop_overlap_multi_batch``, ``..._single_batch`` and ``..._normal``).

The homes (``init_weight_list``, ``init_cache_one_gpu_batch``, ``act_home``), the start-up
step, the zig-zag block schedule and its layout: docs/deployed.md, FlexGen, "What FlexGen
does, as modelled".
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.memgraph import Loc, MemGraph, MemVertex
from ...core.taskgraph import TaskGraph
from ..allocator import GpuMemory
from .structure import Structure

START = -1      # the start-up step


@dataclass(frozen=True)
class Policy:
    """A FlexGen policy, in FlexGen's ``Policy`` names; the host holds the rest of each."""

    w_gpu_percent: float
    cache_gpu_percent: float
    act_gpu_percent: float
    overlap: bool = True

    def options(self) -> dict[str, object]:
        """The policy as the planner's options (what ``flexgen:...`` takes to plan it).

        Returns
        -------
        dict of str to object
        """
        return {"w_gpu_percent": self.w_gpu_percent,
                "cache_gpu_percent": self.cache_gpu_percent,
                "act_gpu_percent": self.act_gpu_percent, "overlap": self.overlap}

    def flexgen(self, batches: int) -> dict[str, object]:
        """The policy in all of FlexGen's ``Policy`` fields that it sets.

        Parameters
        ----------
        batches : int
            FlexGen's ``num_gpu_batches``.

        Returns
        -------
        dict of str to object
        """
        return {**self.options(), "w_cpu_percent": 100 - self.w_gpu_percent,
                "cache_cpu_percent": 100 - self.cache_gpu_percent,
                "act_cpu_percent": 100 - self.act_gpu_percent,
                "gpu_batch_size": 1, "num_gpu_batches": batches}


@dataclass(eq=False)
class Op:
    """A MemGraph vertex in the making: its step (:data:`START` for start-up), the resource
    its step chains it on, the MemGraph vertices it reads; a vertex that writes the GPU names
    the copy it writes by its own id."""

    id: str
    kind: str
    size: int
    step: int
    resource: str
    inputs: tuple[str, ...] = ()
    task: str | None = None
    of: str | None = None
    kept: bool = False          # its copy stays to the end


@dataclass
class Plan:
    """A laid-out schedule: its MemGraph (None if the layout did not fit) and the GPU's peak
    bytes (at which step)."""

    mg: MemGraph | None = None
    peak: int = 0
    peak_step: int = START


def gpu_weights(graph: TaskGraph, st: Structure, w_gpu_percent: float) -> set[str]:
    """The weights whose home is the GPU.

    FlexGen's ``init_weight_list``: by the middle of each one's bytes in its layer's list.

    Parameters
    ----------
    graph : TaskGraph
        The LLaMA TaskGraph.
    st : Structure
        Its FlexGen layers.
    w_gpu_percent : float
        The policy's percent of each layer's weights on the GPU.

    Returns
    -------
    set of str
    """
    cpu = 100 - w_gpu_percent
    home: set[str] = set()
    for layer in st.weights:
        total = sum(graph[w].bytes for w in layer)
        done = 0
        for w in layer:
            size = graph[w].bytes
            if (done + size / 2) / total * 100 >= cpu:
                home.add(w)
            done += size
    return home


def cache_on_gpu(heads: int, cache_gpu_percent: float, gpu_batch_size: int = 1) -> bool:
    """Whether a GPU batch's (one sequence's) cache is on the GPU.

    FlexGen's mixed device rounds the GPU's share down to whole sequences.

    Parameters
    ----------
    heads : int
        The attention heads.
    cache_gpu_percent : float
        The policy's percent of the KV cache on the GPU.
    gpu_batch_size : int
        The sequences in a GPU batch.

    Returns
    -------
    bool
    """
    return int(gpu_batch_size * heads * cache_gpu_percent / 100) // heads >= 1


def schedule(graph: TaskGraph, st: Structure, policy: Policy, gpu: str) -> list[Op]:
    """The ops of FlexGen's block schedule under ``policy``, in the order it issues them.

    Parameters
    ----------
    graph : TaskGraph
        The LLaMA TaskGraph.
    st : Structure
        Its FlexGen layers and steps.
    policy : Policy
        The policy.
    gpu : str
        The GPU.

    Returns
    -------
    list of Op
    """
    issued = _Issued(graph, st, gpu, policy.overlap)
    issued.weights(gpu_weights(graph, st, policy.w_gpu_percent))
    for u in st.tokens:
        op = issued.move("load", u, max(START, issued.before(st.readers[u][0])), u)
        for m in st.readers[u]:
            issued.copy[u, m] = op.id
    cache_gpu = cache_on_gpu(int(graph.meta["heads"]), policy.cache_gpu_percent)
    issued.homes_on_host(cache_gpu, policy.act_gpu_percent >= 100)

    ops: list[Op] = [Op(u, "input", graph[u].bytes, START, "", task=u)
                     for layer in st.weights for u in layer]
    ops += [Op(u, "input", graph[u].bytes, START, "", task=u) for u in st.tokens]
    for s in range(START, len(st.steps)):
        ops += issued.stores.get(s, []) + issued.loads.get(s, [])
        for t in st.computes[s] if s >= 0 else ():
            task = graph[t]
            role = st.role[t]
            ops.append(Op(t, "compute", task.bytes, s, issued.resource("compute"),
                          tuple(issued.copy[u, s] for u in task.inputs), task=t,
                          kept=role == "output" or role == "cache" and cache_gpu))
        ops += issued.after.get(s, [])
    return ops


class _Issued:
    """The copies FlexGen's loop issues, by step, as :func:`schedule` collects them."""

    def __init__(self, graph: TaskGraph, st: Structure, gpu: str, overlap: bool):
        self.graph, self.st, self.gpu, self.overlap = graph, st, gpu, overlap
        self.multi = st.batches > 1
        self.stores: dict[int, list[Op]] = {}   # step -> offloads of what earlier steps wrote
        self.after: dict[int, list[Op]] = {}    # step -> offloads of what it wrote
        self.loads: dict[int, list[Op]] = {}    # step -> loads and reloads it issues
        self.copy: dict[tuple[str, int], str] = {}  # (tensor, reader step) -> its copy

    def before(self, m: int) -> int:
        """The step that loads the hidden states step ``m`` reads."""
        return m - 1 if self.overlap and self.multi else m

    def ahead(self, m: int) -> int:
        """The step that loads the cache step ``m`` reads: the step before, with one GPU
        batch too (``load_cache(i, j + 1, 0)``)."""
        return m - 1 if self.overlap else m

    def resource(self, kind: str) -> str:
        if not self.overlap:
            return "all"
        return {"compute": "gpu", "offload": "d2h"}.get(kind, "h2d")

    def move(self, kind: str, of: str, step: int, source: str, kept: bool = False,
             token: int = 0) -> Op:
        """Issue a copy of ``of`` at ``step``."""
        tail = f"#{token}" if token else ""     # a later token's copy
        op = Op(f"{kind}:{of}@{self.gpu}{tail}", kind, self.graph[of].bytes, step,
                self.resource(kind), (source,), of=of, kept=kept)
        if kind == "offload":
            at = self.after if step == self.st.step_of[of] else self.stores
            at.setdefault(step, []).append(op)
        else:
            self.loads.setdefault(step, []).append(op)
        return op

    def by_token(self, steps: list[int]) -> list[list[int]]:
        """``steps`` (ascending) grouped by the token they compute."""
        groups: dict[int, list[int]] = {}
        for m in steps:
            groups.setdefault(self.st.token(m), []).append(m)
        return list(groups.values())

    def weights(self, on_gpu: set[str]) -> None:
        """Each weight loaded once if its home is the GPU, else once per token
        (``load_weight(i, j, k)``): with ``overlap`` in the previous layer's first step."""
        st = self.st
        first = {j: st.layer_steps(j)[0] for j in range(st.layers)}
        for layer in st.weights:
            for w in layer:
                groups = [st.readers[w]] if w in on_gpu else self.by_token(st.readers[w])
                for group in groups:
                    j = st.steps[group[0]][0]
                    if w in on_gpu:
                        step = START
                    elif self.overlap:
                        step = first[j - 1] if j else START
                    else:
                        step = first[j]
                    op = self.move("load", w, step, w, kept=w in on_gpu,
                                   token=st.token(group[0]))
                    for m in group:
                        self.copy[w, m] = op.id

    def homes_on_host(self, cache_gpu: bool, act_gpu: bool) -> None:
        """Cache and hidden states whose home is the host: stored after the step that wrote
        them (the next one with ``overlap`` and several GPU batches) and read back once per
        token that reads them (``load_cache``, ``load_hidden``)."""
        st, S = self.st, len(self.st.steps)
        for t, role in st.role.items():
            n = st.step_of[t]
            for m in st.readers.get(t, ()):
                self.copy[t, m] = t
            if role == "cache" and not cache_gpu or role == "hidden" and not act_gpu:
                if not self.overlap or role == "hidden" and not self.multi:
                    store = n
                else:
                    store = min(n + 1, S - 1)
                off = self.move("offload", t, store, t)
                late = [m for m in st.readers.get(t, ()) if m > store]
                for group in self.by_token(late):
                    at = self.ahead(group[0]) if role == "cache" else self.before(group[0])
                    back = self.move("reload", t, max(at, store), off.id,
                                     token=st.token(group[0]))
                    for m in group:
                        self.copy[t, m] = back.id


def lay_out(graph: TaskGraph, ops: list[Op], gpu: str, capacity: int) -> Plan:
    """The MemGraph of ``ops`` on a GPU of ``capacity`` bytes.

    Copies that stay to the end at the bottom, the others where the allocator finds room;
    the steps' chains and barriers.

    Parameters
    ----------
    graph : TaskGraph
        The LLaMA TaskGraph.
    ops : list of Op
        The schedule (:func:`schedule`).
    gpu : str
        The GPU.
    capacity : int
        Its bytes.

    Returns
    -------
    Plan
        Without room ``Plan.mg`` is None; the plan still counts the peak.
    """
    plan = Plan()
    uses: dict[str, int] = {}            # copy -> its uses still to come
    readers: dict[str, list[str]] = {}
    writes = {op.id for op in ops if op.kind in ("compute", "load", "reload")}
    for op in ops:
        for u in op.inputs:
            if u in writes:
                uses[u] = uses.get(u, 0) + 1
    memory = GpuMemory(gpu, capacity)
    mg = MemGraph()
    offset: dict[str, int] = {}
    kept = 0
    for op in ops:
        if op.kept and op.id in writes:
            offset[op.id] = kept
            kept += op.size
    fits = kept <= capacity
    if fits and kept:
        memory.place(0, kept, "kept")       # never released
    live = kept
    plan.peak, plan.peak_step = kept, START
    tails: list[str] = []           # the previous step's last vertex on each resource
    last: dict[str, str] = {}       # this step's last vertex on each resource
    step = START
    for order, op in enumerate(ops):
        if op.step != step:
            if last:
                tails = list(last.values())
            step, last = op.step, {}
        loc = None
        if op.id in writes:
            if op.kept:
                at: int | None = offset[op.id]
            else:
                live += op.size
                at = memory.find_free(op.size) if fits else None
                fits = at is not None
            if fits:
                assert at is not None
                loc = Loc(gpu, at, op.size)
            if live > plan.peak:
                plan.peak, plan.peak_step = live, op.step
        mg.add_vertex(_vertex(graph, op, gpu, loc, order))
        mg.add_edges(op.inputs, op.id, "data")
        if loc is not None and op.id not in offset:
            covered = memory.place(loc.offset, op.size, op.id)
            mg.add_edges([g for segment in covered for g in segment.guard], op.id, "memory")
        if op.resource:
            mg.add_edges(tails if op.resource not in last else [last[op.resource]], op.id,
                         "memory")
            last[op.resource] = op.id
        for u in op.inputs:
            if u not in uses:
                continue
            readers.setdefault(u, []).append(op.id)
            uses[u] -= 1
            if uses[u] == 0 and u not in offset:
                live -= mg[u].bytes
                gone = mg[u].loc
                if fits and gone is not None:
                    memory.release(u, gone.offset, tuple(readers[u]), order)
    plan.mg = mg if fits else None
    return plan


def _vertex(graph: TaskGraph, op: Op, gpu: str, loc: Loc | None, order: int) -> MemVertex:
    if op.task is None:
        return MemVertex(op.id, op.kind, gpu, op.size, loc, of=op.of, inputs=op.inputs,
                         order=order)
    task = graph[op.task]
    return MemVertex(op.id, op.kind, task.device, op.size, loc, task=op.task, op=task.op,
                     flops=task.flops, inputs=op.inputs, order=order, time=task.time)
