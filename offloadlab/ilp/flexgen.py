"""FlexGen's cost model and its policy search by linear programming (Sheng et al., "FlexGen:
High-Throughput Generative Inference of Large Language Models with a Single GPU", ICML 2023,
Sec. 4.3; the code's ``experimental/cost_model.py``, ``solve_lp``, in
FMInference/FlexGen@19753bc).

The block's prefill runs FlexGen's layers (input embedding, decoder layers, output embedding)
one after the other; while layer ``j`` computes, the next layer's weights held on the host
come in and the KV cache and hidden states held on the host go out.  FlexGen's per-layer time
is then ``T_j = max(ctog_j, gtoc_j, comp_j)`` (its ``Tpre`` without the disk terms):

* ``ctog_j = ((1 - wg) W_{j+1} + (1 - hg) Hin_j + (1 - cg) Cread_j) / h2d``: the host part of
  the next layer's weights, the hidden states read back, the cache read back (a chunked
  prefill reads earlier row blocks' keys and values);
* ``gtoc_j = ((1 - cg) C_j + (1 - hg) H_j) / d2h``: the KV cache and the hidden states stored;
* ``comp_j``: the layer's kernels.

The objective is ``(1 - wg) W_0 / h2d + sum_j T_j`` (FlexGen's ``T = Tpre * l``, layer by
layer; the weights FlexGen keeps on the GPU are placed at start-up, which its model does not
time).  A generation of ``gen_len`` tokens repeats the layers once per token (FlexGen's
``T = Tpre * l + Tgen * (n - 1) * l``), each decode step's layer with its own constants: the
next layer's weights, the cache the step reads back (the prompt's and the tokens' so far: it
grows each step, where FlexGen's ``Tgen`` takes the cache at mid-generation) and writes, its
kernels.  The GPU's peak (``gpu_home_p + gpu_w_p``) must fit the memory: ``wg sum W + cg sum C +
hg max H`` at home, ``(1 - wg) max(W_j + W_{j+1})`` for two layers' weights in flight,
``(1 - hg)`` one GPU batch's hidden state, and the largest step's workspace.

The weights count once in the peak, whatever ``gen_len``.  ``wg``, ``cg`` and ``hg`` are
fractions (``w_gpu_percent / 100``, ...); FlexGen has no disk
here, so the rest of each is on the host.  Fixing some of them is FlexGen's ``--percent``
mode (equality constraints), the others are the LP's.
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
        """The prologue's seconds and each layer's ``(ctog, gtoc, comp)``, for fractions that
        are numbers or PuLP expressions alike."""
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
        """The block's time under the policy (the LP's objective at these fractions)."""
        prologue, layers = self.parts(wg, cg, hg)
        return float(prologue + sum(max(parts) for parts in layers))

    def moved(self, wg: float, cg: float, hg: float) -> float:
        """Seconds of host<->GPU copies under the policy, overlapped or not (the tie-break
        between policies of equal time: fewer bytes moved)."""
        prologue, layers = self.parts(wg, cg, hg)
        return float(prologue + sum(ctog + gtoc for ctog, gtoc, _ in layers))

    def peak(self, wg: Any, cg: Any, hg: Any) -> Any:
        """The GPU's peak bytes under the policy (FlexGen's ``gpu_home_p + gpu_w_p``)."""
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
    """FlexGen's LP: the fractions ``wg``, ``cg``, ``hg`` (those in ``fixed`` held at their
    value) minimising the block's time with the peak within ``memory`` bytes; None if no
    fractions fit.  Solved with PuLP's bundled CBC (imported here: planning needs it only
    when FlexGen searches)."""
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
    """The fastest of the LP's solutions under each of ``choices`` (fixed fractions), by the
    cost model, of equal ones (to a part in 10^9) the one moving least; None if none fits."""
    found = [s for fixed in choices if (s := solve(model, memory, fixed)) is not None]
    if not found:
        return None
    fastest = min(s.seconds for s in found) * (1 + 1e-9)
    return min((s for s in found if s.seconds <= fastest),
               key=lambda s: model.moved(s.wg, s.cg, s.hg))
