"""Algorithm 2 of Beaumont et al. (Sec. 5, "Scheduling phase") and the L2L schedule [19].

A schedule is one steady-state *cycle* (``B_L..B_1`` of iteration t then ``F_1..F_L`` of
iteration t+1) on the GPU and the two directions of the link (Sec. 3).  GPU memory (Sec. 3,
eq. 1) is an address line: batches at the bottom, the activation stack above them, and each
weight in a block of contiguous bytes; weights resident across the cycle boundary have a fixed
block, their *home*, which makes this stricter than the paper's byte count.  The layout, the
feasibility rule and the homes: docs/beaumont.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...core.cycle import TrainingChain
from ...core.errors import PlanError
from ...core.machine import Machine
from .selection import Choice

INF = math.inf
GPU = "gpu0"
RESOURCES = {"F": GPU, "B": GPU, "prefetch": f"h2d:{GPU}", "offload": f"d2h:{GPU}", "delete": ""}


@dataclass(frozen=True)
class Event:
    """One timed step of the cycle.  ``kind``: ``F``/``B`` (operation of ``layer``),
    ``prefetch``/``offload`` (of ``w_layer``) or ``delete`` (``w_layer`` leaves the GPU).
    ``phase`` is ``"B"`` for what belongs to the backward half (its operations, their
    prefetches and offloads), ``"F"`` for the rest.  ``offset``: the block a prefetch writes.
    ``drop``: an offload after which the GPU copy is deleted.  ``after``: for a move or a
    deletion, the index of the event whose end it waits for besides its resource (the
    operation an offload follows, the operation an L2L prefetch is released by, the offload
    whose end is T_ava(Off) for a deletion)."""

    kind: str
    layer: int
    start: float
    end: float
    phase: str
    offset: int | None = None
    size: int = 0
    drop: bool = False
    after: int | None = None

    @property
    def resource(self) -> str:
        return RESOURCES[self.kind]


@dataclass(frozen=True)
class Schedule:
    """A steady-state cycle: its events and its length, the iteration time.

    ``reserved``: bytes at the bottom of GPU memory held besides eq. (1) (other iterations'
    batches).  ``selection``: the choices ``(k, d)`` scheduled.  ``cut``: how many of the
    prefetches before ``B_k`` (in order of need) are done before ``B_L``, at the end of the
    previous cycle (the cutting point of Algorithm 2), ``precut`` those layers.  ``homes``:
    the block of each weight resident when the cycle starts."""

    planner: str
    chain: TrainingChain
    capacity: int
    reserved: int
    selection: frozenset[Choice]
    precut: tuple[int, ...]
    events: tuple[Event, ...]
    iteration_time: float
    homes: Mapping[int, int] = field(default_factory=dict)

    @property
    def cut(self) -> int:
        return len(self.precut)

    @property
    def base(self) -> int:
        """Where the activation stack starts: the batches below it."""
        return self.reserved + self.chain.a0

    def moved_bytes(self) -> dict[str, int]:
        """Bytes prefetched and offloaded per cycle.

        Returns
        -------
        dict of str to int
        """
        return {kind: sum(e.size for e in self.events if e.kind == kind)
                for kind in ("prefetch", "offload")}

    def timeline(self):
        """The cycle as a DataFrame: ``op, kind, layer, resource, start, end, offset, bytes``."""
        import pandas as pd
        return pd.DataFrame({
            "op": [f"{e.kind}{e.layer}" if e.kind in ("F", "B") else f"{e.kind}:w{e.layer}"
                   for e in self.events],
            "kind": [e.kind for e in self.events],
            "layer": [e.layer for e in self.events],
            "resource": [e.resource for e in self.events],
            "start": [e.start for e in self.events],
            "end": [e.end for e in self.events],
            "offset": [e.offset for e in self.events],
            "bytes": [e.size for e in self.events],
        })


class _Infeasible(Exception):
    """This cutting point cannot be scheduled (or cannot beat the best one found)."""


@dataclass(slots=True)
class _Block:
    """A weight's bytes ``[lo, hi)``, held until ``end``."""

    lo: int
    hi: int
    end: float = INF


class _MemoryTimeline:
    """GPU memory over one cycle: the weights' blocks, each held until its end (open while
    the weight is on the GPU), and the activation stack top ST(t), a step function set by
    the scheduled operations."""

    def __init__(self, lo: int, hi: int, stack_top: int):
        self.lo, self.hi = lo, hi
        self.blocks: list[_Block] = []
        self.held: dict[int, _Block] = {}
        self.steps: list[tuple[float, int]] = [(-INF, stack_top)]

    def reserve(self, layer: int, offset: int, size: int) -> None:
        self.held[layer] = block = _Block(offset, offset + size)
        self.blocks.append(block)

    def free(self, layer: int, t: float) -> None:
        self.held.pop(layer).end = t

    def stack(self, t: float, top: int) -> None:
        """From ``t`` on, the activation stack ends at ``top``."""
        self.steps.append((t, top))

    def forget_before(self, t: float) -> None:
        """Drop what ended before ``t``: no query will look earlier."""
        self.blocks = [b for b in self.blocks if b.end > t]
        i = len(self.steps) - 1
        while i > 0 and self.steps[i][0] > t:
            i -= 1
        del self.steps[:i]

    def stack_max_after(self, t: float) -> int:
        """max ST(t') over t' >= t."""
        top = 0
        for time, value in reversed(self.steps):
            top = max(top, value)
            if time <= t:
                break
        return top

    def _times(self, t0: float, live: list[_Block]) -> list[float]:
        return sorted({t0, *(b.end for b in live if b.end < INF),
                       *(time for time, _ in self.steps if time > t0)})

    def earliest_block(self, size: int, t0: float, floor: int, forbidden: list[tuple[int, int]],
                       avoided: list[tuple[int, int]], in_time: float) -> tuple[float, int] | None:
        """The earliest ``t >= t0`` from which a block of ``size`` bytes above ``floor`` and
        the stack stays free, outside ``forbidden``, and its offset, as high as possible.  A
        block outside ``avoided`` too is preferred if there is one by ``in_time``, else at
        the same time.  None if there is no block."""
        live = [b for b in self.blocks if b.end > t0]
        times = self._times(t0, live)
        for t, extras in [(t, (avoided,)) for t in times if t <= in_time] + \
                         [(t, (avoided, [])) for t in times]:
            lo = max(self.lo, floor, self.stack_max_after(t))
            taken = [(b.lo, b.hi) for b in live if b.end > t] + forbidden
            for extra in extras:
                offset = _highest_fit(sorted(taken + extra), lo, self.hi, size)
                if offset is not None:
                    return t, offset
        return None

    def earliest_free(self, lo: int, hi: int, t0: float, above_stack: bool) -> float | None:
        """The earliest ``t >= t0`` from which ``[lo, hi)`` holds no weight (and, with
        ``above_stack``, no activation either).  None if never."""
        live = [b for b in self.blocks if b.end > t0 and b.lo < hi and lo < b.hi]
        for t in self._times(t0, live):
            if all(b.end <= t for b in live) and (not above_stack or self.stack_max_after(t) <= lo):
                return t
        return None


def _highest_fit(taken: list[tuple[int, int]], lo: int, hi: int, size: int) -> int | None:
    """The highest offset in ``[lo, hi)`` where ``size`` bytes avoid ``taken`` (sorted)."""
    best = None
    cursor = lo
    for a, b in taken + [(hi, hi)]:
        if min(a, hi) - cursor >= size:
            best = min(a, hi) - size
        cursor = max(cursor, b)
    return best


class _RangeMax:
    """O(1) maximum over ``values[a..b]`` (a sparse table)."""

    def __init__(self, values: list[int]):
        self.table = [list(values)]
        span = 1
        while 2 * span <= len(values):
            prev = self.table[-1]
            self.table.append([max(prev[i], prev[i + span])
                               for i in range(len(values) - 2 * span + 1)])
            span *= 2

    def __call__(self, a: int, b: int) -> int:
        j = (b - a + 1).bit_length() - 1
        row = self.table[j]
        return max(row[a], row[b - (1 << j) + 1])


class _Cycle:
    """One cycle being scheduled: memory, the links' T_ava and the events.

    Operations are at their positions in ``chain.cycle()`` (``chain.position``);
    ``levels[p]`` is the stack top while operation ``p`` runs (``chain.stack_tops``).
    """

    def __init__(self, chain: TrainingChain, machine: Machine, capacity: int, reserved: int,
                 bound: float = INF):
        self.chain, self.machine, self.bound = chain, machine, bound
        L = self.L = chain.L
        self.base = reserved + chain.a0
        self.S = chain.stack(self.base)
        self.levels = chain.stack_tops(self.base)
        self.max_level = _RangeMax(self.levels)
        self.capacity = capacity
        self._memory: _MemoryTimeline | None = None
        self.homes: dict[int, int] = {}
        self.events: list[Event] = []
        self.T_end_op = 0.0                   # T_end of the last operation scheduled
        self.T_ava_pre = self.T_ava_off = 0.0  # T_ava(Pre), T_ava(Off)
        self.last_offload: int | None = None
        self.ready = {k: -INF for k in range(1, L + 1)}      # w_k's GPU copy complete
        self.cpu_ready = {k: -INF for k in range(1, L + 1)}  # its CPU copy complete
        self.removed = {k: -INF for k in range(1, L + 1)}    # its last GPU copy gone
        self.has_cpu = {k: True for k in range(1, L + 1)}    # the current value is on the CPU
        self.copy_offloaded = {k: False for k in range(1, L + 1)}  # this GPU copy was offloaded
        self.borrowable: list[tuple[int, int, int]] = []   # (position it is back at, lo, hi)
        self.op_index: dict[tuple[str, int], int] = {}

    @property
    def memory(self) -> _MemoryTimeline:
        """GPU memory, from :meth:`place_homes` on."""
        if self._memory is None:
            raise RuntimeError("_Cycle.place_homes must come first")
        return self._memory

    def range_level(self, a: int, b: int) -> int:
        """Stack top over positions a..b of the cycle, wrapping around past F_L."""
        if a <= b:
            return self.max_level(a, b)
        return max(self.max_level(a, 2 * self.L - 1), self.max_level(0, b))

    # -- the cycle boundary -------------------------------------------------------------
    def place_homes(self, residents: dict[int, tuple[int, int] | None],
                    returns: dict[int, int]) -> None:
        """Fix the blocks of the weights resident when the cycle starts, top down, those that
        must clear the highest stack first.  ``residents[k]``: the positions ``(a, b)`` over
        which ``w_k`` stays (None: always).  ``returns[k]``: the position before which a
        weight that leaves during the cycle comes back into its block (default: after the
        last operation); other weights may borrow the block meanwhile if they leave before."""
        top = self.capacity
        need = {k: self.range_level(*span) if span else self.max_level(0, 2 * self.L - 1)
                for k, span in residents.items()}
        for k in sorted(residents, key=lambda k: (residents[k] is not None, -need[k], k)):
            top -= self.chain.w[k - 1]
            if top < need[k]:
                raise _Infeasible
            self.homes[k] = top
        permanent = [self.homes[k] for k, span in residents.items() if span is None]
        self._memory = _MemoryTimeline(self.base, min(permanent, default=self.capacity),
                                      self.S[-1])
        for k, span in residents.items():
            if span is not None:
                self.memory.reserve(k, self.homes[k], self.chain.w[k - 1])
                self.borrowable.append((returns.get(k, 2 * self.L), self.homes[k],
                                        self.homes[k] + self.chain.w[k - 1]))

    # -- events ------------------------------------------------------------------------------
    def _add(self, event: Event) -> int:
        if event.end >= self.bound:
            raise _Infeasible
        self.events.append(event)
        return len(self.events) - 1

    def run(self, kind: str, k: int, phase: str) -> int:
        """Schedule ``kind_k`` after the previous operation and its weight's prefetch, once
        the bytes it adds to the stack are free."""
        w = self.chain.w[k - 1]
        lo, hi = (self.S[k], self.S[k] + w) if kind == "B" else (self.S[k - 1], self.S[k])
        t = self.memory.earliest_free(lo, hi, max(self.T_end_op, self.ready[k]), above_stack=False)
        if t is None:
            raise _Infeasible
        u = self.chain.duration(kind, k)
        self.memory.stack(t, self.levels[self.chain.position(kind, k)])
        self.memory.stack(t + u, self.S[k - 1] if kind == "B" else self.S[k])
        self.T_end_op = t + u
        if kind == "B":
            self.has_cpu[k] = self.copy_offloaded[k] = False
        self.op_index[kind, k] = index = self._add(Event(kind, k, t, t + u, phase))
        self.memory.forget_before(min(self.T_end_op, self.T_ava_pre))
        return index

    def prefetch(self, k: int, need: int, until: int, phase: str,
                 home: int | None = None, after: int | None = None) -> int:
        """Pre_k at max(T_ava(Pre), the end of its CPU copy and of its last GPU copy, the
        earliest time it is feasible): into ``home`` if given, else into a free block above
        the stack of operations ``need..until`` (positions; ``w_k`` is removed after
        ``until``), outside the homes of weights that come back before then, and outside
        any home if one is free in time not to delay the next operation."""
        size = self.chain.w[k - 1]
        assert self.has_cpu[k], f"prefetch of w{k} with no CPU copy"
        t0 = max(self.T_ava_pre, self.cpu_ready[k], self.removed[k],
                 self.events[after].end if after is not None else -INF)
        if home is not None:
            t = self.memory.earliest_free(home, home + size, t0, above_stack=True)
            found = None if t is None else (t, home)
        else:
            floor = self.range_level(need, until)
            forbidden = [(lo, hi) for p, lo, hi in self.borrowable if until >= p]
            avoided = [(lo, hi) for p, lo, hi in self.borrowable if until < p]
            in_time = self.T_end_op - self.machine.duration("reload", GPU, size)
            found = self.memory.earliest_block(size, t0, floor, forbidden, avoided, in_time)
        if found is None:
            raise _Infeasible
        t, offset = found
        end = t + self.machine.duration("reload", GPU, size)
        self.memory.reserve(k, offset, size)
        self.T_ava_pre = self.ready[k] = end
        self.copy_offloaded[k] = False
        return self._add(Event("prefetch", k, t, end, phase, offset, size, after=after))

    def offload(self, k: int, after: int, drop: bool, phase: str) -> int:
        """Off_k at max(T_end(after), T_ava(Off)); with ``drop`` w_k's block is freed at its end."""
        size = self.chain.w[k - 1]
        t = max(self.T_ava_off, self.events[after].end)
        end = t + self.machine.duration("offload", GPU, size)
        self.T_ava_off = self.cpu_ready[k] = end
        self.has_cpu[k] = self.copy_offloaded[k] = True
        if drop:
            self.memory.free(k, end)
            self.removed[k] = end
        self.last_offload = self._add(Event("offload", k, t, end, phase, size=size, drop=drop,
                                            after=after))
        return self.last_offload

    def delete(self, k: int, after: int, phase: str) -> int:
        """Delete w_k from GPU memory at max(T_end(after), T_ava(Off))."""
        t = max(self.events[after].end, self.T_ava_off)
        self.memory.free(k, t)
        self.removed[k] = t
        return self._add(Event("delete", k, t, t, phase, size=self.chain.w[k - 1],
                               after=self.last_offload))

    def schedule(self, planner: str, selection: frozenset[Choice], precut: list[int],
                 reserved: int) -> Schedule:
        period = max(self.T_end_op, self.T_ava_pre, self.T_ava_off)
        if period >= self.bound:
            raise _Infeasible
        return Schedule(planner, self.chain, self.capacity, reserved, selection, tuple(precut),
                        tuple(self.events), period, dict(self.homes))


def algorithm2(chain: TrainingChain, machine: Machine, selection: frozenset[Choice], *,
               capacity: int, reserved: int = 0, discount: bool = True,
               planner: str = "greedy-offload") -> Schedule:
    """Algorithm 2: schedule the cycle at every cutting point of the prefetches; keep the shortest.

    For every cutting point in the sequence of prefetches before ``B_k`` (in order of need),
    schedule the cycle assuming those before the cut were done before ``B_L``; keep the
    shortest cycle (the first one on ties).  With unequal layers the free memory may be too
    fragmented for some weight's block at every cutting point.  The selection is then
    completed: first the layers removed only between ``F_k`` and ``B_k`` (resident from
    ``B_k`` to ``F_k``, the ones that fragment the memory) get their other choice too, then
    every selected layer.  The last always schedules: each weight that moves is then on the
    GPU for one operation at a time.  Cost: O(L) cutting points, each O(L) events whose
    memory queries scan the O(L) blocks held at a few candidate times: O(L^3) in practice
    (128 layers in well under a second).

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    machine : Machine
        Its bandwidths.
    selection : frozenset of (int, int)
        The (layer, d) choices of Algorithm 1 or the MILP.
    capacity : int
        The GPU's memory, in bytes.
    reserved : int
        Bytes held besides eq. (1)'s needs.
    discount : bool
        As the selection's: F_k then deletes a weight with a copy in host RAM; without it,
        only one whose copy this cycle offloaded (Greedy*).
    planner : str
        The planner's name, for the schedule and errors.

    Returns
    -------
    Schedule

    Raises
    ------
    PlanError
        No cutting point gives a feasible schedule.
    """
    for attempt in _completions(chain.L, selection):
        best: Schedule | None = None
        precut_order = [k for k in range(chain.L, 0, -1) if (k, 1) in attempt]
        for cut in range(len(precut_order) + 1):
            try:
                best = _algorithm2_cycle(chain, machine, attempt, precut_order[:cut], capacity,
                                         reserved, discount, planner,
                                         best.iteration_time if best else INF)
            except _Infeasible:
                continue
        if best is not None:
            return best
    raise PlanError(f"{planner}: Algorithm 2 found no feasible schedule in {capacity} bytes")


def _completions(L: int, selection: frozenset[Choice]) -> list[frozenset[Choice]]:
    """The selection, then with (k, 0) added where only (k, 1) is, then with both choices of
    every selected layer (each distinct one once)."""
    only_1 = {(k, 0) for k in range(1, L + 1) if (k, 1) in selection and (k, 0) not in selection}
    both = {(k, d) for k, _ in selection for d in (0, 1)}
    return list(dict.fromkeys([selection, selection | only_1, frozenset(both)]))


def _algorithm2_cycle(chain: TrainingChain, machine: Machine, selection: frozenset[Choice],
                      precut: list[int], capacity: int, reserved: int, discount: bool,
                      planner: str, bound: float) -> Schedule:
    """One cutting point of Algorithm 2, its pseudo-code step by step."""
    L, pos = chain.L, chain.position
    c = _Cycle(chain, machine, capacity, reserved, bound)
    residents: dict[int, tuple[int, int] | None] = {}
    returns: dict[int, int] = {}
    for k in range(1, L + 1):
        d0, d1 = (k, 0) in selection, (k, 1) in selection
        if not d0 and not d1:
            residents[k] = None
        elif d0 and not d1:               # resident from F_k to B_k, across the boundary
            residents[k] = (pos("F", k), pos("B", k))
            returns[k] = pos("F", k)
        elif k in precut:                 # prefetched before B_L, removed after B_k or F_k
            residents[k] = (0, pos("B", k) if d0 else pos("F", k))
    c.place_homes(residents, returns)

    WL: list[int] = []
    for k in range(L, 0, -1):
        if (k, 1) in selection and k not in precut:                  # B_k needs Prefetch
            c.prefetch(k, pos("B", k), pos("B" if (k, 0) in selection else "F", k), "B")
        b = c.run("B", k, "B")
        if (k, 0) in selection:                                      # B_k needs Offload
            while WL:                      # offload min |w_k'| from WL while it fits
                k2 = min(WL, key=lambda j: (chain.w[j - 1], j))
                T_start = max(c.T_ava_off, c.events[c.op_index["B", k2]].end)
                if c.events[b].end - T_start <= machine.duration("offload", GPU, chain.w[k2 - 1]):
                    break          # the paper's loop runs while the gap is strictly larger
                WL.remove(k2)
                c.offload(k2, c.op_index["B", k2], drop=False, phase="B")   # kept on the GPU
            c.offload(k, b, drop=True, phase="B")
        elif (k, 1) in selection:                                    # F_k needs Offload
            WL.append(k)
    for k in range(1, L + 1):
        if (k, 0) in selection:                                      # F_k needs Prefetch
            home = c.homes[k] if (k, 1) not in selection else None
            c.prefetch(k, pos("F", k), pos("F", k), "F", home=home)
        f = c.run("F", k, "F")
        if (k, 1) in selection:                                      # F_k needs Offload
            in_cpu = c.has_cpu[k] if discount else c.copy_offloaded[k]
            if in_cpu:
                c.delete(k, f, "F")
            else:
                c.offload(k, f, drop=True, phase="F")
    for k in precut:                         # finish the communications before the cut
        c.prefetch(k, pos("B", L), pos("B", k), "F", home=c.homes[k])
    return c.schedule(planner, selection, precut, reserved)


def l2l(chain: TrainingChain, machine: Machine, *, capacity: int, reserved: int = 0) -> Schedule:
    """Layer-to-Layer [19]: only the layer being computed keeps its weights on the GPU.

    The next layer's prefetch starts when the current operation ends and is not overlapped
    with computation (the paper's L2L times, 10-50% above the bound, imply two exposed
    transfers per layer).  ``w_i`` is offloaded after ``B_i`` (updated), overlapping the next
    prefetch on the full-duplex link, and deleted after ``F_i``; it stays when the next
    operation is of the same layer (``F_L -> B_L``, ``B_1 -> F_1``).

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    machine : Machine
        Its bandwidths.
    capacity : int
        The GPU's memory, in bytes.
    reserved : int
        Bytes held besides eq. (1)'s needs.

    Returns
    -------
    Schedule

    Raises
    ------
    PlanError
        The free memory is too fragmented for a schedule.
    """
    L, pos = chain.L, chain.position
    c = _Cycle(chain, machine, capacity, reserved)
    try:
        c.place_homes({L: (pos("F", L), pos("B", L))}, {})
        ops = chain.cycle()
        for p, (kind, k) in enumerate(ops):
            if p > 0 and (kind, k) != ("F", 1):
                release = c.op_index[ops[p - 1]]
                until = pos("F", 1) if (kind, k) == ("B", 1) else p
                c.prefetch(k, p, until, kind, home=c.homes[L] if (kind, k) == ("F", L) else None,
                           after=release)
            op = c.run(kind, k, kind)
            if kind == "B":
                c.offload(k, op, drop=k != 1, phase="B")
            elif k != L:
                c.delete(k, op, "F")
    except _Infeasible:
        raise PlanError(f"l2l: no feasible schedule in {capacity} bytes (the free memory is "
                        f"too fragmented for the weights' blocks)") from None
    selection = frozenset([(k, 0) for k in range(2, L + 1)] + [(k, 1) for k in range(1, L)])
    return c.schedule("l2l", selection, [], reserved)
