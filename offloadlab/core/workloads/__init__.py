"""Workload builders, callable from Python and from the CLI as ``NAME:key=value,...``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..errors import SpecError
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


def build_workload(spec: str) -> TaskGraph:
    """``"matmul-chain:layers=4,gpus=2"`` -> its TaskGraph."""
    name, raw = parse_spec(spec)
    options = apply_options(workload_options(name), raw, f"workload {name!r}")
    with no_gc():                       # a vertex, a dict and a tuple or two per vertex
        graph = WORKLOADS[name](**options)
        graph.validate()
    return graph


__all__ = ["WORKLOADS", "TrainingChain", "build_workload", "workload_options", "matmul_chain",
           "random_dag", "tp_matmul", "training_chain", "gpt2_train", "bert_train", "model",
           "llama_prefill", "llama_lora_train"]
