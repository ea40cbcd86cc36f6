"""``offloadlab import-torch``: its parser and its handler."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ...core.errors import SpecError
from ...core.ops import GENERIC, op_name
from ...core.util import fmt_bytes
from .common import AddCommand, phases
from .options import positive_int
from .outputs import check_writable


def cmd_import_torch(args: argparse.Namespace) -> int:
    """Trace a PyTorch module (built by ``MODULE:FACTORY`` on the meta device, no weights
    allocated) into a TaskGraph file.

    Parameters
    ----------
    args : argparse.Namespace
        The ``import-torch`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the TaskGraph file is written.
    """
    check_writable(args, "out")
    try:
        import torch
    except ImportError:
        raise SpecError("import-torch needs PyTorch: pip install \"offloadlab[torch]\""
                        ) from None
    from ...core.formats import to_json
    from ...core.workloads.from_torch import from_torch
    factory = _factory(args.factory)
    with phases(args).phase(f"building {args.factory} on the meta device"):
        try:
            with torch.device("meta"):
                module = factory()
        except Exception as exc:   # noqa: BLE001 - the user's code: say what it raised
            raise SpecError(f"{args.factory}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(module, torch.nn.Module):
        raise SpecError(f"{args.factory}() returned a {type(module).__name__}, not a "
                        f"torch.nn.Module")
    inputs = [torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
              for shape, dtype in args.input]
    target = None
    if args.target:
        (shape, dtype), = args.target
        target = torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
    with phases(args).phase("tracing"):
        graph = from_torch(module, inputs, train=args.train, gpus=args.gpus, dtype=args.dtype,
                           name=args.name or args.factory.rpartition(":")[2],
                           loss=args.loss, target=target, optimizer=args.optimizer,
                           generic=args.generic)
    with args.outputs.file(args.out) as tmp, phases(args).phase(f"writing {args.out}"):
        to_json(graph, tmp)
    args.outputs.commit()
    if not args.quiet:
        weights = sum(t.bytes for t in graph if t.kind == "input")
        generic = sum(t.op is not None and op_name(t.op) == GENERIC for t in graph)
        print(f"wrote {args.out}: {len(graph)} vertices ({graph.meta['mode']}, "
              f"{args.gpus} GPU(s)), {fmt_bytes(weights)} of inputs and weights in host RAM"
              + (f"; {generic} generic op(s) priced from shapes alone: it plans and simulates, "
                 f"the executor refuses it" if generic else ""))
    return 0


def _factory(spec: str) -> Callable[[], object]:
    """``package.module:function`` (or ``path/to/file.py:function``) -> the function.  A
    module is looked up in the working directory first, a file's imports beside the file (as
    ``uvicorn module:app`` and ``python file.py`` do)."""
    import importlib
    import importlib.util
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise SpecError(f"expected MODULE:FACTORY (e.g. mypackage.models:build or "
                        f"models.py:build), got {spec!r}")
    path = Path(where)
    if where.endswith(".py") and not path.is_file():
        raise SpecError(f"{spec}: no file {where!r}")
    first = str(path.resolve().parent) if where.endswith(".py") else os.getcwd()
    sys.path.insert(0, first)
    try:
        if where.endswith(".py"):
            found = importlib.util.spec_from_file_location(path.stem, path)
            assert found is not None and found.loader is not None
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as exc:   # noqa: BLE001 - importing the user's module ran their code
        raise SpecError(f"{spec}: importing {where!r} raised {type(exc).__name__}: {exc}"
                        ) from None
    finally:
        sys.path.remove(first)
    if not hasattr(module, name):
        raise SpecError(f"{spec}: {where!r} has no attribute {name!r}")
    factory = getattr(module, name)
    if not callable(factory):
        raise SpecError(f"{spec}: {name!r} is a {type(factory).__name__}, not a function "
                        f"returning an nn.Module")
    return factory


def _tensor_spec(text: str) -> tuple[tuple[int, ...], str]:
    """``32,256`` or ``4,64:int64`` -> (shape, dtype)."""
    shape_text, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    if dtype not in TORCH_DTYPES:
        raise argparse.ArgumentTypeError(f"dtype {dtype!r}: use one of "
                                         f"{', '.join(TORCH_DTYPES)}")
    try:
        shape = tuple(int(x) for x in shape_text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 32,256 (and :int64 for "
                                         f"indices), got {text!r}") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"a shape's sizes must be positive, got {text!r}")
    return shape, dtype


TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")


def add_parser(add: AddCommand) -> None:
    """The ``import-torch`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``import-torch`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("import-torch", cmd_import_torch, "trace a PyTorch module (on the meta device, "
            "no weights allocated) into a TaskGraph: its forward pass, or with --train one "
            "training step")
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a function returning the nn.Module: package.module:build or "
                        "path/to/models.py:build")
    p.add_argument("--input", action="append", type=_tensor_spec, required=True,
                   metavar="SHAPE[:DTYPE]",
                   help="an input's shape (repeatable, in the forward's argument order), "
                        "e.g. 32,256 or 4,64:int64 for token ids")
    p.add_argument("--out", required=True, metavar="FILE", help="TaskGraph JSON to write")
    p.add_argument("--train", action="store_true",
                   help="one training step: forward, loss, backward, an optimizer update per "
                        "weight")
    p.add_argument("--gpus", type=positive_int, default=1,
                   help="pipeline stages, one per GPU (1)")
    p.add_argument("--dtype", choices=("float16", "float32", "float64"),
                   help="recast every floating-point weight and input")
    p.add_argument("--loss", choices=("mean", "cross_entropy"), default="mean",
                   help="--train: the loss (mean of the output, or cross_entropy against "
                        "--target)")
    p.add_argument("--target", action="append", type=_tensor_spec, metavar="SHAPE[:DTYPE]",
                   help="--train with cross_entropy: the target's shape, e.g. 4,64:int64")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="--train: the update per weight (adam)")
    p.add_argument("--generic", action="store_true",
                   help="price an ATen op the toolkit does not know from its shapes alone (one "
                        "flop per output element, its inputs and outputs touched) as a "
                        "generic:<op> vertex, instead of an error; the executor refuses such "
                        "a graph")
    p.add_argument("--name", help="the TaskGraph's name (default: the factory's)")
