"""Gemini plans large steps (issue 45: the LoRA 7B step of docs/results/deployed.md): the
eviction victim is found without a pass over every chunk and the offline layout looks only at
the copies living at the same time as the one it places, with the same plans as those passes
(bench/plan_hashes.py --gemini fingerprints them)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gemini import CASES, at

from offloadlab.core import formats
from offloadlab.core.workloads import build_workload
from offloadlab.planner.gemini import Manager, manager, program
from offloadlab.planner.gemini.chunks import Chunk, next_use
from offloadlab.planner.gemini.held import Held
from offloadlab.planner.gemini.layout import _first_fit, pack
from offloadlab.planner.registry import parse_options

copies = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12), st.integers(0, 9)),
                  min_size=1, max_size=40)


def _copies(drawn: list[tuple[int, int, int]]) -> list[manager.Copy]:
    return [manager.Copy(("t", "gpu0"), size, "w", born, born + life)
            for born, life, size in drawn]


def _lowest_fit(placed: list[tuple[int, int, int, int]], c: manager.Copy) -> int:
    """The lowest of 0 and the ends of the placed ranges living at the same time as ``c``
    where ``c`` overlaps none of them: first fit, by its definition."""
    living = [(start, end) for born, freed, start, end in placed
              if born < c.freed and c.born < freed]
    for offset in sorted({0, *(end for _, end in living)}):
        if all(end <= offset or offset + c.size <= start for start, end in living):
            return offset
    raise AssertionError("above every range there is room")


@settings(max_examples=300, deadline=None)
@given(copies, st.booleans())
def test_the_offline_layout_is_first_fit_among_the_copies_living_at_the_same_time(drawn, by_size):
    mine = _copies(drawn)
    rank = {e: k for k, e in enumerate(sorted({e for c in mine for e in (c.born, c.freed)}))}
    key = (lambda c: (-c.size, c.born)) if by_size else \
        (lambda c: (-c.size * (rank[c.freed] - rank[c.born]), c.born))
    offsets, top = _first_fit(mine, rank, key)
    placed: list[tuple[int, int, int, int]] = []
    for k in sorted(range(len(mine)), key=lambda k: key(mine[k])):
        c = mine[k]
        assert offsets[k] == _lowest_fit(placed, c)
        placed.append((c.born, c.freed, offsets[k], offsets[k] + c.size))
    assert top == max(end for *_, end in placed)


def test_the_offline_layout_of_many_copies_takes_seconds_not_hours():
    """80,000 copies, each living beside a few others (a pass's events on one GPU of the LoRA
    7B step: 56,000): laid out in seconds on a loaded machine, where a pass over every copy
    placed before each took minutes (3.2 billion copies looked at)."""
    mine = [manager.Copy(("t", "gpu0"), 1 + k % 7, "w", k, k + 1 + k % 5)
            for k in range(80_000)]
    start = time.process_time()
    need = pack(mine)
    assert time.process_time() - start < 30
    assert need["gpu0"] == max(c.offset + c.size for c in mine)


ops = st.lists(st.tuples(st.sampled_from(["arrive", "leave", "rekey", "first"]),
                         st.integers(0, 7), st.integers(0, 5)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_held_chunks_come_out_least_key_first_as_a_pass_over_them_finds_them(steps):
    chunks = [Chunk(k, f"gpu{k % 2}") for k in range(8)]
    keys = [(0, k) for k in range(8)]
    held = Held(chunks, lambda c: keys[c.index])
    tensors = [0] * 8
    for what, k, value in steps:
        chunk = chunks[k]
        if what == "arrive":
            held.arrive(chunk)
            tensors[k] += 1
        elif what == "leave" and tensors[k]:
            held.leave(chunk)
            tensors[k] -= 1
        elif what == "rekey":
            keys[k] = (value, k)
            held.rekey(chunk)
        elif what == "first":
            skip = chunks[value:value + 2]
            expected = min((c for c in chunks if c.device == chunk.device and tensors[c.index]
                            and c not in skip), key=lambda c: keys[c.index], default=None)
            assert held.first(chunk.device, skip) is expected


class Passing(Manager):
    """The manager choosing each victim by a pass over every chunk (its definition)."""

    def _victim(self, i, dev):
        compute = self.prog.compute[i]
        held = [c for c in self.prog.chunks if c.device == dev and c not in compute
                and any(s in self.resident for s in c.slots)]
        if not held:
            return None
        if self.warmup:
            return held[0]
        if self.options.eviction == "lru":
            return min(held, key=lambda c: self.last_use[c.index])
        return max(held, key=lambda c: (next_use(c, i), c.index))


@pytest.mark.parametrize("workload,spec", [CASES[1], CASES[5], CASES[6]],
                         ids=["gpt2", "training-chain", "gpt2-train"])
@pytest.mark.parametrize("options", ["", ",eviction=lru", ",warmup_share=0.05"])
def test_victims_are_those_a_pass_over_every_chunk_chooses(workload, spec, options):
    """The warm-up's (the first registered), OPT's (needed latest; ties: the last registered)
    and LRU's (least recently used; ties: the first registered), at the tightest memory of
    test_gemini: the same MemGraph as the pass over every chunk gives, evicting as often."""
    graph = build_workload(workload)
    _, opts = parse_options(spec.replace(",warmup_share=1", "") + options)
    prog = program(graph, opts.chunk_size)
    for factor in (1.1, 1.5):
        machine = at(graph, factor)
        warmups = [kind(graph, machine, opts, prog) for kind in (Manager, Passing)]
        for m in warmups:
            m.run()
        assert warmups[0].peaks == warmups[1].peaks
        assert formats.to_json(warmups[0].mg) == formats.to_json(warmups[1].mg)
        plans = [kind(graph, machine, opts, prog, warmups[0].peaks) for kind in (Manager, Passing)]
        for m in plans:
            m.run()
        assert formats.to_json(plans[0].mg) == formats.to_json(plans[1].mg)
        assert plans[0].mg.count("offload") + plans[0].mg.count("reload") > 0


LAYERS = 40
LONG_CHAIN = ",".join(f"{k}=" + ";".join([v] * LAYERS) for k, v in
                      (("w", "400KB"), ("a", "100KB"), ("uF", "0.1"), ("uB", "0.2")))


def test_opt_looks_up_a_chunks_next_use_once_per_use_not_once_per_eviction(monkeypatch):
    """OPT's order of a HOLD chunk changes only when the chunk is used: a planned pass looks
    its next use up then (and once for each chunk at the start), not for every HOLD chunk at
    every eviction (which made the LoRA 7B step's victims take 95 s of a 150 s profile)."""
    graph = build_workload(f"training-chain:{LONG_CHAIN}")
    _, opts = parse_options("gemini:chunk_size=1,warmup_share=1")
    prog = program(graph, 1)
    machine = at(graph, 1.5)
    warmup = Manager(graph, machine, opts, prog)
    warmup.run()
    calls = []

    def counted(chunk, i):
        calls.append(chunk)
        return next_use(chunk, i)

    monkeypatch.setattr(manager, "next_use", counted)
    planned = Manager(graph, machine, opts, prog, warmup.peaks)
    planned.run()
    assert planned.mg.count("offload") + planned.mg.count("reload") > 400
    assert len(calls) <= sum(len(c.uses) for c in prog.chunks) + len(prog.chunks)
