"""The MILP lower bound of Beaumont et al., Section 6 (eqs. 2-8, Theorem 2).

Operations are numbered ``1..2L`` in the chain's cycle ``B_L..B_1, F_1..F_L``
(``TrainingChain.cycle``): ``B_i`` is ``L - i + 1`` and ``F_i`` is ``L + i``; all sums over
operations are cyclic.  For operation ``j`` and layer ``i`` the model has the amounts
``O[i, j]`` offloaded, ``P[i, j]`` prefetched and ``D[i, j]`` deleted of ``w_i`` between the
starts of ``j`` and ``j + 1``, and ``idle[j]``, the idle time after ``j``; binaries ``D1[i]``,
``D0[i]`` (``D_i^(1)``, ``D_i^(0)``) and ``Ostar[i]`` (``O_i^*``) are the choices.  The sparse
form, and how the model reads the paper where it is ambiguous: docs/planners.md, The MILP
bound.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.cycle import TrainingChain
from ..core.errors import PlanError, SpecError

SOLVERS = ("auto", "highs", "cbc")
GAP_REL = 1e-9
"""Relative MIP gap on Σ idle; the absolute gap is ``GAP_REL`` of Σu."""


@dataclass(frozen=True)
class IlpResult:
    """Outcome of :func:`lower_bound`; times in seconds.

    ``bound`` is always a valid lower bound on the iteration time (the solver's proven dual
    bound); ``objective`` is the best MILP solution found (``inf`` if none).  ``selection``
    holds ``(k, 1)`` for ``D_k^(1) = 1`` (``w_k`` removed between ``F_k`` and ``B_k``) and
    ``(k, 0)`` for ``D_k^(0) = 1`` (removed between ``B_k`` and ``F_k``); ``offloaded`` the
    ``k`` with ``O_k^* = 1``.  ``status`` is ``"optimal"``, ``"time_limit"`` or ``"infeasible"``.
    """

    bound: float
    objective: float
    selection: frozenset[tuple[int, int]]
    offloaded: frozenset[int]
    status: str
    solver: str
    build_time: float
    solve_time: float
    variables: int
    constraints: int


def lower_bound(chain: TrainingChain, memory: int, bandwidth: float, *,
                offload_bandwidth: float | None = None, solver: str = "auto",
                time_limit: float | None = None, msg: bool = False) -> IlpResult:
    """Theorem 2: a lower bound on the iteration time of OFF(L, M_GPU, β) (Sec. 6).

    ``min Σ_j (u_j + idle_j)`` subject to eqs. (2)-(8).  Nothing is written to stdout: with
    ``msg=True`` the solver's log goes to stderr, otherwise nothing is printed (not even
    HiGHS's banner).  The MILP is feasible whenever every operation fits alone (delete every
    weight after each use and wait for each transfer), so ``"infeasible"`` can only be a
    solver's numerical failure; ``bound`` is then Σu.

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    memory : int
        M_GPU, in bytes.
    bandwidth : float
        β, the prefetch bandwidth in bytes/s (``math.inf`` allowed).
    offload_bandwidth : float, optional
        The offload bandwidth in bytes/s; default β.
    solver : str
        ``"highs"`` (highspy), ``"cbc"`` (bundled with PuLP) or ``"auto"`` (HiGHS when
        importable).
    time_limit : float, optional
        Seconds after which the solver may stop early; ``bound`` is then the best proven
        bound: HiGHS's MIP dual bound, CBC's last "best possible" from its log (rounded down),
        or, when CBC prints none, the LP relaxation's value; never less than
        :func:`transfer_bound`, which a solver stopped early may not have proven yet.  CBC
        checks the time limit only between phases: on large models its root LP alone may take
        longer.
    msg : bool
        The solver's log to stderr.

    Returns
    -------
    IlpResult

    Raises
    ------
    PlanError
        An operation does not fit even with no other weight on the GPU (``M_k`` of eq. (1)
        above ``memory``), or HiGHS stops without a result.
    SpecError
        A bandwidth or time limit that is not positive, or an unknown or missing solver.
    """
    beta_o = bandwidth if offload_bandwidth is None else offload_bandwidth
    for name, value in (("bandwidth", bandwidth), ("offload_bandwidth", beta_o)):
        if not value > 0:
            raise SpecError(f"{name} must be > 0 bytes/s, got {value}")
    if time_limit is not None and not time_limit > 0:
        raise SpecError(f"time_limit must be > 0 seconds, got {time_limit}")
    solver_name, solve = _solver(solver)
    misfit = chain.misfit(memory)
    if misfit is not None:
        kind, i = misfit
        raise PlanError(f"{chain.name}: {kind}_{i} of layer {i} needs {chain.memory(kind, i)} "
                        f"bytes (eq. 1) but the GPU has {memory} bytes")

    start = time.perf_counter()
    model = Milp(chain, memory, bandwidth, beta_o)
    build_time = time.perf_counter() - start

    start = time.perf_counter()
    with _native_stdout(to_stderr=msg):
        status, dual, primal = solve(model.prob, time_limit, msg,
                                     GAP_REL * chain.sum_u / model.tau)
    solve_time = time.perf_counter() - start

    found = math.isfinite(primal)
    bound = max(chain.sum_u + model.tau * max(dual, 0.0), transfer_bound(chain, memory, bandwidth))
    objective = chain.sum_u + model.tau * primal if found else math.inf
    return IlpResult(
        bound=min(bound, objective), objective=objective,
        selection=model.selection() if found else frozenset(),
        offloaded=model.offloaded() if found else frozenset(),
        status=status, solver=solver_name,
        build_time=build_time, solve_time=solve_time,
        variables=model.prob.numVariables(), constraints=model.prob.numConstraints())


def transfer_bound(chain: TrainingChain, memory: int, bandwidth: float) -> float:
    """A closed-form bound the MILP implies, from the transfers alone.

    During the fullest operation o, the other weights on the GPU fit in ``memory - M_o``
    (eq. 4), so at least ``Σ_i |w_i| - |w_o| + M_o - memory`` bytes are away; each comes
    back whole before its next use (eq. 5), and prefetches run at ``bandwidth`` during the
    cycle (eq. 2).

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    memory : int
        M_GPU, in bytes.
    bandwidth : float
        β, in bytes/s.

    Returns
    -------
    float
        That volume over the bandwidth, in seconds.
    """
    weights = sum(chain.w)
    away = max(weights - chain.w[i - 1] + chain.memory(kind, i) - memory
               for kind, i in chain.operations())
    return max(away, 0) / bandwidth


class Milp:
    """The PuLP model of Section 6 for one chain, memory and pair of bandwidths."""

    def __init__(self, chain: TrainingChain, memory: int, beta: float, beta_o: float):
        import pulp

        self.chain = chain
        L, n = chain.L, 2 * chain.L
        self.L, self.ops, self.layers = L, range(1, n + 1), range(1, L + 1)
        w = {i: chain.w[i - 1] for i in self.layers}
        u, activity = {}, {}  # u_j and M_j - |w_l|: the non-weight memory of operation j
        for j, (kind, i) in enumerate(chain.cycle(), 1):
            u[j], activity[j] = chain.duration(kind, i), chain.memory(kind, i) - w[i]
        scale = max(w.values())
        self.tau = max(max(u.values()), scale / min(beta, beta_o)) or 1.0
        cost_P = {i: w[i] / (beta * self.tau) for i in self.layers}  # seconds/tau per unit
        cost_O = {i: w[i] / (beta_o * self.tau) for i in self.layers}

        self.prob = prob = pulp.LpProblem("offload_lower_bound", pulp.LpMinimize)
        new = getattr(prob, "add_variable", pulp.LpVariable)  # PuLP >= 3.3 wants the former

        def grid(name: str) -> dict[tuple[int, int], pulp.LpVariable]:
            return {(i, j): new(f"{name}_{i}_{j}", 0, 1) for i in self.layers for j in self.ops}

        O, P, D, m, o = grid("O"), grid("P"), grid("D"), grid("m"), grid("o")  # noqa: E741
        idle = {j: new(f"idle_{j}", 0) for j in self.ops}
        self.D1 = {i: new(f"D1_{i}", cat=pulp.LpBinary) for i in self.layers}
        self.D0 = {i: new(f"D0_{i}", cat=pulp.LpBinary) for i in self.layers}
        self.Ostar = {i: new(f"Ostar_{i}", cat=pulp.LpBinary) for i in self.layers}

        def add(name: str, terms: list, sense: int, rhs: float = 0.0) -> None:
            prob.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), sense, name, rhs))

        EQ, LE, GE = pulp.LpConstraintEQ, pulp.LpConstraintLE, pulp.LpConstraintGE
        prob.setObjective(pulp.LpAffineExpression([(idle[j], 1.0) for j in self.ops]))
        for j in self.ops:  # eq. (2): the interval of j carries its transfers
            add(f"eq2_O_{j}", [(O[i, j], cost_O[i]) for i in self.layers] + [(idle[j], -1.0)],
                LE, u[j] / self.tau)
            add(f"eq2_P_{j}", [(P[i, j], cost_P[i]) for i in self.layers] + [(idle[j], -1.0)],
                LE, u[j] / self.tau)
        for k in self.ops:  # eq. (4): weights plus the rest of M_k fit at the start of k
            add(f"eq4_{k}", [(m[i, k], w[i] / scale) for i in self.layers], LE,
                (memory - activity[k]) / scale)
        for i in self.layers:
            a = self.op("B", i)
            order = self.cycle_from(a)  # intervals B_i .. F_i-1 (D^(0)), then F_i .. B_i-1 (D^(1))
            add(f"eq3_{i}", [(idle[a], 1.0), (O[i, a], -cost_O[i])], GE)
            # eq. (5): w_i whole at the starts of B_i and F_i; eq. (6) first part: m <= |w_i|
            m[i, a].lowBound = m[i, self.op("F", i)].lowBound = 1
            o[i, a].upBound = 0  # nothing offloaded yet at the start of B_i
            for j in order:  # running sums of eqs. (5)-(6): m and the offloaded part o
                add(f"m_{i}_{j}", [(m[i, self.next(j)], 1.0), (m[i, j], -1.0), (P[i, j], -1.0),
                                   (D[i, j], 1.0)], EQ)
            for j in order[:-1]:
                add(f"o_{i}_{j}", [(o[i, self.next(j)], 1.0), (o[i, j], -1.0), (O[i, j], -1.0)], EQ)
            for k in order[1:]:  # eq. (6) second part: Σ O + P - D >= 0, i.e. m - 1 + o >= 0
                add(f"eq6_{i}_{k}", [(m[i, k], 1.0), (o[i, k], 1.0)], GE, 1.0)
            last = order[-1]  # eq. (7): everything offloaded over the cycle is w_i, once
            add(f"eq7_{i}", [(o[i, last], 1.0), (O[i, last], 1.0), (self.Ostar[i], -1.0)], EQ)
            split = self.op("F", i) - a  # position of F_i in ``order``; eq. (8)
            add(f"eq8_1_{i}", [(D[i, j], 1.0) for j in order[split:]] + [(self.D1[i], -1.0)], EQ)
            add(f"eq8_0_{i}", [(D[i, j], 1.0) for j in order[:split]] + [(self.D0[i], -1.0)], EQ)

    def op(self, kind: str, i: int) -> int:
        """The number ``j`` of ``kind_i`` (1-based, in the chain's cycle).

        Parameters
        ----------
        kind : str
            ``"F"`` or ``"B"``.
        i : int
            The layer, from 1.

        Returns
        -------
        int
        """
        return self.chain.position(kind, i) + 1

    def next(self, j: int) -> int:
        """The operation after ``j`` in the cycle.

        Parameters
        ----------
        j : int
            An operation's number, from 1.

        Returns
        -------
        int
        """
        return j % (2 * self.L) + 1

    def cycle_from(self, a: int) -> list[int]:
        """Operations ``a, a+1, ..., a-1`` (cyclically).

        Parameters
        ----------
        a : int
            The first operation's number.

        Returns
        -------
        list of int
        """
        n = 2 * self.L
        return [(a - 1 + p) % n + 1 for p in range(n)]

    def selection(self) -> frozenset[tuple[int, int]]:
        """The solved D(1) and D(0): the (layer, d) pairs whose weight is deleted.

        Returns
        -------
        frozenset of (int, int)
        """
        return frozenset((i, d) for d, x in ((1, self.D1), (0, self.D0))
                         for i in self.layers if x[i].varValue > 0.5)

    def offloaded(self) -> frozenset[int]:
        """The layers whose weight the solution offloads (O* = 1).

        Returns
        -------
        frozenset of int
        """
        return frozenset(i for i in self.layers if self.Ostar[i].varValue > 0.5)


def _solver(name: str):
    """``(solver name, solve function)`` for ``name``; a solve function maps ``(prob,
    time_limit, msg, gap_abs)`` to ``(status, dual bound, objective)``, objective ``inf``
    without a solution, both in the model's units."""
    if name not in SOLVERS:
        raise SpecError(f"unknown MILP solver {name!r}; choose one of {', '.join(SOLVERS)}")
    try:
        import highspy  # noqa: F401
    except ImportError:
        if name == "highs":
            raise SpecError("solver 'highs' needs highspy: pip install offloadlab[highs]") from None
        return "cbc", _solve_cbc
    return ("cbc", _solve_cbc) if name == "cbc" else ("highs", _solve_highs)


def _solve_highs(prob, time_limit: float | None, msg: bool, gap_abs: float):
    import highspy
    import pulp

    prob.solve(pulp.HiGHS(msg=msg, timeLimit=time_limit, gapRel=GAP_REL, gapAbs=gap_abs))
    highs = prob.solverModel
    status, info = highs.getModelStatus(), highs.getInfo()
    kinds = highspy.HighsModelStatus
    if status in (kinds.kInfeasible, kinds.kUnboundedOrInfeasible):
        return "infeasible", 0.0, math.inf
    if status not in (kinds.kOptimal, kinds.kTimeLimit):
        raise PlanError(f"HiGHS stopped with {highs.modelStatusToString(status)!r}")
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    primal = info.objective_function_value if feasible else math.inf
    label = "optimal" if status == kinds.kOptimal else "time_limit"
    return label, min(info.mip_dual_bound, primal), primal


def _solve_cbc(prob, time_limit: float | None, msg: bool, gap_abs: float):
    import pulp

    text = run_cbc(prob, mip=True, time_limit=time_limit, gap_abs=gap_abs)
    if msg:
        print(text, file=sys.stderr)
    if prob.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible", 0.0, math.inf
    found = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    primal = pulp.value(prob.objective) if found else math.inf
    if prob.sol_status == pulp.LpSolutionOptimal:  # proven within the gaps we gave
        return "optimal", primal - max(gap_abs, GAP_REL * primal), primal
    reported = re.findall(r"best possible ([-+.0-9eE]+)", text)
    dual = _printed_floor(reported[-1]) if reported else _lp_relaxation(prob)
    return "time_limit", min(dual, primal), primal


@contextmanager
def _native_stdout(to_stderr: bool) -> Iterator[None]:
    """Send whatever is written to file descriptor 1 meanwhile to stderr (``to_stderr``) or
    nowhere: HiGHS prints its banner from C on the first ``Highs()`` of a process, whatever
    ``msg`` says, and nothing may reach stdout (``offloadlab reproduce --json`` prints JSON
    there)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:                     # no file descriptor 1 (embedded interpreters)
        yield
        return
    target = os.dup(2) if to_stderr else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(target)


def _flush_c_stdio() -> None:
    """Flush the C library's stdout buffer (where native solvers print) while fd 1 is
    redirected."""
    try:
        import ctypes
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):
        pass


def _printed_floor(number: str) -> float:
    """A value no larger than the one CBC rounded to ``number`` (it prints ~7 digits)."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return float(number) - 10.0 ** (int(exponent or 0) - decimals)


def run_cbc(prob, *, mip: bool, time_limit: float | None = None, gap_abs: float | None = None
             ) -> str:
    """Solve ``prob`` with PuLP's bundled CBC; return CBC's log.

    Parameters
    ----------
    prob : pulp.LpProblem
        The problem.
    mip : bool
        Keep the integer variables (false: the LP relaxation).
    time_limit : float, optional
        Seconds.
    gap_abs : float, optional
        The absolute gap at which CBC may stop.

    Returns
    -------
    str
        CBC's log.
    """
    import pulp

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "cbc.log")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # PuLP 3.3 deprecates it
            cbc = pulp.PULP_CBC_CMD(mip=mip, msg=False, timeLimit=time_limit, gapRel=GAP_REL,
                                    gapAbs=gap_abs, logPath=log)
        prob.solve(cbc)
        with open(log) as f:
            return f.read()


def _lp_relaxation(prob) -> float:
    """The LP relaxation's optimum, a valid (weaker) bound when CBC reports none; the
    incumbent's values are kept."""
    import pulp

    incumbent = {v.name: v.varValue for v in prob.variables()}
    status = prob.sol_status
    run_cbc(prob, mip=False)
    relaxed = pulp.value(prob.objective) if prob.status == pulp.LpStatusOptimal else 0.0
    prob.assignVarsVals(incumbent)
    prob.sol_status = status
    return relaxed
