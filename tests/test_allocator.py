"""The offset allocator behind BuildMemGraph (planner/allocator.py), against brute force."""

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.errors import GraphError
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.planner import allocator
from offloadlab.planner.allocator import (
    INDEX_AT,
    LEAST,
    PINNED,
    GpuMemory,
    Segment,
)
from offloadlab.planner.blocked import Blocked


def free_runs(memory: GpuMemory) -> list[tuple[int, int]]:
    """Maximal runs of free bytes as (start, end)."""
    runs: list[tuple[int, int]] = []
    for s in memory.segments:
        if s.owner is None:
            if runs and runs[-1][1] == s.start:
                runs[-1] = (runs[-1][0], s.end)
            else:
                runs.append((s.start, s.end))
    return runs


def occupants(memory: GpuMemory, offset: int, size: int) -> list:
    """Occupants of the segments overlapping ``[offset, offset + size)``."""
    return [s.owner for s in memory.segments
            if s.owner is not None and s.start < offset + size and s.end > offset]


def check_layout(memory: GpuMemory) -> None:
    segs = memory.segments
    assert segs[0].start == 0 and segs[-1].end == memory.capacity
    assert all(a.end == b.start and a.start < a.end for a, b in zip(segs, segs[1:]))
    # linked both ways, each segment found by its start, the hand's segment containing it
    assert segs[0].prev is None and all(b.prev is a for a, b in zip(segs, segs[1:]))
    assert memory._at == {s.start: s for s in segs}
    assert memory._hand_at in segs and \
        memory._hand_at.start <= memory._hand < memory._hand_at.end
    # find_free's fail threshold: no free run holds _no_fit bytes
    assert all(end - start < memory._no_fit for start, end in free_runs(memory))
    # the index of free runs, when kept, agrees with the segments
    runs = free_runs(memory) if memory._indexed else []
    assert memory._run_start == {b: a for a, b in runs}
    assert {a: run.end for a, run in memory._runs.items()} == dict(runs)
    # each run's steps, found up to its reached segment: the latest freeing among the segments
    # a window at its start covers is, for every size up to the reached segment's end, the
    # least value among the items serving that size (size >= it), and for longer windows at
    # least that (the open step's item a lower bound)
    shift = memory._shift
    items = []
    for a, b in runs:
        run = memory._runs[a]
        inside = [seg for seg in segs if a <= seg.start < b]
        assert run.reached in inside
        steps = run.steps + [b - a, run.key]
        items += [(steps[k], steps[k + 1]) for k in range(0, len(steps), 2)]
        pairs = [(steps[k], (steps[k + 1] >> shift) - 1) for k in range(0, len(steps), 2)]
        assert all(steps[k + 1] & ((1 << shift) - 1) == a for k in range(0, len(steps), 2))
        assert pairs[-1][1] == run.newest
        for size in range(1, b - a + 1):
            newest = max(seg.freed_at for seg in inside if seg.start < a + size)
            found = min(v for n, v in pairs if n >= size)
            assert found == newest if a + size <= run.reached.end else found <= newest
        assert [v for _, v in pairs] == sorted({v for _, v in pairs})   # rising
    assert memory._steps.items() == sorted(items, key=lambda item: item[1])


@pytest.fixture(autouse=True, scope="module")
def _restore_index_at():
    yield
    allocator.INDEX_AT = INDEX_AT


class Table:
    """Victim costs (a :class:`Victims`) read from a table: owner -> (badness, bytes moved)."""

    def __init__(self, costs: dict):
        self.costs = costs

    def badness(self, owner) -> int:
        return self.costs[owner][0]

    def moved(self, owner) -> int:
        return self.costs[owner][1]


@st.composite
def histories(draw):
    """An allocator after a random sequence of allocations, evictions (as BuildMemGraph's
    simMallocOffld makes them: a victim search, its victims freed, the window occupied),
    releases and retractions, with the free-run index taken up and dropped at a random number
    of segments (the default is rarely reached by these small histories)."""
    allocator.INDEX_AT = draw(st.sampled_from([1, 4, 8, INDEX_AT]))
    capacity = draw(st.integers(16, 200))
    memory = GpuMemory("gpu0", capacity)
    held: dict[int, tuple[int, int, list]] = {}
    for step in range(draw(st.integers(0, 40))):
        action = draw(st.sampled_from(["place", "place", "evict", "release", "restore"]))
        if action == "place":
            size = draw(st.integers(1, capacity // 2))
            offset = memory.find_free(size)
            if offset is not None:
                covered = memory.place(offset, size, step)
                assert all(c.prev is None and c.next is None for c in covered)  # no cycles
                held[step] = (offset, size, covered)
        elif action == "evict":
            size = draw(st.integers(1, capacity // 2))
            costs = {o: (PINNED, 0) if draw(st.booleans()) else
                     (draw(st.sampled_from([LEAST, -1, 0, 2])), draw(st.integers(0, 3)))
                     for o in memory.owners()}
            found = memory.find_victims(size, Table(costs))
            if found is not None:
                offset, victims = found
                for victim in victims:
                    at, _, covered = held.pop(victim)
                    if draw(st.booleans()):
                        memory.release(victim, at, (f"r{victim}",), now=step)
                    else:
                        memory.restore(victim, at, covered)
                held[step] = (offset, size, memory.place(offset, size, step))
        elif held:
            owner = draw(st.sampled_from(sorted(held)))
            offset, size, covered = held.pop(owner)
            if action == "release":
                memory.release(owner, offset, (f"r{owner}",), now=step)
            else:
                memory.restore(owner, offset, covered)
        check_layout(memory)
    return memory


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(1, 200))
def test_find_free_agrees_with_brute_force(memory, size):
    runs = [(a, b) for a, b in free_runs(memory) if b - a >= size]
    offset = memory.find_free(size)
    if not runs:
        assert offset is None
        return

    def newest(start):   # the latest freeing among the bytes [start, start + size)
        return max(s.freed_at for s in memory.segments
                   if s.owner is None and s.start < start + size and s.end > start)

    best = min((newest(a), a) for a, _ in runs)
    assert offset == best[1]
    check_layout(memory)


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(1, 200), st.data())
def test_find_victims_agrees_with_brute_force(memory, size, data):
    owners = memory.owners()
    costs = {o: (PINNED, 0) if data.draw(st.booleans()) else
             data.draw(st.tuples(st.sampled_from([LEAST, -3, -1, 0, 2]), st.integers(0, 3)))
             for o in owners}
    hand, hand_at = memory._hand, memory._hand_at.start       # the search moves the hand
    found = memory.find_victims(size, Table(costs))
    windows = []
    for s in memory.segments:
        if s.start + size > memory.capacity:
            break
        inside = occupants(memory, s.start, size)
        if all(costs[o][0] != PINNED for o in inside):
            worst = max((costs[o][0] for o in inside), default=LEAST)
            distance = (s.start - hand) % memory.capacity   # ties: nearest after the hand
            windows.append(((worst, sum(costs[o][1] for o in inside), distance), inside))
    if not windows:
        assert found is None
        return
    key, victims = min(windows, key=lambda w: w[0])
    # The search stops at the first window, in its order from the segment holding the hand,
    # that loses nothing (a hand inside a segment so prefers that segment's window).
    scan = sorted(windows, key=lambda w: (w[0][2] + hand - hand_at) % memory.capacity)
    key, victims = next((w for w in scan if w[0][:2] == (LEAST, 0)), (key, victims))
    assert found == ((hand + key[2]) % memory.capacity, victims)


def test_find_free_prefers_the_run_freed_longest_ago():
    memory = GpuMemory("gpu0", 30)
    for name in "abc":
        memory.place(memory.find_free(10), 10, name)
    assert [s.owner for s in memory.segments] == ["a", "b", "c"]
    memory.release("c", 20, ("c-reader",), now=1)
    memory.release("a", 0, ("a-reader",), now=2)
    assert memory.find_free(10) == 20           # c's run was freed first
    assert memory.find_free(11) is None
    memory.release("b", 10, ("b-reader",), now=3)
    assert memory.find_free(30) == 0            # one run again
    covered = memory.place(0, 20, "d")
    assert [s.guard for s in covered] == [("a-reader",), ("b-reader",)]
    memory.restore("d", 0, covered)             # retraction gives the guards back
    assert [s.guard for s in memory.segments] == [("a-reader",), ("b-reader",), ("c-reader",)]


def test_out_of_order_names_the_first_misordered_pair():
    g = TaskGraph()
    g.add_input("x", 4)
    assert g.out_of_order() is None
    g.add_compute("z", "add", ["x", "y"], "gpu0", 4)
    g.add_compute("y", "relu", ["x"], "gpu0", 4)
    assert g.out_of_order() == ("z", "y")
    g.validate()                                # acyclic all the same
    assert g.topological_order() == ["x", "y", "z"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 7), st.data())
def test_checked_order_is_validate_and_out_of_order(n, data):
    """``checked_order`` (what the serial order ``given`` asks, one pass) raises what
    ``validate`` raises and otherwise answers what ``out_of_order`` answers, on graphs whose
    insertion order may be misordered or cyclic."""
    g = TaskGraph()
    g.add_input("v0", 4)
    for k in range(1, n):
        reads = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
        g.add_compute(f"v{k}", "add", [f"v{u}" for u in reads], "gpu0", 4)
    try:
        g.validate()
        expected: object = g.out_of_order()
    except GraphError as exc:
        expected = str(exc)
    try:
        got: object = g.checked_order()
    except GraphError as exc:
        got = str(exc)
    assert got == expected


def test_replaced_segments_are_freed_without_the_collector():
    """Linked segments are reference cycles: place and restore unlink the segments they
    replace, so that planning, which pauses the cyclic collector, does not keep every segment
    it ever made."""
    gc.collect()
    gc.disable()
    try:
        memory = GpuMemory("gpu0", 1 << 16)
        held: list[tuple[int, int, list]] = []
        for step in range(3000):
            size = 1 + step * 7919 % 2048
            offset = memory.find_free(size)
            while offset is None or len(held) > 40:
                owner, at, covered = held.pop(step % len(held))
                if owner % 3:
                    memory.release(owner, at, (f"r{owner}",), now=step)
                else:
                    memory.restore(owner, at, covered)
                offset = memory.find_free(size)
            held.append((step, offset, memory.place(offset, size, step)))
        del covered                     # the last retracted allocation's
        alive = sum(type(o) is Segment for o in gc.get_objects())
        assert alive == len(memory.segments) + sum(len(c) for _, _, c in held)
    finally:
        gc.enable()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.booleans(), st.integers(0, 12),
                                             st.integers(0, 12)), max_size=120),
       st.integers(0, 13))
def test_blocked_agrees_with_a_sorted_list(block, steps, size):
    """Items added and removed in any order (blocks split and emptied): the items stay sorted
    by key and :meth:`Blocked.least` is the least key among the items of at least ``size``."""
    blocked, kept = Blocked(block), set()
    for add, n, key in steps:
        if add and key not in {k for _, k in kept}:
            blocked.add(n, key)
            kept.add((n, key))
        elif not add and kept:
            item = sorted(kept)[(n * 13 + key) % len(kept)]
            blocked.remove(*item)
            kept.remove(item)
        assert blocked.items() == sorted(kept, key=lambda item: item[1])
        assert all(0 < len(keys) <= 2 * block for keys in blocked.keys)
        assert blocked.last == [keys[-1] for keys in blocked.keys]
        assert blocked.largest == [max(sizes) for sizes in blocked.sizes]
        assert blocked.at_largest == [sizes.count(max(sizes)) for sizes in blocked.sizes]
        leaves, tree = blocked.leaves, blocked.tree      # the max tree over the blocks
        assert leaves >= len(blocked.keys) and tree[leaves:] == \
            blocked.largest + [-1] * (leaves - len(blocked.keys))
        assert all(tree[i] == max(tree[2 * i], tree[2 * i + 1]) for i in range(1, leaves))
        assert len(blocked) == len(kept)
        assert blocked.least(size) == min((k for n, k in kept if n >= size), default=-1)
