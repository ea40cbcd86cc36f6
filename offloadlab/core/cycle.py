"""One training iteration of a layer chain (Beaumont et al., Sec. 3): the typed object that the
workload builder, Algorithm 1 (selection), Algorithm 2 and L2L (schedules), their MemGraph
emitter and the MILP (Sec. 6) share.

:class:`TrainingChain` owns the numbering of the operations, the memory model (eq. 1) and its
fit check, the offsets of the activation stack and the names of the vertices of the unrolled
TaskGraph, which :meth:`TrainingChain.to_taskgraph` builds and the MemGraph emitter reads.  The
TaskGraph carries the chain as ``graph.meta["chain"]`` (:meth:`TrainingChain.to_dict`), read
back in one place, :meth:`TrainingChain.from_taskgraph`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .checks import number
from .errors import PlanError, SpecError
from .taskgraph import TaskGraph

Op = tuple[str, int]
"""An operation: ``("F", i)`` is F_i, ``("B", i)`` is B_i (layers from 1)."""

_FIELDS = ("uF", "uB", "w", "a", "a0", "name")


@dataclass(frozen=True)
class TrainingChain:
    """An L-layer chain and its training iteration; index 0 of each tuple is layer 1.

    Layer i takes ``uF[i-1]``, ``uB[i-1]`` seconds forward and backward (u_{F_i}, u_{B_i}),
    has weights w_i of ``w[i-1]`` bytes and an activation a^i of ``a[i-1]`` bytes; ``a0`` is
    |a^0|, the batch.  The update of w_i happens inside B_i, as the paper proposes.
    """

    uF: tuple[float, ...]
    uB: tuple[float, ...]
    w: tuple[int, ...]
    a: tuple[int, ...]
    a0: int = 0
    name: str = "training-chain"

    def __post_init__(self) -> None:
        if type(self.name) is not str:
            raise SpecError(f"training chain: name must be a string, got {self.name!r}")
        for key in ("uF", "uB", "w", "a"):
            if type(getattr(self, key)) is not tuple:
                raise SpecError(f"{self.name}: {key} must be a list of per-layer values, got "
                                f"{getattr(self, key)!r}")
        n = len(self.uF)
        if n == 0 or not len(self.uB) == len(self.w) == len(self.a) == n:
            raise SpecError(f"{self.name}: uF, uB, w and a need one value per layer "
                            f"(got {len(self.uF)}, {len(self.uB)}, {len(self.w)}, {len(self.a)})")
        for key, times in (("uF", self.uF), ("uB", self.uB)):
            for i, x in enumerate(times, 1):
                number(x, self.name, f"{key} of layer {i}", error=SpecError)
        for key, sizes in (("w", self.w), ("a", self.a)):
            for i, s in enumerate(sizes, 1):
                if not (isinstance(s, int) and not isinstance(s, bool) and s > 0):
                    raise SpecError(f"{self.name}: {key} of layer {i} must be > 0 bytes, got {s!r}")
        number(self.a0, self.name, "a0", count=True, error=SpecError)

    @property
    def L(self) -> int:
        return len(self.uF)

    @property
    def sum_u(self) -> float:
        """Σu: the iteration time with no idle time, a trivial lower bound."""
        return sum(self.uF) + sum(self.uB)

    # -- the operations ---------------------------------------------------------------------
    def operations(self) -> list[Op]:
        """One iteration, ``F_1..F_L, B_L..B_1``: Algorithm 1's operations o (Sec. 5).

        Returns
        -------
        list of (str, int)
            The operations in order.
        """
        return [("F", i) for i in range(1, self.L + 1)] + [("B", i) for i in range(self.L, 0, -1)]

    def index(self, kind: str, i: int) -> int:
        """Where ``kind_i`` is in :meth:`operations`.

        Parameters
        ----------
        kind : str
            ``"F"`` (forward) or ``"B"`` (backward).
        i : int
            The layer, from 1 (also 0 or L + 1, the ends of a range).

        Returns
        -------
        int
            F_i at i - 1, B_i at 2L - i.
        """
        return i - 1 if kind == "F" else 2 * self.L - i

    def cycle(self) -> list[Op]:
        """The steady-state cycle ``B_L..B_1, F_1..F_L`` of Algorithm 2 and the MILP (Sec. 5-6).

        B of iteration t, F of iteration t + 1.

        Returns
        -------
        list of (str, int)
            The operations in order.
        """
        return [("B", i) for i in range(self.L, 0, -1)] + [("F", i) for i in range(1, self.L + 1)]

    def position(self, kind: str, i: int) -> int:
        """Where ``kind_i`` is in :meth:`cycle`.

        Parameters
        ----------
        kind : str
            ``"F"`` (forward) or ``"B"`` (backward).
        i : int
            The layer, from 1.

        Returns
        -------
        int
            B_i at L - i, F_i at L + i - 1.
        """
        return self.L - i if kind == "B" else self.L + i - 1

    def duration(self, kind: str, i: int) -> float:
        """u_o: the time of F_i or B_i.

        Parameters
        ----------
        kind : str
            ``"F"`` (forward) or ``"B"`` (backward).
        i : int
            The layer, from 1.

        Returns
        -------
        float
            Seconds.
        """
        return self.uB[i - 1] if kind == "B" else self.uF[i - 1]

    # -- memory (eq. 1) -----------------------------------------------------------------------
    @property
    def batch(self) -> int:
        """The bytes the unrolled TaskGraph gives a^0 and δ^0: |a^0|, or one float32 element
        where the model has 0 (a tensor must exist; 4 bytes keep what follows it aligned)."""
        return max(self.a0, 4)

    def activations_upto(self, i: int) -> int:
        """Σ_{k<=i} |a^k|, k from 0.

        Parameters
        ----------
        i : int
            The last layer counted.

        Returns
        -------
        int
            Bytes.
        """
        return self.a0 + sum(self.a[:i])

    def memory_forward(self, i: int) -> int:
        """M_{F_i} = |w_i| + Σ_{k<=i} |a^k|  (eq. 1).

        Parameters
        ----------
        i : int
            The layer, from 1.

        Returns
        -------
        int
            Bytes.
        """
        return self.w[i - 1] + self.activations_upto(i)

    def memory_backward(self, i: int) -> int:
        """M_{B_i} = 2|w_i| + Σ_{k<=i} |a^k|  (eq. 1: weight, gradient, activations).

        Parameters
        ----------
        i : int
            The layer, from 1.

        Returns
        -------
        int
            Bytes.
        """
        return 2 * self.w[i - 1] + self.activations_upto(i)

    def memory(self, kind: str, i: int) -> int:
        """M_o of eq. (1) for o = ``kind_i``.

        Parameters
        ----------
        kind : str
            ``"F"`` (forward) or ``"B"`` (backward).
        i : int
            The layer, from 1.

        Returns
        -------
        int
            Bytes.
        """
        return self.memory_backward(i) if kind == "B" else self.memory_forward(i)

    def misfit(self, capacity: int) -> Op | None:
        """The fit check: the first operation that cannot run even with every other weight away.

        Parameters
        ----------
        capacity : int
            The GPU's memory, in bytes.

        Returns
        -------
        (str, int) or None
            The first operation of :meth:`operations` with M_o > ``capacity``, or None.
        """
        return next((op for op in self.operations() if self.memory(*op) > capacity), None)

    # -- the activation stack (Sec. 3) ----------------------------------------------------
    def stack(self, base: int) -> list[int]:
        """``S_0..S_L``, the offsets of the activation stack (Sec. 3).

        Slot i (a^i from F_i, then δ^i until B_i) is ``[S_{i-1}, S_i)``.

        Parameters
        ----------
        base : int
            Bytes below the stack: eq. 1's |a^0| and other iterations' batches.

        Returns
        -------
        list of int
            L + 1 offsets in bytes.
        """
        offsets = [base]
        for size in self.a:
            offsets.append(offsets[-1] + size)
        return offsets

    def stack_tops(self, base: int) -> list[int]:
        """The stack top while each operation of :meth:`cycle` runs.

        ``S_i`` for F_i, ``S_i + |w_i|`` for B_i (its weight gradient on top), i.e. eq. (1)'s
        M_o - |w_i| above the ``base - |a^0|`` bytes held besides.

        Parameters
        ----------
        base : int
            Bytes below the stack, as for :meth:`stack`.

        Returns
        -------
        list of int
            One offset in bytes per operation of :meth:`cycle`.
        """
        S = self.stack(base)
        return [S[i] + (self.w[i - 1] if kind == "B" else 0) for kind, i in self.cycle()]

    # -- the unrolled TaskGraph's vertices ----------------------------------------------------
    @staticmethod
    def vertex(kind: str, i: int, t: int) -> str:
        """The name of a vertex of iteration t of the unrolled TaskGraph.

        Parameters
        ----------
        kind : str
            ``F`` (F_i, writes a^i), ``G`` (dw_i), ``B`` (δ^{i-1}), ``w`` (w_i after t's update;
            t = 0: the initial weights, on the host) or ``a`` with i = 0 (the batch a^0).
        i : int
            The layer, from 1 (0 for the batch).
        t : int
            The iteration, from 1 (0 for the initial weights).

        Returns
        -------
        str
            ``"{kind}{i}@{t}"``.
        """
        return f"{kind}{i}@{t}"

    def activation(self, i: int, t: int) -> str:
        """The vertex holding a^i in iteration t: the batch for i = 0, else F_i.

        Parameters
        ----------
        i : int
            The layer, from 0.
        t : int
            The iteration, from 1.

        Returns
        -------
        str
            The vertex's name.
        """
        return self.vertex("a", 0, t) if i == 0 else self.vertex("F", i, t)

    def delta(self, i: int, t: int) -> str:
        """The vertex holding δ^i in iteration t: F_L for i = L (the loss is free), else B_{i+1}.

        Parameters
        ----------
        i : int
            The layer, from 1.
        t : int
            The iteration, from 1.

        Returns
        -------
        str
            The vertex's name.
        """
        return self.vertex("F", i, t) if i == self.L else self.vertex("B", i + 1, t)

    def to_taskgraph(self, iterations: int = 3, gpu: str = "gpu0") -> TaskGraph:
        """Unroll ``iterations`` iterations on one GPU, the chain in ``graph.meta["chain"]``.

        Iteration t: F_i reads a^{i-1} and w_i of iteration t - 1; B_i is three vertices in
        the paper's order: G_i (dw_i from a^{i-1} and δ^i), B_i (δ^{i-1} from δ^i and w_i)
        and the update w_i (adam_update of w_i with dw_i), taking ``uB/2``, ``uB/2`` and 0
        seconds.  The initial weights (w_i of iteration 0) live in host RAM, each batch on
        the GPU.  Categories: w_i weights, the batch and F_i activations, G_i and B_i
        gradients.

        Parameters
        ----------
        iterations : int
            How many iterations to unroll.
        gpu : str
            The GPU they run on.

        Returns
        -------
        TaskGraph
            ``unrolled_size(iterations)`` vertices.

        Raises
        ------
        SpecError
            ``iterations`` is not positive.
        """
        if iterations <= 0:
            raise SpecError(f"{self.name}: iterations must be positive, got {iterations}")
        v = self.vertex
        g = TaskGraph(name=self.name, meta={"chain": self.to_dict(), "iterations": iterations})
        for i in range(1, self.L + 1):
            g.add_input(v("w", i, 0), self.w[i - 1], category="weights")
        for t in range(1, iterations + 1):
            g.add_input(self.activation(0, t), self.batch, home=gpu, category="activations")
            for i in range(1, self.L + 1):
                g.add_compute(v("F", i, t), "layer_forward",
                              [self.activation(i - 1, t), v("w", i, t - 1)], gpu, self.a[i - 1],
                              time=self.uF[i - 1], category="activations")
            for i in range(self.L, 0, -1):
                delta, half = self.delta(i, t), self.uB[i - 1] / 2
                g.add_compute(v("G", i, t), "weight_grad", [self.activation(i - 1, t), delta],
                              gpu, self.w[i - 1], time=half, category="gradients")
                g.add_compute(v("B", i, t), "layer_backward", [delta, v("w", i, t - 1)], gpu,
                              max(self.a[i - 2], 1) if i > 1 else self.batch, time=half,
                              category="gradients")
                g.add_compute(v("w", i, t), "adam_update", [v("w", i, t - 1), v("G", i, t)],
                              gpu, self.w[i - 1], time=0.0, category="weights")
        return g

    def unrolled_size(self, iterations: int) -> int:
        """Vertices of ``iterations`` unrolled iterations.

        The initial weights, then per iteration the batch and F_i, G_i, B_i and the update w_i
        of each layer.

        Parameters
        ----------
        iterations : int
            How many iterations.

        Returns
        -------
        int
            The vertex count of :meth:`to_taskgraph`'s graph.
        """
        return self.L + iterations * (1 + 4 * self.L)

    # -- the serialised form, ``graph.meta["chain"]`` -------------------------------------
    def to_dict(self) -> dict:
        """The chain as ``graph.meta["chain"]`` holds it: its fields, tuples as lists.

        Returns
        -------
        dict
            JSON-ready; :meth:`from_dict` reads it back.
        """
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> TrainingChain:
        """Read :meth:`to_dict`'s output (a training TaskGraph's ``graph.meta["chain"]``).

        Parameters
        ----------
        data : dict
            ``uF``, ``uB``, ``w``, ``a`` and optionally ``a0`` and ``name``.

        Returns
        -------
        TrainingChain

        Raises
        ------
        SpecError
            ``data`` is not an object, lacks or adds a field, or holds a bad value.
        """
        if type(data) is not dict:
            raise SpecError(f"a training chain is a JSON object of {', '.join(_FIELDS)}, "
                            f"got {data!r:.80}")
        unknown = sorted(set(data) - set(_FIELDS))
        missing = [k for k in ("uF", "uB", "w", "a") if k not in data]
        if unknown or missing:
            problems = ([f"unknown field(s) {', '.join(map(str, unknown))}"] if unknown else []) \
                + ([f"missing {', '.join(missing)}"] if missing else [])
            raise SpecError(f"training chain: {'; '.join(problems)}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in data.items()}
        return cls(**values)

    @classmethod
    def from_taskgraph(cls, graph: TaskGraph) -> TrainingChain:
        """The chain a training TaskGraph was unrolled from.

        Parameters
        ----------
        graph : TaskGraph
            A training workload (``training-chain``, ``gpt2-train``, ``bert-train``).

        Returns
        -------
        TrainingChain

        Raises
        ------
        PlanError
            ``graph`` carries no ``meta["chain"]``.
        SpecError
            Its chain is malformed.
        """
        if "chain" not in graph.meta:
            raise PlanError(f"TaskGraph {graph.name!r} is not a training workload (no "
                            f"meta['chain']); use training-chain, gpt2-train or bert-train")
        return cls.from_dict(graph.meta["chain"])
