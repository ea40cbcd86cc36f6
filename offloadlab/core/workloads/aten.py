"""What the TaskGraph tracer (:mod:`.from_torch`) knows of ATen ops and their FX nodes: the
ops it prices by rules of its own, their flops from shapes, the executor kernel that computes
exactly what an op does, and what a node reads, writes, aliases and returns.  torch is
imported only inside the functions, when a module is traced."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import GraphError

if TYPE_CHECKING:
    from torch import fx

NO_COPY = ("_unsafe_view",)   # not views by their schema, but they move no bytes
MATMULS = ("mm", "bmm", "addmm", "baddbmm")
CONVOLUTIONS = ("convolution", "convolution_backward")
CAST = "_to_copy"   # x.half(), x.to(dtype), autocast: aten.to and type_as dispatch to it
PER_ELEMENT = frozenset((
    # arithmetic, comparisons and selection (an in-place ``add_`` is ``add``)
    "add", "sub", "rsub", "mul", "div", "neg", "pow", "sqrt", "rsqrt", "exp", "log", "abs",
    "reciprocal", "sin", "cos", "erf", "sign", "clamp", "clamp_min", "clamp_max", "maximum",
    "minimum", "where", "masked_fill", "addcmul", "addcdiv", "lerp", "eq", "ne", "lt", "le",
    "gt", "ge", "logical_not", "logical_and", "logical_or", "bitwise_not", "bitwise_and",
    "bitwise_or", "fill", "zero", "copy",
    # activations and their gradients
    "relu", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "leaky_relu", "elu", "threshold",
    "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward",
    "tanh_backward", "hardtanh_backward", "leaky_relu_backward", "elu_backward",
    # softmax, normalizations, dropout, losses
    "_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
    "native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
    "native_group_norm", "native_group_norm_backward", "native_dropout",
    "native_dropout_backward", "nll_loss_forward", "nll_loss_backward", "mse_loss",
    "mse_loss_backward",
    # reductions
    "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "argmax", "argmin",
    "all", "any",
    # copies, gathers, scatters and new tensors
    "clone", "cat", "stack", "constant_pad_nd", "repeat", "flip", "roll", "triu", "tril",
    "embedding", "embedding_dense_backward", "index_select", "gather", "index", "scatter",
    "scatter_add", "index_add", "index_put", "select_backward", "slice_backward", "arange",
    "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "new_zeros", "new_ones", "new_full", "new_empty", "empty_strided", "scalar_tensor",
    # pooling
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
    "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
))
"""The ATen ops (overload packets, an in-place ``op_`` as ``op``) priced by the largest
input's or output's element count: with :data:`MATMULS`, :data:`CONVOLUTIONS`, fused attention
and :data:`CAST`, the ops the toolkit knows."""


def kernel_op(node: fx.Node, out: Any, reads: dict[fx.Node, tuple[str, bool]]
              ) -> tuple[str, list[str]] | None:
    """The executor op computing exactly what ATen ``node`` does, with its input vertices in
    argument order, or None (then the vertex is ``mix``).

    Parameters
    ----------
    node : torch.fx.Node
        A ``call_function`` node of an ATen op.
    out : torch.Tensor
        The node's one (floating-point) output.
    reads : dict
        The vertex of each tensor argument and whether it holds exactly that tensor.

    Returns
    -------
    tuple of (str, list of str) or None
        The op and its input vertices; None where no op of the toolkit computes it exactly.
    """
    import torch
    name = packet_name(node)
    args: Any = node.args
    kwargs: Any = node.kwargs
    shape = tuple(out.shape)

    def exact(*nodes: Any, fits: Any = lambda s: tuple(s) == shape) -> list[str] | None:
        """The vertices of ``nodes`` if each holds exactly its tensor, of ``out``'s dtype and
        of a shape that ``fits``."""
        for n in nodes:
            if not (isinstance(n, torch.fx.Node) and reads[n][1]
                    and n.meta["val"].dtype == out.dtype and fits(n.meta["val"].shape)):
                return None
        return [reads[n][0] for n in nodes]

    unary = {"relu": "relu", "silu": "silu", "clone": "copy"}
    if name in unary and len(args) == 1:
        ins = exact(args[0])
        return (unary[name], ins) if ins else None
    if name == "gelu" and len(args) == 1 and kwargs.get("approximate") == "tanh":
        ins = exact(args[0])
        return ("gelu", ins) if ins else None
    if name == "_softmax" and shape and args[1] % len(shape) == len(shape) - 1 and not args[2]:
        ins = exact(args[0])
        return ("softmax", ins) if ins else None
    if name == "mul" and len(args) == 2 and not kwargs:
        ins = exact(*args)
        return ("mul", ins) if ins else None
    if name == "add" and len(args) == 2 and kwargs.get("alpha", 1) == 1:
        ins = exact(*args, fits=lambda s: _tiles(s, shape))
        return ("add", ins) if ins else None
    if name == "mm":
        ins = exact(*args, fits=lambda s: True)
        return ("matmul", ins) if ins else None
    return None


def packet_name(node: fx.Node) -> str:
    """The ATen op of a ``call_function`` node, without its overload (``add`` for
    ``aten.add.Tensor``).

    Parameters
    ----------
    node : torch.fx.Node
        A ``call_function`` node.

    Returns
    -------
    str
        The overload packet's name.
    """
    return node.target._overloadpacket.__name__      # type: ignore[union-attr]


def known(name: str) -> bool:
    """Whether the toolkit prices ATen op ``name`` by a rule of its own (module docstring).

    Parameters
    ----------
    name : str
        An overload packet's name (:func:`packet_name`).

    Returns
    -------
    bool
        It has a rule; otherwise it is ``generic``.
    """
    return name in MATMULS or name in CONVOLUTIONS or name == CAST or attention(name) \
        or name.removesuffix("_") in PER_ELEMENT


def attention(name: str) -> bool:
    """Fused attention, forward or backward (``_scaled_dot_product_flash_attention``...).

    Parameters
    ----------
    name : str
        An overload packet's name.

    Returns
    -------
    bool
        It is fused attention.
    """
    return name.startswith("_scaled_dot_product") and "attention" in name


# -- FX nodes ------------------------------------------------------------------------------
def is_view(target: Any) -> bool:
    """An op whose outputs alias its input without writing it (``view``, ``t``, ``split``,
    ``alias``, ...), or one that moves no bytes though its schema says otherwise.

    Parameters
    ----------
    target : object
        An FX node's target.

    Returns
    -------
    bool
        It copies nothing.
    """
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    if target._overloadpacket.__name__ in NO_COPY:
        return True
    returns = [r.alias_info for r in schema.returns]
    return bool(returns) and all(a is not None and not a.is_write for a in returns)


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The FX nodes among a node's arguments, in order (a repeated one once).

    Parameters
    ----------
    node : torch.fx.Node
        Any node of the traced graph.

    Returns
    -------
    list of torch.fx.Node
        Its tensor arguments, positional and keyword.
    """
    import torch
    leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
    return list(dict.fromkeys(a for a in leaves if isinstance(a, torch.fx.Node)))


def written(node: fx.Node) -> list[fx.Node]:
    """The arguments an op writes in place, by its schema (``self`` of ``add_``).

    Parameters
    ----------
    node : torch.fx.Node
        A node of an ATen op.

    Returns
    -------
    list of torch.fx.Node
        The arguments written.
    """
    import torch
    schema = node.target._schema                    # type: ignore[union-attr]
    bound = dict(zip((a.name for a in schema.arguments), node.args)) | dict(node.kwargs)
    return [bound[a.name] for a in schema.arguments
            if a.alias_info is not None and a.alias_info.is_write
            and isinstance(bound.get(a.name), torch.fx.Node)]


def read_as(node: fx.Node, val: Any) -> Any:
    """The tensor every reader of ``node`` sees if they all read it through one reshape
    keeping its element order, else ``val``.

    Such as the ``[B*T, D]`` output of ``addmm`` viewed as ``[B, T, D]``, or a bias gradient
    ``[1, D]`` viewed as ``[D]``: the shape a ``mix`` vertex, which writes any shape, is best
    recorded with, so that its readers can use real ops.

    Parameters
    ----------
    node : torch.fx.Node
        The node.
    val : torch.Tensor
        Its output.

    Returns
    -------
    torch.Tensor
        The view its readers share, or ``val``.
    """
    seen: list[Any] = [u.meta.get("val") for u in node.users if is_view(u.target)]
    if len(seen) != len(node.users) or not seen:
        return val
    first = seen[0]
    if val.is_contiguous() and all(
            type(t) is type(val) and t.shape == first.shape and t.is_contiguous()
            and t.numel() == val.numel() and t.storage_offset() == val.storage_offset()
            for t in seen):
        return first
    return val


def returns_written(node: fx.Node) -> bool:
    """Whether an op returns an argument it wrote in place (``add_``).

    Parameters
    ----------
    node : torch.fx.Node
        An ATen op's node, whose schema says what it returns.

    Returns
    -------
    bool
        It returns what it wrote.
    """
    return any(r.alias_info is not None and r.alias_info.is_write
               for r in node.target._schema.returns)           # type: ignore[union-attr]


def outputs(node: fx.Node, val: Any) -> list[Any] | None:
    """The tensors an op makes that are used (None at an unused output's index), or None
    for an op returning nothing.

    Parameters
    ----------
    node : torch.fx.Node
        The op's node.
    val : object
        What it returns (its ``meta["val"]``).

    Returns
    -------
    list or None
        The tensors, None where unused; None if it returns nothing.

    Raises
    ------
    GraphError
        It returns something other than tensors, or its outputs are not read one at a time.
    """
    import torch
    if isinstance(val, torch.Tensor):
        return [val]
    if val is None or (isinstance(val, (tuple, list)) and not val):
        return None
    if not isinstance(val, (tuple, list)) or \
            not all(isinstance(t, torch.Tensor) or t is None for t in val):
        raise GraphError(f"op {node.target} returns {type(val).__name__}, not tensors "
                         f"(data-dependent values are not supported)")
    used = set()
    for user in node.users:
        if user.target is not operator.getitem:
            raise GraphError(f"op {node.target}: its outputs are read by {user.format_node()}, "
                             f"not one at a time")
        used.add(user.args[1])
    return [t if i in used else None for i, t in enumerate(val)]


def flops(node: fx.Node, val: Any) -> float:
    """Flops from shapes (see the module's docstring).

    Parameters
    ----------
    node : torch.fx.Node
        The op's node.
    val : object
        What it returns.

    Returns
    -------
    float
        Its flops.
    """
    import torch
    name = packet_name(node)
    shapes = [a.meta["val"].shape for a in tensor_args(node)
              if isinstance(a.meta.get("val"), torch.Tensor)]
    args: list[Any] = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in node.args]
    if name in ("mm", "bmm"):
        return 2.0 * args[0].numel() * args[1].shape[-1]
    if name in ("addmm", "baddbmm"):
        return 2.0 * args[1].numel() * args[2].shape[-1]
    if name == "convolution":
        return 2.0 * val.numel() * math.prod(args[1].shape[1:])
    if name == "convolution_backward":
        grad_out, weight, mask = args[0], args[2], args[-1]
        per = 2.0 * grad_out.numel() * math.prod(weight.shape[1:])
        return per * (mask[0] + mask[1]) + grad_out.numel() * mask[2]
    if name == CAST:
        return 0.0                  # memory-bound, and none in torch.utils.flop_counter either
    if attention(name):
        backward = name.endswith("_backward")
        q, k, v = args[1:4] if backward else args[0:3]
        forward = 2.0 * math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        return forward * (2.5 if backward else 1.0)
    outs = [val] if isinstance(val, torch.Tensor) else [t for t in val or () if t is not None]
    return float(max([math.prod(s) for s in shapes] + [t.numel() for t in outs] + [1]))


def _tiles(shape: Sequence[int], out: Sequence[int]) -> bool:
    """Whether broadcasting ``shape`` to ``out`` repeats it whole (leading dimensions only),
    as the ``add`` kernel's tiling does."""
    rest = list(shape)
    while rest and rest[0] == 1:
        rest.pop(0)
    return not rest or list(out[len(out) - len(rest):]) == rest
