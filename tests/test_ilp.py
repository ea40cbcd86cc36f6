"""The MILP lower bound (Beaumont et al., Sec. 6) against hand-computed values and feasible
schedules of OFF(L, M, β) found by an independent event simulation."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadlab.core.errors import PlanError, SpecError
from offloadlab.core.workloads.training import TrainingChain, transformer_chain
from offloadlab.ilp import IlpResult, lower_bound

W = 10**9  # bytes: with bandwidth 1e9 B/s one weight moves in 1 s
SOLVERS = ["cbc", pytest.param("highs", marks=pytest.mark.skipif(
    importlib.util.find_spec("highspy") is None, reason="highspy not installed"))]


def chain(uF, uB, w, a, a0=1) -> TrainingChain:
    return TrainingChain(tuple(map(float, uF)), tuple(map(float, uB)), tuple(w), tuple(a), a0)


# ---------------------------------------------------------------- an independent OFF simulator

def simulate(c: TrainingChain, memory: int, beta: float, beta_o: float, selection,
             pre_order, off_order, jit, cycles: int = 12):
    """Earliest-start schedule of ``cycles`` iterations of OFF(L, M, β) (Sec. 3) for a fixed
    selection; returns ``(period, schedule)``, or ``(inf, None)`` on deadlock or when no exact
    periodic regime appears within 48 iterations.

    Per iteration: compute ``B_L..B_1, F_1..F_L``; for each chosen ``(k, d)`` a deletion (after
    the last use, once ``w_k``'s offload since ``B_k`` has ended; one offload serves both
    choices: the discount) and a prefetch before the next use, whose buffer is reserved from its
    start; one offload per chosen layer, after ``B_k``.  Links run one transfer per direction,
    in ``pre_order``/``off_order`` each iteration; a prefetch in ``jit`` waits for the start of
    the operation before its user.  Memory: weights on the GPU or in flight, plus ``M_k - |w_k|``
    during operation ``k`` (eq. 1) and the surviving activations between operations.  Compute
    has priority over transfers when memory is contended.
    """
    S = set(selection)
    L, n = c.L, 2 * c.L
    w = dict(enumerate(c.w, 1))
    ops = [("B", i) for i in range(L, 0, -1)] + [("F", i) for i in range(1, L + 1)]
    pos = {op: p for p, op in enumerate(ops)}
    u = [c.uB[i - 1] if kd == "B" else c.uF[i - 1] for kd, i in ops]
    act = [(c.memory_backward(i) if kd == "B" else c.memory_forward(i)) - w[i] for kd, i in ops]
    gap = [c.activations_upto(i - 1 if kd == "B" else i) for kd, i in ops]
    user = {(k, 1): pos["B", k] for k in w} | {(k, 0): pos["F", k] for k in w}

    start, end = {}, {}
    for k in w:  # before iteration 0, the weights chosen (k, 1) are out
        end["D", -1, k, 1] = 0.0
    weights = sum(w[k] for k in w if (k, 1) not in S)
    pq = deque(("P", it, k, d) for it in range(cycles) for k, d in pre_order)
    oq = deque(("O", it, k) for it in range(cycles) for k in off_order)
    pending = {("D", it, k, d) for it in range(cycles) for k, d in S}
    t, g, running, run_p, run_o, level_after = 0.0, 0, None, None, None, gap[-1]

    def done(key) -> bool:
        return key in end and end[key] <= t

    while True:
        changed = True
        while changed:
            changed = False
            for key in sorted(pending):
                _, it, k, d = key
                used = ("C", it * n + pos["B" if d == 0 else "F", k])
                if done(used) and done(("O", it, k)):
                    pending.discard(key)
                    weights -= w[k]
                    start[key] = end[key] = t
                    changed = True
            if running is None and g < cycles * n:
                p, it = g % n, g // n
                kd, i = ops[p]
                wanted = (i, 1 if kd == "B" else 0)
                if (wanted not in S or done(("P", it, *wanted))) and weights + act[p] <= memory:
                    start["C", g], end["C", g] = t, t + u[p]
                    running, g, changed = g, g + 1, True
            if run_o is None and oq:
                _, it, k = oq[0]
                if done(("C", it * n + pos["B", k])):
                    run_o = oq.popleft()
                    start[run_o], end[run_o] = t, t + w[k] / beta_o
                    changed = True
            if run_p is None and pq:
                _, it, k, d = pq[0]
                freed = ("D", it - 1, k, 1) if d == 1 else ("D", it, k, 0)
                release = it * n + user[k, d] - 1
                level = act[running % n] if running is not None else level_after
                if (done(freed) and (not jit or release < 0 or ("C", release) in start)
                        and weights + w[k] + level <= memory):
                    run_p = pq.popleft()
                    weights += w[k]
                    start[run_p], end[run_p] = t, t + w[k] / beta
                    changed = True
        ends = [end[x] for x in (run_p, run_o) if x is not None]
        if running is not None:
            ends.append(end["C", running])
        if not ends:
            break
        t = min(ends)
        if running is not None and end["C", running] <= t:
            level_after, running = gap[running % n], None
        if run_p is not None and end[run_p] <= t:
            run_p = None
        if run_o is not None and end[run_o] <= t:
            run_o = None
    if g < cycles * n or running is not None:
        return math.inf, None

    def signature(it):  # the start times of iteration it's events, relative to its B_L
        t0 = start["C", it * n]
        return tuple(round(start[x] - t0, 9) for x in sorted(start, key=repr)
                     if (x[1] // n if x[0] == "C" else x[1]) == it)

    sigs = [signature(it) for it in range(cycles - 1)]  # the last one has no successor
    for K in (1, 2, 3):
        for first in range(1, cycles - 1 - 2 * K):
            if all(sigs[it] == sigs[it + K] for it in range(first, cycles - 1 - K)):
                period = (start["C", (first + K) * n] - start["C", first * n]) / K
                return period, (start, end, ops, act, gap, w, S)
    if cycles < 48:  # a long transient: look further
        return simulate(c, memory, beta, beta_o, selection, pre_order, off_order, jit, 2 * cycles)
    return math.inf, None


def check_schedule(schedule, memory: int) -> None:
    """Independent check of a simulated schedule: one transfer at a time per link, compute in
    sequence, and GPU memory within ``memory`` after the events of every instant."""
    start, end, ops, act, gap, w, S = schedule
    n = len(ops)
    for kind in "CPO":
        spans = sorted((start[x], end[x]) for x in start if x[0] == kind)
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(spans, spans[1:])), kind
    computes = sorted((start[x], end[x], x[1]) for x in start if x[0] == "C")
    residency = {k: [(0.0, 0 if (k, 1) in S else 1)] for k in w}
    for x in start:
        if x[0] == "P":
            residency[x[2]].append((start[x], +1))
        elif x[0] == "D":
            residency[x[2]].append((start[x], -1))
    for t in sorted({v for x in start for v in (start[x], end[x])}):
        weights = sum(w[k] for k, evs in residency.items() if sum(s for tt, s in evs if tt <= t))
        running = [g for s, e, g in computes if s <= t < e]
        if running:
            level = act[running[0] % n]
        else:
            ended = [g for s, e, g in computes if e <= t]
            level = gap[ended[-1] % n] if ended else gap[-1]
        assert weights + level <= memory, (t, weights, level)


def brute_force(c: TrainingChain, memory: int, beta: float, *, all_orders: bool = True):
    """The best period of :func:`simulate` over every selection, prefetch order (the order of
    need only unless ``all_orders``), offload order and ``jit``.  Each is the period of a
    feasible periodic schedule, so the result is an upper bound on OFF's optimum."""
    L = c.L
    choices = [(k, d) for k in range(1, L + 1) for d in (1, 0)]
    need = {(k, 1): L - k for k in range(1, L + 1)} | {(k, 0): L + k - 1 for k in range(1, L + 1)}
    best, best_schedule = math.inf, None
    for r in range(len(choices) + 1):
        for S in itertools.combinations(choices, r):
            layers = sorted({k for k, _ in S}, reverse=True)
            pre_orders = (itertools.permutations(S) if all_orders
                          else [sorted(S, key=need.get)])
            for pre_order in pre_orders:
                for off_order in itertools.permutations(layers):
                    for jit in (False, True):
                        period, schedule = simulate(c, memory, beta, beta, S, pre_order,
                                                    off_order, jit)
                        if period < best:
                            best, best_schedule = period, schedule
    if best_schedule is not None:
        check_schedule(best_schedule, memory)
    return best


def l2l(c: TrainingChain, memory: int, beta: float) -> float:
    """L2L with the discount: every weight leaves after each use, the next layer's weight is
    prefetched while the current one computes, offloads in FIFO order."""
    L = c.L
    S = [(k, 1) for k in range(L, 0, -1)] + [(k, 0) for k in range(1, L + 1)]
    period, schedule = simulate(c, memory, beta, beta, S, S, list(range(L, 0, -1)), True)
    check_schedule(schedule, memory)
    return period


# ---------------------------------------------------------------- hand-computed instances

def two_layers(uB2: float) -> tuple[TrainingChain, int]:
    """w_1 = w_2 = W; memory holds both weights but not a third |w| (δw of B_2 with w_1), so
    w_1 must be out at the start of B_2 and w_2 out at the start of B_1."""
    c = chain([1, 1], [1, uB2], [W, W], [1, 1], a0=1)
    return c, 2 * W + 3


@pytest.mark.parametrize("solver", SOLVERS)
def test_two_layers_by_hand(solver):
    # w_2 leaves after B_2 (offload after B_2, eq. 3: in idle time: >= 1 s) and w_1 comes back
    # during B_2 (0.5 s) and its idle time: idle = 1 s; everything else overlaps.
    c, memory = two_layers(0.5)
    r = lower_bound(c, memory, 1e9, solver=solver)
    assert r.status == "optimal" and r.solver == solver
    assert r.bound == pytest.approx(c.sum_u + 1.0, abs=1e-8)
    assert r.objective == pytest.approx(r.bound, abs=1e-8) and r.objective >= r.bound
    assert r.selection == {(1, 1), (2, 0)} and r.offloaded == {1, 2}
    assert r.variables > 0 and r.constraints > 0 and r.build_time >= 0 and r.solve_time >= 0
    # offloads for free: the 1 s prefetch of w_1 still overlaps B_2 by 0.5 s only
    free = lower_bound(c, memory, 1e9, offload_bandwidth=math.inf, solver=solver)
    assert free.bound == pytest.approx(c.sum_u + 0.5, abs=1e-8)


@pytest.mark.parametrize("solver", SOLVERS)
def test_offload_after_backward_is_idle_time(solver):
    # eq. (3): a 2 s B_2 could hide every transfer, but w_2 changes during B_2 and must be
    # offloaded after it, before B_1 can start: idle = W/β = 1 s all the same.
    c, memory = two_layers(2.0)
    assert lower_bound(c, memory, 1e9, solver=solver).bound == pytest.approx(c.sum_u + 1.0,
                                                                             abs=1e-8)
    # with twice the offload bandwidth only, the idle time halves
    r = lower_bound(c, memory, 1e9, offload_bandwidth=2e9, solver=solver)
    assert r.bound == pytest.approx(c.sum_u + 0.5, abs=1e-8)


def test_simulated_schedules_reach_the_two_layer_bound():
    for uB2 in (0.5, 2.0):
        c, memory = two_layers(uB2)
        assert brute_force(c, memory, 1e9) == pytest.approx(c.sum_u + 1.0)


@pytest.mark.parametrize("solver", SOLVERS)
def test_infinite_memory_is_sum_u(solver):
    c = transformer_chain("gpt2", 6, batch=16, seq=128)
    r = lower_bound(c, 10**15, 1e3, solver=solver)  # tiny bandwidth: still no transfer needed
    assert r.bound == pytest.approx(c.sum_u, rel=1e-12) and r.status == "optimal"
    # just enough memory for all weights plus the largest eq. (1) remainder: still Σu
    need = sum(c.w) + max(max(c.memory_forward(i), c.memory_backward(i)) - c.w[i - 1]
                          for i in range(1, c.L + 1))
    assert lower_bound(c, need, 1e3, solver=solver).bound == pytest.approx(c.sum_u, rel=1e-12)
    short = need - c.w[0] // 10**4  # well above the solvers' feasibility tolerance (~1e-7)
    assert lower_bound(c, short, 1e3, solver=solver).bound > c.sum_u * 1.01


@pytest.mark.parametrize("solver", SOLVERS)
def test_tight_memory_and_tiny_bandwidth_idle(solver):
    c = chain([0.1] * 4, [0.2] * 4, [W] * 4, [1] * 4)
    r = lower_bound(c, c.memory_backward(4), 1e8, solver=solver)  # one weight in 10 s
    assert r.bound > c.sum_u + 10.0
    assert r.bound <= l2l(c, c.memory_backward(4), 1e8) + 1e-6


def three_partition(x: list[int], m: int, V: int, unit: int = 10**8):
    """The instance of Theorem 1's proof (weights in ``unit`` bytes; zero sizes become one
    byte, which the memory's 64 spare bytes absorb): schedulable in T = 2m = Σu iff ``x``
    splits into m triples of sum V."""
    L = 5 * m
    uF = [0.0] * L
    uF[2 * m - 1] = m
    uB = [1.0 if i <= 2 * m and i % 2 == 0 else 0.0 for i in range(1, L + 1)]
    w = [(1 if i % 2 == 0 else V * unit) if i <= 2 * m else x[i - 2 * m - 1] * unit
         for i in range(1, L + 1)]
    return chain(uF, uB, w, [1] * L, a0=0), (m + 1) * V * unit + 64, V * unit


@pytest.mark.parametrize("solver", SOLVERS)
def test_theorem_1_schedule_is_within_the_bound(solver):
    # The proof's schedule takes 2m; it needs B_{2k-1} to run with w_{2k-1}, δw_{2k-1} and the
    # other weights in exactly M_GPU: eq. (4) must count |w_{2k-1}| once (read literally, eq. 4
    # counts it twice and the bound would exceed 2m).
    c, memory, beta = three_partition([3, 4, 5, 4, 4, 4], 2, 12)
    assert c.sum_u == 4
    assert lower_bound(c, memory, beta, solver=solver).bound == pytest.approx(4.0, rel=1e-8)


def test_a_layer_that_does_not_fit_is_a_plan_error():
    c = chain([1, 1], [1, 1], [W, 3 * W], [5, 7], a0=2)
    with pytest.raises(PlanError, match=r"B_2 of layer 2 needs 6000000014 bytes"):
        lower_bound(c, 6 * W, 1e9)
    lower_bound(c, 6 * W + 14, 1e9)  # exactly M_{B_2} (eq. 1) is enough


def test_bad_arguments_are_spec_errors(monkeypatch):
    c, memory = two_layers(1.0)
    with pytest.raises(SpecError, match="unknown MILP solver 'gurobi'"):
        lower_bound(c, memory, 1e9, solver="gurobi")
    for kw in (dict(bandwidth=0), dict(bandwidth=1e9, offload_bandwidth=-1.0),
               dict(bandwidth=1e9, time_limit=0)):
        with pytest.raises(SpecError):
            lower_bound(c, memory, **kw)
    monkeypatch.setitem(sys.modules, "highspy", None)  # import highspy -> ImportError
    with pytest.raises(SpecError, match=r"pip install offloadlab\[highs\]"):
        lower_bound(c, memory, 1e9, solver="highs")
    assert lower_bound(c, memory, 1e9, solver="auto").solver == "cbc"


def test_auto_prefers_highs():
    pytest.importorskip("highspy")
    c, memory = two_layers(1.0)
    assert lower_bound(c, memory, 1e9).solver == "highs"


@pytest.mark.parametrize("solver", SOLVERS)
def test_time_limit_gives_a_valid_bound(solver):
    """Whatever the machine's speed (a loaded machine may barely start the search, a fast one
    may finish it), a time limit gives a valid bound: the status says which, and the bound
    lies between Σu and the incumbent's value, below any planner's iteration time."""
    c = transformer_chain("gpt2", 36, batch=16, seq=128, dtype_bytes=4)
    r = lower_bound(c, 8 * 10**9, 3e9, solver=solver, time_limit=2)
    assert r.status in ("time_limit", "optimal")
    assert c.sum_u * (1 - 1e-6) <= r.bound <= r.objective * (1 + 1e-9)
    assert r.bound <= l2l(c, 8 * 10**9, 3e9)


def test_cbc_bound_helpers():
    from offloadlab.ilp.milp import Milp, _lp_relaxation, _printed_floor, run_cbc
    assert _printed_floor("13.225") == pytest.approx(13.224) and _printed_floor("1.5e+02") < 150
    c, memory = two_layers(0.5)
    model = Milp(c, memory, 1e9, 1e9)
    run_cbc(model.prob, mip=True)
    mip = model.prob.objective.value()
    values = {v.name: v.varValue for v in model.prob.variables()}
    assert 0 <= _lp_relaxation(model.prob) <= mip + 1e-9
    assert {v.name: v.varValue for v in model.prob.variables()} == values  # incumbent kept


def test_sparse_model_size():
    from offloadlab.ilp.milp import Milp
    for L in (6, 12):
        prob = Milp(chain([1] * L, [1] * L, [W] * L, [1] * L), 10 * W, 1e9, 1e9).prob
        nonzeros = len(prob.coefficients())
        assert prob.numVariables() == 10 * L * L + 2 * L + 3 * L  # O P D m o, idle, binaries
        assert nonzeros <= 30 * L * L


# ---------------------------------------------------------------- properties

sizes = st.sampled_from([1, 2, 3])


@st.composite
def instances(draw, max_layers: int):
    L = draw(st.integers(1, max_layers))
    times = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])
    c = chain(draw(st.lists(times, min_size=L, max_size=L)),
              draw(st.lists(times, min_size=L, max_size=L)),
              [W * x for x in draw(st.lists(sizes, min_size=L, max_size=L))],
              [W // 4 * x for x in draw(st.lists(sizes, min_size=L, max_size=L))], a0=W // 4)
    least = max(max(c.memory_forward(i), c.memory_backward(i)) for i in range(1, L + 1))
    memory = least + draw(st.integers(0, 8)) * W // 2
    beta = draw(st.sampled_from([2.5e8, 5e8, 1e9, 4e9]))
    return c, memory, beta


fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(instances(6))
def test_bound_between_sum_u_and_l2l(instance):
    c, memory, beta = instance
    r = lower_bound(c, memory, beta, solver="cbc")
    assert c.sum_u - 1e-9 <= r.bound <= r.objective
    assert r.bound <= l2l(c, memory, beta) * (1 + 1e-7)


@fast
@given(instances(6), st.integers(1, 4), st.sampled_from([2.0, 4.0, math.inf]))
def test_more_memory_or_bandwidth_never_hurts(instance, extra, faster):
    c, memory, beta = instance
    bound = lower_bound(c, memory, beta, solver="cbc").bound
    slack = bound * 1e-7  # the solvers' tolerances
    assert lower_bound(c, memory + extra * W // 2, beta, solver="cbc").bound <= bound + slack
    assert lower_bound(c, memory, beta * faster, solver="cbc").bound <= bound + slack


@settings(max_examples=25, deadline=None)
@given(instances(6))
def test_highs_and_cbc_agree(instance):
    pytest.importorskip("highspy")
    c, memory, beta = instance
    cbc, highs = (lower_bound(c, memory, beta, solver=s) for s in ("cbc", "highs"))
    assert highs.bound == pytest.approx(cbc.bound, rel=1e-6)
    assert isinstance(highs, IlpResult) and highs.solver == "highs"


@settings(max_examples=12, deadline=None)
@given(instances(2))
def test_bound_below_every_simulated_schedule(instance):
    c, memory, beta = instance
    bound = lower_bound(c, memory, beta, solver="cbc").bound
    assert bound <= brute_force(c, memory, beta) * (1 + 1e-7)


def test_bound_below_schedules_of_three_layers():
    c = chain([0.5, 1, 0.25], [1, 2, 0.5], [W, 2 * W, W], [W // 4] * 3, a0=W // 4)
    for memory in (c.memory_backward(2), c.memory_backward(2) + W, 3 * W + 2 * W):
        bound = lower_bound(c, memory, 1e9, solver="cbc").bound
        best = brute_force(c, memory, 1e9, all_orders=False)
        assert c.sum_u <= bound <= best * (1 + 1e-7)
