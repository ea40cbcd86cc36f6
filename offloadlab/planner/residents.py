"""What BuildMemGraph keeps of each tensor's copy on a GPU (:class:`Resident`, the allocator's
occupant) and its victim policies, which price evicting one (:class:`Eviction`; TURNIP
Fig. 9's Belady rule, LRU, and the bytes an eviction makes move)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..core.errors import PlanError
from ..core.memgraph import Loc
from .allocator import LEAST, PINNED, Segment

Slot = int   # a tensor on a device: its TaskGraph vertex's number * stride + the device's
NEVER = 2**60           # the next use of a tensor not read again (a short int, compiled)
VICTIMS = ("belady", "cost", "lru")   # victim policies, the default first
SCALE = 20              # fixed-point bits of the ``cost`` victim policy's bytes per item


@dataclass(slots=True, eq=False, init=False)
class Resident:
    """A tensor's copy on a GPU: where it is, which MemGraph vertex writes it, who read it.
    It is its memory's occupant in the allocator."""

    slot: Slot
    task: int                 # its TaskGraph vertex's number
    loc: Loc
    size: int                 # loc.size, kept in the object (the victim search reads it)
    writer: str
    item: int                 # the V item that allocated it (-1: placed before the run)
    materialized: bool
    clean: bool               # host RAM has a copy (only a tensor with one can be on two GPUs)
    last_use: int
    uses: list[int]           # the items that read it, ascending (BuildMemGraph.uses)
    covered: list[Segment]    # the free segments it replaced
    readers: list[str]
    next_use: int             # cache of the first item after execution that reads it
    pin: int                  # the victim search that must spare it (_costs)

    # written out: compiled, it is native code, where dataclass's generated one is interpreted
    def __init__(self, slot: Slot, task: int, loc: Loc, writer: str, item: int,
                 materialized: bool, clean: bool, last_use: int, uses: list[int]):
        self.slot, self.task, self.loc, self.size = slot, task, loc, loc.size
        self.writer, self.item, self.materialized, self.clean = writer, item, materialized, clean
        self.last_use, self.uses = last_use, uses
        self.covered, self.readers, self.next_use, self.pin = [], [], -1, -1


def check_victim(victim: str) -> None:
    """Raise :class:`PlanError` unless ``victim`` is one of :data:`VICTIMS`.

    Parameters
    ----------
    victim : str
        The policy's name.

    Raises
    ------
    PlanError
        An unknown policy.
    """
    if victim not in VICTIMS:
        raise PlanError(f"unknown victim policy {victim!r}; use {', '.join(VICTIMS)}")


class Eviction:
    """The cost of evicting a resident at item ``now`` (the allocator's :class:`Victims`):
    the victim search minimises a window's worst badness, then the bytes it moves.

    ``belady`` (the paper's rule): badness is minus the next use (the furthest is evicted
    first), bytes are those to offload.  ``lru``: badness is the last use.  ``cost``: no
    badness; "bytes" are the bytes the eviction makes move (an offload unless host RAM has a
    copy, and a reload if the tensor is read again) divided by how many items away its next
    use is, summed over the window: with equal sizes and every victim dirty this is Belady's
    rule, but a clean tensor (a weight, or a reload not written since) costs half a dirty
    one, a big tensor more than a small one, and a copy not needed again only its offload.
    Retracting an allocation made ahead moves nothing (``cost``: free); its "use" is when
    its item comes.  Residents stamped ``stamp`` are pinned."""

    def __init__(self, victim: str, now: int, stamp: int, kept: list[bool], horizon: int):
        self.by_cost, self.lru = victim == "cost", victim == "lru"
        self.now, self.stamp, self.kept, self.horizon = now, stamp, kept, horizon

    def badness(self, owner: Resident) -> int:
        """How bad evicting ``owner`` is now (the class docstring's rules); :data:`PINNED` if it is.

        Parameters
        ----------
        owner : Resident
            An occupant.

        Returns
        -------
        int
            Its badness.
        """
        if owner.pin == self.stamp:
            return PINNED
        if self.by_cost:
            return 0
        if self.lru:
            return owner.last_use
        if not owner.materialized:
            return -owner.item
        nxt = self.next_use(owner)
        return LEAST if nxt == NEVER else -nxt

    def moved(self, owner: Resident) -> int:
        """The bytes evicting ``owner`` makes move now, weighed by its next use under ``cost``.

        Parameters
        ----------
        owner : Resident
            An occupant that is not pinned.

        Returns
        -------
        int
            The bytes (shifted by :data:`SCALE` under ``cost``).
        """
        if not owner.materialized:
            return 0
        offload = 0 if owner.clean else owner.size
        if not self.by_cost:
            return offload
        now, nxt = self.now, self.next_use(owner)
        if nxt == NEVER:
            if not self.kept[owner.task]:
                return 0
            return (offload << SCALE) // max(1, self.horizon - now)
        return ((offload + owner.size) << SCALE) // (nxt - now)

    def next_use(self, res: Resident) -> int:
        """The first item after ``now`` that reads ``res`` (:data:`NEVER` if none), cached
        on it until that item has passed.

        Parameters
        ----------
        res : Resident
            An occupant.

        Returns
        -------
        int
            The item.
        """
        nxt = res.next_use
        if nxt <= self.now:
            used = res.uses
            k = bisect.bisect_right(used, self.now)
            nxt = res.next_use = used[k] if k < len(used) else NEVER
        return nxt
