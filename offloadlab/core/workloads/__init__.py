"""Workload builders, callable from Python and from the CLI as ``NAME:key=value,...``."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

from ..budget import TASK_VERTEX, check_ram
from ..errors import SpecError
from ..nodelink import check_input
from ..spec import apply_options, parse_spec
from ..taskgraph import TaskGraph
from ..util import no_gc
from .llama import llama_prefill
from .llama_lora import llama_lora_train
from .matmul_chain import matmul_chain
from .models import model
from .random_dag import random_dag
from .tp_matmul import tp_matmul
from .training import TrainingChain, bert_train, gpt2_train, training_chain

WORKLOADS: dict[str, Callable[..., TaskGraph]] = {
    "matmul-chain": matmul_chain,
    "tp-matmul": tp_matmul,
    "random": random_dag,
    "training-chain": training_chain,
    "gpt2-train": gpt2_train,
    "bert-train": bert_train,
    "model": model,
    "llama-prefill": llama_prefill,
    "llama-lora-train": llama_lora_train,
}


def workload_options(name: str) -> dict[str, object]:
    """The options a workload takes, with their defaults."""
    if name not in WORKLOADS:
        raise SpecError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    params = inspect.signature(WORKLOADS[name]).parameters
    return {p.name: p.default for p in params.values()}


def check_workload(spec: str) -> tuple[str, dict[str, object]]:
    """The name and options of the workload ``spec``, checked: a known name, known options of
    the right types, and a graph whose vertices (:func:`estimated_vertices`) fit in the RAM
    available (:mod:`..budget`); nothing is built."""
    name, raw = parse_spec(spec)
    options = apply_options(workload_options(name), raw, f"workload {name!r}")
    vertices = estimated_vertices(name, options)
    check_ram(f"workload {spec!r} (about {vertices:.3g} vertices)", vertices * TASK_VERTEX)
    return name, options


def build_workload(spec: str) -> TaskGraph:
    """``"matmul-chain:layers=4,gpus=2"`` -> its TaskGraph."""
    name, options = check_workload(spec)
    with no_gc():                       # a vertex, a dict and a tuple or two per vertex
        graph = WORKLOADS[name](**options)
        graph.validate()
    return graph


def estimated_vertices(name: str, options: dict) -> int:
    """How many vertices workload ``name`` builds with ``options`` (an upper bound, at most
    1.6 times the count: tests/test_adversarial.py checks both on a grid of options), before
    building it; 0 for the shipped models, whose files are small.  Options a builder refuses
    (a negative count) give 0 here and their error there."""
    o, count = options, 0
    if name == "matmul-chain":
        count = o["gpus"] + o["layers"] * o["gpus"] * (o["gpus"] + 1)
    elif name == "tp-matmul":
        count = 15
    elif name == "random":
        count = o["vertices"]
    elif name in ("gpt2-train", "bert-train"):
        count = o["depth"] + o["iterations"] * (1 + 4 * o["depth"])
    elif name == "training-chain":
        layers = _chain_layers(o)
        count = layers + o["iterations"] * (1 + 4 * layers)
    elif name in ("llama-prefill", "llama-lora-train"):
        count = _llama_vertices(name, o)
    return max(count, 0)


def _chain_layers(o: dict) -> int:
    """training-chain's layers: its ``uF`` list's, or at most a CSV file's lines (a row takes
    at least 8 bytes: four values, three commas and a newline)."""
    if not o["csv_path"]:
        return len([x for x in str(o["uF"]).split(";") if x.strip()])
    if not os.path.exists(o["csv_path"]):
        return 0                                # training_chain names the missing file
    check_input(o["csv_path"], "training-chain CSV", sniff=False)
    return os.stat(o["csv_path"]).st_size // 8


def _llama_vertices(name: str, o: dict) -> int:
    """LLaMA's vertices (:mod:`.llama`): per layer and row block ``i`` (of ``nb`` per
    sequence), each head's q, k, v, their rotations, ``i + 1`` score and probability blocks,
    its statistics and output, and each GPU's share of the MLP, reductions and gathers; the
    LoRA step adds the backward pass and the recomputed forward (at most 5 times as many)."""
    from .llama import CONFIGS
    config = CONFIGS.get(o["model"])
    if config is None or min(o["seq"], o["block"], o["batch"], o["gpus"]) <= 0:
        return 0
    layers, heads, batch, gpus = config.layers, config.heads, o["batch"], o["gpus"]
    nb = -(-o["seq"] // min(o["block"], o["seq"]))
    count = (layers * batch * (heads * nb * (nb + 8) + 10 * gpus * nb)
             + layers * (3 * heads + 4 * gpus + 2) + batch * nb * (4 + gpus) + 10)
    return count * (5 if name == "llama-lora-train" else 1)


__all__ = ["WORKLOADS", "TrainingChain", "build_workload", "check_workload", "workload_options",
           "estimated_vertices", "matmul_chain",
           "random_dag", "tp_matmul", "training_chain", "gpt2_train", "bert_train", "model",
           "llama_prefill", "llama_lora_train"]
