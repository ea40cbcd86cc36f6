"""Algorithm 1 of Beaumont et al. (Sec. 5, "Selection phase"): which weights to offload.

A choice ``(k, d)`` removes ``w_k`` from GPU memory between ``F_k`` and ``B_k`` (``d = 1``) or
between ``B_k`` and ``F_k`` (``d = 0``), and *covers* the operations that run while ``w_k`` is
away; choices are taken while they reduce some operation's excess memory ``E_o`` (eq. 1).  The
covered operations, the excess and when the selection stops: docs/beaumont.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.cycle import TrainingChain
from ...core.errors import PlanError

# numpy is imported where it is used: planning a TaskGraph (offloadlab plan) does not need it,
# and importing it takes 0.05 s
if TYPE_CHECKING:
    import numpy as np

Choice = tuple[int, int]


def check_fits(chain: TrainingChain, capacity: int, reserved: int = 0,
               device: str = "gpu0") -> None:
    """Raise PlanError if some operation cannot run even with every other weight offloaded.

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    capacity : int
        The GPU's memory, in bytes.
    reserved : int
        Bytes held by other iterations' batches.
    device : str
        The GPU, for the error.

    Raises
    ------
    PlanError
        ``M_o + reserved > capacity`` for some operation o.
    """
    op = chain.misfit(capacity - reserved)
    if op is not None:
        kind, i = op
        formula = "2|w_i|" if kind == "B" else "|w_i|"
        extra = f" plus {reserved} bytes held by the other iterations' batches" if reserved else ""
        raise PlanError(
            f"layer {i} does not fit on {device} even alone: {kind}{i} needs "
            f"M_{kind}{i} = {formula} + Σ_{{k<={i}}}|a^k| = "
            f"{chain.memory(kind, i)} bytes (eq. 1){extra}, but {device} has a "
            f"capacity of {capacity} bytes")


def _covers(chain: TrainingChain) -> np.ndarray:
    """Boolean ``(L, 2, 2L)``: ``[k-1, d, o]`` is whether choice ``(k, d)`` covers operation
    ``o`` (its index in :meth:`~offloadlab.core.cycle.TrainingChain.operations`)."""
    import numpy as np
    L, at = chain.L, chain.index
    cover = np.zeros((L, 2, 2 * L), dtype=bool)
    for k in range(1, L + 1):
        cover[k - 1, 1, at("F", k + 1):at("B", k + 1) + 1] = True    # F_{k+1} .. B_{k+1}
        cover[k - 1, 0, :at("F", k)] = True                           # F_1 .. F_{k-1}
        cover[k - 1, 0, at("B", k) + 1:] = True                       # B_{k-1} .. B_1
    return cover


def _excess(chain: TrainingChain, memory: int) -> np.ndarray:
    """E_o = Σ_i |w_i| + M_o - M_GPU for o in ``F_1..F_L, B_L..B_1``."""
    import numpy as np
    total = sum(chain.w)
    return np.array([total + chain.memory(kind, i) - memory for kind, i in chain.operations()],
                    dtype=float)


def greedy_selection(chain: TrainingChain, memory: int, *,
                     discount: bool = True) -> frozenset[Choice]:
    """Algorithm 1: the choices that bring every operation within ``memory``.

    While some operation exceeds ``memory``, select the choice of largest profit = benefit /
    cost, where the benefit is ``Σ_{o in _covers(k, d)} min(E_o, |w_k|)`` and the cost
    ``2|w_k|``, halved when the other choice of layer k is already selected (the
    *discount*); stop early when no choice has a benefit (see the module's note on E_o).

    Parameters
    ----------
    chain : TrainingChain
        The chain.
    memory : int
        M_GPU, the bytes the chain may use.
    discount : bool
        Halve the cost as above; off for Greedy*.

    Returns
    -------
    frozenset of (int, int)
        The (layer, d) choices.
    """
    import numpy as np
    check_fits(chain, memory)
    L = chain.L
    w = np.array(chain.w, dtype=float)
    cover = _covers(chain)
    E = _excess(chain, memory)
    selected = np.zeros((L, 2), dtype=bool)
    while E.max() > 0:
        saved = np.minimum(np.clip(E, 0, None)[None, :], w[:, None])        # (L, 2L)
        benefit = (cover * saved[:, None, :]).sum(axis=2)                    # (L, 2)
        cost = np.where(selected[:, ::-1] & discount, 1.0, 2.0) * w[:, None]
        profit = np.where(selected, -np.inf, benefit / cost)
        k0, d = np.unravel_index(int(np.argmax(profit)), profit.shape)
        if profit[k0, d] <= 0:
            break
        selected[k0, d] = True
        E[cover[k0, d]] = np.maximum(E[cover[k0, d]] - w[k0], 0)
    return frozenset((int(k) + 1, int(d)) for k, d in zip(*np.nonzero(selected)))
