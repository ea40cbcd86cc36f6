"""TaskGraphs traced from PyTorch modules (``pip install ".[torch]"``; torch is imported only
when :func:`from_torch` runs).

``make_fx`` records the ATen ops a module runs on FakeTensors (no weight is materialised); each
op becomes one ``compute`` vertex (views none, dtype conversions ``cast`` vertices), weights,
buffers and inputs host-RAM ``input`` vertices, and ``train=True`` adds the loss, its gradients
and one optimizer update per trainable weight.  How ops map to vertices, how they are priced
and which ones are refused: docs/commands/import-torch.md.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..devices import HOST
from ..errors import GraphError, OffloadlabError, SpecError
from ..ops import DTYPES, FLOAT_DTYPES, GENERIC
from ..taskgraph import TaskGraph
from . import aten
from .pipeline import pipeline

if TYPE_CHECKING:
    import torch
    from torch import fx

LOSSES = ("mean", "cross_entropy")
OPTIMIZERS = {"adam": "adam_update", "sgd": "sgd_update"}
FLOAT_OF_SIZE = {2: "float16", 4: "float32", 8: "float64"}
ALIGN = 8         # vertex bytes are rounded up to a multiple of the largest item size
DEVICE = "gpu0"   # where compute runs before the pipeline placement


def from_torch(module: torch.nn.Module, inputs: torch.Tensor | Sequence[torch.Tensor], *,
               train: bool = False, gpus: int = 1, dtype: str | None = None, name: str = "",
               loss: str = "mean", target: torch.Tensor | None = None,
               optimizer: str = "adam", generic: bool = False) -> TaskGraph:
    """The TaskGraph of ``module``'s forward pass on ``inputs``, or with ``train=True`` of one
    training step (forward, ``loss``, backward, one ``optimizer`` update per weight), placed
    as a pipeline on ``gpus`` GPUs (:func:`~offloadlab.core.workloads.pipeline.pipeline`).

    The module is traced in training mode if ``train``, else in eval mode, and its modes are
    restored afterwards.

    Parameters
    ----------
    module : torch.nn.Module
        The model.
    inputs : torch.Tensor or sequence of torch.Tensor
        Its inputs; only their shapes and dtypes count (meta tensors will do).
    train : bool, default False
        Trace one training step instead of the forward pass.
    gpus : int, default 1
        The pipeline's GPUs.
    dtype : str, optional
        ``float16``, ``float32`` or ``float64``: recasts every floating-point weight, buffer and
        input.
    name : str, default ""
        The graph's name (default: the module's class name).
    loss : str, default "mean"
        ``mean`` or ``cross_entropy``, the training step's loss.
    target : torch.Tensor, optional
        The loss's target (shape and dtype only); ``cross_entropy`` needs it.
    optimizer : str, default "adam"
        ``adam`` or ``sgd``, the training step's update.
    generic : bool, default False
        Price an op the toolkit does not know from its shapes alone (``generic``).

    Returns
    -------
    TaskGraph
        The traced computation.

    Raises
    ------
    SpecError
        An unknown loss, optimizer or dtype, or ``cross_entropy`` without a target.
    GraphError
        Naming the op for what a TaskGraph cannot hold (a dtype outside
        :data:`~offloadlab.core.ops.DTYPES`, an op that returns a number, an in-place write into
        part of a tensor), and naming the node for an op the toolkit does not know, unless
        ``generic``.
    """
    if loss not in LOSSES:
        raise SpecError(f"from_torch: unknown loss {loss!r}; known: {', '.join(LOSSES)}")
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"from_torch: unknown optimizer {optimizer!r}; known: "
                        f"{', '.join(OPTIMIZERS)}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise SpecError(f"from_torch: dtype must be one of {', '.join(FLOAT_DTYPES)}, got "
                        f"{dtype!r}")
    if train and loss == "cross_entropy" and target is None:
        raise SpecError("from_torch: loss='cross_entropy' needs a target")
    import torch
    name = name or type(module).__name__
    data = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    traced = _trace(module, data, target if train else None, train, dtype, loss, name)
    meta: dict[str, Any] = dict(source="torch", torch=str(torch.__version__),
                                mode="train" if train else "infer", gpus=gpus)
    if train:
        meta.update(loss=loss, optimizer=optimizer)
    graph = _Converter(traced, TaskGraph(name=name, meta=meta), OPTIMIZERS[optimizer],
                       generic).run()
    return pipeline(graph, gpus)


@dataclass
class _Traced:
    """A traced forward pass or training step: its FX graph of ATen ops, the vertex id of
    each placeholder, and in a training step the weights whose gradient each node is."""

    gm: fx.GraphModule
    names: list[str]
    grads: dict[fx.Node, list[str]]
    state: frozenset[str] = frozenset()     # the placeholders that are parameters or buffers


def _trace(module: torch.nn.Module, data: list[torch.Tensor], target: torch.Tensor | None,
           train: bool, dtype: str | None, loss: str, name: str) -> _Traced:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode(allow_non_fake_inputs=True)   # a plain tensor attribute: a constant
    cast = getattr(torch, dtype) if dtype is not None else None

    def fake(t: torch.Tensor, grad: bool = False) -> torch.Tensor:
        floating = t.is_floating_point()
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=cast if cast and floating
                                       else t.dtype, requires_grad=grad and floating)

    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    state = [*params, *buffers]
    trainable = [k for k, p in params.items() if train and p.requires_grad]
    names = [*state, *(f"input{i}" if len(data) > 1 else "input" for i in range(len(data)))]
    tensors = [*(fake(p, k in trainable) for k, p in params.items()),
               *map(fake, buffers.values()), *map(fake, data)]
    if target is not None:
        names.append("target")
        tensors.append(fake(target))

    def step(*args: torch.Tensor) -> Any:
        weights = dict(zip(state, args))
        out = torch.func.functional_call(module, weights, tuple(args[len(state):][:len(data)]))
        if not train:
            return out
        value = _loss(out, loss, args[-1] if target is not None else None)
        return value, torch.autograd.grad(value, [weights[k] for k in trainable],
                                          allow_unused=True)

    modes = {m: m.training for m in module.modules()}
    module.train(train)
    # A failing op is logged there with its traceback, then raised: say it once, below.
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, quiet.disabled = quiet.disabled, True
    try:
        gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)
    except OffloadlabError:
        raise
    except Exception as exc:        # torch raises many kinds; its message says what failed
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise GraphError(f"cannot trace {name}: {type(exc).__name__}: {first}") from exc
    finally:
        quiet.disabled = was_disabled
        for m, training in modes.items():
            m.training = training
    gm.graph.eliminate_dead_code()
    grads: dict[fx.Node, list[str]] = {}
    if train:
        output = next(n for n in gm.graph.nodes if n.op == "output")
        for weight, node in zip(trainable, output.args[0][1]):
            if node is not None:
                grads.setdefault(node, []).append(weight)
    return _Traced(gm, names, grads, frozenset(state))


def _loss(out: Any, loss: str, target: torch.Tensor | None) -> torch.Tensor:
    import torch
    if not isinstance(out, torch.Tensor):
        raise SpecError(f"from_torch: train=True needs a module returning one tensor, got "
                        f"{type(out).__name__}")
    if loss == "mean":
        return out.mean()
    assert target is not None
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


@dataclass
class _Ref:
    """What an FX node's tensor is in the TaskGraph: a view of the latest version of the
    storage first written by vertex ``base``; ``val`` is the node's FakeTensor."""

    base: str
    val: Any


class _Converter:
    """Walks a traced FX graph in order, adding vertices to ``graph`` (all compute on
    :data:`DEVICE`)."""

    def __init__(self, traced: _Traced, graph: TaskGraph, update_op: str, generic: bool):
        self.traced, self.g, self.update_op, self.generic = traced, graph, update_op, generic
        self.refs: dict[fx.Node, Any] = {}          # node -> _Ref, or a list of them
        self.current: dict[str, str] = {}           # base -> vertex holding its latest version
        self.holds: dict[str, Any] = {}             # vertex -> its one tensor (None: several)
        self.unread: dict[str, Any] = {}            # input vertices not added yet -> FakeTensor

    def run(self) -> TaskGraph:
        placeholders = iter(self.traced.names)
        output = next(n for n in self.traced.gm.graph.nodes if n.op == "output")
        loss = output.args[0][0] if self.traced.grads else None
        for node in self.traced.gm.graph.nodes:
            if node.op == "placeholder":
                self._input(node, next(placeholders))
            elif node.op == "get_attr":
                self._input(node, str(node.target))
            elif node.op == "call_function" and node.target is operator.getitem:
                self.refs[node] = self.refs[node.args[0]][node.args[1]]
            elif node.op == "call_function" and aten.is_view(node.target):
                base = self.refs[aten.tensor_args(node)[0]].base
                self.refs[node] = _alias(base, node.meta["val"])
            elif node.op == "call_function":
                self._compute(node)
            elif node.op != "output":
                raise GraphError(f"{self.g.name}: unsupported FX node {node.format_node()}")
            for weight in self.traced.grads.get(node, ()):
                self._update(weight, node)
            if node is loss:        # the forward pass ends: pipeline() cuts stages over it
                self.g.meta["forward"] = sum(t.kind == "compute" for t in self.g)
        return self.g

    def _input(self, node: fx.Node, name: str) -> None:
        val = node.meta.get("val")
        if val is None:
            raise GraphError(f"{self.g.name}: no tensor recorded for {node.format_node()}")
        _dtype_name(val, f"input {name!r}")
        self.refs[node] = _Ref(name, val)
        if name in self.current:
            return                                      # a constant referenced again
        self.current[name] = name
        self.holds[name] = val
        self.unread[name] = val

    def _read(self, node: fx.Node) -> tuple[str, bool]:
        """The vertex a node's tensor lives in, and whether that vertex holds exactly this
        tensor (same shape, dtype and element order)."""
        ref = self.refs[node]
        vertex = self._vertex(ref.base)
        held = self.holds[vertex]
        return vertex, held is not None and _same_tensor(ref.val, held)

    def _vertex(self, base: str) -> str:
        """The vertex holding ``base``'s latest version; an input vertex is added at its
        first read."""
        vertex = self.current[base]
        val = self.unread.pop(vertex, None)
        if val is not None:     # a get_attr constant is part of the model, like a buffer
            self.g.add_input(vertex, _nbytes([val]), home=HOST, shape=tuple(val.shape),
                             dtype=_dtype_name(val, f"input {vertex!r}"),
                             category="weights" if vertex in self.traced.state or vertex
                             not in self.traced.names else "activations")
        return vertex

    def _copied(self, node: fx.Node) -> tuple[str, Any]:
        """The vertex a ``_to_copy`` reads, and the tensor it holds if the copy reads that
        tensor's elements in order (whatever its shape), else None."""
        ref = self.refs[aten.tensor_args(node)[0]]
        vertex = self._vertex(ref.base)
        held = self.holds[vertex]
        return vertex, held if held is not None and _in_order(ref.val, held) else None

    def _copy_of_same(self, node: fx.Node) -> bool:
        """Whether ``node`` is a ``_to_copy`` changing neither dtype nor element order; then
        its readers read the vertex of the tensor it copies, under a version of their own."""
        if aten.packet_name(node) != aten.CAST:
            return False
        vertex, held = self._copied(node)
        val = node.meta["val"]
        if held is None or val.dtype != held.dtype or not val.is_contiguous():
            return False
        self.refs[node] = _Ref(node.name, val)
        self.current[node.name] = vertex
        return True

    def _cast(self, node: fx.Node, out: Any) -> tuple[str, list[str]] | None:
        """``cast`` if ``node`` converts, between floats, a tensor its input vertex holds
        and reads it in order into ``out``, else None."""
        vertex, held = self._copied(node)
        ok = held is not None and _float(held) and out.is_contiguous()
        return ("cast", [vertex]) if ok else None

    def _compute(self, node: fx.Node) -> None:
        if self._copy_of_same(node):
            return
        val = node.meta.get("val")
        outputs = aten.outputs(node, val)
        if outputs is None:
            return                                       # an op returning nothing (an assert)
        known = aten.known(aten.packet_name(node))
        if not known and not self.generic:
            raise GraphError(f"{self.g.name}: node {node.name!r}: ATen op {node.target} is not "
                             f"one the toolkit knows (--generic prices it from its shapes "
                             f"alone, and the executor then refuses the graph)")
        args = aten.tensor_args(node)
        reads = {a: self._read(a) for a in args}
        written = aten.written(node)
        for a in written:
            if not reads[a][1]:
                raise GraphError(f"{self.g.name}: op {node.target} writes in place into part "
                                 f"of tensor {reads[a][0]!r}, which a TaskGraph cannot hold")
        aliased = aten.returns_written(node)               # ``add_`` returns the ``self`` it wrote
        tensors = [self.refs[a].val for a in written]
        if not aliased:
            tensors[:0] = [t for t in outputs if t is not None]
        for t in tensors:
            _dtype_name(t, f"op {node.target}")
        single = tensors[0] if len(tensors) == 1 else None
        shape, dtype = None, "float32"                  # several tensors: flat, their bytes
        if single is not None:
            shape, dtype = tuple(single.shape), _dtype_name(single, f"op {node.target}")
            if dtype not in FLOAT_DTYPES:               # ``mix`` writes floats
                dtype = FLOAT_OF_SIZE.get(DTYPES[dtype], "float32")
                shape = shape if DTYPES[dtype] == single.element_size() else None
                single = None                           # the vertex is not this tensor
        found = None
        if single is not None and known:
            found = self._cast(node, single) if aten.packet_name(node) == aten.CAST else \
                aten.kernel_op(node, single, reads)
        op, inputs = found or ("mix" if known else f"{GENERIC}:{node.target}",
                               list(dict.fromkeys(v for v, _ in reads.values())))
        if op == "mix" and single is not None and not written:
            single = aten.read_as(node, single)
            shape = tuple(single.shape)
        flops = aten.flops(node, val) if known else float(sum(t.numel() for t in tensors))
        self.g.add_compute(node.name, op, inputs, DEVICE, _nbytes(tensors), flops=flops,
                           shape=shape, dtype=dtype, category=self._category(node, written))
        self.holds[node.name] = single
        self.current[node.name] = node.name
        for a in written:
            self.current[self.refs[a].base] = node.name
        if aliased:
            self.refs[node] = _Ref(self.refs[written[0]].base, val)
        elif isinstance(val, (tuple, list)):
            self.refs[node] = [None if t is None else _Ref(node.name, t) for t in outputs]
        else:
            self.refs[node] = _Ref(node.name, val)

    def _category(self, node: fx.Node, written: list[fx.Node]) -> str:
        """A vertex writing a new version of a parameter or buffer (a BatchNorm's running
        statistics) holds weights; else the forward pass's vertices hold activations and the
        backward pass's (after the loss: ``meta["forward"]`` is set) gradients."""
        if any(self.refs[a].base in self.traced.state for a in written):
            return "weights"
        return "gradients" if "forward" in self.g.meta else "activations"

    def _update(self, weight: str, grad: fx.Node) -> None:
        """One optimizer step on ``weight`` from ``grad``, just after the gradient is done."""
        w = self.holds[weight]
        self._vertex(weight)
        vertex, exact = self._read(grad)
        self.g.add_compute(f"{weight}@updated", self.update_op if exact else "mix",
                           [weight, vertex], DEVICE, _nbytes([w]), flops=float(w.numel()),
                           shape=tuple(w.shape), dtype=_dtype_name(w, f"weight {weight!r}"),
                           category="weights")


def _alias(base: str, val: Any) -> Any:
    if isinstance(val, (tuple, list)):
        return [_Ref(base, v) for v in val]
    return _Ref(base, val)


# -- tensors -------------------------------------------------------------------------------
def _nbytes(tensors: Sequence[Any]) -> int:
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def _dtype_name(t: Any, what: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise GraphError(f"{what}: dtype {name} is not one a TaskGraph holds "
                         f"({', '.join(DTYPES)})")
    return name


def _float(t: Any) -> bool:
    return str(t.dtype).removeprefix("torch.") in FLOAT_DTYPES


def _same_tensor(t: Any, held: Any) -> bool:
    """Whether ``t`` is ``held`` or a view of it with its shape, dtype and element order."""
    return t is held or (t.shape == held.shape and _in_order(t, held))


def _in_order(t: Any, held: Any) -> bool:
    """Whether ``t`` is a view of all of ``held`` with its dtype and element order, of any
    shape (``[B*T, D]`` seen as ``[B, T, D]``)."""
    return t is held or (t.dtype == held.dtype and t.numel() == held.numel()
                         and t.is_contiguous() and held.is_contiguous()
                         and t.storage_offset() == held.storage_offset())
