"""FlexGen's cost model and its policy search by linear programming (Sheng et al., "FlexGen:
High-Throughput Generative Inference of Large Language Models with a Single GPU", ICML 2023,
Sec. 4.3; the code's ``experimental/cost_model.py``, ``solve_lp``, in
FMInference/FlexGen@19753bc).  The per-layer time ``T_j = max(ctog_j, gtoc_j, comp_j)``, the
objective and the GPU's peak: docs/deployed.md, FlexGen, "The LP".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CostModel:
    """FlexGen's cost model for one block of a TaskGraph, per FlexGen layer ``j``: its
    constants measured on the TaskGraph and the machine rather than fitted (bytes, seconds,
    bytes/s)."""

    weights: tuple[int, ...]        # W_j: the layer's weights
    cache: tuple[int, ...]          # C_j: the KV cache the layer writes
    cache_reads: tuple[int, ...]    # Cread_j: cache bytes its GPU batches read back
    hidden: tuple[int, ...]         # H_j: the hidden states the layer passes on
    hidden_in: tuple[int, ...]      # Hin_j: the hidden states the layer reads
    compute: tuple[float, ...]      # comp_j: its kernels' seconds
    tokens: int                     # the prompts' token ids, always loaded
    hidden_batch: int               # one GPU batch's hidden state, at most
    workspace: int                  # the most one step holds besides weights and hidden states
    h2d: float
    d2h: float
    gen_len: int = 1                # the tokens: the layers are the model's, once per token

    def parts(self, wg: Any, cg: Any, hg: Any) -> tuple[Any, list[tuple[Any, Any, float]]]:
        """The prologue's seconds and each layer's ``(ctog, gtoc, comp)``.

        Parameters
        ----------
        wg, cg, hg : float or PuLP expression
            The GPU's fractions of the weights, the KV cache and the hidden states: numbers
            or PuLP expressions alike.

        Returns
        -------
        tuple
            The prologue's seconds (the first layer's host weights and the token ids), and a
            list of each layer's ``(ctog, gtoc, comp)`` seconds.
        """
        W, n = self.weights, len(self.weights)
        layers = []
        for j in range(n):
            nxt = W[j + 1] if j + 1 < n else 0
            ctog = ((1 - wg) * nxt + (1 - hg) * self.hidden_in[j]
                    + (1 - cg) * self.cache_reads[j]) * (1 / self.h2d)
            gtoc = ((1 - cg) * self.cache[j] + (1 - hg) * self.hidden[j]) * (1 / self.d2h)
            layers.append((ctog, gtoc, self.compute[j]))
        return ((1 - wg) * W[0] + self.tokens) * (1 / self.h2d), layers

    def seconds(self, wg: float, cg: float, hg: float) -> float:
        """The block's time under the policy (the LP's objective at these fractions).

        Parameters
        ----------
        wg, cg, hg : float
            The GPU's fractions of the weights, the KV cache and the hidden states.

        Returns
        -------
        float
            Seconds.
        """
        prologue, layers = self.parts(wg, cg, hg)
        return float(prologue + sum(max(parts) for parts in layers))

    def moved(self, wg: float, cg: float, hg: float) -> float:
        """Seconds of host<->GPU copies under the policy, overlapped or not.

        The tie-break between policies of equal time: fewer bytes moved.

        Parameters
        ----------
        wg, cg, hg : float
            The GPU's fractions of the weights, the KV cache and the hidden states.

        Returns
        -------
        float
            Seconds.
        """
        prologue, layers = self.parts(wg, cg, hg)
        return float(prologue + sum(ctog + gtoc for ctog, gtoc, _ in layers))

    def peak(self, wg: Any, cg: Any, hg: Any) -> Any:
        """The GPU's peak bytes under the policy (FlexGen's ``gpu_home_p + gpu_w_p``).

        Parameters
        ----------
        wg, cg, hg : float or PuLP expression
            The GPU's fractions of the weights, the KV cache and the hidden states.

        Returns
        -------
        float or PuLP expression
            Bytes, of the same kind as the fractions.
        """
        W = self.weights
        pair = max([a + b for a, b in zip(W, W[1:])] or [W[0]])
        model = sum(W[:len(W) // self.gen_len])     # each weight once
        return (wg * model + cg * sum(self.cache) + hg * max(self.hidden)
                + (1 - wg) * pair + (1 - hg) * self.hidden_batch + self.workspace)


@dataclass(frozen=True)
class Solution:
    """A policy the LP found: the three GPU fractions and the cost model's seconds."""

    wg: float
    cg: float
    hg: float
    seconds: float


def solve(model: CostModel, memory: float, fixed: dict[str, float]) -> Solution | None:
    """FlexGen's LP: the fractions minimising the block's time with the peak within memory.

    Solved with PuLP's bundled CBC (imported here: planning needs it only when FlexGen
    searches).

    Parameters
    ----------
    model : CostModel
        The block's cost model.
    memory : float
        The GPU's bytes the peak must fit in.
    fixed : dict of str to float
        Fractions (``wg``, ``cg``, ``hg``) held at their value.

    Returns
    -------
    Solution or None
        The fractions ``wg``, ``cg``, ``hg`` and their seconds; None if no fractions fit.
    """
    import pulp

    from .milp import run_cbc

    prob = pulp.LpProblem("flexgen_policy", pulp.LpMinimize)
    new = getattr(prob, "add_variable", pulp.LpVariable)  # PuLP >= 3.3 wants the former
    x = {name: new(name, 0, 1) for name in ("wg", "cg", "hg")}
    for name, value in fixed.items():
        prob += x[name] == value, f"fixed_{name}"
    # in units of the all-host policy's time and of the memory, so that CBC sees
    # coefficients near 1 (its tolerances are absolute)
    tau = model.seconds(0.0, 0.0, 0.0) or 1.0
    prologue, layers = model.parts(x["wg"], x["cg"], x["hg"])
    times = [new(f"T_{j}", 0) for j in range(len(layers))]
    for j, (T, parts) in enumerate(zip(times, layers)):
        for name, part in zip(("ctog", "gtoc", "comp"), parts):
            prob += T >= part * (1 / tau), f"{name}_{j}"
    prob += model.peak(x["wg"], x["cg"], x["hg"]) * (1 / max(memory, 1.0)) <= 1, "peak"
    prob += prologue * (1 / tau) + pulp.lpSum(times)
    run_cbc(prob, mip=False)
    if prob.status != pulp.LpStatusOptimal:
        return None
    wg, cg, hg = (min(1.0, max(0.0, x[k].varValue or 0.0)) for k in ("wg", "cg", "hg"))
    return Solution(wg, cg, hg, model.seconds(wg, cg, hg))


def best(model: CostModel, memory: float, choices: Sequence[dict[str, float]]
         ) -> Solution | None:
    """The fastest of the LP's solutions under each of ``choices``, by the cost model.

    Of equal ones (to a part in 10^9), the one moving least.

    Parameters
    ----------
    model : CostModel
        The block's cost model.
    memory : float
        The GPU's bytes the peak must fit in.
    choices : sequence of dict of str to float
        The fixed fractions to solve the LP under, one solve each.

    Returns
    -------
    Solution or None
        None if none fits.
    """
    found = [s for fixed in choices if (s := solve(model, memory, fixed)) is not None]
    if not found:
        return None
    fastest = min(s.seconds for s in found) * (1 + 1e-9)
    return min((s for s in found if s.seconds <= fastest),
               key=lambda s: model.moved(s.wg, s.cg, s.hg))
