"""Workload builders, callable from Python and from the CLI as ``NAME:key=value,...``.

Each builder registers itself with :func:`.registry.workload` where it is defined.  The
imports below re-export the built-in builders and, in their order, set the order in which
``offloadlab list workloads`` shows them (simple ones first, so an explicit list is the lesser
evil here: the order is the user's view); every other module of the package is imported after
them, found by :mod:`pkgutil`, so a new workload is a new module.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..budget import TASK_VERTEX, check_ram
from ..spec import apply_options, parse_spec
from ..taskgraph import TaskGraph
from ..util import no_gc

# isort: off
from .matmul_chain import matmul_chain
from .tp_matmul import tp_matmul
from .random_dag import random_dag
from .training import TrainingChain, bert_train, gpt2_train, training_chain
from .models import model
from .llama import llama_prefill
from .llama_lora import llama_lora_train
# isort: on
from .registry import VERTICES, WORKLOADS, workload

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def workload_options(name: str) -> dict[str, object]:
    """The options a workload takes, with their defaults.

    Parameters
    ----------
    name : str
        A registered workload.

    Returns
    -------
    dict of str to object

    Raises
    ------
    SpecError
        Listing the workloads, if ``name`` is none of them.
    """
    return dict(WORKLOADS.entry(name).options)


def check_workload(spec: str) -> tuple[str, dict[str, object]]:
    """The name and options of the workload ``spec``, checked; nothing is built.

    A known name, known options of the right types, and a graph whose vertices
    (:func:`estimated_vertices`) fit in the RAM available (:mod:`..budget`).

    Parameters
    ----------
    spec : str
        ``NAME[:key=value,...]``.

    Returns
    -------
    (str, dict of str to object)
        The workload's name and its options.

    Raises
    ------
    SpecError
        An unknown workload, option or value, or a graph too large for the RAM available.
    """
    name, raw = parse_spec(spec)
    options = apply_options(workload_options(name), raw, f"workload {name!r}")
    vertices = estimated_vertices(name, options)
    check_ram(f"workload {spec!r} (about {vertices:.3g} vertices)", vertices * TASK_VERTEX)
    return name, options


def build_workload(spec: str) -> TaskGraph:
    """``"matmul-chain:layers=4,gpus=2"`` -> its TaskGraph.

    Parameters
    ----------
    spec : str
        ``NAME[:key=value,...]`` (``offloadlab list workloads``).

    Returns
    -------
    TaskGraph
        Validated.

    Raises
    ------
    SpecError
        As :func:`check_workload`, or a value the builder refuses.
    """
    name, options = check_workload(spec)
    with no_gc():                       # a vertex, a dict and a tuple or two per vertex
        graph = WORKLOADS[name](**options)
        graph.validate()
    return graph


def estimated_vertices(name: str, options: dict) -> int:
    """How many vertices workload ``name`` builds with ``options``, before building it.

    An upper bound, at most 1.6 times the count (tests/test_adversarial.py checks both on a
    grid of options).  Options a builder refuses (a negative count) give 0 here and their
    error there.

    Parameters
    ----------
    name : str
        A registered workload.
    options : dict
        Its options.

    Returns
    -------
    int
        The bound; 0 for a workload registered without an estimate (the shipped models,
        whose files are small).
    """
    estimate = VERTICES.get(name)
    return 0 if estimate is None else max(estimate(options), 0)


__all__ = ["WORKLOADS", "TrainingChain", "build_workload", "check_workload", "workload_options",
           "estimated_vertices", "matmul_chain", "workload",
           "random_dag", "tp_matmul", "training_chain", "gpt2_train", "bert_train", "model",
           "llama_prefill", "llama_lora_train"]
